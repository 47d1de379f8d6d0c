"""Regenerate tests/vectors/contract.json: ``python tests/vectors/make_vectors.py``.

Written from first principles (hmac, f-strings) and pymemcache's own RendezvousHash, not from
plurkcore, so that the vectors check plurkcore and fastpath instead of echoing one of them.
"""
import hashlib
import hmac
import json
import os
import random
import re

from pymemcache.client.rendezvous import RendezvousHash
from pymemcache.client.murmur3 import murmur3_32

HERE = os.path.dirname(os.path.abspath(__file__))
SECRET = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000
UUID = "3f2a9c1e-7b4d-4e8a-9c0f-5d6e7f8a9b0c"       # str() of a Django UUIDField primary key


def token(uid, epoch, expires, key=SECRET):
    payload = f"v1.{uid}.{epoch}.{expires}".encode()
    return payload.decode() + "." + hmac.new(key, payload, hashlib.sha256).hexdigest()


def capability(resource, obj, uid, expires, key=SECRET):
    """docs/contract.md, section 8: "c1." resource "." object "." uid "." expires "." HMAC hex."""
    payload = f"c1.{resource}.{obj}.{uid}.{expires}".encode()
    return payload.decode() + "." + hmac.new(key, payload, hashlib.sha256).hexdigest()


def capabilities():
    """Valid capabilities with what they name and the object's key; invalid ones with why; the
    epoch marker keys of tokens."""
    valid = []
    for resource, obj, uid, expires in [("thread", "t-1", "42", NOW + 60), ("room", UUID, UUID, NOW + 1),
                                        ("r" * 32, "o" * 64, "u" * 64, 2**63 - 1), ("x", "0", "1", NOW + 3600),
                                        ("Chat_2", "A_b-C", "7", 9999999999)]:
        valid.append({"capability": capability(resource, obj, uid, expires), "resource": resource, "object": obj,
                      "uid": uid, "expires": expires, "key": f"p1:{resource}:{obj}:o"})
    assert max(len(v["capability"]) for v in valid) == 250
    good = capability("thread", "t-1", "42", NOW + 60)
    sig = good.rsplit(".", 1)[1]
    invalid = [
        {"capability": capability("thread", "t-1", "42", NOW), "why": "expired (now == expires)"},
        {"capability": capability("thread", "t-1", "42", NOW + 60, key=SECRET[::-1]), "why": "another key"},
        {"capability": good[:-1] + ("0" if good[-1] != "0" else "1"), "why": "bad signature"},
        {"capability": "v1" + good[2:], "why": "a token's version"},
        {"capability": token(42, 3, NOW + 60), "why": "a token is no capability"},
        {"capability": good.replace(sig, sig.upper()), "why": "uppercase hex"},
        {"capability": capability("thr-ead", "t-1", "42", NOW + 60), "why": "a dash in the resource"},
        {"capability": capability("r" * 33, "t-1", "42", NOW + 60), "why": "resource of 33 characters"},
        {"capability": capability("thread", "o" * 65, "42", NOW + 60), "why": "object of 65 characters"},
        {"capability": capability("thread", "t-1", "u" * 65, NOW + 60), "why": "uid of 65 characters"},
        {"capability": capability("thread", "t:1", "42", NOW + 60), "why": "a colon in the object"},
        {"capability": capability("thread", "t.1", "42", NOW + 60), "why": "a dot in the object"},
        {"capability": capability("thread", "t 1", "42", NOW + 60), "why": "a space in the object"},
        {"capability": capability("thread", "", "42", NOW + 60), "why": "empty object"},
        {"capability": capability("thread", "t-1", "", NOW + 60), "why": "empty uid"},
        {"capability": f"c1.thread.t-1.42.0{NOW + 60}." + sig, "why": "leading zero in expires"},
        {"capability": f"c1.thread.t-1.42.9223372036854775808." + sig, "why": "expires above 2^63-1"},
        {"capability": good + ".x", "why": "extra field"},
        {"capability": good[:-2], "why": "short signature"},
        {"capability": "", "why": "empty"},
    ]
    markers = [{"token": token(uid, epoch, NOW + 60), "key": f"p1:@:{uid}:{epoch}"}
               for uid, epoch in [(42, 0), (42, 3), (UUID, 17), ("u" * 64, 2**63 - 1)]]
    return {"valid": valid, "invalid": invalid, "marker_keys": markers}


