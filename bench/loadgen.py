"""What bench/atr.py and bench/connbench.py share: the C tools (bench/atr_client.c, the load
generator; bench/pipetest.c, the kernel-only control), CPU pinning, a fastpath with its /metrics
listener, and one load-generator run with the servers' counters read at both edges of its
measured window."""
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import ROOT  # noqa: E402
from bench.throughput import SECRET, USERS, _cpu_seconds, _fill, _spawn, _tree  # noqa: E402
from fastpoll import tokens# noqa: E402
from plurksite.services import free_port, memcached_command, wait_for_port  # noqa: E402

SERVER_CPU, CLIENT_CPU = 1, 0        # the server under test on one CPU, the load on the other
# The fastpath measured: this checkout's, or another checkout whose extension is built in place
# (to compare two builds with the same bench).
FASTPATH_ROOT = os.environ.get("PLURK_BENCH_FASTPATH_ROOT") or ROOT


def fastpath_source():
    """Which fastpath a result measured: its checkout (None: this one) and commit."""
    commit = subprocess.run(["git", "-C", FASTPATH_ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    return {"root": None if FASTPATH_ROOT == ROOT else FASTPATH_ROOT, "commit": commit}


def tool(name):
    """Path of build/bench/<name>, (re)built by make from bench/<name>.c when stale."""
    target = os.path.join("build", "bench", name)
    subprocess.run(["make", "-s", "-C", ROOT, target], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(ROOT, target)


def pin(pids, cpu):
    """Pin every thread of these processes to one CPU (None: any CPU)."""
    cpus = set(range(os.cpu_count())) if cpu is None else {cpu}
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), cpus)
        except (FileNotFoundError, ProcessLookupError):
            pass


def pinned(argv, cpu):
    """argv run under taskset on one CPU (None: unpinned)."""
    return argv if cpu is None else ["taskset", "-c", str(cpu), *argv]


def cpu_times():
    """{cpu index: (idle + iowait, total)} from /proc/stat's per-CPU lines."""
    out = {}
    with open("/proc/stat") as fh:
        for line in fh:
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu":
                ticks = [int(x) for x in fields]
                out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out


def busy_pct(before, after):
    """{cpu: percent busy} between two cpu_times() readings (other tenants' work included)."""
    return {cpu: round(100.0 * (1 - (after[cpu][0] - before[cpu][0]) / max(after[cpu][1] - before[cpu][1], 1)), 1)
            for cpu in after if cpu in before}


def metrics(admin_port):
    """fastpath's /metrics as {series (with its labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            try:
                out[series] = float(value)
            except ValueError:
                pass
    return out


def context_switches(pid):
    """(voluntary, involuntary) context switches of a process: voluntary ones are its waits that
    slept."""
    found = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                found[key] = int(value)
    return found.get("voluntary_ctxt_switches", 0), found.get("nonvoluntary_ctxt_switches", 0)


def write_tokens(path, users=USERS):
    """'uid token' lines (the format bench/throughput.py's wrk script and atr_client read)."""
    expires = int(time.time()) + 86400
    with open(path, "w") as fh:
        for uid in range(1, users + 1):
            fh.write(f"{uid} {tokens.sign(SECRET, uid, 0, expires)}\n")
    return path


class Workdir:
    """A temporary directory with what every run needs: a log for the servers, the secret file
    and a tokens file for every user."""

    def __init__(self, prefix):
        self.path = tempfile.mkdtemp(prefix=prefix)
        os.makedirs(os.path.join(self.path, "tmp"))       # nginx's temp paths
        self.log = open(os.path.join(self.path, "servers.log"), "ab")
        self.secret_file = os.path.join(self.path, "secret.key")
        with open(self.secret_file, "wb") as fh:
            fh.write(SECRET + b"\n")
        self.tokens_file = write_tokens(os.path.join(self.path, "tokens.txt"))


def exit_on_sigterm():
    """SIGTERM ends a run as Ctrl-C does, through the `finally` that stops its servers (a run
    started in the background ignores SIGINT)."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def raise_fd_limit():
    """The soft descriptor limit up to the hard one (10,000 connections need as many)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start_memcached(log, cpu=None):
    """A memcached holding every user's getUnreadCount answer; returns (process, port)."""
    port = free_port()
    proc = _spawn(memcached_command("127.0.0.1", port, 64, 4096), log)
    wait_for_port("127.0.0.1", port, process=proc, name="memcached")
    _fill(port, USERS)
    pin([proc.pid], cpu)
    return proc, port


class Fastpath:
    """A fastpath (``workers`` workers, libevent ``backend``) with its /metrics listener; its
    processes pinned to ``cpu`` (None: unpinned).  Stop it with throughput's _stop(fp.proc)."""

    def __init__(self, mc_port, secret_file, log, backend=None, workers=1, cpu=SERVER_CPU,
                 max_connections=12000, timeout_ms=50, unix=None):
        self.port, self.admin = free_port(), free_port()
        listen = f"unix:{unix}" if unix else f"127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "fastpath", "--listen", listen,
                "--admin", f"127.0.0.1:{self.admin}", "--memcached", f"127.0.0.1:{mc_port}",
                "--secret-file", secret_file, "--workers", str(workers), "--idle-timeout", "3600",
                "--max-connections", str(max_connections), "--timeout-ms", str(timeout_ms),
                "--resources", "getMessages,getUnreadCount"]
        self.proc = _spawn(argv + (["--backend", backend] if backend else []), log, cwd=FASTPATH_ROOT)
        # the admin listener opens with the data listener, before the workers start
        wait_for_port("127.0.0.1", self.admin, process=self.proc, name="fastpath admin")
        if not unix:
            wait_for_port("127.0.0.1", self.port, process=self.proc, name="fastpath")
        deadline = time.monotonic() + 10
        while len(self.workers()) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        pin(_tree(self.proc.pid), cpu)
        # libevent's method in use, as fastpath reports it (a backend libevent lacks is not
        # silently replaced by another in the figures)
        self.backend = next((k.split('"')[1] for k in metrics(self.admin) if k.startswith("fastpath_info{")), None)

    def workers(self):
        return _tree(self.proc.pid)[1:]


def snapshot(pids, admin_port=None):
    """Counters read at one edge of a measured window: CPU seconds of each named process tree, the
    per-CPU times, fastpath's metrics (if ``admin_port``) and the first worker's context switches."""
    snap = {"cpu_s": {name: _cpu_seconds(_tree(pid)) for name, pid in pids.items()}, "cpus": cpu_times()}
    if admin_port is not None:
        snap["metrics"] = metrics(admin_port)
    worker = pids.get("worker")
    if worker is not None:
        snap["ctxt"] = context_switches(worker)
    return snap


def run_client(argv, pids, admin_port=None, timeout=600):
    """Run the load generator; read the servers' counters when it opens its measured window
    ("measure") and when it reports.  Returns (its JSON result, before, after)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "measure":
            proc.wait(timeout=timeout)
            raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.read().strip()}")
        before = snapshot(pids, admin_port)
        line = proc.stdout.readline()
        after = snapshot(pids, admin_port)
        proc.wait(timeout=timeout)
        if proc.returncode != 0 or not line:
            raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.read().strip()}")
        return json.loads(line), before, after
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def per_answer(result, before, after):
    """Server-side figures of one window: CPU microseconds per answer of each process tree, its
    share of a CPU, and how busy each CPU was."""
    answers = max(result["answers"], 1)
    seconds = max(result["seconds"], 1e-9)
    cpu = {name: after["cpu_s"][name] - before["cpu_s"][name] for name in after["cpu_s"]}
    return {"cpu_us_per_request": {name: round(v * 1e6 / answers, 2) for name, v in cpu.items()},
            "cpu_pct": {name: round(100 * v / seconds, 1) for name, v in cpu.items()},
            "cpu_busy_pct": busy_pct(before["cpus"], after["cpus"])}


def limited_by(server_pct, client_pct, busy, server_cpus=(SERVER_CPU,)):
    """What held a run back: the server's CPU (its share of one CPU per worker), the generator's,
    other tenants on the server's CPUs, or none of them (the round trips of the requests in
    flight)."""
    if server_pct >= 85:
        return "server"
    if client_pct >= 85:
        return "client"
    if all(busy.get(cpu, 0) >= 95 for cpu in server_cpus):
        return "neighbours"
    return "round trips"


def loop_counters(before, after, answers):
    """Ready events per wait from fastpath's loop counters (null until fastpath exports them),
    and the worker's sleeps (voluntary context switches) per request."""
    out = {"events_per_wait": None, "loop_waits": None, "loop_events": None}
    mb, ma = before.get("metrics", {}), after.get("metrics", {})
    waits = ma.get("fastpath_loop_waits_total", 0) - mb.get("fastpath_loop_waits_total", 0)
    events = ma.get("fastpath_loop_events_total", 0) - mb.get("fastpath_loop_events_total", 0)
    if "fastpath_loop_waits_total" in ma and waits > 0:
        out.update(events_per_wait=round(events / waits, 3), loop_waits=int(waits), loop_events=int(events))
    served = sum(v for k, v in ma.items() if k.startswith("fastpath_requests_total")) - \
        sum(v for k, v in mb.items() if k.startswith("fastpath_requests_total"))
    out["server_requests"] = int(served) if ma else None
    if "ctxt" in after:
        out["sleeps_per_request"] = round((after["ctxt"][0] - before["ctxt"][0]) / max(answers, 1), 4)
    return out

