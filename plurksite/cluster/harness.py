"""``Cluster``: the whole multi-host site on one machine, one network namespace per host.

    with Cluster() as cluster:          # network, PostgreSQL, migrations, every host's services
        cluster.partition("plk-mc2"); ...; cluster.heal("plk-mc2")
        cluster.kill("plk-web1")        # the host dies: every process in its namespace, SIGKILL
        cluster.revive("plk-web1")      # and boots again
        cluster.kill_service("plk-web2", "fastpath")    # its runstack restarts it
        cluster.restart_service("plk-db", "postgres")
        cluster.delay("plk-web2", 20)
        cluster.spawn("plk-client", ["locust", ...])    # stopped with the cluster

Each host runs exactly what a real host of that role would run, with the same command line:
``manage.py runstack`` with the host's PLURK_* variables (topology.hosts()), inside its namespace
(``ip netns exec``), in its own process group, its output in var/cluster/<host>/log/host.log.
The db host runs PostgreSQL (plurksite.cluster.postgres) on its address.  The balancer serves the
site over https (plain HTTP redirects) with a certificate of the cluster's own CA
(plurksite.cluster.tls, made once in var/cluster/tls/ and reused); every host trusts that CA
(SSL_CERT_FILE, REQUESTS_CA_BUNDLE), and so do the harness's probes (``ssl_context()``).

Leaving nothing behind: a start first sweeps what a crashed run left (netns.sweep); the exit of
the with-block, an exception, Ctrl-C or SIGTERM stop the hosts in reverse order (SIGTERM to each
runstack, which stops its children; SIGKILL after a grace period), stop PostgreSQL, then remove
the network, which kills anything still running in a namespace.
"""
import contextlib
import http.client
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import time

from plurksite import config as plurk_config
from plurksite.services import ServiceError, wait_for_port

from . import ClusterError, netns, tls, topology
from .postgres import PostgresCluster

log = logging.getLogger("plurksite.cluster")

READY_LINE = "Press Ctrl-C to stop."        # what runstack prints once all its services answer
PYTHON = sys.executable
MANAGE = os.path.join(plurk_config.ROOT, "manage.py")

# service name -> how its processes look in /proc/<pid>/cmdline (argv as a list of str)
SERVICE_MATCH = {
    "nginx": lambda argv: os.path.basename(argv[0].split()[0]).startswith("nginx"),
    "fastpath": lambda argv: argv[1:3] == ["-m", "fastpath"],
    "gunicorn": lambda argv: any(os.path.basename(a) == "gunicorn" for a in argv[:2]),
    "memcached": lambda argv: os.path.basename(argv[0]) == "memcached",
    "repaircache": lambda argv: "repaircache" in argv[1:3],
    "postgres": lambda argv: os.path.basename(argv[0].split()[0]).rstrip(":") == "postgres",
}


def _cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]


def _die_with_parent():
    import ctypes

    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG


class HostProcess:
    """One long-running process of a host (its runstack, or a stand-in), in its namespace."""

    def __init__(self, host, argv, env, log_path, stop_timeout=25.0):
        self.host = host
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.stop_timeout = stop_timeout    # runstack gives each child 10 s before SIGKILL
        self.process = None
        self.log_offset = 0

    def start(self):
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        with open(self.log_path, "ab", buffering=0) as out:
            self.log_offset = out.tell()
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {self.host.name}: "
                      f"{' '.join(self.argv)}\n".encode())
            self.process = subprocess.Popen(
                netns.exec_prefix(self.host.name) + self.argv, env=self.env, cwd=plurk_config.ROOT,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent)
        return self

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def log_since_start(self):
        with contextlib.suppress(OSError), open(self.log_path, errors="replace") as fh:
            fh.seek(self.log_offset)
            return fh.read()
        return ""

    def wait_line(self, line, timeout):
        """Wait until the process printed ``line``; ClusterError quoting its last words if it
        exits first or does not say it in time."""
        deadline = time.monotonic() + timeout
        while line not in self.log_since_start():
            if not self.alive() or time.monotonic() > deadline:
                said = [ln for ln in self.log_since_start().splitlines() if ln.strip()]
                state = (f"exited with status {self.process.returncode}" if not self.alive()
                         else f"not ready within {timeout:.0f}s")
                raise ClusterError(f"{self.host.name}: `{' '.join(self.argv[-2:])}` {state}: "
                                   f"{said[-1] if said else 'no output'} (see {self.log_path})")
            time.sleep(0.1)

    def stop(self):
        if self.process is None:
            return
        if self.process.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", self.host.name, self.stop_timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self.process = None


