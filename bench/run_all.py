"""`make bench`: every benchmark in one invocation, then the plots and the README table.

    .venv/bin/python bench/run_all.py [--quick] [--with-10k]

1. bench/throughput.py  fastpath vs nginx+fastpath, memcached_pass, return 200, Django (wrk)
2. bench/atr.py         epoll against poll (and select) by active ratio, fastpath and the
                        kernel-only control (bench/pipetest.c), 1,000 and 10,000 connections
3. bench/connbench.py   without keep-alive: the seed's ab -c 50 -n 50000 through nginx, new
                        connections per second straight to fastpath and to nginx return 200
4. bench/fanout.py      one plurk to 1,000 / 10,000 followers (SQLite and PostgreSQL)
5. bench/load.py        the locust simulation, 300 users for 60 s, with the delivery verdict
5b.                     the same, 300 users streaming (PLURK_LOAD_POLL_MODE=stream) on fastpath's
                        edge (--edge) and through nginx
6. bench/longpoll.py    long-polls held through nginx -> fastpath against nchan subscribers (1,000 /
                        10,000 / 40,000), fan-out to 10,000 held followers, locust long vs short;
                        then streams and long-polls on the edge and through nginx against nchan's
                        long-poll and EventSource subscribers (1,000 / 10,000, fan-out, the push
                        layer alone, 100,000 and 200,000 streams held on the edge)
7. bench/cluster.py     the namespace cluster with 1 and 2 web hosts: polls through the balancer
                        and long-poll delivery (root only; `make drill` runs the failure drills)
8. bench/tls.py         the balancer's CPU per poll over TLS against plain HTTP (kept connections,
                        new ones with a full handshake and resumed), alternated rounds
9. bench/edgetls.py     held streams through the balancer's TLS edge beside the plain edge: memory
                        per stream, CPU per event
10. bench/onetoken.py   one token holding its cap of 5,000 long-polls (nginx, then the edge):
                        another user's poll latency, the next one's 429
11. (--with-10k)        10,000 polling users in locust's multi-process mode, with the stack's
                        CPU and memory (bench/load.py --preset 10k, also `make load-10k`)
Results: bench/results/*.json and *.png; bench/report.py prints the markdown table.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.common import progress  # noqa: E402


def step(name, argv, env=None):
    progress(f"=== {name}: {' '.join(argv)}" + "".join(f" ({k}={v})" for k, v in (env or {}).items()))
    started = time.monotonic()
    rc = subprocess.run([sys.executable, *argv], cwd=os.path.dirname(HERE),
                        env=dict(os.environ, **(env or {}))).returncode
    progress(f"=== {name}: exit {rc} after {time.monotonic() - started:.0f}s")
    return rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--with-10k", action="store_true")
    args = ap.parse_args()
    failures = 0
    failures += step("throughput", ["bench/throughput.py"] + (["--quick"] if args.quick else ["--duration", "5"])) != 0
    # --quick: one round of the ATR sweep at 1,000 connections, one short round without keep-alive
    failures += step("active ratio", ["bench/atr.py"] + (["--rounds", "1", "--totals", "1000", "--duration", "1"]
                                                         if args.quick else [])) != 0
    failures += step("connections", ["bench/connbench.py"] + (["--rounds", "1", "--requests", "5000"]
                                                              if args.quick else [])) != 0
    failures += step("fan-out", ["bench/fanout.py"]) != 0
    failures += step("load", ["bench/load.py"] + (["--quick"] if args.quick else [])) != 0
    # streams: on the edge (a stack of this run's own with fastpath's edge), then through nginx
    for name, edge in (("load-streampoll", ["--edge"]), ("load-streampoll-nginx", [])):
        failures += step(f"load, streams{' on the edge' if edge else ' through nginx'}",
                         ["bench/load.py", *edge, "--processes", "2", "--result-name", name]
                         + (["--quick"] if args.quick else []), env={"PLURK_LOAD_POLL_MODE": "stream"}) != 0
    # the long-poll run as before (through nginx against nchan's long-poll, and locust), then the
    # streams and the edge against nchan's two subscribers (docs/benchmarks.md, issue 31)
    failures += step("long-polling", ["bench/longpoll.py"] + (["--quick"] if args.quick else
                                                              ["--modes", "longpoll-nginx,nchan-longpoll"])) != 0
    if not args.quick:               # --quick's long-poll run already holds every mode
        # fastpath's workers are sized by what a run holds (descriptors: 20,000 a process here),
        # so the fan-outs run on their own: beside 100,000 streams they would share 2 cores
        # between 15 workers (bench/results/longpoll-edge-15-workers.json: stream, edge 1.70x)
        failures += step("streams and the edge", ["bench/longpoll.py", "--counts", "1000,10000",
                                                  "--fanout-rounds", "5", "--delivery-rounds", "5",
                                                  "--no-load", "--result-name", "longpoll-edge"]) != 0
        failures += step("the edge, 100,000 streams", ["bench/longpoll.py", "--counts", "", "--fanout", "0",
                                                       "--edge-stretch", "100000", "--no-load", "--result-name",
                                                       "longpoll-edge-100k"]) != 0
        failures += step("the edge, 200,000 streams", ["bench/longpoll.py", "--counts", "", "--fanout", "0",
                                                       "--edge-stretch", "200000", "--no-load", "--result-name",
                                                       "longpoll-edge-200k"]) != 0
    if os.geteuid() == 0:
        failures += step("cluster", ["bench/cluster.py"] + (["--web-hosts", "1", "--steady", "20"]
                                                             if args.quick else [])) != 0
    else:
        progress("=== cluster: skipped (network namespaces need root)")
    # the public face (issue 32): TLS at the balancer, streams over TLS, one token at its cap
    failures += step("TLS at the balancer", ["bench/tls.py"] + (["--rounds", "1", "--seconds", "2"]
                                                                 if args.quick else [])) != 0
    failures += step("streams over TLS", ["bench/edgetls.py"] + (["--streams", "500", "--events", "2"]
                                                                  if args.quick else [])) != 0
    failures += step("one token at its cap", ["bench/onetoken.py"] + (["--held", "500", "--polls", "10"]
                                                                      if args.quick else [])) != 0
    if args.with_10k:
        failures += step("10k users", ["bench/load.py", "--preset", "10k"]) != 0
    step("plots", ["bench/plot.py"])
    if failures:
        # a failed step left its previous results in place: do not present them as this run's
        progress(f"{failures} step(s) failed: README.md left as it was (bench/report.py prints the table)")
        step("report", ["bench/report.py"])
        return 1
    step("report", ["bench/report.py", "--write-readme"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
