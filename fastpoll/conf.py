"""fastpoll's settings: one ``settings.FASTPOLL`` dict merged over :data:`DEFAULTS`.

``get_config()`` is cached and cleared on ``setting_changed`` (so ``override_settings`` works in
tests); every derived object (the memcached client, the signing key) registers a reset callback
with :func:`on_reset` and is rebuilt on next use.
"""
import functools
import re

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

#: Every key of FASTPOLL, with its default.  Documented in docs/integrate.md and docs/api.md ("Settings").
DEFAULTS = {
    # memcached servers as "host:port" / "[v6]:port"; the order does not matter (rendezvous hash).
    "MEMCACHED_SERVERS": ["127.0.0.1:11211"],
    # seconds to wait for memcached (connect and each reply); keep it short: never blocks the API.
    "MEMCACHED_TIMEOUT": 0.05,
    # seconds a server that failed is skipped by this process before it is tried again.
    "MEMCACHED_RETRY_INTERVAL": 1.0,
    # the HMAC key file shared with fastpath (docs/contract.md, section 1); required.
    "SECRET_FILE": None,
    # lifetime of issued tokens, seconds.
    "TOKEN_TTL": 30 * 24 * 3600,
    # lifetime of a cached answer, seconds: the last safety net against a stale entry.
    "CACHE_TTL": 3600,
    # gets -> read -> cas attempts per key before the key is handed to the repair pass.
    "CAS_ATTEMPTS": 4,
    # users per answer query / memcached batch.
    "BATCH_SIZE": 1000,
    # most followers whose answers are written in the request that committed the change; a larger
    # fan-out goes to the process's background writer thread (fastpoll.background).
    "FANOUT_IN_REQUEST": 20000,
    # name of the poll token cookie (fastpath --cookie-name, rendered by fastpoll_fastpath).
    "COOKIE_NAME": "fastpoll_token",
    # first part of every cache key (fastpath --key-prefix): 1-16 of A-Z a-z 0-9 - _.
    "KEY_PREFIX": "p1",
    # path of the polls, before the resource name (fastpath --path-prefix; fastpoll.urls).
    "PATH_PREFIX": "/Poll/",
    # logging out with Django (user_logged_out) revokes the user's poll tokens: every session's and
    # API client's, as revocation is per user (fastpoll.middleware).  False: logging out only
    # deletes this browser's poll cookie; its token stays valid until it expires (TOKEN_TTL).
    "REVOKE_ON_LOGOUT": True,
    # lifetime of a capability for a per-object resource (fastpoll.capability), seconds.
    "CAPABILITY_TTL": 3600,
    # seconds between passes of `manage.py repaircache --loop`.
    "REPAIR_INTERVAL": 0.5,
    # seconds after its commit an outbox row (a change whose answers its process has not finished
    # writing) is taken to be abandoned and written by the repair pass.  Longer than a write takes.
    "OUTBOX_GRACE": 5.0,
    # directories of fastpath worker sockets (<dir>/<worker>.sock) that get a notice of every key
    # stored or deleted (docs/contract.md, section 7); empty: no notices, fastpath re-reads only.
    "NOTIFY_DIRS": [],
    # fastpath workers' UDP notice ports as "host:port" / "[v6]:port", one entry per worker
    # (fastpath --notify-udp HOST:FIRST: worker i on FIRST+i), read by fastpoll.notify.UdpNotifier.
    "NOTIFY_UDP": [],
    # dotted path of the notice backend: a class whose instances have send(keys).
    "NOTIFY_BACKEND": "fastpoll.notify.UnixDatagramNotifier",
    # -- fastpath and nginx (rendered by fastpoll_fastpath / fastpoll_nginx)
    # where fastpath listens and nginx sends the polls: "host:port", "[v6]:port" or "unix:/path"
    # (fastpath --listen; the server of nginx's upstream <NGINX_NAME>_fastpath).
    "FASTPATH_ADDRESS": "127.0.0.1:8001",
    # fastpath's loopback stats listener, "host:port" (fastpath --admin); None: no listener.
    "FASTPATH_ADMIN": None,
    # fastpath worker processes (fastpath --workers; 0: one per CPU).
    "FASTPATH_WORKERS": 0,
    # seconds fastpath keeps an idle keep-alive connection (fastpath --idle-timeout); nginx drops
    # its idle connections to fastpath 2 s sooner, so it never reuses one fastpath is closing.
    "FASTPATH_IDLE_TIMEOUT": 10,
    # longest hold of a long-poll (`Prefer: wait=N`), seconds (fastpath --max-wait; 0: never
    # hold); nginx waits 15 s more for the answer before it answers a JSON 504 itself.
    "LONGPOLL_MAX_WAIT": 55,
    # a Server-Sent Events stream's comment line every this many seconds (fastpath
    # --stream-heartbeat); nginx waits 15 s more between two reads of a stream.
    "STREAM_HEARTBEAT": 25,
    # longest life of a stream, seconds, jittered (fastpath --max-stream); EventSource reconnects.
    "STREAM_MAX": 300,
    # how nginx reaches Django for the polls fastpath does not answer: what follows http:// in
    # proxy_pass, an upstream name of the server block's or "host:port" / "unix:/path:".
    "DJANGO_UPSTREAM": "127.0.0.1:8000",
    # prefix of every name the nginx include defines (upstream <name>_fastpath, $<name>_wait,
    # locations /_<name>_wait/, /_<name>_error/<status>, @<name>_django): 1-32 of a-z 0-9 _.
    "NGINX_NAME": "fastpoll",
    # idle connections to fastpath each nginx worker keeps (upstream keepalive): about the polls
    # one worker carries at once, as an answered client polls again at once.
    "NGINX_UPSTREAM_KEEPALIVE": 512,
    # long-polls and streams nginx holds at once per client address ($binary_remote_addr:
    # limit_conn on the hold and stream locations); beyond it a JSON 429 with Retry-After.  Behind
    # a balancer, give nginx the client's address (set_real_ip_from) or this caps the balancer.
    # Loopback clients are not capped.  0: no cap.
    "NGINX_HELD_PER_ADDRESS": 256,
    # the nginx variable sent to fastpath as X-Request-ID: "$request_id" (nginx's own), or one
    # the server block defines (a balancer's id when it comes from a trusted proxy).
    "NGINX_REQUEST_ID": "$request_id",
    # -- the edge: fastpath's second listener, polled by browsers without nginx (fastpath --edge;
    # docs/contract.md section 10, docs/deploy.md "The edge")
    # "host:port" the edge listens on (fastpath --edge); None: no edge, pages poll the site.
    "EDGE_ADDRESS": None,
    # the URL pages reach the edge by, an origin without path ("https://poll.example.com"), as
    # fastpoll.edge_url() gives it to templates.  None: http://EDGE_ADDRESS when that is a
    # loopback address (and only to a page opened on this machine); required otherwise.
    "EDGE_URL": None,
    # the site origins whose pages may read edge answers with their cookie (CORS with
    # credentials; fastpath --edge-origins), as a browser sends them: ["https://www.example.com"].
    # Required with EDGE_ADDRESS.
    "EDGE_ORIGINS": [],
    # open edge connections per fastpath worker (--edge-max-connections); more are closed at once.
    "EDGE_MAX_CONNECTIONS": 2048,
    # long-polls and streams held per client address on the edge, per worker (--edge-max-per-address; 0: no cap).
    "EDGE_MAX_PER_ADDRESS": 64,
    # open edge connections per client address, per worker, held or not (--edge-max-conns-per-address):
    # None is fastpath's default, twice EDGE_MAX_PER_ADDRESS (so 0 there turns this off too); 0: no cap.
    "EDGE_MAX_CONNS_PER_ADDRESS": None,
    # long-polls and streams held per user, per worker, on both listeners (--max-held-per-user;
    # 0: no cap).  Give one (32) when the edge faces the internet (fastpoll.W005).
    "MAX_HELD_PER_USER": 0,
    # seconds an edge request may take to arrive from its first byte (--edge-header-timeout).
    "EDGE_HEADER_TIMEOUT": 10,
    # the Domain of the poll cookie; None: settings.SESSION_COOKIE_DOMAIN (host-only when that
    # is None).  ".example.com" sends it to an edge on poll.example.com too.
    "COOKIE_DOMAIN": None,
}

