"""fastpath's interfaces (issue 4 item 6): ``python -m fastpath`` with --help, its exit statuses
and one-line errors (docs/fastpath.md, CLI), and ``fastpath.serve(...)`` from Python."""
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
import requests
from pymemcache.client.hash import HashClient

import fastpath
import fastpath._server  # noqa: F401  (a build that does not import fails here, never skips)
from fastpath import activation
from fastpath.options import OPTIONS
from plurksite.services import free_port, wait_for_port
from tests.fastpath.conftest import RESOURCES, SECRET, asan_reports, fastpath_env, python_script, token

FLAGS = [opt.flag for opt in OPTIONS]


def _run(tmp_path, *args, timeout=30, resources=RESOURCES):
    """``python -m fastpath args`` (after ``--resources resources``, unless None)."""
    env, cwd = fastpath_env(tmp_path)
    given = ["--resources", resources] if resources is not None else []
    done = subprocess.run([sys.executable, "-m", "fastpath", *given, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    asan_reports(tmp_path)
    return done


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret.key"
    path.write_bytes(SECRET + b"\n")
    return path


def _one_error_line(done, code):
    """The run exited with code, printed nothing on stdout and exactly one line on stderr."""
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_help_lists_every_flag(tmp_path):
    done = _run(tmp_path, "--help")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: python -m fastpath")
    for flag in FLAGS:
        assert flag in done.stdout, flag


def test_help_says_what_each_listener_answers(tmp_path):
    """--help is true of both listeners: behind nginx a poll left to Django is 404 (503 when
    memcached fails) X-Cache: MISS; the edge sends the client to the site with 409 and refuses
    a head it cannot read with 431 (docs/contract.md section 10; tests/fastpath/test_edge.py)."""
    text = " ".join(_run(tmp_path, "--help").stdout.split())      # undo argparse's wrapping
    options = re.split(r" (?=--[a-z][a-z-]* [A-Z][A-Z_]* )", text[text.index("options:"):])
    helps = {entry.split()[0]: entry for entry in options[1:]}
    description = text[text.index("Answer GET"):text.index("options:")]
    assert "404 X-Cache: MISS" in description and "503" in description
    assert '--edge' in description and '409 {"retry":"site"}' in description and "431" in description
    assert "503 X-Cache: MISS on --listen" in helps["--timeout-ms"], helps["--timeout-ms"]
    assert '409 {"retry":"site"} on --edge' in helps["--timeout-ms"], helps["--timeout-ms"]
    assert "404 X-Cache: MISS on --listen" in helps["--max-headers"], helps["--max-headers"]
    assert "431 on --edge" in helps["--max-headers"], helps["--max-headers"]
    assert "404 not found on --edge" in helps["--resources"], helps["--resources"]
    assert helps["--resources"].startswith("--resources RESOURCES required"), helps["--resources"]
    assert "default" not in helps["--resources"], helps["--resources"]


@pytest.mark.parametrize("args, complaint", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--workers", "many"], "argument --workers: invalid int value: 'many'"),
    (["--backend", "kqueue"], "argument --backend: invalid choice: 'kqueue'"),
    (["--listen"], "argument --listen: expected one argument"),
    # checked after parsing (ConfigurationError), reported the same way
    (["--timeout-ms", "0"], "--timeout-ms must be in 1..60000, got 0"),
    (["--listen", "nowhere"], "bad --listen 'nowhere': expected host:port"),
    (["--admin", "10.1.2.3:8002"], "--admin must be a loopback address"),
    (["--listen", "127.0.0.1:²"], "bad --listen '127.0.0.1:²': expected host:port"),
    (["--admin", "127.0.0.1:²"], "bad --admin '127.0.0.1:²': expected host:port"),
    (["--memcached", "127.0.0.1:²"], "bad --memcached server '127.0.0.1:²': expected host:port"),
    (["--listen", "localhost:18001", "--admin", "127.0.0.1:18001"],
     "--admin 127.0.0.1:18001 is the address of --listen localhost:18001; give --admin another port"),
    (["--cookie-name", "plurk token"], "bad --cookie-name 'plurk token': 1-64 RFC 6265 token characters"),
    (["--path-prefix", "Poll/"], "bad --path-prefix 'Poll/': at most 64 characters, starting and ending with /"),
    (["--key-prefix", "p1:x"], "bad --key-prefix 'p1:x': 1-16 letters, digits, _ or -"),
    # 107 bytes relative, more once made absolute (as it is bound)
    (["--listen", "unix:" + "s" * 107], "unix:<path of at most 107 bytes>"),
])
def test_bad_flags_exit_2_with_usage(tmp_path, secret_file, args, complaint):
    done = _run(tmp_path, "--secret-file", str(secret_file), *args)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("usage: python -m fastpath")
    assert lines[-1].startswith("python -m fastpath: error: ") and complaint in lines[-1], done.stderr


def test_missing_secret_file_exits_1_naming_it(tmp_path):
    missing = tmp_path / "nope" / "secret.key"
    line = _one_error_line(_run(tmp_path, "--secret-file", str(missing)), 1)
    assert line == f"fastpath: error: cannot read secret file {missing}: No such file or directory"


def test_secret_file_is_required_even_with_var_secret_key_in_the_current_directory(tmp_path):
    """No default path: fastpath never reads a secret it was not given (a file relative to
    wherever it starts, the demo's var/secret.key, was the default)."""
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "secret.key").write_bytes(SECRET + b"\n")
    env, tree = fastpath_env(tmp_path)
    env["PYTHONPATH"] = str(tree)                          # the tree's fastpath, run elsewhere
    # a --listen that cannot bind: a fastpath that takes var/secret.key fails at once, not serves
    done = subprocess.run([sys.executable, "-m", "fastpath", "--listen", f"unix:{tmp_path}/no/such/dir/fp.sock"],
                          cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines()[-1] == (
        "python -m fastpath: error: --secret-file is required: the file of the secret shared with "
        "Django (`manage.py fastpoll_fastpath` prints fastpath's whole command line)"), done.stderr
    with pytest.raises(fastpath.ConfigurationError, match="^--secret-file is required"):
        fastpath.Options().validate()


_RESOURCES_REQUIRED = ("python -m fastpath: error: --resources is required: the per-user poll resources to "
                       "serve, e.g. the line `manage.py fastpoll_fastpath` prints")


def test_resources_are_required(tmp_path, secret_file):
    """No default list (it was the demo's getMessages,getUnreadCount): without --resources or
    --object-resources fastpath exits 2 naming the fix, before it listens anywhere."""
    done = _run(tmp_path, "--secret-file", str(secret_file), "--listen", f"unix:{tmp_path}/no/such/dir/fp.sock",
                resources=None)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines()[-1] == _RESOURCES_REQUIRED, done.stderr
    assert not [line for line in done.stderr.splitlines() if not line.startswith(("usage:", " ", "python -m"))]
    for empty in (None, "", ",", ()):
        with pytest.raises(fastpath.ConfigurationError, match="^--resources is required: "):
            fastpath.Options(secret=SECRET, resources=empty).validate()
    with pytest.raises(fastpath.ConfigurationError, match="^--resources is required: "):
        fastpath.serve(secret=SECRET)
    assert not hasattr(fastpath, "DEFAULT_RESOURCES") and "DEFAULT_RESOURCES" not in fastpath.__all__
    # per-object resources alone are a whole configuration
    assert fastpath.Options(secret=SECRET, object_resources="thread").validate().resources is None
    with pytest.raises(fastpath.ConfigurationError, match="^--resources takes at most 16 names"):
        fastpath.Options(secret=SECRET, resources=[f"r{i}" for i in range(17)]).validate()


def test_secret_file_that_is_a_directory_exits_1(tmp_path):
    line = _one_error_line(_run(tmp_path, "--secret-file", str(tmp_path)), 1)
    assert line == f"fastpath: error: cannot read secret file {tmp_path}: Is a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_secret_file_exits_1(tmp_path, secret_file):
    secret_file.chmod(0)
    line = _one_error_line(_run(tmp_path, "--secret-file", str(secret_file)), 1)
    assert line == f"fastpath: error: cannot read secret file {secret_file}: Permission denied"


@pytest.mark.parametrize("content, length", [(b"short\n", 5), (b" \n\t\n", 0), (b"x" * 31, 31)])
def test_too_short_secret_exits_1(tmp_path, content, length):
    path = tmp_path / "short.key"
    path.write_bytes(content)
    line = _one_error_line(_run(tmp_path, "--secret-file", str(path)), 1)
    assert line == f"fastpath: error: secret file {path} must hold 32..1024 bytes, has {length}"


@pytest.mark.parametrize("flag", ["--listen", "--admin"])
def test_port_in_use_exits_1(tmp_path, secret_file, flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        ports = {"--listen": free_port(), "--admin": free_port(), flag: port}
        started = time.monotonic()
        line = _one_error_line(_run(tmp_path, "--secret-file", str(secret_file), "--memcached", "127.0.0.1:1",
                                    "--listen", f"127.0.0.1:{ports['--listen']}",
                                    "--admin", f"127.0.0.1:{ports['--admin']}"), 1)
    assert line == f"fastpath: error: {flag} 127.0.0.1:{port} is already in use"
    assert time.monotonic() - started < 10


def test_notify_dir_too_long_for_a_socket_exits_2_and_makes_nothing(tmp_path, secret_file):
    """Refused before the directory is made, not by each worker in a restart loop."""
    notify_dir = tmp_path / ("n" * 100)
    started = time.monotonic()
    done = _run(tmp_path, "--secret-file", str(secret_file), "--listen", f"127.0.0.1:{free_port()}",
                "--notify-dir", str(notify_dir))
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"python -m fastpath: error: --notify-dir {notify_dir}: "
                                                   f"worker 0's socket <dir>/0.sock is ")
    assert not notify_dir.exists()
    assert time.monotonic() - started < 10


def test_unix_socket_error_without_strerror_names_the_reason(tmp_path):
    """An OSError of the socket module may carry no errno (a path too long for sun_path):
    its message, never 'None'."""
    path = str(tmp_path / ("s" * 200))
    with pytest.raises(fastpath.FastpathError) as info:
        activation.unix_listen_socket(path)
    assert str(info.value) == f"cannot listen on unix:{path}: AF_UNIX path too long"


def test_serve_rejects_bad_options_before_starting_anything(tmp_path):
    with pytest.raises(fastpath.ConfigurationError, match="--workers must be in 0..256, got -1"):
        fastpath.serve(workers=-1, secret=SECRET)
    with pytest.raises(fastpath.ConfigurationError, match="secret must be 32..1024 bytes"):
        fastpath.serve(secret=b"short", resources="getMessages")
    with pytest.raises(fastpath.FastpathError, match="cannot read secret file"):
        fastpath.serve(secret_file=str(tmp_path / "missing.key"), resources="getMessages")
    with pytest.raises(fastpath.FastpathError, match=r"cannot resolve 'nohost.invalid' \(.*\); give a "
                                                     r"numeric address such as 127.0.0.1:11211"):
        fastpath.serve(memcached=["127.0.0.1:11211", "nohost.invalid:11211"], secret=SECRET, resources="getMessages")


def test_serve_from_python_answers_a_poll_and_stops_cleanly(tmp_path, memcached, secret_file):
    """fastpath.serve(...) runs in the foreground until SIGTERM (it forks workers and installs
    signal handlers, so it runs in a process of its own here), then returns.  The memcached
    server is given by host name, as Django may name it."""
    port, admin = free_port(), free_port()
    spec = f"localhost:{memcached.port}"
    HashClient([spec], default_noreply=False).set("p1:getMessages:5:0", b'{"from":"serve"}')
    script = (
        "import fastpath\n"
        f"fastpath.serve(listen='127.0.0.1:{port}', memcached=['{spec}'],\n"
        f"               secret_file={str(secret_file)!r}, workers=2, admin='127.0.0.1:{admin}',\n"
        "               resources='getMessages,getUnreadCount')\n"
        "print('serve returned', flush=True)\n")
    with python_script(tmp_path, script) as proc:
        wait_for_port("127.0.0.1", port, process=proc, name="fastpath.serve")
        resp = requests.get(f"http://127.0.0.1:{port}/Poll/getMessages", timeout=5,
                            headers={"Authorization": f"Bearer {token(5)}"})
        assert resp.status_code == 200 and resp.json() == {"from": "serve"}
        metrics = requests.get(f"http://127.0.0.1:{admin}/metrics", timeout=5).text
        assert "fastpath_workers 2" in metrics
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert out == "serve returned\n"
    assert err.rstrip().endswith("stopped"), err
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 0)
        raise AssertionError("a worker outlived serve()")
    with socket.socket() as again:                # the port is free again
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
    asan_reports(tmp_path)


