"""Smoke runs of the connection benchmarks (bench/atr.py, bench/connbench.py) and their C tools:
the structure of what they report, never a speed."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.loadgen import tool  # noqa: E402


def _run(script, tmp_path, *argv):
    env = dict(os.environ, PLURK_BENCH_RESULTS=str(tmp_path))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("backend", ["epoll", "poll", "select"])
def test_pipetest_keeps_exactly_the_active_descriptors_ready(backend):
    out = subprocess.run([tool("pipetest"), "--backend", backend, "--descriptors", "100", "--active", "10",
                          "--duration", "0.1", "--warmup", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["backend"] == backend and result["descriptors"] == 100 and result["active"] == 10
    # every wait finds the T tokens, each on its own descriptor, and nothing else
    assert result["events_per_wait"] == 10.0
    assert result["tokens"] == 10 * result["waits"] > 0


def test_pipetest_refuses_select_beyond_fd_setsize():
    out = subprocess.run([tool("pipetest"), "--backend", "select", "--descriptors", "1100", "--active", "1",
                          "--duration", "0.1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "select" in out.stderr


class _Server:
    """A keep-alive HTTP/1.1 server answering 200 with a body, 204, and 404 in turn, counting
    requests; ``close_after`` closes each connection after that many answers."""

    def __init__(self, close_after=None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests, self.close_after = 0, close_after
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"count\":3}",
                   b"HTTP/1.1 204 No Content\r\nX-Cache: HIT\r\n\r\n",
                   b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}"]
        buf, served = b"", 0
        # the client ends with RST (no TIME_WAIT), which may meet this thread in recv or in sendall
        with conn, contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while self.close_after is None or served < self.close_after:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    _, buf = buf.split(b"\r\n\r\n", 1)
                    with self.lock:
                        n = self.requests
                        self.requests += 1
                    conn.sendall(answers[n % 3])
                    served += 1


def test_atr_client_frames_answers_and_counts_statuses():
    with _Server() as server:
        out = subprocess.run([tool("atr_client"), "--connect", f"127.0.0.1:{server.port}", "--connections", "20",
                              "--active", "5", "--pipeline", "2", "--duration", "0.5", "--warmup", "0.1"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "measure" and len(lines) == 2
    result = json.loads(lines[1])
    assert result["connections"] == 20 and result["active"] == 5 and result["pipeline"] == 2
    assert result["answers"] > 30 and result["errors"] == 0 and result["closed"] == 0
    # one answer in three is a 404, in whatever order the connections took them
    assert abs(result["non_2xx"] / result["answers"] - 1 / 3) < 0.1, result
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"] * 1.05 + 0.01
    assert server.requests >= 20 + result["answers"]       # the priming round, then the window


def test_atr_client_fails_when_the_server_drops_an_unanswered_connection():
    with _Server(close_after=0) as server:
        out = subprocess.run([tool("atr_client"), "--connect", f"127.0.0.1:{server.port}", "--connections", "3",
                              "--duration", "0.2"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "closed a connection" in out.stderr


def test_atr_smoke(tmp_path):
    _run("atr.py", tmp_path, "--smoke")
    doc = json.load(open(tmp_path / "atr.json"))
    assert doc["config"]["totals"] == [200] and doc["config"]["ratios"] == [0.1, 1.0]
    assert doc["fastpath"]["backends_in_use"] == {"epoll": "epoll", "poll": "poll", "select": "select"}
    for part, key in (("fastpath", "rps"), ("control", "rate")):
        rows = doc[part]["sweep"]["200"]
        assert [r["atr"] for r in rows] == [0.1, 1.0]
        for row in rows:
            assert set(row["backends"]) == {"epoll", "poll", "select"}
            assert all(p[key] > 0 for p in row["backends"].values())
            labels = [k for k in row["ratios"] if not k.endswith(" rounds")]
            assert len(labels) == 4 and all(row["ratios"][k] > 0 for k in labels)
        # where each ratio crosses 1.0, per total
        assert len(doc[part]["break_even"]) == 2
        assert all(set(by_total) == {"200"} for by_total in doc[part]["break_even"].values())
    for row in doc["fastpath"]["sweep"]["200"]:
        assert row["active"] == {0.1: 20, 1.0: 200}[row["atr"]]
        for p in row["backends"].values():
            assert p["socket_errors"] == 0 and p["non_2xx"] == 0
            assert p["server_cpu_us_per_request"] > 0 and p["p99_ms"] > 0
            assert "events_per_wait" in p and p["limited_by"] in ("server", "client", "neighbours", "round trips")
            assert p["server_requests"] > 0
    assert [(c["total"], c["atr"]) for c in doc["fastpath"]["client_check"]] == [(200, 0.1), (200, 1.0)]
    assert set(doc["superpoll"]) >= {"threshold", "poll_ahead", "build"}


def test_connbench_smoke(tmp_path):
    _run("connbench.py", tmp_path, "--smoke")
    doc = json.load(open(tmp_path / "connbench.json"))
    assert set(doc["ab"]["configs"]) == {"nginx+fastpath", "nginx+fastpath unix", "nginx memcached_pass",
                                         "nginx return 200"}
    for key in ("ab", "connect 1 worker", "connect 2 workers"):
        for name, p in doc[key]["configs"].items():
            assert p["rps"] > 0 and p["p99_ms"] is not None, (key, name)
            assert p.get("failed", 0) + p.get("socket_errors", 0) + p["non_2xx"] == 0, (key, name, p)
        assert all(r["median"] > 0 for r in doc[key]["ratios"].values())
    assert doc["connect 2 workers"]["workers"] == 2
    assert doc["connect 1 worker"]["configs"]["fastpath"]["connections_per_s"] > 0
    assert set(doc["connect 1 worker"]["configs"]) == {"fastpath", "nginx return 200", "nginx return 200 deferred"}