#: the EDGE_* settings (and MAX_HELD_PER_USER, the per-user cap it comes with): fastpoll.E016
EDGE_SETTINGS = ("EDGE_ADDRESS", "EDGE_URL", "EDGE_ORIGINS", "EDGE_MAX_CONNECTIONS", "EDGE_MAX_PER_ADDRESS",
                 "EDGE_MAX_CONNS_PER_ADDRESS", "MAX_HELD_PER_USER", "EDGE_HEADER_TIMEOUT")

#: a PATH_PREFIX fastpath can take (fastpath/options.py) and nginx can route: "/", one or more
#: segments, "/" again.  "/" alone would send every request of the site to fastpath, which
#: answers 404 to all but the polls.  fastpoll.E012 and the renderers (fastpoll.nginx) say so.
PATH_PREFIX_RE = re.compile(r"\A/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]+/)+\Z")
PATH_PREFIX_RULE = "a path of one or more segments that starts and ends with / (such as '/Poll/'), at most 64 bytes"


def is_path_prefix(value):
    return isinstance(value, str) and len(value) <= 64 and PATH_PREFIX_RE.match(value) is not None


_reset_callbacks = []


@functools.lru_cache(maxsize=None)
def get_config():
    """The effective configuration: a copy of DEFAULTS updated with ``settings.FASTPOLL``."""
    config = dict(DEFAULTS)
    user = getattr(settings, "FASTPOLL", None)
    if isinstance(user, dict):
        config.update(user)
    return config


def on_reset(callback):
    """Call ``callback()`` whenever the configuration is invalidated; returns ``callback``."""
    _reset_callbacks.append(callback)
    return callback


def reset():
    get_config.cache_clear()
    for callback in _reset_callbacks:
        callback()


@receiver(setting_changed)
def _setting_changed(*, setting, **kwargs):
    if setting == "FASTPOLL":
        reset()
