"""Long-poll clients for the stack tests (issue 14): plain HTTP/1.1 over asyncio connections, so a
test can keep thousands in flight without a thread each, and a poller that follows the page's
rule (plurkweb/static/.../app.js, pollCount): re-poll at once after an answer fastpath held
(Preference-Applied), after the short-poll interval otherwise (Django's answer: fastpath down),
with a jittered backoff after errors.
"""
import asyncio
import contextlib
import hashlib
import random
import time
import urllib.request

from plurksite.config import format_hostport

QUICK_S = 1.0           # app.js QUICK_MS: a held 304 sooner than this is not trusted to re-poll at once


def etag_of(body):
    """docs/contract.md section 7: the first 32 hex digits of SHA-256 of the body, quoted."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


class Answer:
    def __init__(self, status, headers, body, began, ended):
        self.status, self.headers, self.body = status, headers, body
        self.began, self.ended = began, ended

    @property
    def held(self):
        """fastpath answered it as a long-poll (Django never sends Preference-Applied)."""
        return "preference-applied" in self.headers

    @property
    def cache(self):
        return self.headers.get("x-cache")

    @property
    def etag(self):
        return self.headers.get("etag")

    def __repr__(self):
        return (f"<{self.status} X-Cache={self.cache} held={self.held} etag={self.etag} "
                f"after {self.ended - self.began:.2f}s>")


async def _read_body(reader, status, headers, method):
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                return body
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return await reader.read()


async def fetch(address, path, headers=None, method="GET", body=b"", timeout=120):
    """One request on a new connection (Connection: close); the Answer, or OSError/TimeoutError."""
    host, port = address
    began = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {format_hostport(host, port)}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items() if value is not None]
        if body or method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

        async def answer():
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionResetError("closed before an answer")
            status = int(status_line.split()[1])
            got = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                got[name.strip().lower()] = value.strip()
            return status, got, await _read_body(reader, status, got, method)

        status, got, data = await asyncio.wait_for(answer(), timeout)
        return Answer(status, got, data, began, time.monotonic())
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


class Poller:
    """One page's long-poll loop on ``resource`` with ``token``.  Every answer is kept in
    ``answers`` (``errors`` has the requests that got none); ``etag`` is the ETag of the last
    200/204/304, as the page keeps it."""

    def __init__(self, address, token, resource="getUnreadCount", wait=50, short_s=2.0, etag=None):
        self.address, self.token, self.resource = address, token, resource
        self.wait, self.short_s, self.etag = wait, short_s, etag
        self.answers, self.errors = [], []

    async def once(self):
        headers = {"Authorization": f"Bearer {self.token}", "Prefer": f"wait={self.wait}",
                   "If-None-Match": self.etag}
        answer = await fetch(self.address, f"/Poll/{self.resource}", headers, timeout=self.wait + 60)
        self.answers.append(answer)
        if answer.status in (200, 204, 304) and answer.etag:
            self.etag = answer.etag
        return answer

    def next_delay(self, answer):
        """The page's rule (app.js pollCount): at once after a held answer, unless it was a 304
        that came back too soon to have been held; the short-poll interval otherwise."""
        quick = answer.status == 304 and answer.ended - answer.began < QUICK_S
        return 0 if answer.held and not quick else self.short_s

    async def run(self, stop, first_delay=0.0):
        backoff = 1.0
        try:
            await asyncio.wait_for(stop.wait(), first_delay)
            return
        except asyncio.TimeoutError:
            pass
        while not stop.is_set():
            try:
                answer = await self.once()
            except (OSError, asyncio.TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
                self.errors.append(repr(exc))
                delay, backoff = backoff * random.uniform(0.5, 1.0), min(backoff * 2, 30)
            else:
                backoff = 1.0
                delay = self.next_delay(answer)
            if delay:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except asyncio.TimeoutError:
                    pass


@contextlib.asynccontextmanager
async def polling(pollers, first_delay=lambda: 0.0):
    """The pollers' loops run while the block does (each first waits ``first_delay()`` s); then
    they stop, and a request still held is abandoned, not waited for."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(p.run(stop, first_delay=first_delay())) for p in pollers]
    try:
        yield
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def metrics(config):
    """fastpath's metrics (its admin port), the lines that are not comments: for failure messages."""
    url = f"http://{format_hostport(*config.fastpath_admin)}/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError as exc:
        return f"no metrics: {exc}"
    return " ".join(line for line in text.splitlines() if not line.startswith("#") and "bucket" not in line)


def metric(config, name):
    """One of fastpath's Prometheus metrics (its admin port), as an int."""
    url = f"http://{format_hostport(*config.fastpath_admin)}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return int(float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " "))))


async def wait_held(config, count, timeout=20):
    """Until fastpath holds ``count`` polls and none is still being read (the first compare done)."""
    deadline = time.monotonic() + timeout
    held = inflight = "no answer"
    while True:
        try:
            held = await asyncio.to_thread(metric, config, "fastpath_held_polls")
            inflight = await asyncio.to_thread(metric, config, "fastpath_inflight_requests")
        except OSError:                 # a fastpath just started may not serve /metrics yet
            pass
        else:
            if held == count and inflight == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"fastpath holds {held} polls ({inflight} in flight), not {count}")
        await asyncio.sleep(0.05)
