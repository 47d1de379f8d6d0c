"""The CI-sized locust run: tens of users for ~30 s through nginx; nothing lost, nothing failed."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.load
@pytest.mark.slow
def test_quick_simulation_delivers_everything(stack, tmp_path):
    env = dict(os.environ, PLURK_BENCH_RESULTS=str(tmp_path))
    env.update(stack.config.to_env())
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "load.py"), "--quick",
                           "--host", stack.base_url], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    result = json.load(open(tmp_path / "load.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["requests"] > 300
    assert result["failures"] == 0
    assert result["lost"] == 0
    assert result["deliveries_checked"] > 0
    assert result["hit_ratio"] > 0.95, result


@pytest.mark.load
@pytest.mark.slow
def test_distributed_mode_merges_every_worker(stack, tmp_path):
    """locust --processes 2 (the mode of the 10,000-user run): both workers' records reach the judge,
    with a bulk-made graph and a warm cache."""
    env = dict(os.environ, PLURK_BENCH_RESULTS=str(tmp_path))
    env.update(stack.config.to_env())
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "load.py"), "--users", "40",
                           "--spawn-rate", "20", "--run-time", "20", "--processes", "2", "--prefollow",
                           "--celebrities", "3", "--celeb-wait", "3", "--poll-wait", "2", "--write-weight", "0",
                           "--result-name", "multi", "--host", stack.base_url], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    result = json.load(open(tmp_path / "multi.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["record_files"] == 2, result
    assert result["failures"] == 0 and result["lost"] == 0
    assert result["plurks_posted"] > 0 and result["deliveries_checked"] > 0, result
    assert result["hit_ratio"] > 0.95, result
