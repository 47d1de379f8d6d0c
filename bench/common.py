"""Helpers every benchmark shares: machine facts, versions, and writing results."""
import datetime
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.environ.get("PLURK_BENCH_RESULTS") or os.path.join(ROOT, "bench", "results")


def proc_stat(pid):
    """(parent pid, user + system CPU seconds) of a process, from /proc/<pid>/stat.  Split after
    the last ')': the command name before it may itself hold spaces and parentheses.  Raises
    OSError when the process is gone, ValueError/IndexError on an unreadable line."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return fields[1], (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def socket_inodes(pids):
    """The inodes (ints) of the sockets the processes ``pids`` hold, from their /proc/<pid>/fd
    links (``socket:[<inode>]``, the number ss -e and /proc/net/tcp print).  A process or a
    descriptor gone meanwhile is skipped."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def _version(cmd, pattern=r"(\d+\.\d+(?:\.\d+)?)"):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(pattern, proc.stdout + proc.stderr)
    return match.group(1) if match else None


def machine_info():
    """What a reader needs to judge the figures: CPU, memory, kernel, tool versions, commit."""
    cpu = None
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None)
    except OSError:
        pass
    mem_kb = None
    try:
        with open("/proc/meminfo") as fh:
            mem_kb = int(next(ln.split()[1] for ln in fh if ln.startswith("MemTotal")))
    except (OSError, StopIteration):
        pass
    commit = _version(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], r"([0-9a-f]{7,})")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host_cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1) if mem_kb else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nginx": _version(["nginx", "-v"]) or _version(["/usr/sbin/nginx", "-v"]),
        "memcached": _version(["memcached", "-V"]) or _version(["/usr/bin/memcached", "-V"]),
        "wrk": _version(["wrk", "-v"]),
        "libevent": _version(["pkg-config", "--modversion", "libevent"]),
        "llhttp": _dpkg_version("node-llhttp"),
        "postgresql": _version(["pg_config", "--version"]),
        "django": _module_version("django"),
        "locust": _module_version("locust"),
        "pymemcache": _module_version("pymemcache"),
        "commit": commit,
    }


def _module_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


def _dpkg_version(package):
    return _version(["dpkg-query", "-W", "-f=${Version}", package], r"(\d+\.\d+(?:\.\d+)?)")


def wrk_figures(out):
    """What wrk's ``--latency`` report ``out`` says, unrounded: requests answered, requests a
    second, the 50th and 99th percentile latencies in ms, the non-2xx/3xx answers and the socket
    errors (connect, read, write, timeout); None where wrk printed no such line."""
    def number(pattern, kind=float):
        m = re.search(pattern, out, re.M)
        return None if m is None else kind(m.group(1))

    def pct(p):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return None if m is None else float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    return {"requests": number(r"(\d+) requests in [\d.]+(?:ms|s)", int),
            "rps": number(r"Requests/sec:\s+([\d.]+)"), "p50_ms": pct(50), "p99_ms": pct(99),
            "non_2xx": number(r"Non-2xx or 3xx responses: (\d+)", int) or 0,
            "socket_errors": sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))}


def write_result(name, data):
    """Write ``bench/results/<name>.json`` with machine info and return its path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    doc = {"benchmark": name, "machine": machine_info(), **data}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)
    return path


def read_to_close(sock, timeout):
    """An HTTP answer read from ``sock`` until the server closes it (the request said
    Connection: close), ``timeout`` seconds at most a read: (head as text, body)."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode(), body


def progress(message):
    """One progress line on stderr (benchmarks run for minutes; say what is happening)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