class Cluster:
    """The network, the database and every host's services; a context manager."""

    def __init__(self, hosts=None, seed_demo=False, ready_timeout=120.0, say=None):
        self.hosts = list(hosts) if hosts is not None else topology.hosts()
        self.by_name = {h.name: h for h in self.hosts}
        self.seed_demo = seed_demo
        self.ready_timeout = ready_timeout
        self.say = say or (lambda text: log.info("%s", text))
        self.net = None
        self.postgres = None
        self.processes = {}             # host name -> [HostProcess]
        self._old_handlers = {}

    # -- configuration --------------------------------------------------------------------
    def _env(self, host):
        """The caller's environment without its PLURK_* (one source: the topology), plus the
        host's variables; its clients trust the cluster's CA (Python's ssl and curl read
        SSL_CERT_FILE, requests REQUESTS_CA_BUNDLE), as a host with it in its trust store."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLURK_")}
        env.update(host.env)
        env["SSL_CERT_FILE"] = env["REQUESTS_CA_BUNDLE"] = self.ca_file
        env["DJANGO_SETTINGS_MODULE"] = "plurksite.settings"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _log_path(self, host):
        return os.path.join(plurk_config.ROOT, host.var_dir, "log", "host.log")

    def _commands(self, host):
        """The long-running processes of ``host`` (PostgreSQL aside): its runstack, which
        starts the services of its PLURK_ROLES."""
        return [[PYTHON, MANAGE, "runstack"]] if host.stack_roles else []

    @property
    def ca_file(self):
        """The cluster CA's certificate: what a client of the site trusts."""
        return os.path.join(plurk_config.ROOT, topology.CA_FILE)

    def ssl_context(self):
        """A client context that trusts the cluster's CA alone and checks the site's name."""
        return ssl.create_default_context(cafile=self.ca_file)

    def _ensure_certificates(self):
        """The CA, and the site's certificate in each balancer's <var dir>/tls/ (where
        plurksite.nginxconf.site_tls finds it): made once, reused while good."""
        ca_dir = os.path.join(plurk_config.ROOT, topology.CA_DIR)
        tls.ensure_ca(ca_dir)
        for host in self.hosts:
            if "balancer" in host.roles:
                tls.ensure_site(os.path.join(plurk_config.ROOT, host.var_dir, "tls"), ca_dir, topology.site_names())

    def host(self, name):
        try:
            return self.by_name[name]
        except KeyError:
            raise ClusterError(f"no host {name!r}; the cluster has {', '.join(self.by_name)}") from None

    # -- bringing up ----------------------------------------------------------------------
    def start(self):
        netns.require_root()
        netns.require_tools()
        self._install_signal_handlers()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self):
        from fastpoll.secret import ensure_secret

        netns.sweep()
        self.say(f"network: bridge {netns.BRIDGE} {topology.GATEWAY}/{topology.PREFIXLEN}, "
                 f"{len(self.hosts)} namespaces")
        self.net = netns.Network(netns.BRIDGE, topology.GATEWAY, topology.PREFIXLEN).create()
        for host in self.hosts:
            self.net.add_host(host.name, host.address)
            os.makedirs(os.path.join(plurk_config.ROOT, host.var_dir, "log"), exist_ok=True)
        ensure_secret(os.path.join(plurk_config.ROOT, topology.SECRET_FILE))
        self._ensure_certificates()
        db = next((h for h in self.hosts if "postgres" in h.roles), None)
        if db is not None:
            self._start_postgres(db)
            self._migrate(next((h for h in self.hosts if "web" in h.roles), db))
        for host in self.hosts:
            self.start_host(host.name)

    def _start_postgres(self, db):
        self.say(f"{db.name}: PostgreSQL on {db.address}:{topology.POSTGRES_PORT}")
        if self.postgres is None:
            self.postgres = PostgresCluster(
                port=topology.POSTGRES_PORT, host=db.address,
                trust=(f"{topology.SUBNET}.0/{topology.PREFIXLEN}",),
                argv_prefix=netns.exec_prefix(db.name), max_connections=200,
                log_path=os.path.join(plurk_config.ROOT, db.var_dir, "log", "postgres.log"))
        try:
            self.postgres.start()
            self.postgres.create_database(topology.DATABASE, owner=topology.DATABASE)
        except (ServiceError, OSError) as exc:
            raise ClusterError(f"{db.name}: PostgreSQL did not start: {exc}") from None
        except Exception as exc:            # psycopg's errors: not importable before Django's
            raise ClusterError(f"{db.name}: PostgreSQL did not start: {exc}") from None

    def _manage(self, host, *args, timeout=300):
        """``manage.py <args>`` once inside ``host``'s namespace with its environment."""
        proc = self.run_on(host.name, [PYTHON, MANAGE, *args], timeout=timeout)
        if proc.returncode != 0:
            said = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines()
            raise ClusterError(f"{host.name}: `manage.py {' '.join(args)}` failed: "
                               f"{said[-1] if said else f'status {proc.returncode}'}")

    def _migrate(self, host):
        self.say(f"{host.name}: manage.py migrate (once, for the cluster)")
        self._manage(host, "migrate", "--noinput", "-v", "0")
        if self.seed_demo:
            self._manage(host, "seeddemo")

    def start_host(self, name):
        """Start ``name``'s processes and wait until they answer."""
        host = self.host(name)
        if "postgres" in host.roles and self.postgres is not None and not self.postgres.running():
            self._start_postgres(host)
        procs = [HostProcess(host, argv, self._env(host), self._log_path(host)).start()
                 for argv in self._commands(host)]
        self.processes[name] = procs
        for proc in procs:
            if proc.argv[-1] == "runstack":
                proc.wait_line(READY_LINE, self.ready_timeout)
        self._wait_ports(host, procs)
        if procs or "postgres" in host.roles:
            self.say(f"{host.name} ({host.address}) up: {'; '.join(host.listens())}")

    def _wait_ports(self, host, procs):
        checks = []
        if "memcached" in host.roles:
            checks.append((host.address, topology.MEMCACHED_PORT))
        if "web" in host.roles:
            checks.append((host.address, topology.WEB_PORT))
        if "balancer" in host.roles:
            checks += [(host.address, topology.HTTP_PORT), (host.address, topology.HTTPS_PORT)]
        for address, port in checks:
            try:
                wait_for_port(address, port, timeout=self.ready_timeout,
                              process=procs[0].process if procs else None, name=f"{host.name} {address}:{port}")
            except ServiceError as exc:
                raise ClusterError(f"{exc} (see {self._log_path(host)})") from None
            if port != topology.MEMCACHED_PORT:
                self._http_answers(host, address, port)

    def _http_answers(self, host, address, port):
        """nginx at address:port answers a GET (over https, checked against the CA, on
        HTTPS_PORT)."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            conn = (http.client.HTTPSConnection(address, port, timeout=5, context=self.ssl_context())
                    if port == topology.HTTPS_PORT else http.client.HTTPConnection(address, port, timeout=5))
            try:
                conn.request("GET", "/")
                conn.getresponse().read()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ClusterError(f"{host.name}: nginx on {address}:{port} does not answer ({exc})") from None
            finally:
                conn.close()
            time.sleep(0.2)

    def spawn(self, name, argv, log_name=None, env=None):
        """Start ``argv`` inside host ``name`` with the host's environment (plus ``env``; cwd:
        the checkout), output in var/cluster/<host>/log/<log_name or argv's program>.log;
        stopped with the host (kill, or the cluster's exit).  For the client host's locust, or a
        drill's own probe."""
        host = self.host(name)
        log_name = log_name or os.path.basename(argv[0])
        proc = HostProcess(host, list(argv), dict(self._env(host), **(env or {})),
                           os.path.join(plurk_config.ROOT, host.var_dir, "log", f"{log_name}.log")).start()
        self.processes.setdefault(name, []).append(proc)
        return proc

    def run_on(self, name, argv, timeout=300):
        """Run ``argv`` to completion inside host ``name`` with its environment: the
        CompletedProcess (text output captured)."""
        return subprocess.run(netns.exec_prefix(name) + list(argv), env=self._env(self.host(name)),
                              cwd=plurk_config.ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)

    # -- faults ---------------------------------------------------------------------------
    def kill(self, name):
        """The host dies: SIGKILL to every process in its namespace, nothing restarts them."""
        self.host(name)
        for proc in self.processes.get(name, []):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.process.pid, signal.SIGKILL)
        killed = netns.kill_namespace_processes(name, reap_timeout=0)
        for proc in self.processes.pop(name, []):   # our own children: reaped here, not by init
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(timeout=5)
        if "postgres" in self.host(name).roles and self.postgres is not None:
            self.postgres.halt()            # reaps it; the data stays for revive()
        netns.wait_reaped(killed, 2.0)

    def revive(self, name):
        """Boot a killed host again (memcached comes back empty, PostgreSQL recovers)."""
        if any(p.alive() for p in self.processes.get(name, [])):
            raise ClusterError(f"{name} is running; kill() it first")
        self.start_host(name)

    def service_pids(self, name, service):
        """Pids of ``service`` (a SERVICE_MATCH name) in host ``name``'s namespace."""
        self.host(name)
        if service not in SERVICE_MATCH:
            raise ClusterError(f"no service {service!r}; expected one of {', '.join(SERVICE_MATCH)}")
        pids = []
        for pid in netns.namespace_pids(name):
            with contextlib.suppress(OSError):
                argv = _cmdline(pid)
                if argv and SERVICE_MATCH[service](argv):
                    pids.append(pid)
        return pids

    def kill_service(self, name, service):
        """SIGKILL one service's processes in host ``name`` (its runstack restarts it); the
        pids killed."""
        pids = self.service_pids(name, service)
        if not pids:
            raise ClusterError(f"{name} runs no {service}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def restart_service(self, name, service):
        """Stop ``service`` cleanly and start it again; PostgreSQL only (the others' runstack
        restarts them after kill_service)."""
        if service != "postgres" or "postgres" not in self.host(name).roles:
            raise ClusterError(f"restart_service: only postgres on the db host; use kill_service({name!r}, "
                               f"{service!r}) and let runstack restart it")
        self.postgres.halt()
        self._start_postgres(self.host(name))

    def cut_notices(self, name):
        """The notice path to web host ``name`` is cut: every datagram to its UDP notice ports
        is dropped (from the other web hosts and from its own Django); HTTP still flows."""
        host = self.host(name)
        if "web" not in host.roles:
            raise ClusterError(f"cut_notices: {name} is not a web host")
        netns.block_udp(name, host.address, *topology.NOTIFY_PORTS)

    def restore_notices(self, name):
        self.host(name)
        netns.unblock_udp(name)

    def partition(self, name):
        self.host(name)
        self.net.partition(name)

    def heal(self, name):
        self.host(name)
        self.net.heal(name)

    def delay(self, name, ms):
        """Delay frames to and from host ``name`` by ``ms`` each way (0: no delay)."""
        self.host(name)
        self.net.delay(name, ms)

    # -- stopping -------------------------------------------------------------------------
    def stop(self):
        """Stop every host in reverse order, then PostgreSQL, then remove the network; Ctrl-C
        and SIGTERM are held off meanwhile so a second one cannot leave half of it behind."""
        held = self._hold_signals()
        errors = []
        try:
            for host in reversed(self.hosts):
                for proc in reversed(self.processes.pop(host.name, [])):
                    try:
                        proc.stop()
                    except Exception as exc:  # keep stopping the others
                        errors.append(f"{host.name}: {exc}")
            if self.postgres is not None:
                self.postgres.stop()
                self.postgres = None
            if self.net is not None:
                try:
                    self.net.teardown()
                except ClusterError as exc:
                    errors.append(str(exc))
                self.net = None
        finally:
            self._restore_signals(held)
            self._restore_signal_handlers()
        if errors:
            raise ClusterError("; ".join(errors))

    # -- signals --------------------------------------------------------------------------
    @staticmethod
    def _main_thread():
        return threading.current_thread() is threading.main_thread()

    def _install_signal_handlers(self):
        """SIGTERM and SIGHUP end the with-block as Ctrl-C does (KeyboardInterrupt), so all clean
        up; SIGINT too, even when it came ignored (a background job of a script)."""
        if not self._main_thread():
            return

        def interrupt(signum, _frame):
            raise KeyboardInterrupt(f"signal {signum}")

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, interrupt)

    def _restore_signal_handlers(self):
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    def _hold_signals(self):
        if not self._main_thread():
            return {}
        return {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    @staticmethod
    def _restore_signals(held):
        for sig, handler in held.items():
            signal.signal(sig, handler)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