def credentials(t, u):
    """Header sets -> the token each side reads (docs/contract.md, section 2); t and u are tokens.

    Values are latin-1 strings: one character per byte on the wire.  "fastpath" is what the C
    must read: {"token": <bytes as latin-1>}, "none" or "ambiguous" (404 MISS, Django decides).
    "django" is what plurkcore's token_from_request reads behind gunicorn: {"token", "source"}
    or "none"; Django re-decodes the Cookie header as UTF-8 (errors="replace"), so its tokens
    are text.  Derived from gunicorn 23 (strips " \t" around a value, joins a repeated header
    with ","), Django's parse_cookie (splits on ";" and the first "=", str.strip()s both sides,
    last pair wins, unquotes "...") and auth.token_from_request ("bearer " case-insensitive,
    then the cookie if non-empty)."""
    hdr = {"token": t, "source": "header"}
    ck = {"token": t, "source": "cookie"}

    def v(why, headers, fastpath, django):
        return {"why": why, "headers": [list(h) for h in headers], "fastpath": fastpath, "django": django}

    def tok(x):
        return {"token": x}

    A, C = "Authorization", "Cookie"
    return [
        # Authorization: Bearer, the scheme and the header name in any ASCII case
        v("bearer", [(A, f"Bearer {t}")], tok(t), hdr),
        v("scheme lowercase", [(A, f"bearer {t}")], tok(t), hdr),
        v("scheme uppercase", [(A, f"BEARER {t}")], tok(t), hdr),
        v("scheme mixed case", [(A, f"BeArEr {t}")], tok(t), hdr),
        v("header name lowercase", [("authorization", f"Bearer {t}")], tok(t), hdr),
        v("header name uppercase", [("AUTHORIZATION", f"Bearer {t}")], tok(t), hdr),
        v("cookie header name uppercase", [("COOKIE", f"plurk_token={t}")], tok(t), ck),
        v("cookie header name mixed case", [("cOoKiE", f"plurk_token={t}")], tok(t), ck),
        v("two spaces after Bearer: the token starts with a space",
          [(A, f"Bearer  {t}")], tok(f" {t}"), {"token": f" {t}", "source": "header"}),
        v("tab after Bearer is no Bearer", [(A, f"Bearer\t{t}")], "none", "none"),
        v("tab after Bearer, then the cookie", [(A, f"Bearer\t{u}"), (C, f"plurk_token={t}")], tok(t), ck),
        v("Bearer alone", [(A, "Bearer")], "none", "none"),
        v("Bearer and a space alone (the space is stripped)", [(A, "Bearer ")], "none", "none"),
        v("Bearer and a space, then the cookie", [(A, "Bearer "), (C, f"plurk_token={t}")], tok(t), ck),
        v("Bearer token followed by OWS", [(A, f"Bearer {t} \t ")], tok(t), hdr),
        v("Bearer token surrounded by OWS", [(A, f"  Bearer   {t}  ")], tok(f"  {t}"),
          {"token": f"  {t}", "source": "header"}),
        v("tab before the token is part of it", [(A, f"Bearer \t{t}")], tok(f"\t{t}"),
          {"token": f"\t{t}", "source": "header"}),
        v("vertical tab after the token is part of it (only the cookie is str.strip()ped)",
          [(A, f"Bearer {t}\x0b")], tok(f"{t}\x0b"), {"token": f"{t}\x0b", "source": "header"}),
        v("latin-1 no-break space after the token is part of it",
          [(A, f"Bearer {t}\xa0")], tok(f"{t}\xa0"), {"token": f"{t}\xa0", "source": "header"}),
        v("empty Authorization, then the cookie", [(A, ""), (C, f"plurk_token={t}")], tok(t), ck),
        v("Basic and a cookie: the cookie", [(A, "Basic Zm9vOmJhcg=="), (C, f"plurk_token={t}")], tok(t), ck),
        v("Basic alone", [(A, "Basic Zm9vOmJhcg==")], "none", "none"),
        v("Proxy-Authorization is not ours", [("Proxy-Authorization", f"Bearer {t}")], "none", "none"),
        v("Bearer wins over the cookie", [(A, f"Bearer {t}"), (C, f"plurk_token={u}")], tok(t), hdr),
        v("Bearer wins even with a bad token", [(A, "Bearer junk"), (C, f"plurk_token={t}")], tok("junk"),
          {"token": "junk", "source": "header"}),
        v("Bearer wins over an empty cookie", [(A, f"Bearer {t}"), (C, "plurk_token=")], tok(t), hdr),
        v("Bearer wins over repeated Cookie headers",
          [(C, f"plurk_token={u}"), (A, f"Bearer {t}"), (C, "a=1")], tok(t), hdr),
        v("repeated Authorization", [(A, f"Bearer {t}"), (A, f"Bearer {u}")], "ambiguous",
          {"token": f"{t},Bearer {u}", "source": "header"}),
        v("repeated Basic Authorization and a cookie", [(A, "Basic eA=="), (A, "Basic eQ=="), (C, f"plurk_token={t}")],
          "ambiguous", ck),
        # Cookie
        v("cookie", [(C, f"plurk_token={t}")], tok(t), ck),
        v("cookie among others", [(C, f"theme=dark; plurk_token={t}; other=1")], tok(t), ck),
        v("empty cookie is no cookie", [(C, "plurk_token=")], "none", "none"),
        v("empty cookie among others", [(C, "a=1; plurk_token= ; b=2")], "none", "none"),
        v("empty cookie with Basic", [(A, "Basic Zm9vOmJhcg=="), (C, "plurk_token=")], "none", "none"),
        v("empty Cookie header", [(C, "")], "none", "none"),
        v("whitespace around name and value", [(C, f"a=1 ; plurk_token = {t} ;b=2")], tok(t), ck),
        v("cookie token surrounded by OWS", [(C, f"plurk_token=  \t{t}\t  ")], tok(t), ck),
        v("vertical tab and form feed around the value", [(C, f"plurk_token=\x0b{t}\x0c")], tok(t), ck),
        v("\\x1c-\\x1f around name and value", [(C, f"\x1cplurk_token\x1d=\x1e{t}\x1f")], tok(t), ck),
        v("a lone \\xa0 byte before the value (U+FFFD to Django)", [(C, f"plurk_token=\xa0{t}")], "ambiguous",
          {"token": f"\ufffd{t}", "source": "cookie"}),
        v("a lone \\x85 byte after the value (U+FFFD to Django)", [(C, f"plurk_token={t}\x85")], "ambiguous",
          {"token": f"{t}\ufffd", "source": "cookie"}),
        v("UTF-8 no-break space around the value", [(C, f"plurk_token=\xc2\xa0{t}\xc2\xa0")], "ambiguous", ck),
        v("UTF-8 next line (U+0085) after the value", [(C, f"plurk_token={t}\xc2\x85")], "ambiguous", ck),
        v("UTF-8 em space (U+2003) before the value", [(C, f"plurk_token=\xe2\x80\x83{t}")], "ambiguous", ck),
        v("UTF-8 ideographic space (U+3000) before the value", [(C, f"plurk_token=\xe3\x80\x80{t}")],
          "ambiguous", ck),
        v("UTF-8 no-break space before the name", [(C, f"\xc2\xa0plurk_token={t}")], "ambiguous", ck),
        v("UTF-8 no-break space after the name", [(C, f"plurk_token\xc2\xa0={t}")], "ambiguous", ck),
        v("a lone \\x85 byte before the name (U+FFFD to Django)", [(C, f"\x85plurk_token={t}")], "ambiguous",
          "none"),
        v("non-whitespace UTF-8 at the end of the value", [(C, f"plurk_token={t}\xc3\xa9")], "ambiguous",
          {"token": f"{t}\xe9", "source": "cookie"}),
        v("UTF-8 inside the value", [(C, f"plurk_token=ab\xc3\xa9cd")], tok("ab\xc3\xa9cd"),
          {"token": "ab\xe9cd", "source": "cookie"}),
        v("UTF-8 in another cookie's name", [(C, f"caf\xc3\xa9=1; plurk_token={t}")], tok(t), ck),
        v("quoted value", [(C, f'plurk_token="{t}"')], "ambiguous", ck),
        v("quoted empty value", [(C, 'plurk_token=""')], "ambiguous", "none"),
        v("a quote at the start only", [(C, f'plurk_token="{t}')], tok(f'"{t}'),
          {"token": f'"{t}', "source": "cookie"}),
        v("a lone quote", [(C, 'plurk_token="')], tok('"'), {"token": '"', "source": "cookie"}),
        v("a quoted value of another cookie containing ';'", [(C, f'a="x;y"; plurk_token={t}')], tok(t), ck),
        v("'=' inside the value", [(C, f"plurk_token={t}=x")], tok(f"{t}=x"),
          {"token": f"{t}=x", "source": "cookie"}),
        v("space inside the value", [(C, "plurk_token=a b")], tok("a b"), {"token": "a b", "source": "cookie"}),
        v("two plurk_token cookies", [(C, f"plurk_token={u}; plurk_token={t}")], "ambiguous", ck),
        v("a plurk_token cookie, then an empty one", [(C, f"plurk_token={t}; plurk_token=")], "ambiguous", "none"),
        v("an empty plurk_token cookie, then one", [(C, f"plurk_token=; plurk_token={t}")], "ambiguous", ck),
        v("repeated Cookie header, plurk_token first", [(C, f"plurk_token={t}"), (C, "a=1")], "ambiguous",
          {"token": f"{t},a=1", "source": "cookie"}),
        v("repeated Cookie header, plurk_token second", [(C, "a=1"), (C, f"plurk_token={t}")], "ambiguous", "none"),
        v("a cookie without '='", [(C, f"junk; plurk_token={t}")], tok(t), ck),
        v("plurk_token without '='", [(C, "plurk_token")], "none", "none"),
        v("plurk_token without '=' and another", [(C, "plurk_token; a=1")], "none", "none"),
        v("empty name", [(C, f"={t}")], "none", "none"),
        v("semicolons around", [(C, f";;plurk_token={t};;")], tok(t), ck),
        v("cookie names are case-sensitive", [(C, f"PLURK_TOKEN={t}")], "none", "none"),
        v("a name with a space inside", [(C, f"plurk token={t}")], "none", "none"),
    ]


