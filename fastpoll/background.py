"""Large fan-outs, written off the request that committed them.

A committed change whose writer would rewrite the answers of more than ``FANOUT_IN_REQUEST``
followers (an author with many followers posts) is handed to one writer thread per process: the
request answers at once instead of waiting ~25-50 us per follower (100,000 followers: about 3 s,
and near gunicorn's 30 s timeout at 600,000).  The change's outbox rows stay until the thread has
written it, so a process that exits first (a restart, a killed worker) leaves them to the repair
pass, as a process killed after its commit always did (docs/consistency.md).

Jobs run one at a time, in the order submitted.  Every write reads the database afresh and stores
with ``cas``, so a later change written in a request meanwhile cannot be overwritten by this
thread's older view (the write protocol of docs/consistency.md holds between any two writers).

A process that exits (a management command, a cron job that touched many users, a worker told to
stop) first lets the thread finish, for at most :data:`EXIT_DRAIN_SECONDS` (a few seconds): the
thread is a daemon, and its jobs would otherwise die with the interpreter, their answers stale
until a repair pass.  The wait is short because it is not needed for correctness: a job not done
by then keeps its outbox rows, and the repair pass writes them ``OUTBOX_GRACE`` seconds after
their commit.  A long wait would stall a gunicorn worker restarted by ``--max-requests`` (and one
longer than ``--timeout`` is killed mid-wait).  The wait is logged before it starts, and what is
left after it, or after a Ctrl-C or a ``SystemExit`` during it, is logged and left to the repair
pass.

A child forked while the thread had jobs starts with an empty queue and zero counters: the
parent's jobs are the parent's to write (:func:`_after_fork_in_child`).
"""
import atexit
import logging
import os
import queue
import threading
import time

from django.db import close_old_connections

logger = logging.getLogger("fastpoll.background")

#: Counters since process start: jobs submitted, finished, raised.
stats = {"submitted": 0, "done": 0, "errors": 0}

#: Longest wait of an exiting process for its writer thread's jobs, seconds (a fan-out to 100,000
#: followers takes about 3 s); the rest stays in the outbox and the repair pass writes it.  Kept
#: short: a gunicorn worker restarted by --max-requests is not replaced until this wait ends.
EXIT_DRAIN_SECONDS = 3.0

_jobs = queue.Queue()
_lock = threading.Lock()
_thread = None


def submit(job):
    """Run ``job()`` on this process's writer thread (started on first use, and again in a forked
    child, where the parent's thread does not exist)."""
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="fastpoll-fanout", daemon=True)
            _thread.start()
        stats["submitted"] += 1
    _jobs.put(job)


def wait(timeout=None):
    """Block until every job submitted so far is done, or for at most ``timeout`` seconds: True
    if they are done (tests, and a clean shutdown)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _jobs.all_tasks_done:
        while _jobs.unfinished_tasks:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            _jobs.all_tasks_done.wait(left)
    return True


_LEFT = ("their outbox rows are left to the repair pass, which writes them OUTBOX_GRACE seconds after "
         "their commit (manage.py repaircache)")


@atexit.register
def _drain():
    """At interpreter exit: let the thread finish, for at most :data:`EXIT_DRAIN_SECONDS`; a
    KeyboardInterrupt or SystemExit (Ctrl-C, gunicorn's timeout) ends the wait quietly."""
    if not _jobs.unfinished_tasks:
        return
    if _thread is None or not _thread.is_alive():
        logger.warning("exiting with %d background fan-out(s) not written; %s", _jobs.unfinished_tasks, _LEFT)
        return
    try:
        # said before the wait: a process killed during it (SIGKILL, a supervisor) still said why
        logger.warning("waiting up to %g s for %d background fan-out(s) before exiting; what is not written "
                       "by then is left to the repair pass", EXIT_DRAIN_SECONDS, _jobs.unfinished_tasks)
        if wait(EXIT_DRAIN_SECONDS):
            return
        why = f"after {EXIT_DRAIN_SECONDS:g} s"
    except (KeyboardInterrupt, SystemExit) as exc:
        why = f"when the wait was interrupted ({type(exc).__name__})"
    try:
        logger.warning("exiting with %d background fan-out(s) not written %s; %s", _jobs.unfinished_tasks, why,
                       _LEFT)
    except (KeyboardInterrupt, SystemExit):
        pass                                # a second Ctrl-C: exit without the line


def _after_fork_in_child():
    """A forked child has none of the parent's jobs (nor its thread): a fresh queue and lock (the
    parent's may have been held at the fork), no thread, and counters from zero.  Inherited, the
    parent's unfinished count made the child's exit wait for jobs no thread of its would run."""
    global _jobs, _lock, _thread
    _jobs = queue.Queue()
    _lock = threading.Lock()
    _thread = None
    stats.update(submitted=0, done=0, errors=0)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _run():
    while True:
        job = _jobs.get()
        try:
            job()
            stats["done"] += 1
        except Exception:
            # the job's outbox rows stay: the repair pass writes them
            stats["errors"] += 1
            logger.exception("a background fan-out failed; the repair pass writes it again")
        finally:
            close_old_connections()          # as at a request's end: kept within CONN_MAX_AGE
            _jobs.task_done()
