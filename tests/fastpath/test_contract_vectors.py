"""fastpath's C against the shared vectors (tests/vectors/contract.json) and pymemcache itself."""
import json
import os
import random
import socket
import subprocess
import sys

import pytest
from pymemcache.client.base import Client
from pymemcache.client.murmur3 import murmur3_32
from pymemcache.client.rendezvous import RendezvousHash

from fastpath import _server   # a build that does not import fails here, never skips
from tests.fastpath.conftest import fastpath_env, token
from tests.support.wsgi import django_request, django_response, request_bytes

VECTORS = json.load(open(os.path.join(os.path.dirname(__file__), "..", "vectors", "contract.json")))
SECRET = VECTORS["secret"].encode()
NOW = VECTORS["now"]
# the vectors' cookie: the demo's FASTPOLL['COOKIE_NAME'] (plurksite), which Django reads here;
# fastpath reads it with --cookie-name (its default, the library's, is fastpoll_token)
COOKIE = "plurk_token"


@pytest.mark.parametrize("text, expected", VECTORS["murmur3_32"])
def test_murmur3(text, expected):
    assert _server._testhelper_murmur3(text.encode()) == expected


@pytest.mark.parametrize("vector", VECTORS["valid_tokens"], ids=lambda v: v["token"][:24])
def test_valid_tokens(vector):
    uid, epoch, expires, key = _server._testhelper_token(SECRET, vector["token"].encode(), NOW, "getMessages")
    assert (uid, epoch, expires) == (vector["uid"], vector["epoch"], vector["expires"])
    assert key == vector["key"]


@pytest.mark.parametrize("vector", VECTORS["invalid_tokens"], ids=lambda v: v["why"])
def test_invalid_tokens(vector):
    result = _server._testhelper_token(SECRET, vector["token"].encode(), NOW)
    assert isinstance(result, str), vector["why"]


@pytest.mark.parametrize("vector", VECTORS["keys"], ids=lambda v: v["key"])
def test_keys(vector):
    from fastpoll import tokens
    tok = tokens.sign(SECRET, vector["uid"], vector["epoch"], 2**62)
    assert _server._testhelper_token(SECRET, tok.encode(), NOW, vector["resource"])[3] == vector["key"]


@pytest.mark.parametrize("case", VECTORS["server_mapping"], ids=lambda c: f"{len(c['servers'])}servers")
def test_server_mapping_vectors(case):
    for key, node in case["keys"]:
        assert case["servers"][_server._testhelper_pick(case["servers"], key.encode())] == node


def test_mapping_agrees_with_pymemcache_on_thousands_of_keys():
    rng = random.Random(7)
    for n in (2, 3, 5, 8):
        nodes = [f"127.0.0.{rng.randint(1, 9)}:{rng.randint(1024, 65535)}" for _ in range(n)]
        nodes = list(dict.fromkeys(nodes))
        hasher = RendezvousHash(list(nodes))
        for _ in range(1500):
            key = f"p1:{rng.choice(['getMessages', 'getUnreadCount'])}:{rng.randint(1, 2**63 - 1)}:{rng.randint(0, 99)}"
            assert nodes[_server._testhelper_pick(nodes, key.encode())] == hasher.get_node(key)


# Two node names whose murmur3 states collide once "<name>-p" has been hashed (both are 14
# bytes, so the rest of the input lines up): they tie for every key that starts with "p", as all
# of ours ("p1:...") do.  Found by brute force over 10.0.0.<1-9>:<port> with
# _testhelper_murmur3; checked below with pymemcache's own murmur3.
TIE_LOW, TIE_HIGH = "10.0.0.1:35346", "10.0.0.2:35824"
TIE_KEYS = ["p1:getMessages:42:0", "p1:getUnreadCount:7:3"] + [
    f"p1:getMessages:{random.Random(n).randint(1, 2**63 - 1)}:{n % 7}" for n in range(200)]


def _score(node, key):
    return murmur3_32(f"{node}-{key}")