def same_answer(fastpath, django):
    """Where fastpath is sure, Django must answer the same: the same token, or tokens that are
    both malformed (non-ASCII: the token grammar is ASCII)."""
    if "none" in (fastpath, django):
        return fastpath == django
    a, b = fastpath["token"], django["token"]
    return a == b or not (a.isascii() or b.isascii())


def etag(body):
    """docs/contract.md, section 7: the first 32 lowercase hex digits of SHA-256 of the body, quoted."""
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


ETAG_BODIES = ["", '{"count":1}', '{"count":2}', '{"count":10}',
               '{"count":1,"items":[{"id":7,"plurk_id":7,"kind":"plurk","author":"a","content":"\u2603 <b> \\"\\"",'
               '"created":"2026-11-23T14:45:21.123456+00:00"}]}',
               '{"count":3,"items":[' + ",".join(
                   f'{{"id":{i},"plurk_id":1,"kind":"response","author":"\u00e9","content":"{"x" * 300}",'
                   f'"created":"2026-11-23T14:45:21+00:00"}}' for i in (3, 2, 1)) + "]}"]


def conditional(body, other):
    """Request headers + the current body -> what each side answers (docs/contract.md, section 7).

    "django": the status Django's poll view gives (django.utils.cache semantics, never holds).
    "fastpath": 200 / 204 / 304 at once, "miss" (404 X-Cache: MISS: Django decides) or "hold"
    (held until the answer changes -> its 200/204, or until min(wait, --max-wait) -> 304);
    "wait": the N of ``Preference-Applied: wait=N`` fastpath sends (None: no such header)."""
    tag, tag2 = etag(body.encode()), etag(other.encode())
    ok = 200 if body else 204
    INM, P = "If-None-Match", "Prefer"

    def v(why, headers, django, fastpath, wait=None):
        return {"why": why, "headers": [list(h) for h in headers], "django": django, "fastpath": fastpath,
                "wait": wait}

    return [
        v("no validator", [], ok, ok),
        v("matching strong tag", [(INM, tag)], 304, 304),
        v("matching weak tag (weak comparison)", [(INM, "W/" + tag)], 304, 304),
        v("other tag", [(INM, tag2)], ok, ok),
        v("other weak tag", [(INM, "W/" + tag2)], ok, ok),
        v("matching tag surrounded by OWS", [(INM, f"  {tag}\t")], 304, 304),
        v("unquoted tag: no entity-tag", [(INM, tag.strip('"'))], ok, "miss"),
        v("a list containing the tag", [(INM, f"{tag2}, {tag}")], 304, "miss"),
        v("a list without the tag", [(INM, f'{tag2}, "x"')], ok, "miss"),
        v("star", [(INM, "*")], 304, "miss"),
        v("empty If-None-Match: no entity-tag", [(INM, "")], ok, "miss"),
        v("garbage", [(INM, "garbage")], ok, "miss"),
        v("repeated If-None-Match", [(INM, tag), (INM, tag2)], 304, "miss"),
        v("wait without a validator", [(P, "wait=10")], ok, ok, 10),
        v("wait, other tag: at once", [(P, "wait=10"), (INM, tag2)], ok, ok, 10),
        v("wait, matching tag: held", [(P, "wait=10"), (INM, tag)], 304, "hold", 10),
        v("wait, matching weak tag: held", [(P, "wait=10"), (INM, "W/" + tag)], 304, "hold", 10),
        v("wait among other preferences", [(P, "respond-async, wait=20"), (INM, tag)], 304, "hold", 20),
        v("wait=0: held for no time", [(P, "wait=0"), (INM, tag)], 304, "hold", 0),
        v("unparseable wait is no wait", [(P, "wait=soon"), (INM, tag)], 304, 304),
        v("negative wait is no wait", [(P, "wait=-1"), (INM, tag)], 304, 304),
        v("other preferences only", [(P, "return=minimal"), (INM, tag)], 304, 304),
        # RFC 7240: a comma or semicolon inside a quoted value separates nothing
        v("wait=2 inside a quoted value is no wait", [(P, 'foo="a, wait=2 ,b"'), (INM, tag)], 304, 304),
        v("a quoted parameter before wait", [(P, 'wait=2; foo="x, y"'), (INM, tag)], 304, "hold", 2),
        v("wait with a list: Django decides", [(P, "wait=10"), (INM, f"{tag2}, {tag}")], 304, "miss"),
    ]