def test_memcached_host_names_are_resolved_at_start_and_hashed_as_written(fastpath_factory, memcached3):
    """--memcached localhost:P,...: C connects to the address the name resolves to, and keys are
    mapped over the names as written, as pymemcache (Django's side) maps them."""
    named = [types.SimpleNamespace(spec=f"localhost:{m.port}") for m in memcached3]
    client = HashClient([n.spec for n in named], default_noreply=False)
    for uid in range(1, 31):
        client.set(f"p1:getMessages:{uid}:0", b'{"uid":%d}' % uid)
    fp = fastpath_factory(named)
    with requests.Session() as session:
        for uid in range(1, 31):
            resp = session.get(f"{fp.url}/Poll/getMessages", timeout=5,
                               headers={"Authorization": f"Bearer {token(uid)}"})
            assert (resp.status_code, resp.json()) == (200, {"uid": uid}), uid


def test_memcached_host_name_that_does_not_resolve_exits_1_naming_the_fix(tmp_path, secret_file):
    line = _one_error_line(_run(tmp_path, "--secret-file", str(secret_file),
                                "--memcached", "127.0.0.1:11211,nohost.invalid:11311"), 1)
    assert line.startswith("fastpath: error: --memcached server nohost.invalid:11311: cannot resolve "
                           "'nohost.invalid' ("), line
    assert line.endswith("); give a numeric address such as 127.0.0.1:11311"), line


def test_options_take_server_lists_as_on_the_command_line_or_as_sequences():
    """fastpath.Options has typed fields, and a comma-separated string is split the way
    --memcached and --resources are (never iterated character by character)."""
    a = fastpath.Options(memcached="127.0.0.1:11211,127.0.0.1:11212", resources="getMessages",
                         secret=SECRET).validate()
    b = fastpath.Options(memcached=["127.0.0.1:11211", "127.0.0.1:11212"], resources=("getMessages",),
                         secret=SECRET).validate()
    assert a.node_names == b.node_names == ["127.0.0.1:11211", "127.0.0.1:11212"]
    assert a.resources == b.resources == ("getMessages",)
    with pytest.raises(TypeError):
        fastpath.Options(workers="2")


def test_serve_refuses_to_run_outside_the_main_thread():
    import threading
    errors = []

    def run():
        try:
            fastpath.serve(secret=SECRET, listen="127.0.0.1:1", resources="getMessages")
        except fastpath.FastpathError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert len(errors) == 1 and isinstance(errors[0], fastpath.ConfigurationError)
    assert str(errors[0]) == "fastpath.serve() must run in the main thread"