def test_the_tie_pair_really_ties():
    assert TIE_HIGH > TIE_LOW
    for key in TIE_KEYS:
        assert _score(TIE_LOW, key) == _score(TIE_HIGH, key), key
        assert _server._testhelper_murmur3(f"{TIE_LOW}-{key}".encode()) == _score(TIE_LOW, key)


@pytest.mark.parametrize("nodes", [[TIE_LOW, TIE_HIGH], [TIE_HIGH, TIE_LOW]], ids=["low-first", "high-first"])
def test_tie_goes_to_the_greater_node_name(nodes):
    """pymemcache keeps max(str(node), str(winner)) on equal scores, whatever the list order."""
    for key in TIE_KEYS:
        assert RendezvousHash(list(nodes)).get_node(key) == TIE_HIGH
        assert nodes[_server._testhelper_pick(nodes, key.encode())] == TIE_HIGH, key


def test_tie_among_more_nodes():
    """A tie at the top goes to the greater name; a tie below the top changes nothing."""
    key = "p1:getMessages:42:0"
    tie = _score(TIE_LOW, key)
    below = next(n for n in (f"10.0.1.1:{p}" for p in range(11211, 12000)) if _score(n, key) < tie)
    above = next(n for n in (f"10.0.1.1:{p}" for p in range(11211, 12000)) if _score(n, key) > tie)
    for nodes, winner in [([below, TIE_LOW, TIE_HIGH], TIE_HIGH), ([TIE_HIGH, below, TIE_LOW], TIE_HIGH),
                          ([TIE_LOW, above, TIE_HIGH], above), ([TIE_HIGH, TIE_LOW, above], above)]:
        assert RendezvousHash(list(nodes)).get_node(key) == winner
        assert nodes[_server._testhelper_pick(nodes, key.encode())] == winner, nodes


@pytest.mark.parametrize("a, b", [
    ("10.0.0.2:11211", "10.0.0.1:11211"), ("10.0.0.1:11211", "10.0.0.1:1121"),   # a prefix sorts first
    ("10.0.0.10:1", "10.0.0.1:11211"), ("b:1", "a:99999"), ("::1:11211", "127.0.0.1:11211"),
    ("a:1", "a:1"), ("", "a:1"), ("Z:1", "a:1"),
])
def test_name_comparison_is_pythons(a, b):
    """The tie-break itself, both ways round, against Python's str comparison."""
    assert _server._testhelper_name_greater(a.encode(), b.encode()) is (a > b)
    assert _server._testhelper_name_greater(b.encode(), a.encode()) is (b > a)


@pytest.mark.parametrize("key_len", [32, 63, 64, 65, 200, 1024])
def test_hmac_for_every_key_length(key_len):
    """The precomputed-pad HMAC agrees with Python's hmac for keys shorter and longer than a block."""
    from fastpoll import tokens
    key = bytes((i * 7 + 3) % 256 for i in range(key_len))
    tok = tokens.sign(key, 12345, 6, NOW + 10)
    assert _server._testhelper_token(key, tok.encode(), NOW)[:3] == ("12345", 6, NOW + 10)
    assert _server._testhelper_token(key[:-1] + b"\x00", tok.encode(), NOW) == "bad signature"


# ---- credentials: which token a request carries (docs/contract.md, section 2) ----------------

CREDENTIALS = VECTORS["credentials"]["vectors"]


def _header_bytes(headers):
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


def _c_expected(case):
    return case["fastpath"]["token"].encode("latin-1") if isinstance(case["fastpath"], dict) else case["fastpath"]


@pytest.mark.parametrize("case", CREDENTIALS, ids=lambda c: c["why"])
def test_credentials(case):
    assert _server._testhelper_credentials(_header_bytes(case["headers"]), COOKIE.encode()) == _c_expected(case)


def test_the_default_cookie_name_is_the_librarys():
    """Without --cookie-name fastpath reads fastpoll_token; the demo's plurk_token is another cookie."""
    assert _server._testhelper_credentials([(b"Cookie", b"fastpoll_token=T")]) == b"T"
    assert _server._testhelper_credentials([(b"Cookie", b"plurk_token=T")]) == "none"


