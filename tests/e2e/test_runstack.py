"""`manage.py runstack` as an operator runs it: refuses bad starts with one line, serves, and
leaves no process behind on SIGTERM."""
import os
import signal
import socket
import sys
import time

import pytest
import requests

from plurksite import services
from tests.support.stack import manage, output_until, stack_config, start_runstack

pytestmark = pytest.mark.slow


def _descendants(pid):
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent and int(entry) not in found:
                found.add(int(entry))
                frontier.append(int(entry))
    return found


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_refuses_a_port_in_use(tmp_path):
    config = stack_config(tmp_path)
    manage(config, "migrate", "--noinput", "-v", "0")
    with socket.socket() as holder:
        holder.bind(config.http)
        holder.listen()
        proc = start_runstack(config)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = [ln for ln in out.splitlines() if "in use" in ln]
    assert lines and "PLURK_HTTP" in lines[0], out


def test_refuses_invalid_config(tmp_path):
    config = stack_config(tmp_path)
    proc = start_runstack(config, extra_env={"PLURK_HTTP": "nonsense"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "PLURK_HTTP='nonsense'" in out and "host:port" in out


def test_refuses_missing_binary(tmp_path):
    config = stack_config(tmp_path)
    manage(config, "migrate", "--noinput", "-v", "0")
    bindir = os.path.dirname(sys.executable)
    proc = start_runstack(config, extra_env={"PATH": bindir})   # memcached (/usr/bin) is not on this PATH
    out, _ = proc.communicate(timeout=60)
    # nginx is still found in /usr/sbin (find_binary looks there too); memcached is not
    assert proc.returncode == 1, out
    assert "memcached not found (apt-get install memcached" in out


def test_serves_then_stops_everything_on_sigterm(tmp_path):
    config = stack_config(tmp_path)
    manage(config, "migrate", "--noinput", "-v", "0")
    proc = start_runstack(config)
    try:
        output = output_until(proc, "The stack is up", 60)
        assert "The stack is up" in output, output
        resp = requests.get(config.base_url + "/Poll/getUnreadCount", timeout=5)
        assert resp.status_code == 401
        children = _descendants(proc.pid)
        assert len(children) >= 5          # memcached, gunicorn(+workers), fastpath, nginx(+worker)
        # A stopped child must not block shutdown either.
        os.kill(sorted(children)[0], signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0
        time.sleep(0.5)
        assert [pid for pid in children if _alive(pid)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_nginx_t_failure_is_one_line_naming_the_problem(tmp_path):
    """What runstack does with the rendered file: `nginx -t`, and nginx's own complaint."""
    from plurksite import nginxconf, services

    config = stack_config(tmp_path)
    conf = nginxconf.render(config, worker_processes=1)
    with open(conf, "a") as fh:
        fh.write("\nhttp { no_such_directive on; }\n")
    with pytest.raises(services.ServiceError) as err:
        services.nginx_test(conf, config.var_dir)
    message = str(err.value)
    assert message.startswith(f"nginx rejects {conf}:") and "\n" not in message
    assert "[emerg]" in message


def test_refuses_a_socket_nginx_workers_cannot_reach(tmp_path):
    """The issue's case: fastpath's socket in a 0700 directory (as root, nginx's workers are
    nobody) used to start cleanly and send every poll to Django.  Now: one line naming the
    directory and the chmod, before anything is started."""
    import tempfile

    closed = tempfile.mkdtemp(prefix="plurk-closed-")           # 0700, root's when run as root
    if os.geteuid() != 0:
        os.chmod(closed, 0o600)                                 # closed to the invoking user too
    config = stack_config(tmp_path, PLURK_FASTPATH=f"unix:{closed}/fp.sock")
    proc = start_runstack(config)
    try:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1, out
        errors = [ln for ln in out.splitlines() if "PLURK_FASTPATH" in ln]
        assert len(errors) == 1, out
        assert f"cannot search {closed} (drw" in errors[0]
        assert f"chmod {'o' if os.geteuid() == 0 else 'u'}+x {closed}" in errors[0], errors[0]
        assert "set PLURK_FASTPATH to" in errors[0]
        assert not os.path.exists(f"{closed}/fp.sock")
        # nothing was started, so nothing is left
        ports = [config.http, config.django, config.fastpath_admin, *config.memcached]
        assert [hp for hp in ports if services.accepts(*hp)] == []
        assert _processes_mentioning(config.var_dir) == []
    finally:
        if proc.poll() is None:          # it started after all: stop it and what it started
            proc.terminate()
            proc.wait(timeout=60)
        os.chmod(closed, 0o700)
        os.rmdir(closed)


def _processes_mentioning(text):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append((int(entry), cmdline))
    return found
