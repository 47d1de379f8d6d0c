"""The supervisor (fastpath/_lifecycle.pyx): restarts, the crash limit, SIGTERM forwarding and
the SIGKILL that ends a drain which never finishes.  Each run forks, so it runs in a process of
its own, never inside pytest."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import requests

import fastpath
import fastpath._lifecycle  # a build that does not import fails here, never skips
from tests.fastpath.conftest import fastpath_env, python_script, token


def _children(pid):
    try:
        return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def _run_script(tmp_path, body, timeout=30):
    env, cwd = fastpath_env(tmp_path)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_worker_that_keeps_failing_is_given_up_on(tmp_path):
    """Restarted CRASH_LIMIT times with a growing delay, then run() raises and no worker is left."""
    result = _run_script(tmp_path, """
        import os, time
        from fastpath._lifecycle import Supervisor, CRASH_LIMIT
        from fastpath.errors import FastpathError
        starts = "{starts}"
        def worker(index):
            with open(starts, "a") as fh:
                fh.write(f"{{index}} {{time.monotonic()}}\\n")
            if index == 1:
                raise FastpathError("cannot start on purpose")
            time.sleep(60)                       # worker 0 is healthy until told to stop
        t0 = time.monotonic()
        try:
            Supervisor(worker, 2, drain_timeout=1).run()
        except FastpathError as exc:
            print("raised:", exc, round(time.monotonic() - t0, 2))
        """.format(starts=tmp_path / "starts"))
    assert result.returncode == 0, result.stderr
    assert "raised: worker 1 failed 6 times in 10 s" in result.stdout, result.stdout + result.stderr
    lines = [ln.split() for ln in (tmp_path / "starts").read_text().splitlines()]
    starts_1 = [float(t) for i, t in lines if i == "1"]
    assert len(starts_1) == 6                    # the first start and 5 restarts
    gaps = [b - a for a, b in zip(starts_1, starts_1[1:])]
    assert gaps[-1] > gaps[0] and gaps[-1] >= 0.2    # the delay grows with each failure
    assert [i for i, _ in lines].count("0") == 1     # the healthy worker was never restarted
    log = result.stderr
    assert log.count("cannot start on purpose") == 6
    assert "exited with 1; restarting" in log and "giving up" in log


def test_sigterm_is_forwarded_and_a_stuck_drain_is_killed(tmp_path):
    """SIGTERM reaches every worker; one that never exits (here it ignores SIGTERM) is killed
    drain_timeout + 5 s later, and run() returns instead of hanging."""
    ready = tmp_path / "ready"
    script = textwrap.dedent("""
        import os, signal, time
        from fastpath._lifecycle import Supervisor
        def worker(index):
            if index == 0:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open("{ready}." + str(index), "w").close()
            time.sleep(120)
        Supervisor(worker, 2, drain_timeout=0).run("supervising")
        print("run returned", flush=True)
        """.format(ready=ready))
    with python_script(tmp_path, script) as proc:
        deadline = time.monotonic() + 10
        while not all(os.path.exists(f"{ready}.{i}") for i in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert len(workers) == 2
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - t0
    assert proc.returncode == 0, err
    assert out == "run returned\n"
    assert "SIGTERM: draining the workers" in err
    assert "still running 0 s + 5 s after SIGTERM; killing it" in err
    assert err.count("killing it") == 1          # only the worker that ignored SIGTERM
    assert 4.5 <= took < 15
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_a_second_sigterm_during_the_drain_is_taken_by_the_supervisor(tmp_path):
    """Signals stay blocked until every worker has exited: a second SIGTERM while a worker drains
    neither cuts the drain short nor reaches the caller's default handler (which would kill the
    process that serve() returns to)."""
    script = textwrap.dedent("""
        import os, signal, time
        from fastpath._lifecycle import Supervisor
        def worker(index):
            signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), os._exit(0)))
            time.sleep(120)
        Supervisor(worker, 1, drain_timeout=5).run("supervising")
        time.sleep(0.5)
        print("still alive", flush=True)
        """)
    with python_script(tmp_path, script) as proc:
        deadline = time.monotonic() + 10
        while len(_children(proc.pid)) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)         # while the worker is still draining
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out == "still alive\n"


def test_killed_fastpath_worker_is_replaced_and_says_by_what(fastpath_factory, memcached):
    """The real server: a worker killed by a signal is logged as such and replaced; the port keeps
    answering throughout."""
    fp = fastpath_factory([memcached], workers=1)
    (old,) = _children(fp.proc.pid)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (_children(fp.proc.pid) in ([], [old])):
        time.sleep(0.05)
    (new,) = _children(fp.proc.pid)
    assert new != old
    resp = None
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.ConnectionError):
            resp = requests.get(f"{fp.url}/Poll/getMessages", timeout=5,
                                headers={"Authorization": f"Bearer {token(1)}"})
            break
        time.sleep(0.05)
    assert resp is not None and resp.status_code == 404
    assert f"worker 0 (pid {old}) was killed by SIGKILL; restarting" in fp.log.read_text()


@pytest.mark.parametrize("workers", [0, 257])
def test_supervisor_refuses_a_bad_worker_count(workers):
    with pytest.raises(fastpath.ConfigurationError, match="--workers must be in 1..256"):
        fastpath._lifecycle.Supervisor(lambda index: None, workers)



def test_a_restarted_worker_zeroes_its_gauges_not_its_counters(fastpath_factory, memcached):
    """A worker's gauges live in its shared stats slot: one killed with 3 streams and a held poll
    open must not leave them there for the worker that takes the slot (fp_server_init), while
    the *_total counters go on from where they were (monotonic, as Prometheus expects)."""
    from pymemcache.client.base import Client

    from tests.fastpath.test_edge import edge_stream
    from tests.fastpath.test_longpoll import Poll, etag, key, metric, wait_metric
    cache = Client(memcached.spec, default_noreply=False)
    cache.set(key(1), b'{"n":1}')
    fp = fastpath_factory([memcached], workers=1, edge=True, extra=("--reread-interval", "60"))
    base = metric(fp, "fastpath_connections")        # /metrics' own connection, if it counts
    streams = [edge_stream(fp, uid=1) for _ in range(3)]
    for s in streams:
        assert s.event()["data"] == '{"n":1}'
    hold = Poll(fp, 1, etag(b'{"n":1}'), wait=30)
    wait_metric(fp, "fastpath_held_polls", 1)
    wait_metric(fp, "fastpath_streams", 3)
    assert metric(fp, "fastpath_connections") == base + 4
    totals = {name: metric(fp, name) for name in ("fastpath_streams_total", "fastpath_connections_accepted_total",
                                                  "fastpath_holds_total")}
    (old,) = _children(fp.proc.pid)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _children(fp.proc.pid) in ([], [old]):
        time.sleep(0.05)
    for s in streams:
        s.close()
    hold.close()
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            metric(fp, "fastpath_streams")       # the new worker answers /metrics
            break
        time.sleep(0.05)
    for name in ("fastpath_streams", "fastpath_held_polls", "fastpath_inflight_requests"):
        wait_metric(fp, name, 0, timeout=3)
    wait_metric(fp, "fastpath_connections", base, timeout=3)
    for name, before in totals.items():
        assert metric(fp, name) >= before, name
    cache.close()
