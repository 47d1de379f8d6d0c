"""A/B: one benchmark run in two checkouts, interleaved rounds, the ratio B/A per figure.

    python bench/ab.py --a ../old-checkout [--b .] --rounds 4 fanout throughput longpoll

Each round runs every named benchmark once in each checkout, alternating which goes first
(ABBA...), so that drift of the machine (other work on the shared cores, the page cache) falls
on both sides alike.  Each run writes its JSON under a scratch directory (``PLURK_BENCH_RESULTS``),
never over the committed ``bench/results``.  The figures of one benchmark are read by a small
table of extractors (:data:`BENCHES`); the report is the median of each side's rounds, the ratio
B/A of those medians, and each side's spread (max/min over its rounds), which is the noise a ratio
has to clear before it means anything.  The JSON goes to ``bench/results/ab.json`` (``--out``).

Each checkout must be built (``make install`` there): the run uses that checkout's own Python
modules and fastpath, with this virtualenv's interpreter.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine_info, write_result  # noqa: E402


def _throughput(data):
    out = {}
    for config in ("fastpath", "nginx+fastpath"):
        for conc, point in data["configs"].get(config, {}).items():
            out[f"{config} c={conc} req/s"] = point["rps"]
    return out


def _fanout(data):
    out = {}
    for run in data["runs"]:
        if run["history"] or run["backlog"]:
            continue
        out[f"{run['backend']} {run['followers']} followers {run['phase']} s"] = run["seconds"]
    for row in data.get("writes", ()):
        out[f"{row['backend']} ms per one-user write"] = row["ms_per_write"]
    return out


def _longpoll(data):
    out = {}
    fanout = data.get("fanout") or {}
    stack = fanout.get("stack") or {}
    for key in ("post_s", "first_answer_s", "last_answer_s"):
        if isinstance(stack.get(key), (int, float)):
            out[f"fan-out {stack.get('followers_held')} held, {key}"] = stack[key]
    for part, seconds in (stack.get("cpu_s") or {}).items():
        out[f"fan-out cpu s {part}"] = seconds
    for count, point in (data.get("held") or {}).items():
        per = (point.get("stack") or {}).get("per_held") or {}
        for key, value in per.items():
            if isinstance(value, (int, float)):
                out[f"{count} held, per held {key}"] = value
    return out


#: name -> (argv after the script, extractor of {figure: number}, True when higher is better)
BENCHES = {
    "throughput": (["bench/throughput.py", "--quick", "--rounds", "1", "--no-django"], _throughput, True),
    "fanout": (["bench/fanout.py", "--followers", "1000,10000", "--servers", "1", "--backends", "sqlite",
                "--rounds", "1", "--history", "0", "--backlog", "0"], _fanout, False),
    "longpoll": (["bench/longpoll.py", "--counts", "1000", "--fanout", "2000", "--fanout-rounds", "1",
                  "--delivery-rounds", "0", "--no-load"], _longpoll, False),
}


def run_one(checkout, bench, scratch):
    argv, extract, _ = BENCHES[bench]
    env = dict(os.environ, PLURK_BENCH_RESULTS=scratch, PYTHONPATH=checkout)
    began = time.monotonic()
    proc = subprocess.run([sys.executable, *argv], cwd=checkout, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ab: {bench} failed in {checkout} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    with open(os.path.join(scratch, f"{bench}.json")) as fh:
        figures = extract(json.load(fh))
    return figures, time.monotonic() - began


def summarise(rounds_a, rounds_b, higher_better):
    rows = {}
    for figure in sorted(set().union(*rounds_a, *rounds_b)):
        a = [r[figure] for r in rounds_a if figure in r]
        b = [r[figure] for r in rounds_b if figure in r]
        if not a or not b or not statistics.median(a):
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        spread = lambda xs: round(max(xs) / min(xs), 3) if min(xs) > 0 else None   # noqa: E731
        rows[figure] = {"a": ma, "b": mb, "b_over_a": round(mb / ma, 3), "higher_is_better": higher_better,
                        "spread_a": spread(a), "spread_b": spread(b), "rounds_a": a, "rounds_b": b}
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benches", nargs="+", choices=sorted(BENCHES))
    parser.add_argument("--a", required=True, help="the baseline checkout (built)")
    parser.add_argument("--b", default=os.getcwd(), help="the checkout under test (default: here)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default="ab", help="result name under bench/results (default ab)")
    args = parser.parse_args(argv)
    sides = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b)}
    for side, path in sides.items():
        if not os.path.exists(os.path.join(path, "bench", "common.py")):
            raise SystemExit(f"ab: --{side} {path} is not a checkout of this project")
    got = {bench: {"a": [], "b": []} for bench in args.benches}
    failed = None
    with tempfile.TemporaryDirectory(prefix="ab-") as scratch:
        try:
            for i in range(args.rounds):
                order = ("a", "b") if i % 2 == 0 else ("b", "a")
                for bench in args.benches:
                    for side in order:
                        figures, took = run_one(sides[side], bench, scratch)
                        got[bench][side].append(figures)
                        print(f"round {i + 1}/{args.rounds} {bench} {side}: {took:.0f} s", flush=True)
        except SystemExit as exc:          # the rounds so far are kept, and the failure said
            failed = str(exc)
            print(failed, file=sys.stderr)
    result = {"benchmark": "ab", "machine": machine_info(), "a": sides["a"], "b": sides["b"], "failed": failed,
              "commits": {side: _commit(path) for side, path in sides.items()}, "rounds": args.rounds,
              "benches": {bench: summarise(got[bench]["a"], got[bench]["b"], BENCHES[bench][2])
                          for bench in args.benches}}
    path = write_result(args.out, result)
    for bench, rows in result["benches"].items():
        print(f"== {bench} (B/A; spread = max/min of a side's rounds)")
        for figure, row in rows.items():
            print(f"  {figure:48} {row['a']:>10.4g} {row['b']:>10.4g}  x{row['b_over_a']:<6} "
                  f"spread {row['spread_a']}/{row['spread_b']}")
    print(path)
    if failed:
        raise SystemExit(1)


def _commit(path):
    proc = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or None


if __name__ == "__main__":
    main()
