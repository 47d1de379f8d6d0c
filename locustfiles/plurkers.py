"""Plurk users for locust: sign up, follow a skewed social graph, poll every couple of seconds,
post and respond now and then, mark read what they have seen.

    locust -f locustfiles/plurkers.py --host http://127.0.0.1:8080
    locust -f locustfiles/plurkers.py --host http://127.0.0.1:8080 --headless -u 300 -r 50 -t 60s
    locust -f locustfiles/plurkers.py --host ... --headless -u 10000 -r 100 -t 300s --processes 2

Users are FastHttpUser (geventhttpclient): several times cheaper per request than HttpUser
(requests), which matters when locust shares 2 cores with the stack it measures.

Delivery bookkeeping: every process that runs users writes what it posted, followed, polled and
saw to ``$PLURK_LOAD_RECORDS/<pid>.json`` -- a consistent snapshot every few seconds while the test
runs, and again when it stops and when the process quits (in ``--processes`` mode the master may
SIGINT a worker that is slow to stop; the last snapshot is then at most a few seconds old, and a
snapshot never holds a poll without what that poll saw).  ``bench/load.py`` merges the files and
judges (every plurk must reach every follower that followed before it and polled after it).
Celebrities (a few accounts many users follow) come from ``$PLURK_LOAD_SETUP`` (a JSON file
written by bench/load.py); without it, users follow each other only.

Knobs (environment), for a polling-heavy run such as 10,000 users on 2 cores:
  PLURK_LOAD_POLL_WAIT    mean seconds between an ordinary user's actions (default 2, jitter
                          +-25%); Plurk's pollers asked every few to tens of seconds
  PLURK_LOAD_WRITE_WEIGHT task weight of posting and of responding against 30 for polling (default 1)
  PLURK_LOAD_CELEB_WAIT   mean seconds between a celebrity's actions (default 3)
"""
import itertools
import json
import os
import random
import threading
import time
import uuid

import gevent
import gevent.event
from locust import between, events, task
from locust.contrib.fasthttp import FastHttpUser
from locust.runners import MasterRunner

RECORDS_DIR = os.environ.get("PLURK_LOAD_RECORDS")
RECORDS_EVERY_S = 5
# Knobs for a polling-heavy run (see the module docstring).
POLL_WAIT = float(os.environ.get("PLURK_LOAD_POLL_WAIT", "2"))
WRITE_WEIGHT = int(os.environ.get("PLURK_LOAD_WRITE_WEIGHT", "1"))
CELEB_WAIT = float(os.environ.get("PLURK_LOAD_CELEB_WAIT", "3"))
SETUP_FILE = os.environ.get("PLURK_LOAD_SETUP")
PASSWORD = "load-pass-1"

_lock = threading.Lock()
_known_users = []                 # usernames signed up in this process
_celebrities = []                 # [{"username", "token"}]
_accounts = []                    # pre-made logged-in accounts (bench/load.py); else users sign up
_celebrity_turn = itertools.count()
_account_turn = itertools.count()
_records = {"posts": [], "follows": [], "polls": {}, "seen": [], "cache": {"HIT": 0, "MISS": 0},
            "truncated": 0}

if SETUP_FILE and os.path.exists(SETUP_FILE):
    with open(SETUP_FILE) as fh:
        _setup = json.load(fh)
    _celebrities = _setup["celebrities"]
    _accounts = _setup.get("users", [])
    # several locust processes share the list: start each at its own offset
    _account_turn = itertools.count(random.randrange(len(_accounts)) if _accounts else 0)


def _json(resp):
    """The body as JSON, without FastResponse.text's charset detection (our bodies are UTF-8)."""
    return json.loads(resp.content)


def _zipf_index(n, s=1.2):
    weights = [1 / (i + 1) ** s for i in range(n)]
    return random.choices(range(n), weights=weights)[0]


class _Plurker(FastHttpUser):
    abstract = True
    wait_time = between(POLL_WAIT * 0.75, POLL_WAIT * 1.25)   # "every couple of seconds", with jitter

    username = None
    token = None
    seen = None

    def _auth(self):
        return {"Authorization": f"Bearer {self.token}"}

    def _get_poll(self, resource):
        """One poll request: its JSON body, {} for 204, or None on failure (recorded by locust)."""
        path = f"/Poll/{resource}"
        with self.client.get(path, headers=self._auth(), name=path, catch_response=True) as resp:
            self._count_cache(resp)
            if resp.status_code == 204:
                resp.success()
                return {}
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}")
                return None
            resp.success()
            return _json(resp)

    def poll(self):
        started = time.time()
        counted = self._get_poll("getUnreadCount")
        if counted is None:
            return
        body = self._get_poll("getMessages") if counted else {}
        if body is None:
            return
        if not body:
            self._polled(started)
            return
        now = time.time()
        items = body.get("items", [])
        with _lock:
            for item in items:
                if item["kind"] == "plurk" and item["id"] not in self.seen:
                    self.seen.add(item["id"])
                    _records["seen"].append([self.username, item["id"], now])
        self._polled(started)
        if items and body.get("count") == len(items):
            # everything unread was shown: mark it read (reading takes a moment)
            self.client.post("/api/markRead", json={"upto": max(i["id"] for i in items)},
                             headers=self._auth(), name="/api/markRead")
        elif items:
            with _lock:
                _records["truncated"] += 1

    def _polled(self, started):
        with _lock:
            _records["polls"][self.username] = started

    @staticmethod
    def _count_cache(resp):
        state = resp.headers.get("X-Cache") if resp.headers else None
        if state in ("HIT", "MISS"):
            with _lock:
                _records["cache"][state] += 1

    def post(self, text):
        started = time.time()
        resp = self.client.post("/api/plurks", json={"content": text}, headers=self._auth(), name="/api/plurks")
        if resp.status_code == 201:
            with _lock:
                _records["posts"].append([self.username, _json(resp)["id"], started, time.time()])
            return _json(resp)
        return None


