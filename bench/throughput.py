"""Poll throughput: fastpath against its peers, all in one run so the ratios hold on a noisy machine.

    .venv/bin/python bench/throughput.py [--quick] [--concurrency 50,200,1000] [--duration 6] [--rounds 5]

Configurations (each server gets one worker process, Django two; wrk gets one thread), measured in
--rounds interleaved rounds per concurrency (median round reported, ratios paired within a round):
  fastpath            fastpath directly
  nginx+fastpath      nginx proxying /Poll/ to fastpath over upstream keep-alive (the real stack path)
  nginx+fastpath unix   the same over a unix-domain socket (fastpath --listen unix:...)
  nginx memcached_pass  nginx's own memcached module, upstream keep-alive, same memcached, same keys
                      (no token check: it trusts ?u=<uid>, so it does less work than fastpath)
  nginx return 200    a constant answer: the ceiling for any HTTP responder here
  nginx+return-200 upstream  nginx proxying /Poll/ exactly as to fastpath, to a second nginx (one
                      worker) that answers fastpath's hit bytes with `return 200` and does nothing
                      else: the ceiling for any upstream behind nginx over TCP (no token check,
                      no memcached), so the bound on what nginx+fastpath can reach
  nginx+return-200 upstream unix  the same ceiling over a unix-domain socket (the stack's default
                      transport to fastpath), the bound on nginx+fastpath unix
  django              the Django poll view under gunicorn as the stack runs it (2 workers x 4
                      threads; computes from SQLite and fills the cache; 200 users)
10,000 per-user keys/tokens, keep-alive.  Results: bench/results/throughput.json.
Each point also records where the CPU went: microseconds of CPU per request for every process
tree serving it (nginx, fastpath, memcached, gunicorn) and for wrk, and the share left idle.
Also measured: fastpath memory for 10,000 idle keep-alive connections.
"""
import argparse
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import ROOT, proc_stat, progress, write_result, wrk_figures  # noqa: E402
from fastpoll import tokens# noqa: E402
from plurksite.services import (find_binary, free_port, memcached_command,  # noqa: E402
                                wait_for_port)

USERS = 10_000
RESOURCES = "getMessages,getUnreadCount"     # fastpath's --resources (it has no default): the demo's
SECRET = b"bench-secret-0123456789abcdef0123456789abcdef0123456789"

# Every request is formatted once, up front, in both modes: per-request Lua work (string
# concatenation, wrk.format) would otherwise cost wrk more in the token mode than in the uid mode
# and tilt the ratios against the configurations that check tokens.
LUA = r"""
local requests = {}
init = function(args)
  local mode = args[2] or "token"
  for line in io.lines(args[1]) do
    local uid, tok = line:match("(%d+) (%S+)")
    if mode == "uid" then
      requests[#requests + 1] = wrk.format("GET", "/Poll/getUnreadCount?u=" .. uid, {})
    else
      requests[#requests + 1] = wrk.format("GET", "/Poll/getUnreadCount",
                                           {["Authorization"] = "Bearer " .. tok})
    end
  end
end
request = function()
  return requests[math.random(#requests)]
end
"""

NGINX = """
{user}
worker_processes {workers};
pid {var}/nginx-{name}.pid;
error_log {var}/nginx-{name}-error.log warn;
worker_rlimit_nofile 65536;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {var}/tmp; proxy_temp_path {var}/tmp; fastcgi_temp_path {var}/tmp;
    uwsgi_temp_path {var}/tmp; scgi_temp_path {var}/tmp;
    keepalive_requests 1000000;
    upstream fp {{ server 127.0.0.1:{fastpath}; keepalive 1024; keepalive_timeout 8s; }}
    upstream fpu {{ server unix:{fastpath_unix}; keepalive 1024; keepalive_timeout 8s; }}
    upstream mc {{ server 127.0.0.1:{memcached}; keepalive 1024; }}
    upstream ret200 {{ server 127.0.0.1:{ret200}; keepalive 1024; keepalive_timeout 8s; }}
    upstream ret200u {{ server unix:{ret200_unix}; keepalive 1024; keepalive_timeout 8s; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        {extra_listen}
        location /Poll/ {{ {body} }}
    }}
}}
"""
# what nginx/plurk.conf.template's /Poll/ location sends fastpath (minus the fallback to Django)
FASTPATH_PROXY = ("proxy_http_version 1.1; proxy_pass_request_headers off; proxy_pass_request_body off; "
                  "proxy_set_header Content-Length \"\"; proxy_set_header Connection \"\"; "
                  "proxy_set_header Authorization $http_authorization; proxy_set_header Cookie $http_cookie;")
