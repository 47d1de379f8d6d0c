"""Named points in the writer and the poll view where a test runs code, so that races happen in
a chosen order on every run, with no sleeps (tests/plurkcore/test_races.py).

Points: ``write.after_gets``, ``write.after_read``, ``write.after_store`` (context: ``keys``,
``attempt``), ``fill.after_read`` (``resource``, ``uid``, ``epoch``), ``repair.before_flush``
(``node``), ``repair.before_rewrite`` (``keys``: the stale keys a pass is about to rewrite).
Nothing is set outside tests: :func:`fire` is then one dict lookup.
"""
_hooks = {}


def set_hook(name, func):
    """Call ``func(**context)`` at the point ``name``; ``None`` removes it."""
    if func is None:
        _hooks.pop(name, None)
    else:
        _hooks[name] = func


def clear():
    _hooks.clear()


def fire(name, **context):
    func = _hooks.get(name)
    if func is not None:
        func(**context)
