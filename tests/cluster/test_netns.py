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


def syn_retransmits():
    """SYNs the root namespace has sent again (TcpExt TCPSynRetrans): the kernel's own count, where
    a handshake's time would also measure how busy the machine is (0.74 s once under `make test`,
    no SYN lost)."""
    with open("/proc/net/netstat") as fh:
        lines = fh.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split()))["TCPSynRetrans"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")


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
        retransmits = syn_retransmits()
        assert connect_time(A[1]) is not None
        assert syn_retransmits() == retransmits   # no lost SYN: heal() returned with the path open
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


# receives on udp (address, port) and prints what came, until killed
UDP_SINK = ("import socket, sys\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], int(sys.argv[2])))\n"
            "print('ready', flush=True)\n"
            "while True:\n    print(s.recv(100).decode(), flush=True)\n")


def _udp_sink(namespace, address, port):
    proc = subprocess.Popen(netns.exec_prefix(namespace) + [sys.executable, "-c", UDP_SINK, address, str(port)],
                            stdout=subprocess.PIPE, bufsize=0)
    assert _received(proc, timeout=10) == ["ready"]
    return proc


def _send_udp(namespace, address, port, text):
    code = (f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"try: s.sendto({text!r}.encode(), ({address!r}, {port}))\nexcept OSError: pass\n")
    subprocess.run(netns.exec_prefix(namespace) + [sys.executable, "-c", code], check=True, timeout=10)


def _received(proc, timeout=1.0):
    """The lines the sink printed until it has been quiet a while (raw reads of the pipe: a
    buffered readline could keep a second line where select() no longer sees it)."""
    import os
    import select
    data = b""
    while select.select([proc.stdout], [], [], timeout)[0]:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        data += chunk
        timeout = 0.3
    return data.decode().split()


def test_block_udp_drops_only_the_notice_ports_from_anywhere_and_unblock_restores(net):
    """The notice-path drill: datagrams to b's ports 9100-9101 are dropped whether they come over
    the link from a or from b itself; another UDP port and TCP still pass; unblock restores all."""
    sinks = {port: _udp_sink(B[0], B[1], port) for port in (9100, 9101, 9200)}
    server = serve(B[0], B[1])
    try:
        netns.block_udp(B[0], B[1], 9100, 9101)
        assert netns.udp_blocked(B[0])
        for port in (9100, 9101, 9200):
            _send_udp(A[0], B[1], port, f"from-a-{port}")
            _send_udp(B[0], B[1], port, f"from-b-{port}")
        assert _received(sinks[9100]) == [] and _received(sinks[9101]) == []
        assert sorted(_received(sinks[9200])) == ["from-a-9200", "from-b-9200"]
        assert connect_from(A[0], B[1]) is not None           # HTTP's path is untouched
        netns.unblock_udp(B[0])
        assert not netns.udp_blocked(B[0])
        for port in (9100, 9101):
            _send_udp(A[0], B[1], port, f"again-{port}")
            assert _received(sinks[port]) == [f"again-{port}"]
        assert "lookup local" in netns.run(["ip", "-n", B[0], "rule", "show", "pref", "0"])
    finally:
        for proc in (*sinks.values(), server):
            proc.kill()
            proc.wait()
