"""plurkcore's half of the wire contract (docs/contract.md), checked against the shared vectors."""
import json
import os

import pytest

from fastpoll import keys, tokens
from fastpoll import auth
from fastpoll.http import dumps
from fastpoll.cache import AnswerCache
from fastpoll.secret import SecretFileError, parse_secret
from tests.support.wsgi import django_request, django_response, request_bytes

VECTORS = json.load(open(os.path.join(os.path.dirname(__file__), "..", "vectors", "contract.json")))
KEY = VECTORS["secret"].encode()


@pytest.mark.parametrize("case", VECTORS["valid_tokens"], ids=lambda c: c["token"][:24])
def test_valid_tokens(case):
    assert tokens.verify(KEY, case["token"], VECTORS["now"]) == (case["uid"], case["epoch"], case["expires"])
    assert tokens.sign(KEY, case["uid"], case["epoch"], case["expires"]) == case["token"]


@pytest.mark.parametrize("case", VECTORS["invalid_tokens"], ids=lambda c: c["why"])
def test_invalid_tokens(case):
    with pytest.raises(tokens.TokenError):
        tokens.verify(KEY, case["token"], VECTORS["now"])


@pytest.mark.parametrize("case", VECTORS["keys"], ids=lambda c: c["key"])
def test_keys(case):
    assert keys.answer_key(case["resource"], case["uid"], case["epoch"]) == case["key"]


def test_murmur3():
    from pymemcache.client.murmur3 import murmur3_32

    for text, value in VECTORS["murmur3_32"]:
        assert murmur3_32(text) == value


@pytest.mark.parametrize("mapping", VECTORS["server_mapping"], ids=lambda m: str(len(m["servers"])))
def test_server_mapping_is_static_rendezvous(mapping):
    specs = [f"[{s.rsplit(':', 1)[0]}]:{s.rsplit(':', 1)[1]}" if s.count(":") > 1 else s
             for s in mapping["servers"]]
    cache = AnswerCache(specs, 0.05, 1.0)
    for key, node in mapping["keys"]:
        assert cache.node_for(key) == node


def test_body_encoding():
    assert dumps({"count": 1, "items": [{"content": "\u2603 <b>"}]}) == \
        '{"count":1,"items":[{"content":"\u2603 <b>"}]}'.encode()


def test_secret_bounds():
    assert parse_secret(b" " + b"k" * 32 + b"\n") == b"k" * 32
    with pytest.raises(SecretFileError):
        parse_secret(b"k" * 31)


@pytest.mark.parametrize("case", VECTORS["credentials"]["vectors"], ids=lambda c: c["why"])
def test_credentials_behind_gunicorn(case):
    """Django's reading is the reference: the raw header bytes through gunicorn's parser and
    WSGI environ, then token_from_request."""
    expected = case["django"]
    expected = (None, None) if expected == "none" else (expected["token"], expected["source"])
    assert auth.token_from_request(django_request(request_bytes(case["headers"]))) == expected


@pytest.mark.parametrize("cookie", ["plurk_token=", "a=1; plurk_token= ; b=2"])
def test_empty_cookie_is_authentication_required(cookie):
    status, headers, body = django_response(request_bytes([("Cookie", cookie)]))
    assert (status, body) == (401, b'{"error":"authentication required"}')


@pytest.mark.parametrize("body, etag", VECTORS["etag"], ids=lambda v: v[:24])
def test_etag_vectors(body, etag):
    """Section 7: the quoted first 32 hex digits of SHA-256 of the exact body bytes."""
    from fastpoll.http import answer_etag

    assert answer_etag(body.encode()) == etag


@pytest.mark.parametrize("case", VECTORS["capabilities"]["valid"], ids=lambda c: c["capability"][:32])
def test_valid_capabilities(case):
    expected = (case["resource"], case["object"], case["uid"], case["expires"])
    assert tokens.verify_capability(KEY, case["capability"], VECTORS["now"]) == expected
    assert tokens.sign_capability(KEY, *expected) == case["capability"]


@pytest.mark.parametrize("case", VECTORS["capabilities"]["invalid"], ids=lambda c: c["why"])
def test_invalid_capabilities(case):
    with pytest.raises(tokens.TokenError):
        tokens.verify_capability(KEY, case["capability"], VECTORS["now"])
