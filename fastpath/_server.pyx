# cython: language_level=3
"""Thin Cython layer over fastpath/src: configuration in, C event loop (without the GIL), errors out.

fastpath/options.py validates the options and fastpath/_lifecycle.pyx supervises the worker
processes; this module turns validated Options into ``fp_config_t`` (row by row of the option
table), runs one worker's loop and renders stats.
"""
from libc.string cimport memset
from libc.stdint cimport uint64_t

cimport fastpath.includes.fastpath as fp

import os

from fastpath.errors import FastpathError
from fastpath.options import OPTIONS

STATS_SLOT_SIZE = sizeof(fp.fp_stats_t)
MAX_SERVERS = fp.FP_MAX_SERVERS
MAX_RESOURCES = fp.FP_MAX_RESOURCES


# the fp_config_t scalars FP_CONFIG_SCALARS and texts FP_CONFIG_TEXTS generate, by name (the
# c_field of OPTIONS rows)
CONFIG_SCALARS = tuple(fp.fp_config_fields[i].decode("ascii") for i in range(fp.FP_CONFIG_N_SCALARS))
CONFIG_TEXTS = tuple(fp.fp_config_text_fields[i].decode("ascii") for i in range(fp.FP_CONFIG_N_TEXTS))
CONFIG_FIELDS = CONFIG_SCALARS + CONFIG_TEXTS


cdef int _set_field(fp.fp_config_t *cfg, opt, value, list keep) except -1:
    """One OPTIONS row's value into its c_field: a scalar, or a text ``keep`` holds."""
    cdef bytes name = opt.c_field.encode("ascii")
    cdef bytes b
    cdef int rc
    if opt.c_field in CONFIG_TEXTS:
        b = value.encode("ascii")
        keep.append(b)
        rc = fp.fp_config_set_text(cfg, name, len(name), b, len(b))
    else:
        rc = fp.fp_config_set(cfg, name, len(name), value)
    if rc != 0:
        raise FastpathError(f"{opt.flag} {value}: fp_config_t has no field {opt.c_field} that holds it")
    return 0


cdef int _texts(items, const char **ptrs, size_t *lens, int cap, what, list keep) except -1:
    """A list of names into a table of fp_config_t with ``cap`` slots (pointers into bytes
    ``keep`` holds); their count."""
    cdef int i
    cdef bytes b
    if len(items) > cap:
        raise FastpathError(f"need at most {cap} {what}")
    for i in range(len(items)):
        b = items[i].encode("ascii")
        keep.append(b)
        ptrs[i] = b
        lens[i] = len(b)
    return len(items)


cdef int _fill_config(fp.fp_config_t *cfg, opts, list keep) except -1:
    """``cfg`` from validated Options: the C defaults, each OPTIONS row that has a c_field set
    by name, then the servers, the secret, the resources and the backends.  ``keep`` holds every
    bytes object the C side points into, for as long as it does."""
    cdef int i
    cdef bytes b
    node_names, node_addrs, resources = opts.node_names, opts.node_addrs, opts.resources
    avoid_backends = opts.avoid_backends()
    if not 0 < len(node_names) == len(node_addrs) <= fp.FP_MAX_SERVERS:
        raise FastpathError(f"need 1..{fp.FP_MAX_SERVERS} memcached servers")
    resources = resources or ()
    if len(resources) > fp.FP_MAX_RESOURCES or not (resources or opts.object_resources):
        raise FastpathError(f"need 1..{fp.FP_MAX_RESOURCES} poll resources (or per-object ones)")
    if len(avoid_backends) > 3:
        raise FastpathError("too many backends to avoid")
    fp.fp_config_defaults(cfg)
    for opt in OPTIONS:
        if opt.c_field is not None:
            _set_field(cfg, opt, getattr(opts, opt.attr), keep)
    cfg.n_nodes = len(node_names)
    for i in range(cfg.n_nodes):
        b = node_names[i].encode("ascii")
        keep.append(b)
        cfg.nodes[i].name = b
        cfg.nodes[i].name_len = len(b)
        b = node_addrs[i].encode("ascii")
        keep.append(b)
        cfg.node_addr[i] = b
    b = opts.secret
    keep.append(b)
    cfg.secret = <const unsigned char *><char *>b
    cfg.secret_len = len(b)
    cfg.n_resources = _texts(resources, cfg.resources, cfg.resource_len, fp.FP_MAX_RESOURCES,
                             "poll resources", keep)
    cfg.n_object_resources = _texts(opts.object_resources or (), cfg.object_resources,
                                    cfg.object_resource_len, fp.FP_MAX_RESOURCES, "per-object resources", keep)
    cfg.n_edge_origins = _texts(opts.edge_origins or (), cfg.edge_origins, cfg.edge_origin_len,
                                fp.FP_MAX_ORIGINS, "edge origins", keep)
    for i in range(len(avoid_backends)):
        b = avoid_backends[i].encode("ascii")
        keep.append(b)
        cfg.backend_avoid[i] = b
    if opts.notify_dir:
        b = os.fsencode(opts.notify_dir)
        keep.append(b)
        cfg.notify_dir = b
    if opts.notify_udp_addr:
        b = opts.notify_udp_addr[0].encode("ascii")
        keep.append(b)
        cfg.notify_udp_host = b
        cfg.notify_udp_port = opts.notify_udp_addr[1]
    cfg.n_workers = opts.workers
    return 0


