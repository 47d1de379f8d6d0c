"""fastpoll.W010-W013: the running fastpath does not serve a resource of the registry (W010), or
does not agree with Django's settings (W011-W013).

A resource missing from fastpath's ``--resources`` (per-user) or ``--object-resources``
(per-object) is no error anywhere: fastpath answers its polls 404 and nginx hands every one of
them to Django.  fastpath's stats listener (``--admin``, ``GET /metrics``) does not report the
lists, so the check asks the poll listener (``FASTPATH_ADDRESS``) the way nginx does, once per
registered resource, without a token: ``<PATH_PREFIX><name>`` for a per-user one,
``<PATH_PREFIX><name>/<PROBE_OBJECT>`` for a per-object one.  fastpath reads the path before
the credentials (fastpath/src/fp_route.c): it answers 401 for a resource it serves (no token)
and ``404`` with ``X-Cache: MISS`` for one it does not (docs/contract.md, sections 6 and 8).
Anything else (nothing listening, another server, a timeout) says nothing and warns of nothing:
the check is about a fastpath that runs.  Each probe has PROBE_TIMEOUT_S for the whole exchange
(connect, send, the answer), and all of them CHECK_TIMEOUT_S: a server that trickles its answer
costs that much, never more.

Then polls end to end (:func:`end_to_end`) of a per-user resource fastpath serves (else of a
per-object one, with a capability for the object and the user's epoch marker written too): Django
writes the answer of a synthetic user (:data:`PROBE_UID` and a suffix at :data:`PROBE_EPOCH`,
a key no user's), one user for each server of MEMCACHED_SERVERS (the server fastpoll's hash
gives the key), to memcached and polls it with a token signed with SECRET_FILE's secret, in the cookie
COOKIE_NAME; fastpath must answer 200 with that body.  A fastpath that was started with other
settings says which by its answer: 401 ``bad signature`` (another secret, W011), 401
``authentication required`` (another cookie name, W012), 404 MISS (another key prefix or other
memcached servers, W013).  The keys are deleted after.  A server Django lists and fastpath lacks
is always seen (its key is looked for elsewhere); one fastpath has and Django lacks only when
fastpath's ring places a probe key on it.

``register_checks()`` is what ``FastpollConfig.ready()`` calls.
"""
import contextlib
import json
import secrets
import socket
import time

from django.core import checks

from . import conf, keys, resources, tokens
from .cache import CacheUnavailable, get_cache
from .checks import _COOKIE_RE, _malformed
from .secret import SecretFileError, read_secret

TAG = "fastpoll"
#: seconds one probe may take in all (connect, send, read the answer): a server that trickles
#: its answer is cut off there, not after each byte
PROBE_TIMEOUT_S = 0.5
#: seconds all the probes of one ``check --deploy`` may take together: past it the check says
#: what it found so far
CHECK_TIMEOUT_S = 5.0
#: the object id of a per-object probe: any id fastpath can read (1-64 of A-Z a-z 0-9 - _); a
#: probe carries no token, so fastpath never reads the object's key
PROBE_OBJECT = "0"
#: the user of the end-to-end probe's token and answer key, followed by "-" and a random suffix
#: per run (several hosts running ``check --deploy`` at once probe keys of their own): text that
#: no integer or UUID primary key's str() is (a leading "-"), at an epoch no user reaches (an
#: epoch grows by one per revocation, from 0), so the key is never a real user's answer;
#: deleted after the probe
PROBE_UID = "-fastpoll-check"
PROBE_EPOCH = tokens.MAX_INT
#: the most memcached servers the end-to-end probe writes a key to (fastpath takes at most 64)
MAX_PROBED_SERVERS = 64
#: synthetic users tried to give each server a key (64 servers need ~300 on average)
_MAX_TRIES = 64 * 64
#: seconds the probe's token and key live, should the delete not reach memcached
PROBE_TTL_S = 60
_MAX_ANSWER = 65536


def _connect(address, timeout):
    """A socket connected to ``FASTPATH_ADDRESS`` (``unix:/path``, ``host:port``, ``[v6]:port``)."""
    if address.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address[5:])
        except BaseException:
            sock.close()
            raise
        return sock
    host, _, port = address.rpartition(":")
    return socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)