BODIES = {
    "nginx+fastpath": "proxy_pass http://fp; " + FASTPATH_PROXY,
    "nginx+fastpath unix": "proxy_pass http://fpu; " + FASTPATH_PROXY,
    "nginx memcached_pass": "set $memcached_key \"p1:getUnreadCount:$arg_u:0\"; memcached_pass mc; "
                            "default_type application/json; add_header X-Cache HIT;",
    "nginx return 200": "default_type application/json; add_header X-Cache HIT; return 200 '{\"count\":3}';",
    "nginx+return-200 upstream": "proxy_pass http://ret200; " + FASTPATH_PROXY,
    "nginx+return-200 upstream unix": "proxy_pass http://ret200u; " + FASTPATH_PROXY,
}
# The do-nothing upstream behind "nginx+return-200 upstream": the headers and body of a fastpath hit.
RETURN_200_UPSTREAM = ("default_type application/json; add_header Cache-Control no-store; add_header X-Cache HIT; "
                       "return 200 '{\"count\":3}';")


# ratio label -> (numerator config, denominator config); each is the median of per-round ratios
RATIOS = {
    "fastpath / memcached_pass": ("fastpath", "nginx memcached_pass"),
    "fastpath / return 200": ("fastpath", "nginx return 200"),
    "nginx+fastpath / memcached_pass": ("nginx+fastpath", "nginx memcached_pass"),
    "nginx+fastpath unix / memcached_pass": ("nginx+fastpath unix", "nginx memcached_pass"),
    # the bound on the line above over TCP: an upstream that does nothing, against memcached_pass,
    # and how much of that bound fastpath reaches
    "nginx+return-200 upstream / memcached_pass": ("nginx+return-200 upstream", "nginx memcached_pass"),
    "nginx+fastpath / nginx+return-200 upstream": ("nginx+fastpath", "nginx+return-200 upstream"),
    "nginx+fastpath unix / nginx+return-200 upstream unix": ("nginx+fastpath unix",
                                                            "nginx+return-200 upstream unix"),
    "fastpath / django": ("fastpath", "django"),
}


def _median_point(points):
    """The round with the median req/s (its latencies with it); errors summed over all rounds."""
    ranked = sorted(points, key=lambda p: p["rps"])
    point = dict(ranked[(len(ranked) - 1) // 2])
    point["rounds_rps"] = [p["rps"] for p in points]
    point["socket_errors"] = sum(p["socket_errors"] for p in points)
    point["non_2xx"] = sum(p["non_2xx"] for p in points)
    return point


def _spawn(argv, log, **kw):
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)


def _stop(proc):
    if proc and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)


def _start_nginx(tmp, name, port, body, upstreams, log, extra_listen="", workers=1):
    """One nginx (``workers`` worker processes) on port whose /Poll/ location is body; upstreams:
    the addresses NGINX's upstream blocks name (fastpath, fastpath_unix, memcached, ret200,
    ret200_unix); extra_listen: another listen directive (the do-nothing upstream's unix socket).
    Returns once it listens."""
    conf = os.path.join(tmp, f"{name.replace(' ', '_').replace('+', '_')}.conf")
    with open(conf, "w") as fh:
        # as root, workers must stay root to reach the private unix socket
        fh.write(NGINX.format(var=tmp, name=port, port=port, body=body, extra_listen=extra_listen,
                              workers=workers, **upstreams,
                              user="user root;" if os.geteuid() == 0 else ""))
    proc = _spawn([find_binary("nginx", "nginx"), "-p", tmp, "-c", conf, "-g", "daemon off;"], log)
    wait_for_port("127.0.0.1", port, process=proc, name=name)
    return proc