def run_worker(opts, int worker_index, int listen_fd, int admin_fd, stats, int edge_fd=-1):
    """Run worker ``worker_index``'s event loop for validated Options until SIGTERM/SIGINT; raise
    FastpathError on failure.  ``edge_fd``: the edge listener's socket, or -1."""
    cdef fp.fp_config_t cfg
    cdef char err[256]
    cdef int rc
    cdef unsigned char[::1] stats_view = stats
    cdef list keep = []

    _fill_config(&cfg, opts, keep)
    if len(stats) < STATS_SLOT_SIZE * cfg.n_workers or not 0 <= worker_index < cfg.n_workers:
        raise FastpathError("stats region too small")
    memset(err, 0, sizeof(err))
    cfg.listen_fd = listen_fd
    cfg.admin_fd = admin_fd
    cfg.edge_fd = edge_fd
    cfg.stats = <fp.fp_stats_t *>&stats_view[0]
    cfg.worker_index = worker_index
    with nogil:
        rc = fp.fp_server_run(&cfg, err, sizeof(err))
    if rc != 0:
        raise FastpathError(err.decode("utf-8", "replace"))


def render_stats(stats, int n_workers):
    """Prometheus text for the summed counters of ``n_workers`` slots of ``stats``."""
    cdef unsigned char[::1] view = stats
    cdef char buf[8192]
    if len(stats) < STATS_SLOT_SIZE * n_workers:
        raise FastpathError("stats region too small")
    n = fp.fp_stats_render(<fp.fp_stats_t *>&view[0], n_workers, buf, sizeof(buf))
    return buf[:n].decode("ascii")


# -- test hooks (used by tests/fastpath; not public API) --------------------------------------

def _testhelper_murmur3(bytes data, unsigned int seed=0):
    return fp.fp_murmur3_32(<const char *>data, len(data), seed)


def _testhelper_pick(list node_names, bytes key):
    """Index of the node that holds ``key`` (same code as the request path)."""
    cdef fp.fp_node_t nodes[64]
    cdef list keep = [n.encode("ascii") for n in node_names]
    cdef bytes b
    if len(keep) > 64:
        raise ValueError("too many nodes")
    for i, b in enumerate(keep):
        nodes[i].name = b
        nodes[i].name_len = len(b)
    return fp.fp_rendezvous_pick(nodes, len(keep), key, len(key))


def _testhelper_name_greater(bytes a, bytes b):
    """The rendezvous tie-break on its own: does node name a sort after b?"""
    cdef fp.fp_node_t na, nb
    na.name, na.name_len = a, len(a)
    nb.name, nb.name_len = b, len(b)
    return bool(fp.fp_node_name_greater(&na, &nb))


