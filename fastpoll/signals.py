"""The signals plurkcore sends (and nothing else).

``answers_stored``: the writer's last step (``publish._after_store``), sent once memcached has
confirmed a batch of keys: ``keys`` is the frozenset of keys it answered ``STORED`` to, ``deleted``
the frozenset of keys it deleted (a revoked epoch, a deactivated or deleted user).  A key whose
store failed or conflicted is in neither.  ``sender`` is None.  This is where a wake-up of held
polls belongs (long-polling's ``notify``).  Receivers run in the writer's thread after the commit;
an exception in one is logged (``django.dispatch``) and does not stop the writer.
"""
from django.dispatch import Signal

answers_stored = Signal()  # args: keys, deleted
