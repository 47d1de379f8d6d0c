"""The background writer in a short-lived process: a management command or a cron job that touches
more than FANOUT_IN_REQUEST users and exits at once (found adopting fastpoll: the daemon thread
died with the interpreter, and the answers stayed stale until a repair pass).  For real: a
separate Django process, its answers read from memcached once it has exited."""
import time

import pytest

from tests.plurkcore.helpers import server_client

USERS = 5

_SETUP = f"""
from django.contrib.auth import get_user_model
from fastpoll import keys
from fastpoll.models import UserState
for i in range({USERS}):
    user = get_user_model().objects.create_user(f"bulk{{i}}")
    print("key", keys.answer_key("getUnreadCount", user.pk, UserState.objects.get(user=user).epoch))
"""

# FANOUT_IN_REQUEST below the users touched: the background writer's work; each write takes
# WRITE_DELAY seconds first, so the process is always past its last line before it is done
_TOUCH = f"""
import logging, sys, time
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
import fastpoll
from fastpoll import background, changes, conf
logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
settings.FASTPOLL = dict(settings.FASTPOLL, FANOUT_IN_REQUEST=2)
conf.reset()
real = changes._Batch.write
def slow(self):
    time.sleep({{delay}})
    real(self)
changes._Batch.write = slow
with transaction.atomic():
    fastpoll.touch("getUnreadCount", users=list(get_user_model().objects.filter(username__startswith="bulk")))
print("committed; submitted", background.stats["submitted"])
"""

_OUTBOX = """
from fastpoll.models import PendingChange
print(PendingChange.objects.count())
"""


@pytest.fixture
def manage(memcached, manage_py):
    """``manage_py`` with USERS users whose answers are not cached; ``.answers()`` reads them."""
    run = manage_py
    setup = run("shell", "-c", _SETUP)
    answer_keys = [line.split()[1] for line in setup.stdout.splitlines() if line.startswith("key ")]
    assert len(answer_keys) == USERS, setup.stdout + setup.stderr
    client = server_client(memcached.spec)
    for key in answer_keys:                              # as if the users were added in bulk: no answers
        client.delete(key)
    run.answers = lambda: [client.get(key) for key in answer_keys]
    run.outbox = lambda: int(run("shell", "-c", _OUTBOX).stdout.split()[-1])
    return run


def test_a_process_that_exits_after_a_large_touch_writes_it_first(manage):
    done = manage("shell", "-c", _TOUCH.replace("{delay}", "1.0"))
    assert done.returncode == 0 and "committed; submitted 1" in done.stdout, done.stdout + done.stderr
    assert manage.answers() == [b""] * USERS              # written: nothing new for each, not a miss
    assert "repair pass" not in done.stderr and manage.outbox() == 0


def test_the_wait_at_exit_is_bounded_and_says_what_it_left(manage):
    started = time.monotonic()
    left = manage("shell", "-c", _TOUCH.replace("{delay}", "30") + "background.EXIT_DRAIN_SECONDS = 0.5\n")
    assert time.monotonic() - started < 25
    assert left.returncode == 0 and "committed" in left.stdout, left.stdout + left.stderr
    assert ("exiting with 1 background fan-out(s) not written after 0.5 s; their outbox rows are left to the "
            "repair pass") in left.stderr
    assert manage.answers() == [None] * USERS and manage.outbox() == 1