cdef str _testhelper_check(bytes secret, bytes cred, long long now, fp.fp_token_t *t, fp.fp_cap_t *c):
    """Checks ``cred`` with ``secret`` as a token into ``t``, or (``t`` NULL) as a capability into
    ``c``: None when valid, else fp_token_strerror's text."""
    cdef fp.fp_hmac_key_t hmac
    cdef fp.fp_token_result_t r
    if fp.fp_hmac_prepare(&hmac, <const unsigned char *><char *>secret, len(secret)) != 0:
        raise FastpathError("cannot prepare the HMAC key")
    if t != NULL:
        r = fp.fp_token_check(&hmac, cred, len(cred), now, t)
    else:
        r = fp.fp_cap_check(&hmac, cred, len(cred), now, c)
    if r != fp.FP_TOKEN_OK:
        return fp.fp_token_strerror(r).decode("ascii")
    return None


def _testhelper_token(bytes secret, bytes token, long long now, str resource="getMessages",
                      str key_prefix="p1"):
    """(uid, epoch, expires, key) for a valid token (uid as text), else the error string."""
    cdef fp.fp_token_t t
    cdef char key[256]
    cdef bytes res = resource.encode("ascii"), prefix = key_prefix.encode("ascii")
    error = _testhelper_check(secret, token, now, &t, NULL)
    if error is not None:
        return error
    n = fp.fp_make_key(key, sizeof(key), prefix, len(prefix), res, len(res), &t)
    return (t.uid_str[:t.uid_len].decode("ascii"), t.epoch, t.expires, key[:n].decode("ascii"))


def _testhelper_capability(bytes secret, bytes cap, long long now, str key_prefix="p1"):
    """(resource, object, uid, expires, object key) for a valid capability, else the error string."""
    cdef fp.fp_cap_t c
    cdef char key[256]
    cdef bytes prefix = key_prefix.encode("ascii")
    error = _testhelper_check(secret, cap, now, NULL, &c)
    if error is not None:
        return error
    n = fp.fp_make_object_key(key, sizeof(key), prefix, len(prefix), c.res, c.res_len, c.obj, c.obj_len)
    return (c.res[:c.res_len].decode("ascii"), c.obj[:c.obj_len].decode("ascii"),
            c.uid[:c.uid_len].decode("ascii"), c.expires, key[:n].decode("ascii"))


def _testhelper_marker_key(bytes secret, bytes token, long long now, str key_prefix="p1"):
    """The epoch marker key of a valid token's user, else the error string."""
    cdef fp.fp_token_t t
    cdef char key[256]
    cdef bytes prefix = key_prefix.encode("ascii")
    error = _testhelper_check(secret, token, now, &t, NULL)
    if error is not None:
        return error
    n = fp.fp_make_marker_key(key, sizeof(key), prefix, len(prefix), &t)
    return key[:n].decode("ascii")


def _testhelper_config(opts=None, int worker_index=0):
    """fp_config_t as run_worker fills it for validated ``opts`` (None: fp_config_defaults) and
    ``worker_index``, as a dict: every scalar by its C name, and the other fields."""
    cdef fp.fp_config_t cfg
    cdef list keep = []
    cdef long long value
    cdef const char *text
    cdef size_t text_len
    cdef bytes b
    cdef int i
    if opts is None:
        fp.fp_config_defaults(&cfg)
    else:
        _fill_config(&cfg, opts, keep)
        cfg.worker_index = worker_index
    out = {}
    for name in CONFIG_SCALARS:
        b = name.encode("ascii")
        if fp.fp_config_get(&cfg, b, len(b), &value) != 0:
            raise FastpathError(f"fp_config_get does not know {name}")
        out[name] = value
    for name in CONFIG_TEXTS:
        b = name.encode("ascii")
        if fp.fp_config_get_text(&cfg, b, len(b), &text, &text_len) != 0:
            raise FastpathError(f"fp_config_get_text does not know {name}")
        out[name] = text[:text_len].decode("ascii")
    out.update(
        listen_fd=cfg.listen_fd, admin_fd=cfg.admin_fd, edge_fd=cfg.edge_fd, n_workers=cfg.n_workers,
        edge_origins=[cfg.edge_origins[i][:cfg.edge_origin_len[i]].decode("ascii")
                      for i in range(cfg.n_edge_origins)],
        worker_index=cfg.worker_index,
        node_names=[cfg.nodes[i].name[:cfg.nodes[i].name_len].decode("ascii") for i in range(cfg.n_nodes)],
        node_addrs=[(<bytes>cfg.node_addr[i]).decode("ascii") for i in range(cfg.n_nodes)],
        secret=cfg.secret[:cfg.secret_len] if cfg.secret != NULL else b"",
        resources=[cfg.resources[i][:cfg.resource_len[i]].decode("ascii") for i in range(cfg.n_resources)],
        object_resources=[cfg.object_resources[i][:cfg.object_resource_len[i]].decode("ascii")
                          for i in range(cfg.n_object_resources)],
        backend_avoid=[(<bytes>cfg.backend_avoid[i]).decode("ascii")
                       for i in range(4) if cfg.backend_avoid[i] != NULL],
        notify_udp=((<bytes>cfg.notify_udp_host).decode("ascii"), cfg.notify_udp_port)
        if cfg.notify_udp_host != NULL else None)
    return out