def _left(deadline):
    """Seconds until ``deadline`` (time.monotonic()); socket.timeout once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("probe deadline passed")
    return left


def _get(address, path, extra="", timeout=PROBE_TIMEOUT_S, deadline=None):
    """``GET path`` of the server at ``address`` (``extra``: header lines, each ending CRLF):
    (status, {lower-case header name: value}, body), or None when no HTTP/1 server answers
    within ``timeout`` seconds for the whole exchange (and before ``deadline``, a
    time.monotonic() value, when given)."""
    end = time.monotonic() + timeout
    if deadline is not None:
        end = min(end, deadline)
    try:
        with _connect(address, _left(end)) as sock:
            sock.settimeout(_left(end))
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: fastpoll-check\r\n{extra}Connection: close\r\n\r\n"
                         .encode("latin-1"))
            data = b""
            while len(data) < _MAX_ANSWER:
                sock.settimeout(_left(end))
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except (OSError, ValueError):
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ")
    if len(status) < 2 or not status[0].startswith("HTTP/1."):
        return None
    headers = {name.strip().lower(): value.strip() for name, sep, value in (line.partition(":") for line in lines[1:])
               if sep}
    return status[1], headers, body


def probe(address, path, timeout=PROBE_TIMEOUT_S, deadline=None):
    """True: fastpath at ``address`` serves ``path`` (401 without a token); False: it does not
    (404 with ``X-Cache: MISS``); None: no answer from a fastpath (refused, timed out, other)."""
    answer = _get(address, path, timeout=timeout, deadline=deadline)
    if answer is None:
        return None
    status, headers, _ = answer
    if status == "401":
        return True
    if status == "404" and headers.get("x-cache") == "MISS":
        return False
    return None


def _unserved(config, names, object_names, timeout, deadline=None):
    """As :func:`unserved`, but None when no fastpath answers."""
    address, prefix = config["FASTPATH_ADDRESS"], config["PATH_PREFIX"]
    if not isinstance(address, str) or not isinstance(prefix, str):
        return None                    # fastpoll.E0xx say what is wrong with them
    missing = []
    paths = [(name, prefix + name) for name in names] + [(name, f"{prefix}{name}/{PROBE_OBJECT}")
                                                          for name in object_names]
    for name, path in paths:
        answer = probe(address, path, timeout, deadline)
        if answer is None:
            return None
        if answer is False:
            missing.append(name)
    return missing


def unserved(config, names, object_names=(), timeout=PROBE_TIMEOUT_S):
    """The names of ``names`` (per-user) and ``object_names`` (per-object), in that order, that
    the fastpath at ``config['FASTPATH_ADDRESS']`` answers as unknown; [] when no fastpath
    answers there."""
    return _unserved(config, names, object_names, timeout) or []


def _usable(config):
    """The secret, when the settings the end-to-end probe uses are ones fastpath can take
    (fastpoll.E005/E006/E012 say what is wrong otherwise), else None."""
    if not (isinstance(config["COOKIE_NAME"], str) and _COOKIE_RE.match(config["COOKIE_NAME"])
            and isinstance(config["KEY_PREFIX"], str) and keys.PREFIX_RE.match(config["KEY_PREFIX"])):
        return None
    try:
        return read_secret(config["SECRET_FILE"])
    except (SecretFileError, TypeError, ValueError):
        return None


def probe_uid():
    """The synthetic user of one run of the end-to-end probe: PROBE_UID, "-", a random suffix."""
    return f"{PROBE_UID}-{secrets.token_hex(4)}"


def _probe_keys(store, key_of, run):
    """[(uid, key, node)]: synthetic users ``<run>-<n>`` chosen until each memcached server of
    Django's ring (``store``, fastpoll's own client and hash; at most MAX_PROBED_SERVERS of them)
    holds the key ``key_of(uid)`` of one."""
    wanted = min(len(store.nodes), MAX_PROBED_SERVERS)
    found = {}
    for n in range(_MAX_TRIES):
        uid = f"{run}-{n:x}"
        key = key_of(uid)
        node = store.node_for(key)
        if node not in found:
            found[node] = (uid, key, node)
            if len(found) == wanted:
                break
    return list(found.values())


def end_to_end(config, name, timeout=PROBE_TIMEOUT_S, deadline=None, per="user"):
    """Poll the resource ``name`` (one fastpath serves) as a browser would: the answer of a
    synthetic user written to memcached by Django, a token signed with SECRET_FILE's secret in
    the cookie COOKIE_NAME; one such user per memcached server of MEMCACHED_SERVERS, so that a
    server fastpath lacks is found.  A per-object resource (``per="object"``) is polled at the
    object of the user's own id, with a capability for it, its key and the user's epoch marker
    written first (docs/contract.md section 8).  Returns (status, X-Cache, error or None, the key,
    its server) of the first poll fastpath did not answer with that very answer, or None: it
    answered them all, or the probe could not be made (no secret, memcached unreachable from
    Django, no fastpath, the deadline)."""
    secret = _usable(config)
    if secret is None:
        return None
    store = get_cache()
    if per == "object":
        def key_of(uid):
            return keys.object_key(name, uid)        # the object is the synthetic user's own id
    else:
        def key_of(uid):
            return keys.answer_key(name, uid, PROBE_EPOCH)
    probes = _probe_keys(store, key_of, probe_uid())
    body = b'{"fastpoll":"check","probe":"%s"}' % secrets.token_hex(8).encode("ascii")
    expires = int(time.time()) + PROBE_TTL_S
    written, cleanup = [], []
    try:
        for uid, key, node in probes:
            values = [(key, body)] + ([(keys.marker_key(uid, PROBE_EPOCH), b"")] if per == "object" else [])
            try:
                for k, value in values:
                    where = store.node_for(k)
                    cleanup.append((k, where))
                    if store.store_many(where, [(b"set", k, value, None)], PROBE_TTL_S).get(k) != b"STORED":
                        raise CacheUnavailable(where, "not stored")
            except CacheUnavailable:
                continue               # Django cannot write its answers there either: its logs say so
            written.append((uid, key, node))
        for uid, key, node in written:
            token = tokens.sign(secret, uid, PROBE_EPOCH, expires)
            path = config["PATH_PREFIX"] + name
            if per == "object":
                path += f"/{uid}?cap={tokens.sign_capability(secret, name, uid, uid, expires)}"
            answer = _get(config["FASTPATH_ADDRESS"], path, f"Cookie: {config['COOKIE_NAME']}={token}\r\n",
                          timeout, deadline)
            if answer is None:
                return None
            status, headers, got = answer
            if status == "200" and got == body:
                continue
            error = None
            if status == "401":
                with contextlib.suppress(ValueError, AttributeError):
                    error = json.loads(got).get("error")
            return status, headers.get("x-cache"), error, key, node
        return None
    finally:
        for key, node in cleanup:
            with contextlib.suppress(CacheUnavailable):
                store.delete_many(node, [key])


def _drift(config, outcome):
    """The warning of a poll fastpath did not answer with Django's answer (:func:`end_to_end`)."""
    status, cache_status, error, key, node = outcome
    where = f"fastpath at {config['FASTPATH_ADDRESS']}"
    restart = "Restart fastpath with the command line `manage.py fastpoll_fastpath` prints"
    if status == "401" and error == "bad signature":
        return checks.Warning(
            f"{where} refuses a poll token signed with FASTPOLL['SECRET_FILE'] ({config['SECRET_FILE']}): 401 bad "
            f"signature, so it answers every poll 401: fastpath's --secret-file is not SECRET_FILE's secret.",
            hint=f"{restart} (--secret-file {config['SECRET_FILE']}); after `manage.py fastpoll_secret --force`, "
                 f"restart fastpath and every Django process.", id="fastpoll.W011")
    if status == "401" and error == "authentication required":
        return checks.Warning(
            f"{where} does not read the poll cookie FASTPOLL['COOKIE_NAME'] ({config['COOKIE_NAME']!r}): 401 "
            f"authentication required, so it answers every browser's poll 401: its --cookie-name differs.",
            hint=f"{restart} (--cookie-name {config['COOKIE_NAME']}).", id="fastpoll.W012")
    if status == "404" and cache_status == "MISS":
        return checks.Warning(
            f"{where} does not find the answers Django writes (the probe's key {key}, on memcached {node}): 404 MISS, so nginx sends "
            f"every poll to Django: its --key-prefix is not FASTPOLL['KEY_PREFIX'] ({config['KEY_PREFIX']!r}) or "
            f"its --memcached servers are not MEMCACHED_SERVERS.",
            hint=f"{restart} (--key-prefix {config['KEY_PREFIX']} --memcached "
                 f"{','.join(config['MEMCACHED_SERVERS'])}).", id="fastpoll.W013")
    said = f"{status} {error}" if error else f"{status}" + (f" (X-Cache: {cache_status})" if cache_status else "")
    return checks.Warning(
        f"{where} does not answer a poll with the answer Django wrote for it (the probe's key {key}, on "
        f"memcached {node}): it "
        f"answered {said}.", hint=f"{restart}, and compare its log with Django's settings.", id="fastpoll.W013")


