"""The cluster tests build network namespaces: they need root and ``ip netns`` (CI has both)."""
import os
import shutil
import subprocess

import pytest


def _why_not():
    if os.geteuid() != 0:
        return "needs root (network namespaces): run as root"
    if shutil.which("ip") is None and not os.access("/usr/sbin/ip", os.X_OK):
        return "needs `ip` (apt-get install iproute2)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is unavailable here"
    return None


def pytest_collection_modifyitems(config, items):
    why = _why_not()
    if why is None:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=why))