def _fill(port, users):
    """Set every user's getUnreadCount answer with pipelined noreply sets, then check one."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        buf = bytearray()
        for uid in range(1, users + 1):
            value = b'{"count":%d}' % (uid % 7) if uid % 3 else b""
            buf += b"set p1:getUnreadCount:%d:0 0 0 %d noreply\r\n%s\r\n" % (uid, len(value), value)
        sock.sendall(bytes(buf) + b"get p1:getUnreadCount:1:0\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += sock.recv(65536)


def _wrk(port, connections, duration, script, tokens_file, mode):
    argv = [find_binary("wrk", "wrk"), "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
            "-s", script, f"http://127.0.0.1:{port}", "--", tokens_file, mode]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60).stdout
    got = wrk_figures(out)
    return {"rps": float(got["rps"]), "p50_ms": got["p50_ms"], "p99_ms": got["p99_ms"],
            "socket_errors": got["socket_errors"], "non_2xx": got["non_2xx"]}


def _tree(pid):
    """pid and every descendant (nginx's and fastpath's workers, gunicorn's)."""
    pids = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                for child in fh.read().split():
                    pids += _tree(int(child))
    except OSError:
        pass
    return pids


def _cpu_seconds(pids):
    """User + system CPU time of these processes (all their threads), in seconds."""
    total = 0.0
    for pid in pids:
        try:
            total += proc_stat(pid)[1]
        except OSError:
            pass
    return total


def _idle_and_total():
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)      # idle + iowait, all


def _idle_pct(before, after):
    """The share of both CPUs left idle between two _idle_and_total() readings, in percent."""
    return 100.0 * (after[0] - before[0]) / max(after[1] - before[1], 1)


def _settle(quiet_pct=85.0, window_s=0.3, limit_s=30.0):
    """Wait until both CPUs are mostly idle: a run must not start while the previous one's servers
    still work through its backlog.  gunicorn goes on answering the requests queued behind its
    threads for seconds after wrk has gone (up to c of them), and without this wait the next
    configuration in the round -- always fastpath, the rotation keeps it right after django --
    shared the CPUs with it.  Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        before = _idle_and_total()
        time.sleep(window_s)
        if _idle_pct(before, _idle_and_total()) >= quiet_pct:
            break
    return time.monotonic() - started


def _wrk_measured(port, conns, duration, script, tfile, mode, components):
    """wrk's result plus where the CPU went: microseconds per request for each component (the
    process trees in ``components``, and wrk itself) and the share of both CPUs left idle."""
    settled_s = _settle()
    trees = {name: _tree(pid) for name, pid in components.items()}
    before = {name: _cpu_seconds(t) for name, t in trees.items()}
    wrk_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus_before = _idle_and_total()
    r = _wrk(port, conns, duration, script, tfile, mode)
    cpus_after = _idle_and_total()
    wrk_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    requests = max(r["rps"] * duration, 1)
    per_request = {name: (_cpu_seconds(t) - before[name]) * 1e6 / requests for name, t in trees.items()}
    per_request["wrk"] = ((wrk_after.ru_utime + wrk_after.ru_stime)
                          - (wrk_before.ru_utime + wrk_before.ru_stime)) * 1e6 / requests
    r["cpu_us_per_request"] = {k: round(v, 2) for k, v in per_request.items()}
    r["idle_pct"] = round(_idle_pct(cpus_before, cpus_after), 1)
    r["settled_s"] = round(settled_s, 1)
    return r


def _rss_kb(pid):
    with open(f"/proc/{pid}/status") as fh:
        return int(next(ln.split()[1] for ln in fh if ln.startswith("VmRSS")))


def _private_kb(pid):
    """Memory only this process uses (Private_Clean + Private_Dirty): a forked worker shares the
    interpreter's pages with its parent, so RSS overstates what one more worker costs."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for ln in fh:
            if ln.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(ln.split()[1])
    return total


