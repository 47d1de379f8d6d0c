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
