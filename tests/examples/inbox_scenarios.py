"""Scenarios of the inbox example, run in a process of the example's OWN settings (never in
pytest's process, which has plurksite's): ``python tests/examples/inbox_scenarios.py <name>``.

Environment: INBOX_VAR, INBOX_MEMCACHED (one host:port) and INBOX_SECRET_FILE, set by
tests/examples/test_inbox.py.  Exits 0 when the scenario holds; an AssertionError otherwise.
The example is used the way its own code uses fastpoll: ``import fastpoll`` and Django.
"""
import json
import os
import socket
import sys
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "examples", "inbox"), ROOT]
os.environ["DJANGO_SETTINGS_MODULE"] = "inbox_site.settings"

import django  # noqa: E402

django.setup()

import fastpoll  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test import Client  # noqa: E402
from fastpoll import conf  # noqa: E402
from inbox.models import Notification  # noqa: E402
from inbox.polls import inbox  # noqa: E402

MISSING = object()
PREFIX = conf.get_config()["KEY_PREFIX"]      # the example's own (inbox_site.settings)


def cached(key):
    """The raw memcached value of ``key`` (bytes), or MISSING: a socket, not fastpoll's client."""
    host, port = os.environ["INBOX_MEMCACHED"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"get %s\r\n" % key.encode())
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = sock.recv(65536)
            assert chunk, f"memcached closed the connection: {data!r}"
            data += chunk
    if data == b"END\r\n":
        return MISSING
    header, rest = data.split(b"\r\n", 1)
    length = int(header.split()[3])
    return rest[:length]


def new_user():
    user = get_user_model().objects.create_user(f"u{uuid.uuid4().hex[:12]}", password="pw")
    assert isinstance(user.pk, uuid.UUID), user.pk
    return user


def key(user, epoch=0):
    return f"{PREFIX}:inbox:{user.pk}:{epoch}"


def expected(user):
    """The answer the database holds now, built independently of the resource."""
    unread = list(Notification.objects.filter(user=user, read=False).order_by("-created"))
    if not unread:
        return b""
    return fastpoll.dumps({"unread": len(unread), "latest": [{"id": n.pk, "text": n.text} for n in unread[:20]]})


def written():
    """(1) a new Notification writes the user's exact answer into memcached after the commit."""
    user, other = new_user(), new_user()
    with transaction.atomic():
        Notification.objects.create(user=user, text="hello")
        assert cached(key(user)) in (MISSING, b""), "written before the commit"
    want = fastpoll.dumps({"unread": 1, "latest": [{"id": Notification.objects.get(user=user).pk, "text": "hello"}]})
    assert expected(user) == want == inbox([user.pk])[user.pk]
    assert cached(key(user)) == want, (cached(key(user)), want)
    Notification.objects.create(user=user, text="again é")
    assert cached(key(user)) == expected(user), (cached(key(user)), expected(user))
    assert b'"unread":2' in cached(key(user))
    assert cached(key(other)) in (MISSING, b""), "another user's answer was written with this one's"


