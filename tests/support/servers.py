"""Real servers for tests, on free loopback ports, always stopped afterwards."""
import contextlib
import os
import signal
import subprocess
import time

from plurksite.services import free_port, memcached_command, nginx_command, wait_for_port


class Memcached:
    """One real memcached process. ``pause()``/``resume()`` freeze it with SIGSTOP/SIGCONT
    (it keeps its entries, like a server behind a network partition); ``kill()``/``start()``
    lose them."""

    def __init__(self, host="127.0.0.1", port=None, memory_mb=32):
        self.host = host
        self.port = port or free_port(host)
        self.memory_mb = memory_mb
        self.process = None

    @property
    def spec(self):
        return f"{self.host}:{self.port}"

    def start(self):
        self.process = subprocess.Popen(memcached_command(self.host, self.port, self.memory_mb),
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.host, self.port, process=self.process, name="memcached")
        return self

    def pause(self):
        """SIGSTOP, and wait until every thread is stopped: kill() returns before delivery, and a
        memcached thread running on the other core could still answer a request sent meanwhile."""
        self.process.send_signal(signal.SIGSTOP)
        pid = self.process.pid
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            states = []
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    with open(f"/proc/{pid}/task/{task}/stat") as fh:
                        states.append(fh.read().rsplit(")", 1)[1].split()[0])
            if states and all(state in ("T", "t") for state in states):
                return
            time.sleep(0.005)
        raise AssertionError(f"memcached {pid} did not stop")

    def resume(self):
        self.process.send_signal(signal.SIGCONT)

    def kill(self):
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
                self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    stop = kill

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()


@contextlib.contextmanager
def memcached_servers(count, host="127.0.0.1", memory_mb=32):
    servers = [Memcached(host, memory_mb=memory_mb) for _ in range(count)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.kill()


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def running(argv, host, port, name, **popen):
    """``argv`` started (``popen``: Popen's keywords; output discarded unless given) until the
    block ends; yields the Popen once ``host:port`` accepts connections."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    proc = subprocess.Popen(argv, **popen)
    try:
        wait_for_port(host, port, process=proc, name=name)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def nginx_conf(directory, http_text, server_text, port, django_port):
    """A minimal nginx.conf in ``directory`` (also its prefix): fastpoll's http part at http level,
    its server part in a server block that proxies everything else to Django on ``django_port``,
    as a project's own site would.  Returns the path."""
    directory = str(directory)
    with open(os.path.join(directory, "fastpoll-http.conf"), "w") as fh:
        fh.write(http_text)
    with open(os.path.join(directory, "fastpoll-server.conf"), "w") as fh:
        fh.write(server_text)
    temps = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    for name in temps:
        os.makedirs(os.path.join(directory, "temp", name), exist_ok=True)
    temp = "".join(f"    {name}_temp_path {directory}/temp/{name};\n" for name in temps)
    conf = os.path.join(directory, "nginx.conf")
    with open(conf, "w") as fh:
        fh.write(f"""worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log warn;
events {{ worker_connections 256; }}
http {{
{temp}    access_log off;
    include {directory}/fastpoll-http.conf;
    server {{
        listen 127.0.0.1:{port};
        proxy_set_header Host $http_host;
        location / {{ proxy_pass http://127.0.0.1:{django_port}; }}
        include {directory}/fastpoll-server.conf;
    }}
}}
""")
    return conf


def nginx_server(conf, prefix, port):
    """A real nginx on ``conf`` (see :func:`nginx_conf`) listening on 127.0.0.1:``port``."""
    return running(nginx_command(str(conf), str(prefix)), "127.0.0.1", port, "nginx")