def _testhelper_credentials(list headers, bytes cookie_name=b"fastpoll_token"):
    """The token of a request with these (name, value) header pairs (bytes), as the request path
    reads it: the token's bytes, or "none" or "ambiguous".  Like fp_conn.c it keeps the first
    Authorization and Cookie value and counts repeats (up to 2)."""
    cdef fp.fp_header_span_t spans[2]
    cdef int counts[2]
    cdef const char *tok = NULL
    cdef size_t tok_len = 0
    cdef bytes name, value
    cdef int slot
    counts[0] = counts[1] = 0
    for name, value in headers:
        kind = fp.fp_cred_header(name, len(name))
        if kind == fp.FP_CRED_OTHER:
            continue
        slot = 0 if kind == fp.FP_CRED_AUTHORIZATION else 1
        if counts[slot] == 0:
            spans[slot].data, spans[slot].len = value, len(value)   # headers keeps value alive
        counts[slot] = min(counts[slot] + 1, 2)
    r = fp.fp_credentials(&spans[0], counts[0], &spans[1], counts[1], cookie_name, len(cookie_name),
                          &tok, &tok_len)
    if r == fp.FP_CRED_FOUND:
        return tok[:tok_len]
    return "none" if r == fp.FP_CRED_NONE else "ambiguous"


# -- the memcached client on its own (tests/fastpath/test_memcached_client.py) ----------------

from libc.stdlib cimport calloc, free

_MC_RESULTS = {fp.FP_MC_QUEUED: "queued", fp.FP_MC_HIT: "hit", fp.FP_MC_EMPTY: "empty",
               fp.FP_MC_MISS: "miss", fp.FP_MC_UNAVAILABLE: "unavailable",
               fp.FP_MC_OVERLOADED: "overloaded"}


cdef void _mc_client_on_done(void *ctx, fp.fp_mc_result_t r, const char *data,
                             size_t length) noexcept with gil:
    client, index = <tuple>ctx
    (<_testhelper_mc_client>client)._reqs[index] = NULL
    client.answers.append((index, _MC_RESULTS[r], data[:length] if length else b""))
    if client.on_answer is not None:
        client.on_answer(index)      # may get and cancel, as fp_conn.c's callback does


