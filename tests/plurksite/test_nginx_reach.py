"""Whether nginx's workers can reach fastpath's unix socket, asked as they would ask: as root the
runner renders `user nobody nogroup;`, so the check runs as that user (plurksite/nginxconf.py)."""
import os
import socket
import tempfile

import pytest

from plurksite import nginxconf
from plurksite.config import StackConfig

ROOT_RUN = os.geteuid() == 0


@pytest.fixture
def open_dir():
    """A directory anyone can search (pytest's tmp_path is 0700, which nobody cannot)."""
    path = tempfile.mkdtemp(prefix="plurk-reach-")
    os.chmod(path, 0o755)
    yield path
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o700)
            os.rmdir(os.path.join(dirpath, name))
    os.rmdir(path)


def test_the_worker_user_is_the_one_rendered():
    who = nginxconf.worker_user()
    directive = nginxconf._user_directive()
    if ROOT_RUN:
        assert who[0] == "nobody" and directive.startswith("user nobody")
    else:
        assert who is None and directive.startswith("#")


def test_a_searchable_path_is_reachable(open_dir):
    os.mkdir(os.path.join(open_dir, "run"), 0o755)
    assert nginxconf.unreachable_socket(os.path.join(open_dir, "run", "fastpath.sock")) is None


def test_a_closed_directory_is_named_with_its_chmod(open_dir):
    """0700 (root's) is closed to nobody; as another user, a directory without x is closed to
    the user himself."""
    closed = os.path.join(open_dir, "closed")
    os.mkdir(closed, 0o700 if ROOT_RUN else 0o600)
    os.chmod(closed, 0o700 if ROOT_RUN else 0o600)
    why = nginxconf.unreachable_socket(os.path.join(closed, "run", "fastpath.sock"))
    user = "nobody" if ROOT_RUN else None
    assert why is not None and why.startswith("nginx's workers (user ")
    if user:
        assert why.startswith(f"nginx's workers (user {user}) ")
    assert f"cannot search {closed} (drw" in why
    assert why.endswith(f"chmod {'o' if ROOT_RUN else 'u'}+x {closed}")


@pytest.mark.skipif(not ROOT_RUN, reason="the socket's owner is the worker user when not root")
def test_a_socket_nobody_may_write_is_named(open_dir):
    path = os.path.join(open_dir, "fastpath.sock")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(path)
        os.chmod(path, 0o600)
        assert nginxconf.unreachable_socket(path, with_socket=False) is None   # before fastpath makes it
        why = nginxconf.unreachable_socket(path)
        assert why == f"nginx's workers (user nobody) cannot write {path} (srw------- root:root): chmod o+w {path}"
        os.chmod(path, 0o666)
        assert nginxconf.unreachable_socket(path) is None


def test_rendered_config_names_the_socket_and_logs_the_probe(open_dir):
    config = StackConfig.from_env({"PLURK_VAR_DIR": open_dir,
                                   "PLURK_FASTPATH": f"unix:{open_dir}/run/fastpath.sock"})
    text = open(nginxconf.render(config)).read()
    assert f"server unix:{open_dir}/run/fastpath.sock max_fails=0;" in text
    assert f"access_log {open_dir}/log/nginx-probe.log plurk if=$plurk_probe;" in text