class Plurker(_Plurker):
    """An ordinary user: polls a lot, posts and responds sometimes."""

    weight = 20

    def on_start(self):
        self.seen = set()
        if _accounts:
            account = _accounts[next(_account_turn) % len(_accounts)]
            self.username, self.token = account["username"], account["token"]
            if account.get("follows"):            # graph made in bulk before the run
                with _lock:
                    for name in account["follows"]:
                        _records["follows"].append([self.username, name, 0.0])
                        _known_users.append(self.username)
                return
        else:
            self.username = f"u{uuid.uuid4().hex[:12]}"
            resp = self.client.post("/api/signup", json={"username": self.username, "password": PASSWORD},
                                    name="/api/signup")
            if resp.status_code != 201:
                self.stop()
                return
            self.token = _json(resp)["token"]
        targets = set()
        if _celebrities:
            for _ in range(random.randint(1, 3)):
                targets.add(_celebrities[_zipf_index(len(_celebrities))]["username"])
        with _lock:
            others = random.sample(_known_users, min(len(_known_users), random.randint(0, 3)))
            _known_users.append(self.username)
        targets.update(others)
        for name in targets:
            resp = self.client.post("/api/follow", json={"username": name}, headers=self._auth(),
                                    name="/api/follow")
            if resp.status_code in (200, 201):
                with _lock:
                    _records["follows"].append([self.username, name, time.time()])

    @task(30)
    def poll_task(self):
        self.poll()

    @task(WRITE_WEIGHT)
    def post_task(self):
        self.post(f"hello from {self.username} at {time.time():.3f}")

    @task(WRITE_WEIGHT)
    def respond_task(self):
        resp = self.client.get("/api/timeline?limit=5", headers=self._auth(), name="/api/timeline")
        items = _json(resp)["items"] if resp.status_code == 200 else None
        if items:
            plurk = random.choice(items)
            self.client.post(f"/api/plurks/{plurk['id']}/responses", json={"content": "nice"},
                             headers=self._auth(), name="/api/plurks/[id]/responses")


class Celebrity(_Plurker):
    """One of the few accounts that many follow: posts more often, polls too."""

    weight = 1
    fixed_count = len(_celebrities)          # exactly one locust user per celebrity account
    wait_time = between(CELEB_WAIT * 0.7, CELEB_WAIT * 1.3)

    def on_start(self):
        self.seen = set()
        if not _celebrities:
            self.stop()
            return
        celeb = _celebrities[next(_celebrity_turn) % len(_celebrities)]
        self.username, self.token = celeb["username"], celeb["token"]
        # first post only once every user runs (a user spawned later could not see it before it
        # starts, which would measure the ramp-up, not delivery), then at a random moment of the
        # first wait, not all celebrities at once
        _all_spawned.wait(timeout=SPAWN_WAIT_MAX_S)
        gevent.sleep(random.uniform(0, CELEB_WAIT))

    @task(3)
    def post_task(self):
        self.post(f"{self.username} says {random.randint(0, 10**6)}")

    @task(5)
    def poll_task(self):
        self.poll()


def _write_records():
    """One consistent snapshot of this process's records (taken under the lock), replaced atomically."""
    os.makedirs(RECORDS_DIR, exist_ok=True)
    with _lock:
        data = json.dumps(_records)
    path = os.path.join(RECORDS_DIR, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)


def _runs_users(environment):
    return RECORDS_DIR and not isinstance(getattr(environment, "runner", None), MasterRunner)


_snapshots = None
_all_spawned = gevent.event.Event()
SPAWN_WAIT_MAX_S = 600


@events.spawning_complete.add_listener
def _spawned(**kwargs):
    _all_spawned.set()


@events.test_start.add_listener
def _start_snapshots(environment=None, **kwargs):
    """Every process that runs users (the only one, or each worker) snapshots its records."""
    global _snapshots
    if not _runs_users(environment) or _snapshots is not None:
        return

    def loop():
        while True:
            gevent.sleep(RECORDS_EVERY_S)
            _write_records()
    _snapshots = gevent.spawn(loop)


@events.test_stopping.add_listener
@events.test_stop.add_listener
@events.quitting.add_listener
def _final_records(environment=None, **kwargs):
    """Also written when the test stops and when the process quits."""
    if _runs_users(environment):
        _write_records()
