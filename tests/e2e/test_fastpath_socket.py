"""How nginx reaches fastpath: by default over a unix socket under PLURK_VAR_DIR, TCP when asked,
and never silently not at all: the runner proves at start that a poll through nginx is answered
by fastpath itself, not by Django after a fallback."""
import os
import tempfile
import time

import pytest

from plurksite.config import StackConfig, format_hostport
from plurksite.services import ServiceError, accepts
from tests.support.stack import TestStack, stack_config

pytestmark = pytest.mark.slow


@pytest.fixture
def open_var_dir():
    """A var dir nginx's workers (nobody, when run as root) can search; pytest's tmp_path is
    under a 0700 directory.  Removed afterwards."""
    path = tempfile.mkdtemp(prefix="plurk-var-")
    os.chmod(path, 0o755)
    yield path
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def _log_lines(path, wanted, timeout=5.0):
    """Lines of a (buffered) nginx log that contain every string in ``wanted``."""
    deadline = time.monotonic() + timeout
    while True:
        with open(path) as fh:
            lines = [ln for ln in fh if all(w in ln for w in wanted)]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def _hit(stack):
    """A follows nobody, B follows A and A posts: B's poll is a fastpath HIT."""
    name_a, token_a = stack.signup("a")
    _, token_b = stack.signup("b")
    assert stack.api("POST", "/api/follow", token_b, json={"username": name_a}).status_code in (200, 201)
    assert stack.api("POST", "/api/plurks", token_a, json={"content": "over the socket"}).status_code == 201
    deadline = time.monotonic() + 10
    while True:
        resp = stack.poll("getUnreadCount", token_b)
        if resp.headers.get("X-Cache") == "HIT" or time.monotonic() > deadline:
            return resp
        time.sleep(0.1)


def test_default_stack_polls_reach_fastpath_over_a_unix_socket(open_var_dir):
    env = stack_config(open_var_dir).to_env()
    del env["PLURK_FASTPATH"]                          # the default
    config = StackConfig.from_env(env)
    sock = os.path.join(open_var_dir, "run", "fastpath.sock")
    assert config.fastpath == ("unix", sock)
    old_umask = os.umask(0o077)                        # the runner's directory is 0755 regardless
    try:
        stack = TestStack(config, nginx_workers=1).start()
    finally:
        os.umask(old_umask)
    try:
        assert oct(os.stat(os.path.dirname(sock)).st_mode & 0o777) == "0o755"
        resp = _hit(stack)
        assert resp.status_code == 200 and resp.headers["X-Cache"] == "HIT" and resp.json() == {"count": 1}
        access = os.path.join(config.log_dir(), "nginx-access.log")
        assert _log_lines(access, ['"GET /Poll/getUnreadCount HTTP/1.1" 200',
                                   f"upstream=unix:{sock} ustatus=200", "cache=HIT"])
    finally:
        stack.stop()
    assert not os.path.exists(sock)


def test_tcp_is_still_supported_and_proven_at_start(stack):
    """The session stack runs fastpath on a loopback port (tests/support/stack.py)."""
    host, port = stack.config.fastpath
    assert host == "127.0.0.1" and isinstance(port, int)
    probe = os.path.join(stack.config.log_dir(), "nginx-probe.log")
    want = f"upstream={format_hostport(host, port)} ustatus=401 "
    assert _log_lines(probe, ["/Poll/", "plurk_probe=", want])
    assert _hit(stack).headers["X-Cache"] == "HIT"


class _UncheckedStack(TestStack):
    """The runner without its static check: what used to start and degrade in silence."""

    @staticmethod
    def _prepare_socket(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)


def test_a_stack_whose_polls_fall_back_to_django_refuses_to_start(open_var_dir):
    """Past the static check (here skipped), the proof: nginx's workers get "Permission denied"
    on the socket, every poll would be Django's; start() stops everything and says so."""
    if os.geteuid() != 0:
        pytest.skip("a directory fastpath can bind in but nginx's workers cannot search needs two users")
    closed = os.path.join(open_var_dir, "closed")
    os.mkdir(closed)
    os.chmod(closed, 0o700)
    config = stack_config(open_var_dir, PLURK_FASTPATH=f"unix:{closed}/fp.sock")
    stack = _UncheckedStack(config, nginx_workers=1)
    with pytest.raises(ServiceError) as err:
        stack.start()
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"polls through nginx do not reach fastpath at unix:{closed}/fp.sock: "
                              f"a poll without a token got 401 from upstream unix:{closed}/fp.sock : ")
    assert "so every poll would fall back to Django" in message
    assert f"connect() to unix:{closed}/fp.sock failed (13: Permission denied)" in message
    assert f"cannot search {closed} (drwx------ root:root): chmod o+x {closed}" in message
    # everything it started is stopped
    assert all(svc.process is None for svc in stack.services)
    assert [hp for hp in (config.http, config.django, *config.memcached) if accepts(*hp)] == []


class _StackWithoutFastpath(TestStack):
    """nginx pointed at a fastpath that is not there: every poll is Django's."""

    def build(self):
        return [svc for svc in super().build() if svc.name != "fastpath"]


def test_over_tcp_too_a_stack_whose_polls_fall_back_refuses_to_start(tmp_path):
    config = stack_config(tmp_path)
    stack = _StackWithoutFastpath(config, nginx_workers=1)
    with pytest.raises(ServiceError) as err:
        stack.start()
    fastpath = format_hostport(*config.fastpath)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"polls through nginx do not reach fastpath at {fastpath}: a poll without a "
                              f"token got 401 from upstream {fastpath} : ")
    assert "(nginx: connect() failed (111: Connection refused) while connecting to upstream)" in message
    assert message.endswith("; fix that")
    assert [hp for hp in (config.http, config.django, *config.memcached) if accepts(*hp)] == []
