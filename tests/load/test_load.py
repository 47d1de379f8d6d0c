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
