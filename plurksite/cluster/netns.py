"""The cluster's network over ``ip`` and ``tc``: one bridge in the root namespace, one network
namespace per host joined to it by a veth pair.

    root namespace                          namespace plk-web1
    plk0 (bridge, 10.77.0.1/24) ── plk0-web1 ═══ veth ═══ eth0 (10.77.0.21/24), lo

Every name this module creates starts with ``plk`` (the bridge and its ports, ``<bridge>-<host>``,
``<bridge>d-``/``<bridge>r-`` for a delayed link; namespaces ``plk-<host>``), so ``sweep()`` can
remove what a crashed run left behind.  A namespace has its connected /24 route and nothing else:
no default route, no NAT, no forwarding out of the bridge; the root namespace reaches every host
through the bridge's own address.

A partition takes the bridge side of a host's link down: the host keeps its address (its
services keep running) but nothing reaches it or leaves it.  Delay is ``tc netem`` on both ends of
a host's link; a kernel without netem (CONFIG_NET_SCH_NETEM unset) gets the same delay from a
userspace relay (``plurksite.cluster.delay``) spliced into the link.

Every command runs through ``run()``: a failure is a ClusterError naming the command and quoting
its stderr.
"""
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from . import ClusterError

PREFIX = "plk"
BRIDGE = "plk0"
HOST_IFNAME = "eth0"
SOMAXCONN = 65535            # fastpath.activation.BACKLOG: what docs/deploy.md section 3 sets
# br_netfilter would hand bridged frames to iptables; the cluster's traffic must only be switched
BRIDGE_NF = ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables")
_NETEM_MISSING = "qdisc kind is unknown"


def run(argv, check=True, timeout=30):
    """Run ``argv``; its stdout, or a ClusterError quoting the command and its stderr."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        raise ClusterError(f"{argv[0]} not found (apt-get install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(argv)}` did not finish within {timeout}s") from None
    if check and proc.returncode != 0:
        why = proc.stderr.strip().splitlines()
        raise ClusterError(f"`{' '.join(argv)}` failed (status {proc.returncode}): "
                           f"{why[-1] if why else 'no message'}")
    return proc.stdout


def require_root():
    """The cluster needs root (namespaces, links); one line naming the fix otherwise."""
    if os.geteuid() != 0:
        raise ClusterError("the cluster needs root (network namespaces and links): "
                           "run it as root, for example `sudo make cluster`")


def require_tools():
    """``ip`` with netns support, and ``tc``: one line naming the package otherwise."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            raise ClusterError(f"{tool} not found: apt-get install iproute2")
    run(["ip", "netns", "list"])


def exec_prefix(namespace):
    """The argv prefix that runs a command inside ``namespace``."""
    return ["ip", "netns", "exec", namespace]


def namespaces():
    """Names of the network namespaces ``ip netns`` knows."""
    return [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]


def links(namespace=None):
    """Names of the links of the root namespace (or of ``namespace``), without the ``@peer``."""
    argv = ["ip", "-o", "link", "show"] if namespace is None else ["ip", "-n", namespace, "-o", "link", "show"]
    names = []
    for line in run(argv).splitlines():
        match = re.match(r"\d+:\s+([^:@\s]+)", line)
        if match:
            names.append(match.group(1))
    return names


def namespace_pids(namespace):
    """Process ids running in ``namespace``."""
    out = run(["ip", "netns", "pids", namespace], check=False)
    return [int(pid) for pid in out.split() if pid.isdigit()]


def kill_namespace_processes(namespace, sig=signal.SIGKILL, timeout=5.0, reap_timeout=2.0):
    """Send ``sig`` to every process in ``namespace`` and, for SIGKILL, wait until none is left
    (what a host that loses power looks like to the others) and, up to ``reap_timeout``, until
    they are reaped; the pids signalled."""
    deadline = time.monotonic() + timeout
    killed = set()
    while True:
        pids = namespace_pids(namespace)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        killed.update(pids)
        if not pids or sig != signal.SIGKILL:
            break
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {pids} in namespace {namespace} survived SIGKILL")
        time.sleep(0.05)
    wait_reaped(killed, reap_timeout)
    return killed


