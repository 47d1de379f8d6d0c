"""plurksite.cluster.harness with a cluster of the memcached hosts only (no Django, a few
seconds): host faults, and nothing left behind after an exception or SIGTERM.  The whole cluster
(PostgreSQL, web hosts, balancer) is `make cluster` and the drills."""
import os
import signal
import socket
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from plurksite.cluster import ClusterError, netns, topology
from plurksite.cluster.harness import Cluster
from plurksite.config import ROOT

MC1, MC2 = topology.host("plk-mc1"), topology.host("plk-mc2")


def memcached_version(address, timeout=1.0):
    """memcached's answer to `version` at address:11211, or None."""
    try:
        with socket.create_connection((address, topology.MEMCACHED_PORT), timeout=timeout) as sock:
            sock.sendall(b"version\r\n")
            return sock.recv(100)
    except OSError:
        return None


def leftovers():
    """What of a cluster the machine still has: plk namespaces and links, its memcached."""
    procs = subprocess.run(["pgrep", "-f", f"memcached -l {topology.SUBNET}"], capture_output=True, text=True)
    return ([n for n in netns.namespaces() if n.startswith("plk-")]
            + [n for n in netns.links() if n.startswith(netns.BRIDGE)] + procs.stdout.split())


def test_memcached_hosts_faults_and_a_clean_exit_after_an_exception():
    with pytest.raises(RuntimeError, match="boom"):
        with Cluster(hosts=[MC1, MC2], ready_timeout=30) as cluster:
            assert memcached_version(MC1.address).startswith(b"VERSION")
            assert memcached_version(MC2.address).startswith(b"VERSION")
            cluster.partition(MC2.name)
            assert memcached_version(MC2.address) is None
            cluster.heal(MC2.name)
            assert memcached_version(MC2.address).startswith(b"VERSION")
            cluster.kill(MC1.name)
            assert memcached_version(MC1.address) is None
            assert netns.namespace_pids(MC1.name) == []
            with pytest.raises(ClusterError, match="runs no memcached"):
                cluster.kill_service(MC1.name, "memcached")
            cluster.revive(MC1.name)
            assert memcached_version(MC1.address).startswith(b"VERSION")
            assert cluster.service_pids(MC1.name, "memcached")
            # a process of a drill's own runs on the host's address with the shared variables
            said = cluster.run_on(MC2.name, [sys.executable, "-c", "import os, socket; s = socket.socket(); "
                                  "s.connect(('10.77.0.31', 11211)); print(s.getsockname()[0], "
                                  "os.environ['PLURK_MEMCACHED'])"])
            assert said.stdout.split() == [MC2.address, topology.shared_env()["PLURK_MEMCACHED"]]
            probe = cluster.spawn(MC2.name, ["sleep", "600"])
            raise RuntimeError("boom")
    assert leftovers() == []
    assert probe.process is None                # stopped with its host


SCRIPT = """
import signal, sys
from plurksite.cluster import topology
from plurksite.cluster.harness import Cluster
with Cluster(hosts=[topology.host("plk-mc1")], ready_timeout=30):
    print("up", flush=True)
    while True:
        signal.pause()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_removes_the_cluster(sig):
    env = dict(os.environ, PYTHONPATH=ROOT)
    # start_new_session and no terminal: SIGINT arrives ignored, as in a background job
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout.readline().strip() == "up"
        assert leftovers() != []
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            netns.sweep()
    assert leftovers() == []


def test_runcluster_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(CommandError, match=r"needs root .* `sudo make cluster`$"):
        call_command("runcluster")
    assert leftovers() == []


def test_the_db_host_migrated_restarted_killed_and_revived():
    import psycopg

    db = topology.host("plk-db")
    url = topology.shared_env()["PLURK_DATABASE_URL"]

    def users():
        with psycopg.connect(url, connect_timeout=3) as conn:
            return conn.execute("SELECT count(*) FROM auth_user").fetchone()[0]

    with Cluster(hosts=[db], seed_demo=True, ready_timeout=60) as cluster:
        assert users() == 4                             # migrated, demo users loaded, over the link
        cluster.restart_service(db.name, "postgres")
        assert users() == 4
        cluster.kill(db.name)
        with pytest.raises(psycopg.OperationalError):
            users()
        cluster.revive(db.name)
        assert users() == 4                             # the same data after a crash
    assert leftovers() == []
    assert not subprocess.run(["pgrep", "-f", f"listen_addresses={db.address}"], capture_output=True).stdout
