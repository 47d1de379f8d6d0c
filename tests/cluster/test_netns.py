"""plurksite.cluster.netns against the real kernel: a small network of its own (bridge plkt0,
10.78.0.0/24, so it never meets a running `make cluster`), built and removed by each test."""
import contextlib
import socket
import subprocess
import sys
import time

import pytest

from plurksite.cluster import ClusterError, netns

GATEWAY = "10.78.0.1"
A, B = ("plkt-a", "10.78.0.11"), ("plkt-b", "10.78.0.12")
PORT = 7000
# accepts and closes connections forever, on the namespace's own address
SERVER = ("import socket, sys\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); print('ready', flush=True)\n"
          "while True:\n    s.accept()[0].close()\n")
# connects once; prints the local address it connected from and the seconds it took
CLIENT = ("import socket, sys, time\n"
          "t = time.monotonic(); c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
          "print(c.getsockname()[0], time.monotonic() - t)\n")


def ours():
    """What of ours the kernel still has: plkt* links and namespaces, delay relays."""
    relays = subprocess.run(["pgrep", "-f", "plurksite.cluster.delay .*plkt0"], capture_output=True, text=True)
    return ([n for n in netns.links() if n.startswith("plkt")] + [n for n in netns.namespaces() if n.startswith("plkt")]
            + relays.stdout.split())


@pytest.fixture
def net():
    netns.sweep("plkt")
    network = netns.Network("plkt0", GATEWAY)
    with network:
        for name, address in (A, B):
            network.add_host(name, address)
        yield network
    assert ours() == []


def serve(namespace, address):
    proc = subprocess.Popen(netns.exec_prefix(namespace) + [sys.executable, "-c", SERVER, address, str(PORT)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def connect_from(namespace, address):
    """(local address, seconds) of one connection made inside ``namespace``, or None."""
    proc = subprocess.run(netns.exec_prefix(namespace) + [sys.executable, "-c", CLIENT, address, str(PORT)],
                          capture_output=True, text=True, timeout=20)
    if proc.returncode != 0:
        return None
    local, seconds = proc.stdout.split()
    return local, float(seconds)


def connect_time(address):
    """Seconds one TCP handshake from the root namespace takes, or None if it cannot."""
    start = time.monotonic()
    try:
        socket.create_connection((address, PORT), timeout=1.5).close()
    except OSError:
        return None
    return time.monotonic() - start


def test_two_namespaces_talk_over_the_bridge_not_loopback(net):
    server = serve(*A)
    try:
        assert connect_from(B[0], A[1])[0] == B[1]          # from b's own address, over its link
        route = netns.run(["ip", "-n", B[0], "route", "get", A[1]])
        assert f"dev {netns.HOST_IFNAME}" in route and " lo" not in route
        # a host's loopback is its own: a's server is not on b's 127.0.0.1 nor on a's
        assert connect_from(B[0], "127.0.0.1") is None
        # and the link carried it: the bridge side of a's link saw the frames
        assert int(open(f"/sys/class/net/{net.port(A[0])}/statistics/rx_packets").read()) > 0
    finally:
        server.kill()


def test_a_namespace_has_only_the_cluster_route(net):
    routes = netns.run(["ip", "-n", A[0], "-4", "route", "show"]).strip().splitlines()
    assert routes and all(r.startswith("10.78.0.0/24 dev eth0") for r in routes)
    assert netns.run(["ip", "-n", A[0], "-o", "-4", "addr", "show"]).count("inet ") == 2   # lo, eth0


def test_partition_cuts_a_host_and_heal_restores_it(net):
    server = serve(*A)
    try:
        assert connect_time(A[1]) is not None
        net.partition(A[0])
        assert net.is_partitioned(A[0])
        assert connect_time(A[1]) is None
        assert connect_from(B[0], A[1]) is None
        assert server.poll() is None                        # the host itself still runs
        net.heal(A[0])
        assert not net.is_partitioned(A[0])
        assert connect_time(A[1]) < 0.5           # no lost SYN waiting for a retransmit
    finally:
        server.kill()


def test_delay_is_measurable_and_removable(net):
    server = serve(*A)
    try:
        baseline = min(connect_time(A[1]) for _ in range(3))
        assert baseline < 0.1
        net.delay(A[0], 100)                # each way: a handshake crosses the link twice
        assert connect_time(A[1]) is not None   # ARP resolved again through the delay
        delayed = min(connect_time(A[1]) for _ in range(3))
        assert delayed >= 0.18
        net.delay(A[0], 0)
        assert min(connect_time(A[1]) for _ in range(3)) < 0.1
    finally:
        server.kill()


def test_teardown_after_an_exception_leaves_nothing():
    netns.sweep("plkt")
    with pytest.raises(RuntimeError, match="boom"):
        with netns.Network("plkt0", GATEWAY) as network:
            network.add_host(*A)
            serve(*A)                               # a process inside: killed with the namespace
            network.delay(A[0], 20)
            network.partition(A[0])
            raise RuntimeError("boom")
    assert ours() == []


def test_a_failed_step_is_one_line_naming_the_command():
    netns.sweep("plkt")
    with netns.Network("plkt0", GATEWAY) as network:
        network.add_host(*A)
        with pytest.raises(ClusterError, match=r"`ip netns add plkt-a` failed .*File exists"):
            network.add_host(*A)
    assert ours() == []


def test_sweep_removes_what_a_crashed_run_left():
    netns.sweep("plkt")
    network = netns.Network("plkt0", GATEWAY).create()
    network.add_host(*A)
    network.delay(A[0], 10)
    serve(*A)
    assert ours()
    netns.sweep("plkt")                             # no teardown(): as after a SIGKILL
    assert ours() == []
    with contextlib.suppress(ClusterError):
        network.teardown()