@pytest.mark.parametrize("case", CREDENTIALS, ids=lambda c: c["why"])
def test_credentials_with_another_cookie_name(case):
    """--cookie-name: the same vectors with the project's cookie name in place of plurk_token."""
    def rename(text):
        return text.replace("plurk_token", "__Host-poll")
    headers = [(name, rename(value)) for name, value in case["headers"]]
    assert _server._testhelper_credentials(_header_bytes(headers), b"__Host-poll") == _c_expected(case)
    if any("plurk_token" in value for _, value in case["headers"]):
        # and plurk_token is then just another cookie
        assert _server._testhelper_credentials(_header_bytes(case["headers"]), b"__Host-poll") in ("none", "ambiguous") \
            or any(name.lower() == "authorization" for name, _ in case["headers"])


def _turkish_locale(tmp_path):
    """A tr_TR.UTF-8 locale of our own (LOCPATH): there strncasecmp() does not fold 'I' to 'i'."""
    subprocess.run(["localedef", "-i", "tr_TR", "-f", "UTF-8", str(tmp_path / "tr_TR.UTF-8")],
                   check=True, capture_output=True)
    return {"LOCPATH": str(tmp_path), "LC_ALL": "tr_TR.UTF-8"}


_LOCALE_SCRIPT = """
import json, locale, sys
from fastpath import _server
assert locale.setlocale(locale.LC_CTYPE) == "tr_TR.UTF-8", locale.setlocale(locale.LC_CTYPE)
for case in json.load(open(sys.argv[1]))["credentials"]["vectors"]:
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in case["headers"]]
    got = _server._testhelper_credentials(headers, b"plurk_token")
    want = case["fastpath"]["token"].encode("latin-1") if isinstance(case["fastpath"], dict) else case["fastpath"]
    print("ok" if got == want else f"{case['why']}: {got!r} != {want!r}")
"""