def idle_connections(port, worker_pid, count):
    """RSS growth of the fastpath worker while it holds ``count`` idle keep-alive connections."""
    before = _rss_kb(worker_pid)
    private_before = _private_kb(worker_pid)
    socks = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port))
            socks.append(s)
        # one request on each, so every connection has been through the HTTP parser
        for s in socks:
            s.sendall(b"GET /Poll/nope HTTP/1.1\r\nHost: x\r\n\r\n")
        for s in socks:
            s.recv(4096)
        time.sleep(1)
        during = _rss_kb(worker_pid)
        private_during = _private_kb(worker_pid)
    finally:
        for s in socks:
            s.close()
    return {"connections": count, "rss_before_kb": before, "rss_with_connections_kb": during,
            "private_before_kb": private_before, "private_with_connections_kb": private_during,
            "bytes_per_connection": round((during - before) * 1024 / count)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 s per point, concurrency 50 and 200")
    ap.add_argument("--duration", type=int, default=6, help="seconds per point and round (default 6)")
    ap.add_argument("--concurrency", default="50,200,1000")
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds per concurrency (median reported; default 5)")
    ap.add_argument("--no-django", action="store_true")
    args = ap.parse_args()
    duration = 3 if args.quick else args.duration
    levels = [50, 200] if args.quick else [int(c) for c in args.concurrency.split(",")]
    rounds = 1 if args.quick else args.rounds
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))

    tmp = tempfile.mkdtemp(prefix="plurk-bench-")
    os.makedirs(os.path.join(tmp, "tmp"))
    log = open(os.path.join(tmp, "servers.log"), "ab")
    script = os.path.join(tmp, "poll.lua")
    with open(script, "w") as fh:
        fh.write(LUA)
    secret_file = os.path.join(tmp, "secret.key")
    with open(secret_file, "wb") as fh:
        fh.write(SECRET + b"\n")
    expires = int(time.time()) + 86400
    tokens_file = os.path.join(tmp, "tokens.txt")
    with open(tokens_file, "w") as fh:
        for uid in range(1, USERS + 1):
            fh.write(f"{uid} {tokens.sign(SECRET, uid, 0, expires)}\n")

    procs = []
    ports = {}
    components = {}          # config -> {component: pid} whose CPU time is counted per request
    results = {"configs": {}, "users": USERS, "duration_s": duration, "concurrency": levels,
               "rounds": {}, "rounds_per_point": rounds}
    try:
        mc_port = free_port()
        procs.append(_spawn(memcached_command("127.0.0.1", mc_port, 64, 4096), log))
        wait_for_port("127.0.0.1", mc_port)
        _fill(mc_port, USERS)
        fp_port = free_port()
        fp = _spawn([sys.executable, "-m", "fastpath", "--listen", f"127.0.0.1:{fp_port}",
                     "--memcached", f"127.0.0.1:{mc_port}", "--secret-file", secret_file,
                     "--workers", "1", "--idle-timeout", "120", "--resources", RESOURCES], log, cwd=ROOT)
        procs.append(fp)
        wait_for_port("127.0.0.1", fp_port, process=fp, name="fastpath")
        ports["fastpath"] = (fp_port, "token")
        components["fastpath"] = {"fastpath": fp.pid, "memcached": procs[0].pid}
        fp_unix = os.path.join(tmp, "fastpath.sock")
        fpu = _spawn([sys.executable, "-m", "fastpath", "--listen", f"unix:{fp_unix}",
                      "--memcached", f"127.0.0.1:{mc_port}", "--secret-file", secret_file,
                      "--workers", "1", "--idle-timeout", "120", "--resources", RESOURCES], log, cwd=ROOT)
        procs.append(fpu)
        deadline = time.monotonic() + 10
        while not os.path.exists(fp_unix) and time.monotonic() < deadline:
            time.sleep(0.05)
        upstreams = {"fastpath": fp_port, "fastpath_unix": fp_unix, "memcached": mc_port, "ret200": free_port(),
                     "ret200_unix": os.path.join(tmp, "return-200.sock")}
        # one nginx (one worker) serves the do-nothing upstream on both transports
        ret200_proc = _start_nginx(tmp, "return-200 upstream", upstreams["ret200"], RETURN_200_UPSTREAM,
                                   upstreams, log, extra_listen=f"listen unix:{upstreams['ret200_unix']} backlog=4096;")
        procs.append(ret200_proc)
        for name, body in BODIES.items():
            port = free_port()
            proc = _start_nginx(tmp, name, port, body, upstreams, log)
            procs.append(proc)
            ports[name] = (port, "uid" if "memcached_pass" in name else "token")
            components[name] = {"nginx": proc.pid}
            if "upstream" in name:
                components[name]["upstream nginx"] = ret200_proc.pid
            if "fastpath" in name:
                components[name]["fastpath"] = fpu.pid if "unix" in name else fp.pid
            if "fastpath" in name or "memcached_pass" in name:
                components[name]["memcached"] = procs[0].pid
        if not args.no_django:
            ports["django"] = _start_django(tmp, mc_port, secret_file, tokens_file, procs, log)
            components["django"] = {"gunicorn": procs[-1].pid, "memcached": procs[0].pid}

        # Interleaved rounds: every configuration once per round, the order rotated each round,
        # so drift on a shared machine hits all of them alike; ratios are taken within a round
        # (paired) and the median round is reported.
        names = list(ports)
        for conns in levels:
            samples = {name: [] for name in names}
            for rnd in range(rounds):
                order = names[rnd % len(names):] + names[:rnd % len(names)]
                for name in order:
                    port, mode = ports[name]
                    tfile = tokens_file if name != "django" else os.path.join(tmp, "django-tokens.txt")
                    progress(f"{name:22s} c={conns:<5d} round {rnd + 1}/{rounds} {duration}s ...")
                    r = _wrk_measured(port, conns, duration, script, tfile, mode, components[name])
                    samples[name].append(r)
                    progress(f"{name:22s} c={conns:<5d} {r['rps']:>10.0f} req/s  p50 {r['p50_ms']} ms  "
                             f"p99 {r['p99_ms']} ms  errors {r['socket_errors']}  non-2xx {r['non_2xx']}  "
                             f"CPU us/req {r['cpu_us_per_request']}  idle {r['idle_pct']}%  (waited {r['settled_s']} s for quiet CPUs)")
            for name in names:
                results["configs"].setdefault(name, {})[str(conns)] = _median_point(samples[name])
            results["rounds"][str(conns)] = [{name: samples[name][i]["rps"] for name in names}
                                             for i in range(rounds)]
        workers = _tree(fp.pid)[1:]
        if workers:
            progress("10,000 idle keep-alive connections to fastpath ...")
            results["idle_connections"] = idle_connections(fp_port, workers[0], 10_000)
            progress(f"  {results['idle_connections']}")
    finally:
        for proc in reversed(procs):
            _stop(proc)
    ratios = {}
    for conns in map(str, levels):
        ratios[conns] = {}
        for label, (num, den) in RATIOS.items():
            paired = [r[num] / r[den] for r in results["rounds"].get(conns, [])
                      if r.get(num) and r.get(den)]
            ratios[conns][label] = statistics.median(paired) if paired else None
    results["ratios"] = ratios
    path = write_result("throughput", results)
    print(f"\nreq/s by concurrency (wrk -t1, keep-alive, {USERS} per-user keys, {duration}s per point)")
    names = list(results["configs"])
    print(f"{'config':24s}" + "".join(f"{'c=' + str(c):>12s}" for c in levels))
    for name in names:
        print(f"{name:24s}" + "".join(f"{results['configs'][name].get(str(c), {}).get('rps', 0):12.0f}" for c in levels))
    print("\nCPU microseconds per request (median round), idle share of both CPUs")
    for name in names:
        for c in levels:
            point = results["configs"][name].get(str(c))
            if point and point.get("cpu_us_per_request"):
                cpu = ", ".join(f"{k} {v:.1f}" for k, v in point["cpu_us_per_request"].items())
                print(f"  {name:22s} c={c:<5d} {cpu}  (idle {point['idle_pct']}%)")
    for conns, r in ratios.items():
        print(f"c={conns}: " + ", ".join(f"{k} = {v:.2f}" for k, v in r.items() if v))
    print(f"results: {path}")