def wait_reaped(pids, timeout):
    """A dead process leaves its namespace at once but stays a zombie until its parent (often
    init, after an orphaning) reaps it, and a pid file naming it would still look alive: wait
    up to ``timeout`` for ``pids`` to be gone."""
    deadline = time.monotonic() + timeout
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def bridge_netfilter(value):
    """Set net.bridge.bridge-nf-call-* to ``value`` where the kernel has them; the old values."""
    old = {}
    for name in BRIDGE_NF:
        path = f"/proc/sys/net/bridge/{name}"
        with contextlib.suppress(FileNotFoundError):
            with open(path) as fh:
                old[name] = fh.read().strip()
            with open(path, "w") as fh:
                fh.write(str(value))
    return old


def restore_bridge_netfilter(old):
    for name, value in old.items():
        with contextlib.suppress(OSError), open(f"/proc/sys/net/bridge/{name}", "w") as fh:
            fh.write(value)


def netem_available():
    """True when the kernel has the netem qdisc (probed on a throwaway veth pair)."""
    probe_a, probe_b = f"{PREFIX}probe-a", f"{PREFIX}probe-b"
    run(["ip", "link", "add", probe_a, "type", "veth", "peer", "name", probe_b])
    try:
        proc = subprocess.run(["tc", "qdisc", "add", "dev", probe_a, "root", "netem", "delay", "1ms"],
                              capture_output=True, text=True)
        return proc.returncode == 0
    finally:
        run(["ip", "link", "del", probe_a], check=False)


def _wait_gone(names, namespace_names, timeout=10.0):
    """Namespaces are destroyed asynchronously, and their veth ends with them: wait."""
    deadline = time.monotonic() + timeout
    while True:
        left = [n for n in links() if n in names] + [n for n in namespaces() if n in namespace_names]
        if not left:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"{', '.join(left)} still present {timeout:.0f}s after removal; "
                               f"remove by hand (ip link del / ip netns del)")
        time.sleep(0.05)


def _stop_relays(match):
    """Kill delay relays (``plurksite.cluster.delay``) whose link names start with ``match``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            if b"plurksite.cluster.delay" in argv and any(a.startswith(match.encode()) for a in argv):
                os.kill(int(entry), signal.SIGKILL)


def sweep(prefix=PREFIX):
    """Remove every namespace (with its processes), link and delay relay whose name starts with
    ``prefix``: what a run that crashed left behind.  Safe when there is nothing."""
    ns_names = [n for n in namespaces() if n.startswith(prefix)]
    for ns in ns_names:
        kill_namespace_processes(ns)
    _stop_relays(prefix)
    link_names = [n for n in links() if n.startswith(prefix)]
    for name in link_names:
        run(["ip", "link", "del", name], check=False)     # a veth's peer may have gone with it
    for ns in ns_names:
        run(["ip", "netns", "del", ns], check=False)
    _wait_gone(set(link_names), set(ns_names))


def block_udp(namespace, address, first, last):
    """Drop UDP to ``address`` ports first..last inside ``namespace``, whether it comes over the
    link or from the host itself, and nothing else.  Policy routing, not a packet filter: this
    kernel has no netfilter tables or tc drop action here, but `ip rule` selects by protocol and
    port, and a blackhole rule placed before the local table drops input and local delivery."""
    ip = ["ip", "-n", namespace]
    run(ip + ["rule", "add", "pref", "5", "to", address, "ipproto", "udp", "dport", f"{first}-{last}",
              "blackhole"])
    if "lookup local" in run(ip + ["rule", "show", "pref", "0"]):
        run(ip + ["rule", "add", "pref", "10", "table", "local"])
        run(ip + ["rule", "del", "pref", "0", "table", "local"])


def unblock_udp(namespace):
    """Undo block_udp: the blackhole goes, the local table's rule is first again."""
    ip = ["ip", "-n", namespace]
    run(ip + ["rule", "del", "pref", "5"], check=False)
    if "lookup local" in run(ip + ["rule", "show", "pref", "10"]):
        run(ip + ["rule", "add", "pref", "0", "table", "local"])
        run(ip + ["rule", "del", "pref", "10", "table", "local"])


