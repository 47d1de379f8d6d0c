"""bench/tls.py and bench/onetoken.py end to end at a small size (issue 32's benchmarks): what
their results say and that each measured what it claims (polls answered over TLS, handshakes
resumed or not, a token's polls held and its next one refused), not their speed."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.slow


def _run(tmp_path, *argv):
    env = dict(os.environ, PLURK_BENCH_RESULTS=str(tmp_path))
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = os.path.splitext(os.path.basename(argv[0]))[0]
    with open(tmp_path / f"{name}.json") as fh:
        return json.load(fh)


def test_tls_bench_measures_plain_and_tls_polls_and_both_handshakes(tmp_path):
    result = _run(tmp_path, "bench/tls.py", "--rounds", "1", "--seconds", "1", "--users", "2")
    assert result["tls"]["protocol"] in ("TLSv1.2", "TLSv1.3")
    modes = result["modes"]
    assert set(modes) == {"kept plain", "kept TLS", "new plain", "new TLS full handshake", "new TLS resumed"}
    for name, mode in modes.items():
        assert mode["requests"] > 0 and mode["errors"] == 0, (name, mode)
        assert mode["balancer_cpu_us_per_request"] > 0, (name, mode)
    # a full handshake each is never resumed; the resumed mode is (no tickets: the session cache)
    assert modes["new TLS full handshake"]["resumed"] == 0
    resumed = modes["new TLS resumed"]
    assert resumed["resumed"] >= resumed["handshakes"] - 4 > 0      # each thread's first is full
    ratio = result["ratios"]["kept TLS / kept plain"]
    assert ratio["median_over_median"] == round(modes["kept TLS"]["balancer_cpu_us_per_request"]
                                                / modes["kept plain"]["balancer_cpu_us_per_request"], 3)
    assert list(result["goals"].values()) == [ratio["median_over_median"] <= 1.3]


def test_one_token_bench_holds_the_cap_and_refuses_the_next(tmp_path):
    result = _run(tmp_path, "bench/onetoken.py", "--held", "60", "--polls", "5")
    assert result["cap"] == 60
    for name in ("nginx", "edge"):
        r = result[name]
        assert r["held"] == 60 and r["answered_while_held"] == {} and r["held_after"] == 60, (name, r)
        for other in r["other_user"].values():
            assert other["x_cache"] == {"HIT": 5} and sum(other["statuses"].values()) == 5
        beyond = r["beyond_the_cap"]
        assert beyond["answers"] == {"429 Retry-After 5": 10} and beyond["refused_by_fastpath"] == 10