def _start_django(tmp, mc_port, secret_file, tokens_file, procs, log):
    """gunicorn + Django on a fresh SQLite with 200 users (tokens issued by the real login)."""
    import json
    import urllib.request

    port = free_port()
    env = dict(os.environ, PLURK_VAR_DIR=tmp, PLURK_DATABASE_URL=f"sqlite:///{tmp}/bench.sqlite3",
               PLURK_SECRET_FILE=secret_file, PLURK_MEMCACHED=f"127.0.0.1:{mc_port}",
               PLURK_DJANGO=f"127.0.0.1:{port}", DJANGO_SETTINGS_MODULE="plurksite.settings")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    proc = _spawn([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "plurksite.wsgi:application",
                   "--bind", f"127.0.0.1:{port}", "--workers", "2", "--worker-class", "gthread",
                   "--threads", "4"], log, cwd=ROOT, env=env)
    procs.append(proc)
    wait_for_port("127.0.0.1", port, process=proc, name="gunicorn")
    with open(os.path.join(tmp, "django-tokens.txt"), "w") as fh:
        for i in range(200):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/api/signup", method="POST",
                                         data=json.dumps({"username": f"bench{i}", "password": "bench-pass-1"}).encode(),
                                         headers={"Content-Type": "application/json"})
            doc = json.load(urllib.request.urlopen(req, timeout=10))
            fh.write(f"{doc['user']['id']} {doc['token']}\n")
    return (port, "token")


if __name__ == "__main__":
    main()
