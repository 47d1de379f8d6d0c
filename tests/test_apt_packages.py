"""deps/apt-packages.txt declares the Debian package of every program the code and the tests
run, not only packages that happen to pull it in (procps came with chromium, nothing said so)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("fastpath", "fastpoll", "plurkcore", "plurksite", "plurkweb", "locustfiles", "bench", "tests",
         "examples")
# a subprocess call with a literal argv: its first word is the program
ARGV0 = re.compile(r'(?:run|Popen|check_output|check_call|call)\(\s*\[\s*"([A-Za-z][A-Za-z0-9_.+-]*)"')

# program -> the package apt-packages.txt must name; None: why none is needed
PACKAGE_OF = {
    "pgrep": "procps",              # tests/cluster
    "sysctl": "procps",             # plurksite/cluster/netns.py, through `ip netns exec`
    "ip": "iproute2",
    "tc": "iproute2",
    "ss": "iproute2",
    "curl": "curl",
    "openssl": "openssl",
    "pkg-config": "pkg-config",
    "make": "build-essential",
    "ldd": None,                    # libc-bin: Essential
    "localedef": None,              # libc-bin: Essential
    "unshare": None,                # util-linux: Essential
    "git": None,                    # the checkout is a git clone
    "systemd-analyze": None,        # its test skips without it (tests/plurksite/test_units.py)
}
RUN_INDIRECTLY = {"sysctl"}         # not argv[0], so the scan cannot see it


def declared():
    text = (ROOT / "deps" / "apt-packages.txt").read_text()
    return {line.split("#")[0].strip() for line in text.splitlines()} - {""}


def programs_run():
    found = set()
    for tree in TREES:
        for path in (ROOT / tree).rglob("*.py"):
            found |= set(ARGV0.findall(path.read_text()))
    return found


def test_every_program_run_is_in_the_table():
    run = programs_run()
    assert {"pgrep", "ip", "ss", "openssl"} <= run, run       # the scan sees what it should
    assert not run - PACKAGE_OF.keys(), f"add these to PACKAGE_OF: {sorted(run - PACKAGE_OF.keys())}"
    assert not (PACKAGE_OF.keys() - run - RUN_INDIRECTLY), "no longer run: drop them from PACKAGE_OF"


def test_every_package_of_a_program_run_is_declared():
    missing = {prog: pkg for prog, pkg in PACKAGE_OF.items() if pkg and pkg not in declared()}
    assert not missing, f"add to deps/apt-packages.txt: {missing}"
