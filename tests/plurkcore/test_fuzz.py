"""Random malformed input against every endpoint (fixed seed): never a 5xx, always JSON."""
import json
import random

import pytest

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("POST", "/api/signup", ["username", "password"]),
    ("POST", "/api/login", ["username", "password"]),
    ("POST", "/api/follow", ["username"]),
    ("POST", "/api/plurks", ["content"]),
    ("POST", "/api/plurks/{plurk}/responses", ["content"]),
    ("POST", "/api/markRead", ["upto"]),
    ("GET", "/api/timeline?before={text}&limit={text}", []),
    ("GET", "/api/users/{text}", []),
    ("DELETE", "/api/follow/{text}", []),
    ("GET", "/api/plurks/{text}", []),
    ("POST", "/Poll/{text}", []),
]
STRINGS = ["", " ", "a", "\x00", "\ud800", "\u2603", "x" * 400, "../../etc/passwd", "%00", "null", "-1",
           "1e9", "9" * 30, "<script>", "'; DROP TABLE auth_user; --", "\\", "\n", "known"]


def value(rnd, depth=0):
    kind = rnd.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rnd.choice(STRINGS)
    if kind == 1:
        return rnd.choice([0, -1, 1, 2**63, 2**64, -2**70, 10**40])
    if kind == 2:
        return rnd.choice([1.5, -0.0, 1e308])
    if kind == 3:
        return rnd.choice([True, False, None])
    if kind == 4:
        return "".join(chr(rnd.randrange(0, 0x11000)) for _ in range(rnd.randrange(1, 12)))
    if kind == 5:
        return [value(rnd, depth + 1) for _ in range(rnd.randrange(3))]
    return {rnd.choice(STRINGS): value(rnd, depth + 1) for _ in range(rnd.randrange(3))}


def test_random_input_never_breaks_the_api(signup):
    signup("known")
    me = signup("fuzzer")
    plurk = me.call("POST", "/api/plurks", {"content": "target"}).json()["id"]
    rnd = random.Random(20091)
    from urllib.parse import quote
    for _ in range(400):
        method, path, fields = rnd.choice(ENDPOINTS)
        text = quote(str(value(rnd)).encode("utf-8", "surrogatepass"), safe="")
        path = path.format(plurk=rnd.choice([plurk, text]), text=text)
        if fields and rnd.random() < 0.8:
            body = {f: value(rnd) if rnd.random() < 0.7 else rnd.choice(STRINGS) for f in fields}
            raw = json.dumps(body, ensure_ascii=rnd.random() < 0.5).encode("utf-8", "surrogatepass")
        else:
            raw = bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))
        kwargs = {"HTTP_AUTHORIZATION": f"Bearer {me.token}"} if rnd.random() < 0.9 else {}
        resp = me.generic(method, path, raw, content_type="application/json", **kwargs)
        assert resp.status_code < 500, (method, path, raw[:100], resp.content[:200])
        if resp.status_code != 204:
            assert resp["Content-Type"] == "application/json", (method, path)
            json.loads(resp.content)
