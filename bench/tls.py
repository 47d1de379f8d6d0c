"""TLS at the balancer (issue 32): what a poll over TLS costs the balancer beside a plain HTTP poll.

    .venv/bin/python bench/tls.py [--rounds 5] [--seconds 5] [--connections 50] [--users 20]

One web host on free loopback ports (tests.support.stack: memcached, gunicorn, fastpath, nginx,
one worker each where it has workers) and two balancers in front of it, both nginx rendered from
the real balancer template by plurksite.nginxconf (one worker each): one without a certificate
(plain HTTP), one with the site's certificate of a CA made by plurksite.cluster.tls (https; its
plain listener only redirects).  The same polls (fastpath hits, --users tokens at random, wrk's
Lua script of bench/throughput.py) through each, in alternated rounds (plain first, then TLS
first), and the balancer's CPU (its master and worker, from /proc) per request answered:

  kept        wrk -t1 -c<connections>: kept connections, as browsers poll
  new         a new connection per request (Python clients, 4 threads, Connection: close): plain,
              TLS with a full handshake each, and TLS resumed from the balancer's session cache
              (each connection offers the session of the one before; the share resumed is
              reported, as the cache is the only resumption: no session tickets)

The median round of each mode, and the ratios TLS / plain of those medians with each round's own
ratio beside (their spread).  The goal: a kept-connection poll over TLS costs the balancer at most
1.3x a plain one.  Results: bench/results/tls.json.  Other work on the machine moves every figure;
the rounds alternate so that both sides see the same.
"""
import argparse
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import progress, write_result, wrk_figures  # noqa: E402
from bench.throughput import LUA, _cpu_seconds, _idle_and_total, _idle_pct, _tree  # noqa: E402

HOST = "127.0.0.1"
GOAL = 1.3
NEW_THREADS = 4
KEPT, NEW = ("kept plain", "kept TLS"), ("new plain", "new TLS full handshake", "new TLS resumed")


def _balancer(var_dir, web, tls_dir=None, ca_dir=None):
    """A balancer nginx (one worker) before ``web`` rendered from the real template: (process,
    port polls go to, scheme).  With ``ca_dir``, it has the site's certificate: https."""
    from plurksite import nginxconf, services
    from plurksite.cluster import tls
    from plurksite.config import StackConfig, format_hostport

    os.makedirs(var_dir, exist_ok=True)
    config = StackConfig.from_env({
        "PLURK_ROLES": "balancer", "PLURK_HTTP": f"{HOST}:{services.free_port()}",
        "PLURK_WEB_HOSTS": format_hostport(*web), "PLURK_VAR_DIR": var_dir,
        "PLURK_SECRET_FILE": os.path.join(var_dir, "secret.key")})
    port, scheme = config.http[1], "http"
    if ca_dir is not None:
        tls.ensure_site(os.path.join(var_dir, nginxconf.TLS_DIR), ca_dir, [f"IP:{HOST}"])
        port, scheme = services.free_port(), "https"
        nginxconf.HTTPS_PORT = port           # https on a free port standing for 443
    conf = nginxconf.render(config, worker_processes=1)
    services.nginx_test(conf, config.var_dir)
    proc = subprocess.Popen(services.nginx_command(conf, config.var_dir), stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(var_dir, "nginx.out"), "w"))
    services.wait_for_port(HOST, port, process=proc, name=f"the {scheme} balancer")
    return proc, port, scheme


def _wrk(url, connections, seconds, script, tokens_file):
    from plurksite.services import find_binary

    argv = [find_binary("wrk", "wrk"), "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", script,
            url, "--", tokens_file, "token"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60).stdout
    got = wrk_figures(out)
    if got["requests"] is None:
        raise RuntimeError(f"wrk said: {out[-500:]}")
    ms = {k: None if got[k] is None else round(got[k], 3) for k in ("p50_ms", "p99_ms")}
    return {"requests": got["requests"], **ms, "errors": got["socket_errors"] + got["non_2xx"]}


