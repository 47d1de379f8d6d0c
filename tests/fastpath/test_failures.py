"""Failures a healthy machine never shows, made to happen inside a running fastpath by an
LD_PRELOAD shim (tests/fastpath/faults.c): each must end in a clear answer or a restart, never
in a hang or a worker that silently stops accepting."""
import os
import shutil
import socket
import subprocess
import time

import pytest
import requests
from pymemcache.client.hash import HashClient

import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from tests.fastpath.conftest import token

SHIM_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults.c")


@pytest.fixture(scope="session")
def faults_so(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed for the fault shim"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libevent", "libcrypto"],
                           check=True, capture_output=True, text=True).stdout.split()
    out = tmp_path_factory.mktemp("faults") / "faults.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wno-deprecated-declarations",
                    "-o", str(out), SHIM_SOURCE, "-Wl,--no-as-needed", *flags, "-ldl"], check=True)
    return str(out)


class Faulty:
    def __init__(self, fp, fault_dir, memcached):
        self.fp, self.dir, self.memcached = fp, fault_dir, memcached

    def arm(self, *names, pid=None):
        """Fail these calls (in process pid only, when given)."""
        for name in names:
            (self.dir / name).write_text(str(pid) if pid else "")

    def disarm(self, *names):
        for name in names:
            (self.dir / name).unlink(missing_ok=True)

    def log(self):
        return self.fp.log.read_text(errors="replace")

    def poll(self, uid=1, timeout=5):
        return requests.get(f"{self.fp.url}/Poll/getMessages", timeout=timeout,
                            headers={"Authorization": f"Bearer {token(uid)}"})


@pytest.fixture
def faulty(fastpath_factory, memcached, faults_so, tmp_path):
    HashClient([memcached.spec], default_noreply=False).set("p1:getMessages:1:0", b'{"mine":1}')
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    fp = fastpath_factory([memcached], preload=[faults_so], env={"FP_FAULT_DIR": str(fault_dir)})
    faulty = Faulty(fp, fault_dir, memcached)
    assert faulty.poll().status_code == 200
    return faulty


def _children(pid):
    return sorted(int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split())


def test_memcached_deadline_timer_that_cannot_be_set_is_503_at_once(faulty):
    """A get without a deadline would wait forever for a frozen memcached: it is answered 503
    (fallback) at once instead."""
    faulty.arm("mc_timer")
    faulty.memcached.pause()
    started = time.monotonic()
    try:
        resp = faulty.poll()
    finally:
        faulty.memcached.resume()
    assert resp.status_code == 503 and resp.headers["X-Cache"] == "MISS"
    assert resp.json() == {"error": "memcached unavailable"}
    assert time.monotonic() - started < 1
    faulty.disarm("mc_timer")
    assert faulty.poll().json() == {"mine": 1}
    assert "memcached: cannot set a deadline timer; answering 503" in faulty.log()


def test_sha256_failure_is_503_not_a_bad_signature(faulty):
    faulty.arm("sha256")
    resp = faulty.poll()
    assert resp.status_code == 503 and resp.headers["X-Cache"] == "MISS"
    assert resp.json() == {"error": "token check failed"}
    faulty.disarm("sha256")
    assert faulty.poll().json() == {"mine": 1}


def test_wall_clock_failure_is_503_and_keeps_the_last_date(faulty):
    """Without the time a token's expiry cannot be checked: fallback, not a guess."""
    faulty.arm("wall_clock")
    resp = faulty.poll()
    assert resp.status_code == 503 and resp.headers["X-Cache"] == "MISS"
    assert resp.json() == {"error": "clock unavailable"}
    assert resp.headers["Date"].endswith(" GMT")         # the last one made is sent again
    faulty.disarm("wall_clock")
    assert faulty.poll().json() == {"mine": 1}


def test_accept_failure_pauses_accepting_then_resumes(faulty):
    faulty.arm("accept.once")
    started = time.monotonic()
    assert faulty.poll().json() == {"mine": 1}          # accepted after the 100 ms pause
    assert time.monotonic() - started >= 0.09
    assert "accept failed (Too many open files); accepting again in 100 ms" in faulty.log()


def test_accept_pause_that_cannot_be_scheduled_keeps_accepting(faulty):
    """Disabling the listener with no timer to enable it again would leave the worker deaf."""
    faulty.arm("accept.once", "pause_timer")
    assert faulty.poll().json() == {"mine": 1}
    assert "no pause can be scheduled; accepting on" in faulty.log()


def test_listener_that_cannot_be_re_enabled_restarts_the_worker(faulty):
    """After 2 s of failed attempts to accept again, the worker drains and exits 1; the parent
    starts a new one, which serves."""
    parent = faulty.fp.proc.pid
    before = _children(parent)
    faulty.arm("accept.once", "listener_enable", pid=before[0])   # not in the new worker
    with socket.create_connection(("127.0.0.1", faulty.fp.port), timeout=10) as sock:
        sock.sendall(f"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(1)}"
                     f"\r\nConnection: close\r\n\r\n".encode())
        try:
            assert sock.recv(100) == b""      # queued on the old worker's socket: never answered
        except ConnectionResetError:
            pass
    deadline = time.monotonic() + 10
    while "exited with 1; restarting" not in faulty.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = faulty.log()
    assert "cannot resume accepting (Cannot allocate memory); retrying for 2000 ms" in log
    assert "cannot resume accepting connections: draining, then this worker exits" in log
    assert "worker 0: cannot resume accepting connections" in log
    assert "exited with 1; restarting" in log
    while time.monotonic() < deadline:
        try:
            if faulty.poll(timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    assert faulty.poll().json() == {"mine": 1}
    after = _children(parent)
    assert len(after) == 1 and after != before