def test_credentials_do_not_depend_on_the_locale(tmp_path):
    """Python sets LC_CTYPE from the environment; the vectors must still hold under tr_TR."""
    env, cwd = fastpath_env(tmp_path, env=_turkish_locale(tmp_path))
    vectors = os.path.join(os.path.dirname(__file__), "..", "vectors", "contract.json")
    out = subprocess.run([sys.executable, "-c", _LOCALE_SCRIPT, os.path.abspath(vectors)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == ["ok"] * len(CREDENTIALS), out.stdout


def _raw_request(port, raw):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    return int(lines[0].split()[1]), dict(line.split(": ", 1) for line in lines[1:]), body


# llhttp refuses control bytes other than tab in a header value (400) before credentials are
# read; the pure function above covers those vectors.
_ON_THE_WIRE = [c for c in CREDENTIALS
                if not any((ch < " " and ch != "\t") or ch == "\x7f" for _, v in c["headers"] for ch in v)]


def test_credentials_through_fastpath_answer_as_django(fastpath_factory, memcached, settings):
    """Every vector the parser lets through, over a socket, with fresh tokens: the vector's token
    gets the cached answer; no credential or a bad token gets Django's own 401, byte for byte
    (Django run on the same bytes through gunicorn's parser); ambiguous gets 404 MISS."""
    fp = fastpath_factory([memcached], extra=["--cookie-name", COOKIE])
    settings.FASTPOLL = dict(settings.FASTPOLL, SECRET_FILE=str(fp.secret_file))
    Client(memcached.spec).set("p1:getUnreadCount:42:3", b'{"count":42}', noreply=False)
    t_old, u_old = VECTORS["credentials"]["token"], VECTORS["credentials"]["other_token"]
    t_new, u_new = token(42, epoch=3), token(7)
    for case in _ON_THE_WIRE:
        headers = [(n, v.replace(t_old, t_new).replace(u_old, u_new)) for n, v in case["headers"]]
        raw = request_bytes(headers)
        status, head, body = _raw_request(fp.port, raw)
        expected = case["fastpath"]
        if expected == "ambiguous":
            assert (status, head.get("X-Cache")) == (404, "MISS"), case["why"]
        elif expected != "none" and expected["token"] == t_old:
            assert (status, body, head.get("X-Cache")) == (200, b'{"count":42}', "HIT"), case["why"]
        else:
            dj_status, dj_head, dj_body = django_response(raw)
            assert (status, body) == (dj_status, dj_body) and status == 401, (case["why"], body, dj_body)
            assert head["Content-Type"] == dj_head["Content-Type"], case["why"]
    assert len(_ON_THE_WIRE) > 50


def test_empty_cookie_is_authentication_required(fastpath_factory, memcached, settings):
    """Django treats an empty plurk_token as no cookie; fastpath said "malformed token"."""
    fp = fastpath_factory([memcached], extra=["--cookie-name", COOKIE])
    settings.FASTPOLL = dict(settings.FASTPOLL, SECRET_FILE=str(fp.secret_file))
    raw = request_bytes([("Cookie", "plurk_token=")])
    expected = (401, b'{"error":"authentication required"}')
    assert django_response(raw)[::2] == expected
    assert _raw_request(fp.port, raw)[::2] == expected


def test_header_names_fold_ascii_only(fastpath_factory, memcached, tmp_path):
    """Under tr_TR.UTF-8 strncasecmp("AUTHORIZATION", "authorization") is not 0: gunicorn
    upper-cases names, so Django reads these headers and fastpath must too."""
    fp = fastpath_factory([memcached], env=_turkish_locale(tmp_path))
    Client(memcached.spec).set("p1:getUnreadCount:5:0", b'{"count":5}', noreply=False)
    for headers in ([("AUTHORIZATION", f"Bearer {token(5)}")], [("COOKIE", f"fastpoll_token={token(5)}")]):
        assert _raw_request(fp.port, request_bytes(headers))[::2] == (200, b'{"count":5}'), headers


# Edges Django's reading could treat differently: gunicorn's OWS, str.strip()'s ASCII and
# Unicode whitespace (as UTF-8 and as lone bytes), quotes, and a non-whitespace letter.
_PADS = ["", "", " ", "\t", "  ", "\x0b", "\x0c", "\x1c", "\x1f", "\xa0", "\x85", "\xc2\xa0", "\xc2\x85",
         "\xe2\x80\x83", "\xc3\xa9", '"']
_VALUES = ["T", "v1.x", "", "a b", "a=b", '"T"', "T,x", "\xc3\xa9"]
_SCHEMES = ["Bearer ", "bearer ", "BeArEr ", "Bearer", "Bearer  ", "Bearer\t", "Basic ", ""]


def _random_headers(rng):
    def pad():
        return rng.choice(_PADS)

    headers = []
    for _ in range(rng.choice([1, 1, 2, 2, 3])):
        if rng.random() < 0.6:
            pairs = [pad() + rng.choice(["plurk_token", "plurk_token", "a", "PLURK_TOKEN", ""]) + pad() +
                     rng.choice(["=", "=", ""]) + pad() + rng.choice(_VALUES) + pad()
                     for _ in range(rng.randint(1, 3))]
            headers.append((rng.choice(["Cookie", "COOKIE"]), ";".join(pairs)))
        else:
            headers.append((rng.choice(["Authorization", "AUTHORIZATION"]),
                            pad() + rng.choice(_SCHEMES) + pad() + rng.choice(_VALUES) + pad()))
    return headers


def test_random_credentials_read_as_django_or_ambiguous():
    """Seeded header sets, beyond the vectors: where the C is sure, Django (behind gunicorn's
    parser) reads no token when it reads none, and the same token (or one malformed on both
    sides: non-ASCII) when it reads one."""
    from fastpoll import auth

    rng = random.Random(13)
    seen = {"ambiguous": 0, "none": 0, "token": 0}
    for _ in range(2000):
        headers = _random_headers(rng)
        got = _server._testhelper_credentials(_header_bytes(headers), COOKIE.encode())
        django, _ = auth.token_from_request(django_request(request_bytes(headers)))
        if isinstance(got, str):
            seen[got] += 1
            assert got == "ambiguous" or django is None, (headers, django)
            continue
        seen["token"] += 1
        got = got.decode("latin-1")
        assert django is not None and (got == django or not (got.isascii() or django.isascii())), \
            (headers, got, django)
    assert min(seen.values()) > 100, seen


# ---- long-polling (contract section 7): ETag and If-None-Match ------------------------------
# The "etag" and "conditional" vectors are written by Django's side; until they are in
# contract.json, these run on bodies whose ETag is computed here with hashlib.
def _etag(body):
    import hashlib
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


ETAG_VECTORS = VECTORS.get("etag") or [[b.decode(), _etag(b)] for b in (b"", b'{"count":1}', b"\xe2\x98\x83")]
_ONE, _OTHER = _etag(b'{"count":1}'), _etag(b'{"count":2}')
CONDITIONAL_VECTORS = VECTORS.get("conditional") or [
    {"why": "no validator", "headers": [], "fastpath": 200, "wait": None, "body": '{"count":1}'},
    {"why": "matching strong tag", "headers": [["If-None-Match", _ONE]], "fastpath": 304, "wait": None,
     "body": '{"count":1}'},
    {"why": "matching weak tag", "headers": [["If-None-Match", "W/" + _ONE]], "fastpath": 304,
     "wait": None, "body": '{"count":1}'},
    {"why": "other tag", "headers": [["If-None-Match", _OTHER]], "fastpath": 200, "wait": None,
     "body": '{"count":1}'},
    {"why": "OWS", "headers": [["If-None-Match", f"  {_ONE}\t"]], "fastpath": 304, "wait": None,
     "body": '{"count":1}'},
    {"why": "a list", "headers": [["If-None-Match", f"{_OTHER}, {_ONE}"]], "fastpath": "miss",
     "wait": None, "body": '{"count":1}'},
    {"why": "star", "headers": [["If-None-Match", "*"]], "fastpath": "miss", "wait": None, "body": ""},
    {"why": "garbage", "headers": [["If-None-Match", "garbage"]], "fastpath": "miss", "wait": None,
     "body": ""},
    {"why": "repeated", "headers": [["If-None-Match", _ONE], ["If-None-Match", _ONE]],
     "fastpath": "miss", "wait": None, "body": '{"count":1}'},
    {"why": "wait, other tag", "headers": [["Prefer", "wait=10"], ["If-None-Match", _OTHER]],
     "fastpath": 200, "wait": 10, "body": '{"count":1}'},
    {"why": "wait, matching tag: held", "headers": [["Prefer", "wait=10"], ["If-None-Match", _ONE]],
     "fastpath": "hold", "wait": 10, "body": '{"count":1}'},
    {"why": "unparseable wait", "headers": [["Prefer", "wait=soon"], ["If-None-Match", _ONE]],
     "fastpath": 304, "wait": None, "body": '{"count":1}'},
]


@pytest.mark.parametrize("body, expected", ETAG_VECTORS, ids=lambda v: str(v)[:16])
def test_etag(body, expected):
    assert _server._testhelper_etag(body.encode()) == expected
    assert _etag(body.encode()) == expected


def _fastpath_with_memcached(tmp_path_factory, *extra):
    from tests.fastpath.conftest import Fastpath
    from tests.support.servers import memcached_servers
    with memcached_servers(1) as servers:
        fp = Fastpath(servers, tmp_path_factory.mktemp("conditional"), extra=extra).start()
        try:
            yield fp, Client(servers[0].spec, default_noreply=False)   # stored before we poll
        finally:
            fp.stop()


@pytest.fixture(scope="module")
def conditional_fastpath(tmp_path_factory):
    yield from _fastpath_with_memcached(tmp_path_factory)


@pytest.fixture(scope="module")
def short_hold_fastpath(tmp_path_factory):
    yield from _fastpath_with_memcached(tmp_path_factory, "--max-wait", "1")


def _exchange(fp, uid, vector):
    head = "".join(f"{name}: {value}\r\n" for name, value in vector["headers"])
    with socket.create_connection(("127.0.0.1", fp.port), timeout=15) as s:
        s.sendall(f"GET /Poll/getMessages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(uid)}\r\n"
                  f"{head}Connection: close\r\n\r\n".encode("latin-1"))
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head_text, _, rest = raw.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


@pytest.mark.parametrize("vector", [v for v in CONDITIONAL_VECTORS if v["fastpath"] != "hold"],
                         ids=lambda v: f"{v['why']}-{len(v['body'])}")
def test_conditional(conditional_fastpath, vector):
    fp, cache = conditional_fastpath
    uid = 4242
    body = vector["body"].encode()
    cache.set(f"p1:getMessages:{uid}:0", body)
    status, headers, rest = _exchange(fp, uid, vector)
    if vector["fastpath"] == "miss":
        assert status == 404 and headers["x-cache"] == "MISS", vector["why"]
        return
    assert status == vector["fastpath"], vector["why"]
    assert headers["etag"] == _etag(body)
    assert headers["x-cache"] == "HIT" and headers["cache-control"] == "no-store"
    if vector["wait"] is None:
        assert "preference-applied" not in headers
    else:
        assert headers["preference-applied"] == f"wait={vector['wait']}"
    if status == 304:
        assert "content-type" not in headers and "content-length" not in headers and rest == b""
    elif status == 200:
        assert rest == body


@pytest.mark.parametrize("vector", [v for v in CONDITIONAL_VECTORS if v["fastpath"] == "hold"],
                         ids=lambda v: f"{v['why']}-{len(v['body'])}")
def test_conditional_hold(short_hold_fastpath, vector):
    """Held (nothing changes): 304 with the same ETag once min(wait, --max-wait 1) has passed."""
    fp, cache = short_hold_fastpath
    uid = 4343
    body = vector["body"].encode()
    cache.set(f"p1:getMessages:{uid}:0", body)
    status, headers, rest = _exchange(fp, uid, vector)
    assert (status, rest) == (304, b"") and headers["etag"] == _etag(body), vector["why"]
    assert headers["preference-applied"] == f"wait={min(vector['wait'], 1)}"


# ---- capabilities: per-object polls (docs/contract.md, section 8) ----------------------------

CAPABILITIES = VECTORS["capabilities"]


@pytest.mark.parametrize("vector", CAPABILITIES["valid"], ids=lambda v: v["capability"][:32])
def test_valid_capabilities(vector):
    got = _server._testhelper_capability(SECRET, vector["capability"].encode(), NOW)
    assert got == (vector["resource"], vector["object"], vector["uid"], vector["expires"], vector["key"])


@pytest.mark.parametrize("vector", CAPABILITIES["invalid"], ids=lambda v: v["why"])
def test_invalid_capabilities(vector):
    assert isinstance(_server._testhelper_capability(SECRET, vector["capability"].encode(), NOW), str)


@pytest.mark.parametrize("vector", CAPABILITIES["marker_keys"], ids=lambda v: v["key"][:40])
def test_marker_keys(vector):
    assert _server._testhelper_marker_key(SECRET, vector["token"].encode(), NOW) == vector["key"]


def test_object_and_marker_keys_take_the_key_prefix():
    cap = CAPABILITIES["valid"][0]
    assert _server._testhelper_capability(SECRET, cap["capability"].encode(), NOW, "fp-2")[4] == \
        "fp-2" + cap["key"][2:]
    marker = CAPABILITIES["marker_keys"][0]
    assert _server._testhelper_marker_key(SECRET, marker["token"].encode(), NOW, "fp-2") == "fp-2" + marker["key"][2:]