def poll():
    """(2) Django's poll view answers a Bearer token from fastpoll.issue_token: 200 and the JSON;
    401 without a token."""
    user = new_user()
    Notification.objects.create(user=user, text="poll me")
    token = fastpoll.issue_token(user)
    client = Client()
    response = client.get("/Poll/inbox", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, (response.status_code, response.content)
    assert response["Content-Type"] == "application/json"
    assert response.content == expected(user) == cached(key(user))
    response = client.get("/Poll/inbox")
    assert response.status_code == 401, (response.status_code, response.content)
    assert response.json() == {"error": "authentication required"}


def bulk():
    """(3) update() + fastpoll.touch leaves memcached equal to the database."""
    user = new_user()
    for i in range(3):
        Notification.objects.create(user=user, text=f"n{i}")
    assert b'"unread":3' in cached(key(user))
    with transaction.atomic():
        Notification.objects.filter(user=user, pk__lte=Notification.objects.filter(user=user).order_by("pk")[1].pk) \
            .update(read=True)
        fastpoll.touch("inbox", users=[user])
    assert cached(key(user)) == expected(user), (cached(key(user)), expected(user))
    assert b'"unread":1' in cached(key(user))
    with transaction.atomic():
        Notification.objects.filter(user=user).update(read=True)
        fastpoll.touch("inbox", users=[user])
    assert expected(user) == b""
    assert cached(key(user)) == b"", cached(key(user))      # nothing new: 204, stored empty


def logout():
    """(4) Django's logout revokes the user's poll tokens: the old token now gets 401."""
    user = new_user()
    Notification.objects.create(user=user, text="before logout")
    token = fastpoll.issue_token(user)
    client = Client()
    assert client.login(username=user.username, password="pw")
    page = client.get("/")
    assert page.status_code == 200
    cookie = page.cookies.get("fastpoll_token")
    assert cookie is not None and cookie.value, "the middleware gave the logged-in user no poll cookie"
    poller = Client()
    assert poller.get("/Poll/inbox", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200
    assert poller.get("/Poll/inbox", HTTP_COOKIE=f"fastpoll_token={cookie.value}").status_code == 200
    response = client.post("/accounts/logout/")
    assert response.status_code == 302, response.status_code
    for headers in ({"HTTP_AUTHORIZATION": f"Bearer {token}"}, {"HTTP_COOKIE": f"fastpoll_token={cookie.value}"}):
        response = Client().get("/Poll/inbox", **headers)
        assert response.status_code == 401, (response.status_code, response.content)
        assert response.json() == {"error": "token revoked"}
    assert cached(key(user)) is MISSING, "the revoked epoch's answer is still in memcached"


def board():
    """(5) an announcement writes its board's one answer after the commit; Django's poll view
    serves it to a member with the board page's capability URL, 403 to another user with it, and
    the page is a 404 for a non-member (no capability is handed out)."""
    from inbox.models import Announcement, Board

    member, outsider = new_user(), new_user()
    board = Board.objects.create(name="team")
    board.members.add(member)
    okey = f"{PREFIX}:board:{board.pk}:o"
    with transaction.atomic():
        Announcement.objects.create(board=board, text="standup at ten")
        assert cached(okey) is MISSING, "written before the commit"
    assert cached(okey) == board_answer(board.pk) and b'"standup at ten"' in cached(okey), cached(okey)
    client = Client()
    client.force_login(member)
    page = client.get(f"/boards/{board.pk}/")
    assert page.status_code == 200
    script = page.content.decode().split('<script id="poll-url" type="application/json">')[1]
    url = json.loads(script.split("</script>")[0])
    assert url.startswith(f"/Poll/board/{board.pk}?cap=c1.board.{board.pk}.{member.pk}."), url
    token = fastpoll.issue_token(member)
    response = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200 and response.content == cached(okey), (response.status_code, response.content)
    foreign = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {fastpoll.issue_token(outsider)}")
    assert foreign.status_code == 403, (foreign.status_code, foreign.content)
    client.force_login(outsider)
    assert client.get(f"/boards/{board.pk}/").status_code == 404


def user_forms():
    """(6) a token and a capability issued for any form of a UUID user (the instance, its pk, the
    pk's text, ``pk.hex``, upper case, an instance built from the pk) sign the same user text, and the poll serves the board with
    both (a hostile review: the capability signed the text as given, and ``pk.hex`` gave one no
    poll could use)."""
    from inbox.models import Announcement, Board

    member = new_user()
    board = Board.objects.create(name="forms")
    board.members.add(member)
    Announcement.objects.create(board=board, text="forms")
    forms = {"instance": member, "UUID": member.pk, "str": str(member.pk), "hex": member.pk.hex,
             "upper": str(member.pk).upper(), "User(pk=hex)": get_user_model()(pk=member.pk.hex)}
    for label, who in forms.items():
        url = fastpoll.capability_url(who, "board", board)
        assert url.split("?cap=")[1].split(".")[3] == str(member.pk), (label, url)
        token = fastpoll.issue_token(who)
        assert token.split(".")[1] == str(member.pk), (label, token)
        response = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token}")
        assert response.status_code == 200, (label, response.status_code, response.get("Content-Type"))
        assert response.content == board_answer(board.pk), (label, response.content)


# -- the stack tests' driver (tests/examples/test_inbox_stack.py) ---------------------------------
# One process of the example's settings that takes JSON commands on stdin, one a line, and answers
# each with one JSON line: what a background job of the project would do (commit notifications
# and announcements; a bulk update plus touch), and what only Django knows (the database's answers).

def board_answer(board):
    """The board's answer the database holds now, built independently of the resource."""
    from inbox.models import Announcement

    rows = list(Announcement.objects.filter(board_id=board).order_by("-created"))
    if not rows:
        return b""
    return fastpoll.dumps({"count": len(rows), "latest": [{"id": a.pk, "text": a.text} for a in rows[:20]]})


def timed_commit(create):
    """Run ``create()`` in a transaction: the monotonic time (CLOCK_MONOTONIC, the same in every
    process of this host) just before the commit, and once the commit and its writes returned."""
    with transaction.atomic():
        create()
        before = time.monotonic()
    return {"commit_at": before, "written_at": time.monotonic()}


def op_user(name=None):
    user = new_user() if name is None else get_user_model().objects.create_user(name, password="pw")
    return {"id": str(user.pk), "username": user.username, "password": "pw"}


def op_board(members):
    from inbox.models import Board

    board = Board.objects.create(name=f"board {uuid.uuid4().hex[:6]}")
    board.members.set(get_user_model().objects.filter(username__in=members))
    return {"id": board.pk}


def op_notify(username, text):
    user = get_user_model().objects.get(username=username)
    return timed_commit(lambda: Notification.objects.create(user=user, text=text))


def op_announce(board, text):
    from inbox.models import Announcement

    return timed_commit(lambda: Announcement.objects.create(board_id=board, text=text))


def op_edit_board(board, text):
    """Every announcement of ``board`` rewritten by update() (no signal), reported with touch."""
    from inbox.models import Announcement, Board

    with transaction.atomic():
        Announcement.objects.filter(board_id=board).update(text=text)
        fastpoll.touch("board", objects=[Board.objects.get(pk=board)])
    return {}


def op_answers(username=None, board=None):
    """What the database says (``expected``/``board_answer``) and what memcached holds."""
    out = {}
    if username is not None:
        user = get_user_model().objects.get(username=username)
        out["user"] = {"key": key(user), "database": expected(user).decode()}     # epoch 0: never revoked
    if board is not None:
        out["board"] = {"key": f"{PREFIX}:board:{board}:o", "database": board_answer(board).decode()}
    for part in out.values():
        value = cached(part["key"])
        part["cached"] = None if value is MISSING else value.decode()
    return out


def serve():
    for line in sys.stdin:
        command = json.loads(line)
        try:
            result = {"ok": globals()["op_" + command.pop("op")](**command)}
        except Exception as exc:                     # the test shows it, with the command
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
        sys.exit(0)
    globals()[sys.argv[1]]()
    print("ok", sys.argv[1])