def _new_connections(port, tokens, seconds, context=None, resume=False):
    """A new connection per poll from NEW_THREADS threads for ``seconds``: requests answered,
    errors, and how many TLS handshakes were resumptions."""
    counts = {"requests": 0, "errors": 0, "resumed": 0, "handshakes": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def one(i, session):
        sock = socket.create_connection((HOST, port), timeout=10)
        try:
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=HOST, session=session)
            token = tokens[i % len(tokens)]
            sock.sendall((f"GET /Poll/getUnreadCount HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                          f"Authorization: Bearer {token}\r\nConnection: close\r\n\r\n").encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            ok = data.startswith(b"HTTP/1.1 200") or data.startswith(b"HTTP/1.1 204")
            if context is None:
                return ok, None, False
            return ok, sock.session, sock.session_reused
        finally:
            sock.close()

    def worker(n):
        session, i, mine = None, n, dict.fromkeys(counts, 0)
        while time.monotonic() < deadline:
            try:
                ok, got, reused = one(i, session if resume else None)
            except (OSError, ssl.SSLError):
                ok, got, reused = False, None, False
            i += NEW_THREADS
            mine["requests" if ok else "errors"] += 1
            if context is not None:
                mine["handshakes"] += 1
                mine["resumed"] += int(reused)
                if resume and got is not None:
                    session = got
        with lock:
            for k, v in mine.items():
                counts[k] += v

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(NEW_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def _measured(balancer_pid, run):
    """``run()``'s result with the balancer's CPU (master + worker) per request answered."""
    time.sleep(0.5)
    tree = _tree(balancer_pid)
    cpu0, cpus0, t0 = _cpu_seconds(tree), _idle_and_total(), time.monotonic()
    r = run()
    cpu = _cpu_seconds(tree) - cpu0
    r["seconds"] = round(time.monotonic() - t0, 2)
    r["idle_pct"] = round(_idle_pct(cpus0, _idle_and_total()), 1)
    r["requests_per_s"] = round(r["requests"] / r["seconds"])
    r["balancer_cpu_us_per_request"] = round(cpu * 1e6 / max(r["requests"], 1), 2)
    return r


def _median(points):
    """The round with the median CPU per request; every round's figure beside it."""
    ranked = sorted(points, key=lambda p: p["balancer_cpu_us_per_request"])
    point = dict(ranked[(len(ranked) - 1) // 2])
    point["rounds_cpu_us_per_request"] = [p["balancer_cpu_us_per_request"] for p in points]
    point["errors"] = sum(p["errors"] for p in points)
    return point


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5, help="seconds of load per mode and round")
    parser.add_argument("--connections", type=int, default=50, help="wrk's kept connections")
    parser.add_argument("--users", type=int, default=20, help="tokens polled at random")
    args = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "plurksite.settings")

    from tests.support.stack import TestStack, stack_config

    result = {"what": "the balancer's CPU per poll (nginx master + worker), plain HTTP and TLS, through two "
                      "balancers rendered from nginx/balancer.conf.template before one web host on loopback",
              "rounds": args.rounds, "seconds": args.seconds, "connections": args.connections,
              "new_connection_threads": NEW_THREADS, "users": args.users}
    with tempfile.TemporaryDirectory(prefix="tlsbench-") as var:
        os.chmod(var, 0o755)              # nginx's workers (nobody when root) reach its logs
        config = stack_config(os.path.join(var, "web"), PLURK_EDGE="")
        balancers = []
        with TestStack(config, nginx_workers=1) as stack:
            try:
                tokens = [stack.signup("tls")[1] for _ in range(args.users)]
                for token in tokens:                     # each a fastpath hit from now on
                    for _ in range(50):
                        if stack.poll("getUnreadCount", token).headers.get("X-Cache") == "HIT":
                            break
                        time.sleep(0.1)
                tokens_file, script = os.path.join(var, "tokens.txt"), os.path.join(var, "poll.lua")
                with open(tokens_file, "w") as fh:
                    fh.writelines(f"{i} {t}\n" for i, t in enumerate(tokens))
                with open(script, "w") as fh:
                    fh.write(LUA)
                ca_dir = os.path.join(var, "ca")
                plain = _balancer(os.path.join(var, "plain"), config.http)
                balancers.append(plain[0])
                over = _balancer(os.path.join(var, "tls"), config.http, ca_dir=ca_dir)
                balancers.append(over[0])
                client = ssl.create_default_context(cafile=os.path.join(ca_dir, "ca.crt"))
                probe = client.wrap_socket(socket.create_connection((HOST, over[1])), server_hostname=HOST)
                result["tls"] = {"protocol": probe.version(), "cipher": probe.cipher()[0],
                                 "openssl": ssl.OPENSSL_VERSION}
                probe.close()
                progress(f"balancers up: plain :{plain[1]}, https :{over[1]} ({result['tls']})")

                def kept(b):
                    return lambda: _wrk(f"{b[2]}://{HOST}:{b[1]}", args.connections, args.seconds, script, tokens_file)

                runs = {
                    "kept plain": (plain[0].pid, kept(plain)),
                    "kept TLS": (over[0].pid, kept(over)),
                    "new plain": (plain[0].pid, lambda: _new_connections(plain[1], tokens, args.seconds)),
                    "new TLS full handshake": (over[0].pid, lambda: _new_connections(over[1], tokens, args.seconds,
                                                                                     client)),
                    "new TLS resumed": (over[0].pid, lambda: _new_connections(over[1], tokens, args.seconds, client,
                                                                              resume=True)),
                }
                _wrk(f"http://{HOST}:{plain[1]}", args.connections, 2, script, tokens_file)    # warm-up
                _wrk(f"https://{HOST}:{over[1]}", args.connections, 2, script, tokens_file)
                points = {name: [] for name in runs}
                for n in range(args.rounds):
                    order = [KEPT, NEW] if n % 2 == 0 else [KEPT[::-1], NEW[::-1]]
                    for group in order:
                        for name in group:
                            pid, run = runs[name]
                            point = _measured(pid, run)
                            points[name].append(point)
                            progress(f"round {n + 1}, {name}: {point['balancer_cpu_us_per_request']} us/request, "
                                     f"{point['requests_per_s']} req/s, {point['errors']} errors")
            finally:
                for proc in balancers:
                    proc.terminate()
                    proc.wait(10)
    modes = {name: _median(p) for name, p in points.items()}

    def ratio(num, den):
        per_round = [round(a["balancer_cpu_us_per_request"] / b["balancer_cpu_us_per_request"], 3)
                     for a, b in zip(points[num], points[den])]
        return {"median_over_median": round(modes[num]["balancer_cpu_us_per_request"]
                                            / modes[den]["balancer_cpu_us_per_request"], 3),
                "rounds": per_round, "min": min(per_round), "max": max(per_round)}

    ratios = {"kept TLS / kept plain": ratio("kept TLS", "kept plain"),
              "new TLS full handshake / new plain": ratio("new TLS full handshake", "new plain"),
              "new TLS resumed / new plain": ratio("new TLS resumed", "new plain"),
              "new TLS full handshake / kept TLS": ratio("new TLS full handshake", "kept TLS")}
    result.update(modes=modes, ratios=ratios)
    result["goals"] = {f"kept-connection poll over TLS <= {GOAL:g}x plain (balancer CPU per request)":
                       ratios["kept TLS / kept plain"]["median_over_median"] <= GOAL}
    path = write_result("tls", result)
    for name, m in modes.items():
        extra = f", {m['resumed']} of {m['handshakes']} resumed" if m.get("handshakes") else ""
        print(f"{name:24s} {m['balancer_cpu_us_per_request']:8.1f} us/request (rounds "
              f"{m['rounds_cpu_us_per_request']}), {m['requests_per_s']} req/s{extra}")
    for name, r in ratios.items():
        print(f"{name}: {r['median_over_median']}x (rounds {r['min']}-{r['max']})")
    print(result["goals"])
    print(path)
    return 0 if not any(m["errors"] for m in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