def check_running_fastpath(app_configs=None, **kwargs):
    """W010, then (when fastpath serves a registered resource: a per-user one, else a per-object
    one) W011-W013 of its end-to-end polls."""
    if _malformed():
        return []                      # fastpoll.E001
    config = conf.get_config()
    deadline = time.monotonic() + CHECK_TIMEOUT_S
    users, objects = sorted(resources.names(per="user")), sorted(resources.names(per="object"))
    missing = _unserved(config, users, objects, PROBE_TIMEOUT_S, deadline)
    if missing is None:
        return []                      # no fastpath answers: the check is about one that runs
    found = []
    if missing:
        found.append(checks.Warning(
            f"fastpath at {config['FASTPATH_ADDRESS']} does not serve the poll resource(s) "
            f"{', '.join(missing)}: nginx sends every poll of them to Django.",
            hint="Restart fastpath with the command line `manage.py fastpoll_fastpath` prints "
                 "(its --resources and --object-resources, and its path prefix must be PATH_PREFIX).",
            id="fastpoll.W010"))
    served = [(name, "user") for name in users if name not in missing]
    served += [(name, "object") for name in objects if name not in missing]
    if served:
        name, per = served[0]          # a per-user one when fastpath serves one
        outcome = end_to_end(config, name, PROBE_TIMEOUT_S, deadline, per)
        if outcome is not None:
            found.append(_drift(config, outcome))
    return found


def register_checks():
    """Register W010-W013 (``FastpollConfig.ready()`` calls this once).  A deployment check
    (``manage.py check --deploy``): it asks the running fastpath over the network, and writes
    (then deletes) one key in memcached."""
    checks.register(check_running_fastpath, TAG, deploy=True)