def event(id_, name, body):
    """docs/contract.md, section 9: one event: its id, its resource, a data line for each line of
    the body (split at CRLF, CR or LF; the empty body is one empty data line), a blank line."""
    lines = re.split(r"\r\n|\r|\n", body)
    return f"id: {id_}\nevent: {name}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


#: docs/contract.md, section 9: every stream's first bytes (fastpath's and Django's), before its events
STREAM_PREFIX = "retry: 1000\n\n"


def streams():
    """What a stream request is (Accept), every stream's first bytes ("prefix": its retry: line),
    an event's bytes, and what a stream of several resources sends first for a Last-Event-ID
    (docs/contract.md section 9).  "opening": the body after the head, the prefix and then the
    events in path order."""
    accept = [
        ("text/event-stream", "GET", True),
        ("TEXT/Event-Stream", "GET", True),
        ("text/html, text/event-stream;q=0.9", "GET", True),
        ("text/event-stream ; charset=utf-8", "GET", True),
        (" \ttext/event-stream\t", "GET", True),
        ("text/event-stream", "HEAD", False),
        ("text/event-stream", "POST", False),
        ("*/*", "GET", False),
        ("text/*", "GET", False),
        ("application/json", "GET", False),
        ("text/event-streamx", "GET", False),
        ("text/event-stream-x, application/json", "GET", False),
        ("", "GET", False),
        (None, "GET", False),
    ]
    bodies = ["", '{"count":1}', "a\nb", "a\r\nb\rc\n", "\n", '{"count":3,"content":"\u2603"}']
    events = [{"name": name, "body": body, "bytes": event(etag(body.encode("utf-8")), name, body)}
              for name in ("getUnreadCount", "getMessages") for body in bodies]
    names, a, b = ["getUnreadCount", "getMessages"], '{"count":2}', '{"count":2,"items":[]}'
    ta, tb, old = etag(a.encode()), etag(b.encode()), etag(b"old")

    def opening(last_event_id):
        have = [None, None]
        if last_event_id is not None:
            parts = last_event_id.strip(" \t").split(",")
            ok = len(parts) == 2 and all(p == '""' or (len(p) == 34 and p[0] == p[-1] == '"') for p in parts)
            have = [None if p == '""' else p for p in parts] if ok else [None, None]
        out = STREAM_PREFIX
        for i, (name, body, tag) in enumerate(zip(names, (a, b), (ta, tb))):
            if have[i] != tag:
                have[i] = tag
                out += event(",".join(t or '""' for t in have), name, body)
        return out

    several = [{"why": why, "names": names, "bodies": [a, b], "last_event_id": lei, "opening": opening(lei)}
               for why, lei in [("no Last-Event-ID: both, the first with \"\" for the second", None),
                                ("both current: nothing", f"{ta},{tb}"),
                                ("the first changed", f"{old},{tb}"),
                                ("the second changed", f"{ta},{old}"),
                                ("the client had none of the second", f'{ta},""'),
                                ("OWS around the id", f" {ta},{tb}\t"),
                                ("a single ETag is not a composite id: both", ta),
                                ("three parts for two resources: both", f"{ta},{tb},{tb}"),
                                ("garbage: both", "garbage")]]
    return {"accept": [{"accept": h, "method": m, "stream": st} for h, m, st in accept],
            "prefix": STREAM_PREFIX, "events": events, "several": several}


