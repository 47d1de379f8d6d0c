"""The background writer in a short-lived process: a management command or a cron job that touches
more than FANOUT_IN_REQUEST users and exits at once (found adopting fastpoll: the daemon thread
died with the interpreter, and the answers stayed stale until a repair pass).  For real: a
separate Django process, its answers read from memcached once it has exited.

The wait is short (a hostile review: 30 s stalled a gunicorn worker restarted by --max-requests,
and gunicorn's --timeout killed it mid-wait with a traceback), said before it starts, and a
Ctrl-C or a SystemExit ends it quietly."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from fastpoll import background
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
    assert "fan-out(s) not written" not in done.stderr and manage.outbox() == 0


def test_the_wait_at_exit_is_short_and_says_what_it_left(manage):
    assert background.EXIT_DRAIN_SECONDS <= 5             # a worker restarted by --max-requests waits it
    started = time.monotonic()
    left = manage("shell", "-c", _TOUCH.replace("{delay}", "30"))
    assert time.monotonic() - started < 20                 # Django's start and the wait, not the 30 s job
    assert left.returncode == 0 and "committed" in left.stdout, left.stdout + left.stderr
    assert (f"exiting with 1 background fan-out(s) not written after {background.EXIT_DRAIN_SECONDS:g} s; "
            "their outbox rows are left to the repair pass, which writes them OUTBOX_GRACE") in left.stderr
    assert manage.answers() == [None] * USERS and manage.outbox() == 1


# a process with one endless job at exit; SIGTERM raises SystemExit, as gunicorn's worker does on
# the SIGABRT of its --timeout
_ENDLESS = """
import logging, signal, sys, time
import django
from django.conf import settings
settings.configure()
django.setup()
from fastpoll import background
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s: %(message)s")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
background.submit(lambda: time.sleep(60))
print("exiting", flush=True)
"""


def _exiting(code):
    """A Python process running ``code`` (SIGINT as a terminal's, even under a runner that ignores
    it) once it is in its exit wait: (process, stderr lines so far)."""
    from plurksite.config import ROOT

    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines, waiting = [], threading.Event()

    def read():
        for line in process.stderr:
            lines.append(line)
            if "waiting up to" in line:
                waiting.set()
        waiting.set()

    threading.Thread(target=read, daemon=True).start()
    waiting.wait(60)
    assert lines and "waiting up to" in lines[-1], "".join(lines)
    return process, lines


@pytest.mark.parametrize("signum, exc", [(signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, "SystemExit")])
def test_the_wait_is_said_before_it_starts_and_an_interrupt_ends_it_quietly(signum, exc):
    process, lines = _exiting(_ENDLESS)
    assert process.poll() is None                          # said while still waiting
    assert lines == [f"fastpoll.background: waiting up to {background.EXIT_DRAIN_SECONDS:g} s for 1 background "
                     "fan-out(s) before exiting; what is not written by then is left to the repair pass\n"]
    process.send_signal(signum)
    process.wait(10)
    time.sleep(0.2)                                        # the reader's last lines
    err = "".join(lines)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert (f"exiting with 1 background fan-out(s) not written when the wait was interrupted ({exc}); their "
            "outbox rows are left to the repair pass") in err


# a process forks while its writer runs a job (found by a hostile review: the child inherited the
# parent's unfinished count, waited for it at exit and said a fan-out was not written)
_FORK = """
import logging, os, sys, time
import django
from django.conf import settings
settings.configure()
django.setup()
from fastpoll import background
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(process)d %(name)s: %(message)s")
background.submit(lambda: time.sleep(1))
time.sleep(0.2)                                  # the thread runs it
pid = os.fork()
if pid == 0:
    print("child starts with", background._jobs.unfinished_tasks, background.stats, flush=True)
    ran = []
    background.submit(lambda: ran.append("its own"))
    print("child wrote", background.wait(5), ran, flush=True)
    sys.exit(0)                                  # its exit wait: nothing of the parent's
started = time.monotonic()
os.waitpid(pid, 0)
print("child exited after %.1f s" % (time.monotonic() - started), flush=True)
print("parent wrote", background.wait(5), background.stats, flush=True)
"""


def test_a_child_forked_during_a_job_starts_without_it():
    from plurksite.config import ROOT

    run = subprocess.run([sys.executable, "-c", _FORK], cwd=ROOT, text=True, capture_output=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    out = run.stdout.splitlines()
    assert run.returncode == 0 and len(out) == 4, run.stdout + run.stderr
    assert out[0] == "child starts with 0 {'submitted': 0, 'done': 0, 'errors': 0}"
    assert out[1] == "child wrote True ['its own']"
    assert float(out[2].split()[3]) < 2.5, out           # not the wait for a job no thread of its runs
    assert out[3] == "parent wrote True {'submitted': 1, 'done': 1, 'errors': 0}"
    assert "fan-out" not in run.stderr, run.stderr       # no wait at either exit, no false warning
