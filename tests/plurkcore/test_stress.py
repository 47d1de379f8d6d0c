"""Real concurrency, not forced: gunicorn workers, the repaircache service and a memcached that
freezes for a while, hammered from threads; afterwards `checkcache` must find no difference."""
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import requests

from plurksite.services import free_port, wait_for_port

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANAGE = os.path.join(ROOT, "manage.py")


@pytest.fixture
def site(tmp_path, memcached):
    port = free_port()
    # the PostgreSQL run's own "plurk" database (tests use test_plurk), else a fresh SQLite file
    pg = os.environ.get("PLURK_TEST_POSTGRES") and os.environ.get("PLURK_DATABASE_URL")
    env = dict(os.environ, PLURK_DATABASE_URL=pg or f"sqlite:///{tmp_path}/stress.sqlite3",
               PLURK_SECRET_FILE=str(tmp_path / "secret.key"), PLURK_VAR_DIR=str(tmp_path),
               PLURK_MEMCACHED=memcached.spec, DJANGO_SETTINGS_MODULE="plurksite.settings")
    subprocess.run([sys.executable, MANAGE, "migrate", "-v", "0"], env=env, check=True, timeout=120)
    procs = [
        subprocess.Popen([sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", "3",
                          "--log-level", "warning", "plurksite.wsgi"], env=env, cwd=ROOT,
                         stderr=open(tmp_path / "gunicorn.log", "wb")),
        subprocess.Popen([sys.executable, MANAGE, "repaircache", "--loop", "--interval", "0.2"], env=env,
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "repair.log", "wb")),
    ]
    try:
        wait_for_port("127.0.0.1", port, process=procs[0], name="gunicorn")
        yield f"http://127.0.0.1:{port}", env, memcached
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)


def test_concurrent_traffic_with_a_frozen_memcached_leaves_no_difference(site):
    base, env, memcached = site
    names = [f"s{i}" for i in range(6)]
    tokens = {}
    for name in names:
        resp = requests.post(base + "/api/signup", json={"username": name, "password": "secret-pass-1"}, timeout=10)
        assert resp.status_code == 201
        tokens[name] = resp.json()["token"]
    plurk_ids = []
    errors = []
    stop = time.monotonic() + 4.0

    def worker(name, seed):
        rnd = random.Random(seed)
        session = requests.Session()
        token = tokens[name]
        while time.monotonic() < stop:
            headers = {"Authorization": f"Bearer {token}"}
            action = rnd.random()
            try:
                if action < 0.2:
                    r = session.post(base + "/api/plurks", json={"content": f"{name} {rnd.random()}"},
                                     headers=headers, timeout=10)
                    if r.status_code == 201:
                        plurk_ids.append(r.json()["id"])
                elif action < 0.35 and plurk_ids:
                    r = session.post(base + f"/api/plurks/{rnd.choice(plurk_ids)}/responses",
                                     json={"content": "re"}, headers=headers, timeout=10)
                elif action < 0.45:
                    r = session.post(base + "/api/follow", json={"username": rnd.choice(names)},
                                     headers=headers, timeout=10)
                elif action < 0.5:
                    r = session.delete(base + f"/api/follow/{rnd.choice(names)}", headers=headers, timeout=10)
                elif action < 0.6 and plurk_ids:
                    r = session.post(base + "/api/markRead", json={"upto": rnd.choice(plurk_ids)},
                                     headers=headers, timeout=10)
                elif action < 0.62:
                    r = session.post(base + "/api/logout", headers=headers, timeout=10)
                    r2 = session.post(base + "/api/login", json={"username": name, "password": "secret-pass-1"},
                                      timeout=10)
                    token = tokens[name] = r2.json()["token"]
                else:
                    r = session.get(base + f"/Poll/{rnd.choice(['getUnreadCount', 'getMessages'])}",
                                    headers=headers, timeout=10)
                if r.status_code >= 500:
                    errors.append((r.status_code, r.text[:200]))
            except requests.RequestException as exc:
                errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(name, i)) for i, name in enumerate(names)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    memcached.pause()
    time.sleep(1.0)
    memcached.resume()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(plurk_ids) > 10
    time.sleep(0.6)        # one repaircache pass after the last write
    # The freeze made memcached suspect: the repair pass flushes it once it answers, which on a
    # loaded machine can come after the last write and leave nothing cached to compare.  Each
    # user's poll fills its answer again (Django's miss-fill); every check must find 0
    # differences, and one of them must have compared every user's answer.
    for _ in range(10):
        for name in names:
            requests.get(base + "/Poll/getUnreadCount", headers={"Authorization": f"Bearer {tokens[name]}"},
                         timeout=10)
        check = subprocess.run([sys.executable, MANAGE, "checkcache"], env=env, capture_output=True, text=True,
                               timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
        assert " 0 difference(s)" in check.stdout
        cached = int(check.stdout.split(" cached answer(s)")[0].rsplit(" ", 1)[-1])
        if cached >= len(names):
            break
        time.sleep(0.5)
    assert cached >= len(names), check.stdout       # the check really compared entries