cdef class _testhelper_mc_client:
    """One fp_mc_pool_t with one server whose connection is a socketpair: the test plays
    memcached on ``peer``.  ``get(key)`` queues (returns its index, or the answer given at once),
    ``cancel(index)``, ``reply(data)`` feeds bytes and runs the loop, ``written()`` returns the
    commands sent; ``answers`` lists (index, result, value) in the order the callbacks ran, and
    ``on_answer(index)``, if set, runs inside each callback."""
    cdef fp.event_base *_base
    cdef fp.fp_mc_pool_t *_pool
    cdef fp.fp_stats_t *_stats
    cdef fp.fp_config_t _cfg
    cdef fp.fp_mc_req_t *_reqs[256]
    cdef list _ctxs
    cdef bytes _node
    cdef public list answers
    cdef public object on_answer
    cdef public object peer

    def __cinit__(self, int timeout_ms=5000):
        import socket
        cdef char err[256]
        self._ctxs, self.answers, self._node = [], [], b"127.0.0.1:9"
        fp.fp_config_defaults(&self._cfg)
        memset(self._reqs, 0, sizeof(self._reqs))
        self._cfg.n_nodes = 1
        self._cfg.nodes[0].name = self._node
        self._cfg.nodes[0].name_len = len(self._node)
        self._cfg.node_addr[0] = self._node
        if fp.fp_config_set(&self._cfg, b"timeout_ms", 10, timeout_ms) != 0:
            raise FastpathError(f"bad timeout_ms {timeout_ms}")
        self._base = fp.event_base_new()
        self._pool = <fp.fp_mc_pool_t *>calloc(1, sizeof(fp.fp_mc_pool_t))
        self._stats = <fp.fp_stats_t *>calloc(1, sizeof(fp.fp_stats_t))
        if self._base == NULL or self._pool == NULL or self._stats == NULL:
            raise MemoryError()
        if fp.fp_mc_pool_init(self._pool, self._base, self._stats, &self._cfg, err, sizeof(err)) < 0:
            raise FastpathError(err.decode("utf-8", "replace"))
        mine, self.peer = socket.socketpair()
        mine.setblocking(False)
        self.peer.setblocking(False)
        if fp.fp_mc_adopt(self._pool, 0, mine.detach()) < 0:
            raise FastpathError("fp_mc_adopt failed")

    def get(self, bytes key):
        cdef int index = len(self._ctxs)
        if index >= 256:
            raise ValueError("too many gets")
        ctx = (self, index)
        self._ctxs.append(ctx)
        r = fp.fp_mc_get(self._pool, key, len(key), _mc_client_on_done, <void *>ctx, &self._reqs[index])
        return index if r == fp.FP_MC_QUEUED else _MC_RESULTS[r]

    def cancel(self, int index):
        fp.fp_mc_cancel(self._reqs[index])
        self._reqs[index] = NULL

    def spin(self, int rounds=4):
        for _ in range(rounds):
            if fp.event_base_loop(self._base, fp.EVLOOP_NONBLOCK) < 0:
                raise FastpathError("event loop failed")

    def written(self):
        """The commands the client sent since the last call."""
        self.spin()
        chunks = []
        while True:
            try:
                chunk = self.peer.recv(65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def reply(self, bytes data, int chunk=65536):
        """Send data as memcached, ``chunk`` bytes at a time, running the loop in between."""
        cdef Py_ssize_t sent = 0
        while sent < len(data):
            try:
                sent += self.peer.send(data[sent:sent + chunk])
            except BlockingIOError:
                pass
            self.spin(1)
        self.spin(16)

    def in_cap(self):
        """The size of the read buffer now."""
        return fp.fp_mc_in_cap(self._pool, 0)

    def close(self):
        if self._pool != NULL:
            fp.fp_mc_pool_fini(self._pool)
            free(self._pool)
            self._pool = NULL
        if self._base != NULL:
            fp.event_base_free(self._base)
            self._base = NULL
        free(self._stats)
        self._stats = NULL
        if self.peer is not None:
            self.peer.close()

    def __dealloc__(self):
        if self._pool != NULL:
            for i in range(256):     # no callback into an object being destroyed
                fp.fp_mc_cancel(self._reqs[i])
            fp.fp_mc_pool_fini(self._pool)
            free(self._pool)
        if self._base != NULL:
            fp.event_base_free(self._base)
        free(self._stats)


def _testhelper_etag(bytes body):
    """The ETag header value fastpath gives an answer of ``body`` (tests: the contract vectors)."""
    cdef char tag[fp.FP_ETAG_LEN]
    if fp.fp_etag_of(body, len(body), tag) != 0:
        raise FastpathError("libcrypto failed")
    return tag[:fp.FP_ETAG_LEN].decode("ascii")
