"""The supervisor on plain processes: restart with growing backoff, stop whole process groups."""
import os
import sys
import time

from plurksite.stack import Service, Supervisor


def _service(tmp_path, code, name="child"):
    return Service(name, [sys.executable, "-c", code], dict(os.environ), str(tmp_path / f"{name}.log"))


def test_dead_service_is_restarted_with_doubling_backoff(tmp_path):
    svc = _service(tmp_path, "import sys; sys.exit(3)").start()
    svc.process.wait()
    sup = Supervisor(backoff_initial=0.05, backoff_max=0.2, poll_interval=0.01)
    starts = []
    deadline = time.monotonic() + 5
    while svc.restarts < 3 and time.monotonic() < deadline:
        before = svc.restarts
        sup.check(svc)
        if svc.restarts != before:
            starts.append(time.monotonic())
            svc.process.wait()
        time.sleep(0.005)
    assert svc.restarts == 3
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19          # 0.1 then 0.2 (capped)
    assert b"starting:" in (tmp_path / "child.log").read_bytes()


def test_stop_kills_grandchildren_and_stopped_processes(tmp_path):
    code = ("import subprocess, sys, time, signal\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time, signal; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    svc = _service(tmp_path, code)
    svc.stop_timeout = 0.5
    svc.start()
    log = tmp_path / "child.log"
    deadline = time.monotonic() + 5
    grandchild = None
    while grandchild is None and time.monotonic() < deadline:
        lines = [ln for ln in log.read_text().splitlines() if ln.strip().isdigit()]
        grandchild = int(lines[0]) if lines else None
        time.sleep(0.05)
    assert grandchild
    svc.stop()
    time.sleep(0.2)
    assert not os.path.exists(f"/proc/{grandchild}") or \
        open(f"/proc/{grandchild}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_the_runner_makes_the_notice_directory_or_names_the_variable(tmp_path):
    """fastpath binds its notice sockets in PLURK_FASTPATH_NOTIFY and Django sends to them."""
    import stat

    import pytest

    from plurksite.services import ServiceError
    from plurksite.stack import Stack

    old = os.umask(0o077)
    try:
        Stack._prepare_notify_dir(str(tmp_path / "run" / "notify"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "run" / "notify").st_mode) == 0o755
    (tmp_path / "file").write_text("")
    with pytest.raises(ServiceError, match="PLURK_FASTPATH_NOTIFY=.*file/notify.*or to off"):
        Stack._prepare_notify_dir(str(tmp_path / "file" / "notify"))


_MASTER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGUSR1, lambda *_: print("USR1", flush=True))
worker = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'a'); "
                           "print('open', flush=True); time.sleep(60)", sys.argv[1]], stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _nginx_like(tmp_path, held):
    """A "master" that prints USR1 for each SIGUSR1, and its "worker" holding ``held`` open."""
    import subprocess
    proc = subprocess.Popen([sys.executable, "-c", _MASTER, str(held)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _stack_after_a_reopen(tmp_path, log_dir):
    from plurksite.stack import Stack
    from tests.support.stack import stack_config
    stack = Stack(stack_config(tmp_path / "var"))
    stack._reopen_check = (0.0, [str(log_dir / "nginx-access.log")])    # the USR1 was sent, check due
    return stack


def test_a_worker_still_writing_the_rotated_log_gets_the_reopen_again(tmp_path, caplog):
    """CI saw nginx's worker go on writing nginx-access.log.1 after the runner's rotation: the
    runner looks at the workers' open files and asks nginx's master to reopen once more."""
    master = _nginx_like(tmp_path, tmp_path / "nginx-access.log.1")
    try:
        stack = _stack_after_a_reopen(tmp_path, tmp_path)
        stack._check_reopened(master.pid)
        assert master.stdout.readline().strip() == "USR1"
        assert "still write nginx-access.log.1" in caplog.text and stack._reopen_check is None
    finally:
        os.killpg(master.pid, 9)
        master.wait()


def test_workers_that_reopened_are_left_alone(tmp_path, caplog):
    import select
    master = _nginx_like(tmp_path, tmp_path / "nginx-access.log")
    try:
        stack = _stack_after_a_reopen(tmp_path, tmp_path)
        stack._check_reopened(master.pid)
        assert select.select([master.stdout], [], [], 0.5)[0] == [] and "still write" not in caplog.text
    finally:
        os.killpg(master.pid, 9)
        master.wait()