def main():
    rng = random.Random(20091122)
    valid = []
    # uid is text (docs/contract.md section 2): Django's str(pk), an integer's or a UUID's
    for uid, epoch, expires in [(1, 0, NOW + 1), (42, 3, NOW + 86400), (2**63 - 1, 2**63 - 1, 2**63 - 1),
                                (1000000, 17, NOW + 3600), (9, 10, 9999999999), (UUID, 0, NOW + 60),
                                (UUID.upper(), 2, NOW + 60), ("0", 0, NOW + 60), ("042", 0, NOW + 60),
                                ("a", 1, NOW + 60), ("_-", 1, NOW + 60), ("x" * 64, 0, NOW + 60),
                                ("Z9" * 32, 2**63 - 1, 2**63 - 1)]:
        valid.append({"token": token(uid, epoch, expires), "uid": str(uid), "epoch": epoch, "expires": expires,
                      "key": f"p1:getMessages:{uid}:{epoch}"})
    assert max(len(v["token"]) for v in valid) == 172
    good = token(42, 3, NOW + 86400)
    sig = good.rsplit(".", 1)[1]
    invalid = [
        {"token": token(42, 3, NOW), "why": "expired (now == expires)"},
        {"token": token(42, 3, NOW - 1), "why": "expired"},
        {"token": good[:-1] + ("0" if good[-1] != "0" else "1"), "why": "bad signature"},
        {"token": good.upper().replace("V1", "v1"), "why": "uppercase hex"},
        {"token": token(42, 3, NOW + 86400, key=SECRET[::-1]), "why": "signed with another key"},
        {"token": f"v1.042.3.{NOW + 86400}." + sig, "why": "uid 042 is not uid 42 (text): bad signature"},
        {"token": f"v1.0.3.{NOW + 86400}." + sig, "why": "uid 0 is text too: bad signature"},
        {"token": f"v1.42.03.{NOW + 86400}." + sig, "why": "leading zero epoch"},
        {"token": "v2" + good[2:], "why": "wrong version"},
        {"token": good[:-2], "why": "short signature"},
        {"token": good + "0", "why": "long signature"},
        {"token": good + " ", "why": "trailing space"},
        {"token": "", "why": "empty"},
        {"token": "v1...." + sig, "why": "empty fields"},
        {"token": f"v1.9223372036854775808.0.{NOW + 86400}." + sig, "why": "uid above 2^63-1 is text: bad signature"},
        {"token": f"v1.-1.0.{NOW + 86400}." + sig, "why": "uid -1 is text: bad signature"},
        {"token": f"v1.42.-1.{NOW + 86400}." + sig, "why": "negative epoch"},
        {"token": f"v1.42.9223372036854775808.{NOW + 86400}." + sig, "why": "epoch above 2^63-1"},
        {"token": token("x" * 65, 0, NOW + 60), "why": "uid of 65 characters"},
        {"token": token("a.b", 0, NOW + 60), "why": "a dot in the uid"},
        {"token": token("a:b", 0, NOW + 60), "why": "a colon in the uid (it would split the key)"},
        {"token": token("a b", 0, NOW + 60), "why": "a space in the uid"},
        {"token": token("a+b", 0, NOW + 60), "why": "a plus in the uid"},
        {"token": token("a/b", 0, NOW + 60), "why": "a slash in the uid"},
        {"token": token("caf\u00e9", 0, NOW + 60), "why": "a non-ASCII uid"},
        {"token": token("a\nb", 0, NOW + 60), "why": "a line feed in the uid"},
        {"token": f"v1..0.{NOW + 60}." + sig, "why": "empty uid"},
        {"token": f"v1.42.3.{NOW + 86400}.{sig}.x", "why": "extra field"},
        {"token": f"v1.42.3.{NOW + 86400}" + sig, "why": "missing dot"},
        {"token": "v1.42.3." + "9" * 200, "why": "too long"},
    ]
    keys = [{"resource": r, "uid": u, "epoch": e, "key": f"p1:{r}:{u}:{e}"}
            for r, u, e in [("getUnreadCount", 42, 0), ("getMessages", 42, 3),
                            ("getMessages", 2**63 - 1, 2**63 - 1), ("x", 1, 0)]]
    server_sets = [
        ["127.0.0.1:11211"],
        ["127.0.0.1:11211", "127.0.0.1:11212", "127.0.0.1:11213"],
        ["10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211", "::1:11211"],
    ]
    mapping = []
    for servers in server_sets:
        hasher = RendezvousHash(list(servers))
        rows = []
        for _ in range(300):
            resource = rng.choice(["getUnreadCount", "getMessages"])
            uid = rng.choice([rng.randint(1, 10**6), rng.randint(1, 2**63 - 1)])
            epoch = rng.randint(0, 20)
            key = f"p1:{resource}:{uid}:{epoch}"
            rows.append([key, hasher.get_node(key)])
        mapping.append({"servers": servers, "keys": rows})
    murmur = [[s, murmur3_32(s)] for s in ["", "a", "ab", "abc", "abcd", "abcde",
                                           "127.0.0.1:11211-p1:getMessages:42:3",
                                           "The quick brown fox jumps over the lazy dog"]]
    t, u = token(42, 3, NOW + 86400), token(7, 0, NOW + 86400)
    creds = credentials(t, u)
    for vector in creds:
        assert vector["fastpath"] == "ambiguous" or same_answer(vector["fastpath"], vector["django"]), vector
    assert len({vector["why"] for vector in creds}) == len(creds), "duplicate why"
    for body, other in [('{"count":1}', '{"count":2}'), ("", '{"count":1}')]:
        for vector in conditional(body, other):
            # where fastpath answers at once, it answers as Django does
            assert vector["fastpath"] in ("miss", "hold") or vector["fastpath"] == vector["django"], vector
    doc = {
        "about": "Shared vectors for plurkcore and fastpath; see docs/contract.md. Generated by make_vectors.py.",
        "secret": SECRET.decode(),
        "now": NOW,
        "valid_tokens": valid,
        "invalid_tokens": invalid,
        "keys": keys,
        "murmur3_32": murmur,
        "server_mapping": mapping,
        "credentials": {"token": t, "other_token": u, "vectors": creds},
        "capabilities": capabilities(),
        "etag": [[body, etag(body.encode())] for body in ETAG_BODIES],
        "conditional": [dict(vector, body=body) for body, other in [('{"count":1}', '{"count":2}'), ("", '{"count":1}')]
                        for vector in conditional(body, other)],
        "streams": streams(),
    }
    with open(os.path.join(HERE, "contract.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    main()