def udp_blocked(namespace):
    return "blackhole" in run(["ip", "-n", namespace, "rule", "show", "pref", "5"])


class Network:
    """A bridge and the namespaces on it.  ``add_host()`` records what it creates, so
    ``teardown()`` removes exactly that, also after a partial setup."""

    def __init__(self, bridge=BRIDGE, gateway="10.77.0.1", prefixlen=24):
        if not bridge.startswith(PREFIX) or len(bridge) > 6:
            raise ClusterError(f"bridge name {bridge!r}: must start with {PREFIX!r}, 6 characters at most")
        self.bridge = bridge
        self.gateway = gateway
        self.prefixlen = prefixlen
        self.hosts = {}                 # namespace -> address
        self.delays = {}                # namespace -> ("netem"|relay Popen, ms)
        self._created_bridge = False
        self._old_bridge_nf = None
        self._netem = None

    # -- names ----------------------------------------------------------------------------
    def _short(self, namespace):
        short = namespace.split("-", 1)[-1]
        if len(self.bridge) + 2 + len(short) > 15:      # IFNAMSIZ - 1, with "d-"
            raise ClusterError(f"host name {namespace!r}: the part after '-' must be at most "
                               f"{13 - len(self.bridge)} characters (link names are 15 at most)")
        return short

    def port(self, namespace):
        """The bridge side of ``namespace``'s link (root namespace)."""
        return f"{self.bridge}-{self._short(namespace)}"

    def _delay_ports(self, namespace):
        short = self._short(namespace)
        return f"{self.bridge}d-{short}", f"{self.bridge}r-{short}"

    # -- building -------------------------------------------------------------------------
    def create(self):
        """The bridge with the gateway address, bridged traffic kept away from netfilter."""
        self._old_bridge_nf = bridge_netfilter(0)
        run(["ip", "link", "add", self.bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0"])
        self._created_bridge = True
        run(["ip", "addr", "add", f"{self.gateway}/{self.prefixlen}", "dev", self.bridge])
        run(["ip", "link", "set", self.bridge, "up"])
        return self

    def add_host(self, namespace, address):
        """A namespace with lo up and ``eth0`` = ``address``, linked to the bridge."""
        if not namespace.startswith(PREFIX):
            raise ClusterError(f"namespace {namespace!r}: must start with {PREFIX!r}")
        port = self.port(namespace)
        run(["ip", "netns", "add", namespace])
        self.hosts[namespace] = address
        run(["ip", "-n", namespace, "link", "set", "lo", "up"])
        # as docs/deploy.md section 3 sets a host: a restart's re-polls all wait in the backlog
        run(["ip", "netns", "exec", namespace, "sysctl", "-qw", f"net.core.somaxconn={SOMAXCONN}"])
        run(["ip", "link", "add", port, "type", "veth", "peer", "name", HOST_IFNAME, "netns", namespace])
        run(["ip", "-n", namespace, "addr", "add", f"{address}/{self.prefixlen}", "dev", HOST_IFNAME])
        run(["ip", "-n", namespace, "link", "set", HOST_IFNAME, "up"])
        run(["ip", "link", "set", port, "master", self.bridge])
        run(["ip", "link", "set", port, "up"])

    # -- faults ---------------------------------------------------------------------------
    def partition(self, namespace):
        """Cut ``namespace`` off: its link goes down at the bridge; the host keeps running."""
        run(["ip", "link", "set", self.port(namespace), "down"])

    def heal(self, namespace, timeout=5.0):
        """Bring ``namespace``'s link back, and wait until both ends pass traffic again (the
        kernel's link watch turns a carrier change into a working queue up to a second later)."""
        run(["ip", "link", "set", self.port(namespace), "up"])
        deadline = time.monotonic() + timeout
        while not all("state UP" in out for out in (
                run(["ip", "-o", "link", "show", self.port(namespace)]),
                run(["ip", "-n", namespace, "-o", "link", "show", HOST_IFNAME]))):
            if time.monotonic() > deadline:
                raise ClusterError(f"the link of {namespace} is not up {timeout:.0f}s after heal")
            time.sleep(0.02)

    def is_partitioned(self, namespace):
        flags = re.search(r"<([^>]*)>", run(["ip", "-o", "link", "show", self.port(namespace)]))
        return "UP" not in (flags.group(1).split(",") if flags else ())

    def delay(self, namespace, ms):
        """Delay every frame to and from ``namespace`` by ``ms`` milliseconds each way (a round
        trip through its link gains 2 x ms); 0 removes the delay."""
        if namespace in self.delays:
            self._undelay(namespace)
        if ms <= 0:
            return
        if self._netem is None:
            self._netem = netem_available()
        if self._netem:
            for argv in (["tc", "qdisc", "replace", "dev", self.port(namespace)],
                         ["tc", "-n", namespace, "qdisc", "replace", "dev", HOST_IFNAME]):
                run(argv + ["root", "netem", "delay", f"{ms}ms", "limit", "100000"])
            self.delays[namespace] = ("netem", ms)
        else:
            self.delays[namespace] = (self._splice_relay(namespace, ms), ms)

    def _splice_relay(self, namespace, ms):
        """Without netem: the bridge gets a new port (``<bridge>d-``) whose veth peer
        (``<bridge>r-``) and the host's own port are joined by a relay that holds each frame
        ``ms`` before passing it on.  The host's port leaves the bridge only once the relay
        listens, so a frame is delayed or passed, not lost."""
        port = self.port(namespace)
        bridge_side, relay_side = self._delay_ports(namespace)
        run(["ip", "link", "add", bridge_side, "type", "veth", "peer", "name", relay_side])
        relay = subprocess.Popen([sys.executable, "-m", "plurksite.cluster.delay", str(ms), port, relay_side],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, text=True)
        ready = relay.stdout.readline().strip()
        if ready != "ready":
            relay.kill()
            relay.wait()
            run(["ip", "link", "del", bridge_side], check=False)
            raise ClusterError(f"the delay relay for {namespace} did not start: {relay.stderr.read().strip()}")
        for name in (relay_side, bridge_side):
            run(["ip", "link", "set", name, "up"])
        run(["ip", "link", "set", port, "nomaster"])
        run(["ip", "link", "set", bridge_side, "master", self.bridge])
        return relay

    def _undelay(self, namespace):
        how, _ = self.delays.pop(namespace)
        if how == "netem":
            run(["tc", "qdisc", "del", "dev", self.port(namespace), "root"], check=False)
            run(["tc", "-n", namespace, "qdisc", "del", "dev", HOST_IFNAME, "root"], check=False)
            return
        bridge_side, _ = self._delay_ports(namespace)
        run(["ip", "link", "set", bridge_side, "nomaster"], check=False)
        run(["ip", "link", "set", self.port(namespace), "master", self.bridge], check=False)
        how.kill()
        how.wait()
        for stream in (how.stdout, how.stderr):
            stream.close()
        run(["ip", "link", "del", bridge_side], check=False)

    # -- removing -------------------------------------------------------------------------
    def teardown(self):
        """Remove what this network created (processes in its namespaces included), whatever
        state it is in.  Errors are collected and raised at the end, after trying everything."""
        errors = []
        for namespace in list(self.delays):
            try:
                self._undelay(namespace)
            except (ClusterError, OSError) as exc:
                errors.append(str(exc))
        created_links = set()
        for namespace in list(self.hosts):
            try:
                kill_namespace_processes(namespace)
            except ClusterError as exc:
                errors.append(str(exc))
            created_links.add(self.port(namespace))
            run(["ip", "link", "del", self.port(namespace)], check=False)
            run(["ip", "netns", "del", namespace], check=False)
        if self._created_bridge:
            created_links.add(self.bridge)
            run(["ip", "link", "del", self.bridge], check=False)
            self._created_bridge = False
        if self._old_bridge_nf:
            restore_bridge_netfilter(self._old_bridge_nf)
            self._old_bridge_nf = None
        try:
            _wait_gone(created_links, set(self.hosts))
        except ClusterError as exc:
            errors.append(str(exc))
        self.hosts.clear()
        if errors:
            raise ClusterError("; ".join(errors))

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.teardown()
