"""Real servers for tests, on free loopback ports, always stopped afterwards."""
import contextlib
import os
import signal
import subprocess
import time

from plurksite.services import free_port, memcached_command, wait_for_port


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
