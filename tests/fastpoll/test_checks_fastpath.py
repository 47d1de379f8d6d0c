"""fastpoll.W010-W013 (fastpoll/checks_fastpath.py): a real fastpath, started from the command line
fastpoll renders, that lacks a registered resource (per-user or per-object) is named (W010); one
whose secret, cookie name, key prefix or memcached servers are no longer Django's is found by
one poll of an answer Django writes (W011-W013); one that serves them all and agrees, or no
fastpath at all, says nothing."""
import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import checks


from fastpoll import cache, checks_fastpath, commandline, conf
from fastpoll import resources as registry
from plurksite.services import free_port, wait_for_port
from tests.support.servers import memcached_servers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture
def start_fastpath(tmp_path, settings, memcached):
    """start(resources, listen, object_resources=None) -> a fastpath run with ``python -m fastpath``
    as fastpoll.commandline renders it for these settings (object_resources None: the registry's
    per-object resources); stopped after the test."""
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET)
    started = []

    def start(resources, listen, object_resources=None):
        settings.FASTPOLL = dict(settings.FASTPOLL, SECRET_FILE=str(secret), MEMCACHED_SERVERS=[memcached.spec],
                                 FASTPATH_ADDRESS=listen, FASTPATH_WORKERS=1, NOTIFY_DIRS=[],
                                 FASTPATH_ADMIN=f"127.0.0.1:{free_port()}",
                                 EDGE_ADDRESS=None)     # not make run's ports: it may be up meanwhile
        if object_resources is None:
            object_resources = sorted(registry.names(per="object"))
        argv = commandline.fastpath_argv(None, resources, object_resources)
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=open(tmp_path / "fastpath.log", "ab"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        started.append(proc)
        if listen.startswith("unix:"):
            wait_for_port("unix", listen[5:], process=proc, name="fastpath")
        else:
            host, _, port = listen.rpartition(":")
            wait_for_port(host, int(port), process=proc, name="fastpath")
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def w010():
    """W010 as ``manage.py check --deploy`` runs it (FastpollConfig.ready() registers it as a
    deployment check: a plain check never probes what listens on the configured address)."""
    return [m for m in checks.run_checks(tags=[checks_fastpath.TAG], include_deployment_checks=True)
            if m.id == "fastpoll.W010"]


def deploy():
    """(id, message, hint) of everything the running-fastpath check says under ``check --deploy``."""
    return [(m.id, m.msg, m.hint) for m in checks.run_checks(tags=[checks_fastpath.TAG], include_deployment_checks=True)
            if m.id in ("fastpoll.W010", "fastpoll.W011", "fastpoll.W012", "fastpoll.W013")]


PROBE_KEY = r"[A-Za-z0-9_-]+:[A-Za-z0-9_]+:-fastpoll-check-[0-9a-f]{8}-[0-9a-f]+:%d" % (2**63 - 1)


def no_probe_key_left(memcached):
    """No key of a probe's synthetic users stays in memcached (each run's is deleted after)."""
    with socket.create_connection((memcached.host, memcached.port)) as sock:
        sock.sendall(b"lru_crawler metadump all\r\n")
        dump = b""
        while not dump.endswith(b"END\r\n"):
            dump += sock.recv(65536)
    return b"fastpoll-check" not in dump


def test_w010_is_a_deployment_check_only():
    assert checks_fastpath.check_running_fastpath in checks.registry.registry.deployment_checks
    assert checks_fastpath.check_running_fastpath not in checks.registry.registry.registered_checks


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_a_registered_resource_the_running_fastpath_lacks_is_a_warning(start_fastpath, tmp_path, unix):
    users = sorted(registry.names(per="user"))
    assert len(users) >= 2
    listen = f"unix:{tmp_path}/fp.sock" if unix else f"127.0.0.1:{free_port()}"
    start_fastpath(users[:1], listen)
    found = w010()
    assert len(found) == 1 and found[0].level == checks.WARNING
    assert found[0].msg == (f"fastpath at {listen} does not serve the poll resource(s) {', '.join(users[1:])}: "
                            f"nginx sends every poll of them to Django.")
    assert "manage.py fastpoll_fastpath" in found[0].hint


def test_a_registered_per_object_resource_the_running_fastpath_lacks_is_a_warning(start_fastpath):
    """A per-object resource is probed at ``<PATH_PREFIX><name>/<object>``: without
    --object-resources fastpath answers it 404 MISS, and every poll of it goes to Django."""
    users, objects = sorted(registry.names(per="user")), sorted(registry.names(per="object"))
    assert objects
    listen = f"127.0.0.1:{free_port()}"
    start_fastpath(users, listen, object_resources=[])
    [found] = w010()
    assert found.msg == (f"fastpath at {listen} does not serve the poll resource(s) {', '.join(objects)}: "
                         f"nginx sends every poll of them to Django.")
    assert "--object-resources" in found.hint


def test_a_fastpath_that_serves_the_registry_is_no_warning(start_fastpath, settings, memcached):
    start_fastpath(sorted(registry.names(per="user")), f"127.0.0.1:{free_port()}")
    assert deploy() == []
    # the end-to-end probe's key was written, polled and deleted
    assert no_probe_key_left(memcached)


def test_a_fastpath_with_another_secret_is_named_with_the_restart(start_fastpath, settings, tmp_path):
    """`fastpoll_secret --force` without a restart of fastpath: fastpath answers every token
    Django signs with 401 bad signature."""
    listen = f"127.0.0.1:{free_port()}"
    start_fastpath(sorted(registry.names(per="user")), listen)
    newer = tmp_path / "newer.key"
    newer.write_bytes(SECRET[::-1])
    settings.FASTPOLL = dict(settings.FASTPOLL, SECRET_FILE=str(newer))
    [(check_id, msg, hint)] = deploy()
    assert check_id == "fastpoll.W011"
    assert msg == (f"fastpath at {listen} refuses a poll token signed with FASTPOLL['SECRET_FILE'] ({newer}): 401 bad "
                   f"signature, so it answers every poll 401: fastpath's --secret-file is not SECRET_FILE's secret.")
    assert hint.endswith("after `manage.py fastpoll_secret --force`, restart fastpath and every Django process.")


def test_a_fastpath_with_another_cookie_name_is_named(start_fastpath, settings):
    listen = f"127.0.0.1:{free_port()}"
    start_fastpath(sorted(registry.names(per="user")), listen)
    settings.FASTPOLL = dict(settings.FASTPOLL, COOKIE_NAME="site_poll")
    [(check_id, msg, hint)] = deploy()
    assert check_id == "fastpoll.W012"
    assert msg == (f"fastpath at {listen} does not read the poll cookie FASTPOLL['COOKIE_NAME'] ('site_poll'): 401 "
                   f"authentication required, so it answers every browser's poll 401: its --cookie-name differs.")
    assert "--cookie-name site_poll" in hint


def test_a_fastpath_with_another_key_prefix_or_memcached_is_named(start_fastpath, settings, memcached):
    listen = f"127.0.0.1:{free_port()}"
    start_fastpath(sorted(registry.names(per="user")), listen)
    started = dict(settings.FASTPOLL)
    settings.FASTPOLL = dict(started, KEY_PREFIX="other")
    [(check_id, msg, _)] = deploy()
    assert check_id == "fastpoll.W013"
    assert re.fullmatch(
        re.escape(f"fastpath at {listen} does not find the answers Django writes (the probe's key ")
        + "other:" + PROBE_KEY.split(":", 1)[1] + re.escape(
            f", on memcached {memcached.spec}): 404 MISS, so nginx sends every poll to Django: its --key-prefix is not FASTPOLL['KEY_PREFIX'] "
            "('other') or its --memcached servers are not MEMCACHED_SERVERS."), msg)
    with memcached_servers(1) as [another]:
        settings.FASTPOLL = dict(started, MEMCACHED_SERVERS=[another.spec])
        assert [i for i, _, _ in deploy()] == ["fastpoll.W013"]
        assert no_probe_key_left(another)
    settings.FASTPOLL = started
    assert deploy() == []


def test_a_path_prefix_fastpath_does_not_serve_names_every_resource(start_fastpath, settings):
    start_fastpath(sorted(registry.names(per="user")), f"127.0.0.1:{free_port()}")
    settings.FASTPOLL = dict(settings.FASTPOLL, PATH_PREFIX="/api/poll/")
    found = w010()
    assert len(found) == 1 and ", ".join(sorted(registry.names(per="user"))) in found[0].msg


def test_no_fastpath_or_another_server_is_no_warning(settings, tmp_path):
    settings.FASTPOLL = dict(settings.FASTPOLL, FASTPATH_ADDRESS=f"127.0.0.1:{free_port()}")
    assert w010() == []
    settings.FASTPOLL = dict(settings.FASTPOLL, FASTPATH_ADDRESS=f"unix:{tmp_path}/none.sock")
    assert w010() == []
    # a web server that answers 404 to everything, without fastpath's X-Cache: MISS
    other = ThreadingHTTPServer(("127.0.0.1", free_port()), SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        assert checks_fastpath.probe(f"127.0.0.1:{other.server_port}", "/Poll/nothing_here") is None
        settings.FASTPOLL = dict(settings.FASTPOLL, FASTPATH_ADDRESS=f"127.0.0.1:{other.server_port}")
        assert w010() == []
    finally:
        other.shutdown()
        other.server_close()


@contextlib.contextmanager
def trickling_server(seconds):
    """A server that answers any request with a status line, then one byte every 0.05 s for
    ``seconds`` (a wrong FASTPATH_ADDRESS, a sick proxy): yields its address."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn):
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            end = time.monotonic() + seconds
            with contextlib.suppress(OSError):
                while time.monotonic() < end and not stop.is_set():
                    conn.sendall(b"x")
                    time.sleep(0.05)

    def accept():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_a_server_that_trickles_its_answer_costs_one_deadline(settings):
    """The probe's timeout bounds the whole exchange, not each recv: a byte every 0.05 s would
    otherwise keep `check --deploy` waiting for as long as the server likes."""
    with trickling_server(6) as address:
        started = time.monotonic()
        assert checks_fastpath.probe(address, "/Poll/anything") is None
        assert time.monotonic() - started < checks_fastpath.PROBE_TIMEOUT_S + 1
        settings.FASTPOLL = dict(settings.FASTPOLL, FASTPATH_ADDRESS=address)
        started = time.monotonic()
        assert deploy() == []
        assert time.monotonic() - started < checks_fastpath.CHECK_TIMEOUT_S + 1


def test_every_probe_of_a_check_shares_one_deadline():
    """Past the check's deadline no probe waits at all, however many resources there are."""
    with trickling_server(6) as address:
        started = time.monotonic()
        assert checks_fastpath._get(address, "/Poll/x", deadline=time.monotonic() + 0.2) is None
        assert time.monotonic() - started < 1
        started = time.monotonic()
        assert checks_fastpath._get(address, "/Poll/x", deadline=time.monotonic() - 1) is None
        assert time.monotonic() - started < 0.1


def test_checks_run_at_once_probe_keys_of_their_own(start_fastpath, settings, memcached):
    """Several hosts deploying at once run `check --deploy` together: one run's set or delete
    must never land between another's set and poll (a false W013).  Each run's synthetic user
    has a random suffix, and still starts with "-" (no integer or UUID pk's text does)."""
    users = sorted(registry.names(per="user"))
    start_fastpath(users, f"127.0.0.1:{free_port()}")
    uids = {checks_fastpath.probe_uid() for _ in range(100)}
    assert len(uids) == 100 and all(uid.startswith("-fastpoll-check-") for uid in uids)
    config = conf.get_config()
    outcomes = []

    def host():
        try:
            for _ in range(40):
                outcome = checks_fastpath.end_to_end(config, users[0])
                if outcome is not None:
                    outcomes.append(outcome)
        finally:
            cache.close()

    hosts = [threading.Thread(target=host) for _ in range(4)]
    for thread in hosts:
        thread.start()
    for thread in hosts:
        thread.join()
    assert outcomes == []
    assert no_probe_key_left(memcached)


def test_a_server_django_lists_and_fastpath_lacks_is_found(start_fastpath, settings, memcached):
    """One probe key per server of MEMCACHED_SERVERS (fastpoll's own hash places them): a second
    server only Django lists gets one, which fastpath looks for on its one server, 404 MISS.  A
    single probe key would land on the shared server half the time and see nothing."""
    listen = f"127.0.0.1:{free_port()}"
    start_fastpath(sorted(registry.names(per="user")), listen)
    started = dict(settings.FASTPOLL)
    with memcached_servers(1) as [another]:
        settings.FASTPOLL = dict(started, MEMCACHED_SERVERS=[memcached.spec, another.spec])
        for _ in range(8):
            [(check_id, msg, hint)] = deploy()
            assert check_id == "fastpoll.W013"
            assert f", on memcached {another.spec}): 404 MISS" in msg
            assert f"--memcached {memcached.spec},{another.spec}" in hint
        assert no_probe_key_left(memcached) and no_probe_key_left(another)
        # every server of the list gets a key of its own, however many there are
        settings.FASTPOLL = dict(started, MEMCACHED_SERVERS=[f"127.0.0.1:{port}" for port in range(20000, 20064)])
        store = cache.get_cache()
        probes = checks_fastpath._probe_keys(store, lambda uid: f"k:{uid}", checks_fastpath.probe_uid())
        assert sorted(node for _, _, node in probes) == store.nodes and len(probes) == 64
        assert all(store.node_for(key) == node for _, key, node in probes)
        store.close()
    settings.FASTPOLL = started
    assert deploy() == []


def test_a_project_of_per_object_resources_only_is_probed_end_to_end(start_fastpath, settings, memcached,
                                                                    monkeypatch, tmp_path):
    """No per-user resource registered: the probe polls a per-object one, at the object of the
    synthetic user's own id with a capability for it, its key and the user's epoch marker
    written first; fastpath (which needs one --resources name) agrees, then drifts are named."""
    objects = {name: res for name, res in registry._registry.items() if res.per == "object"}
    assert objects
    monkeypatch.setattr(registry, "_registry", objects)
    listen = f"127.0.0.1:{free_port()}"
    start_fastpath(["unregisteredUsers"], listen)
    assert deploy() == []
    assert no_probe_key_left(memcached)
    started = dict(settings.FASTPOLL)
    settings.FASTPOLL = dict(started, KEY_PREFIX="other")
    [(check_id, msg, _)] = deploy()
    assert check_id == "fastpoll.W013" and f"the probe's key other:{sorted(objects)[0]}:-fastpoll-check-" in msg
    newer = tmp_path / "newer.key"
    newer.write_bytes(SECRET[::-1])
    settings.FASTPOLL = dict(started, SECRET_FILE=str(newer))
    assert [i for i, _, _ in deploy()] == ["fastpoll.W011"]
    settings.FASTPOLL = dict(started, COOKIE_NAME="site_poll")
    assert [i for i, _, _ in deploy()] == ["fastpoll.W012"]
    assert no_probe_key_left(memcached)
