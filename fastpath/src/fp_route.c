/* Routing: what a request gets, decided at the end of its head from its kind (the listener it
 * came from), method, URL and the headers fp_http.c kept.  The decision is written into the
 * request (fp_request_t: its action, and the memcached keys or the answer); fp_conn.c carries
 * it out.  Nothing here sends or waits.
 *
 * A poll (docs/contract.md): path -> resource (and object), token -> key, capability -> object
 * key and epoch marker, If-None-Match and Prefer -> how it is answered.  Whatever fastpath
 * could read otherwise than Django is Django's to answer (404 MISS: nginx hands it over).
 */
#include <string.h>

#include "fp_internal.h"

#define ADMIN_MAX_CONNECTIONS 16     /* per worker: /metrics is for one scraper and an operator */

static void _route_poll(fp_conn_t *c, uint8_t method, const char *url, size_t url_len);
static void _route_admin(fp_conn_t *c, uint8_t method, const char *url, size_t url_len);
static void _route_edge(fp_conn_t *c, uint8_t method, const char *url, size_t url_len);

/* ---- kinds ------------------------------------------------------------------------------ */

static int _poll_cap(const fp_config_t *cfg)
{
    return cfg->max_connections;
}

static int _admin_cap(const fp_config_t *cfg)
{
    return ADMIN_MAX_CONNECTIONS;
}

static int _edge_cap(const fp_config_t *cfg)
{
    return cfg->edge_max_connections;
}

static int _edge_header_timeout(const fp_config_t *cfg)
{
    return cfg->edge_header_timeout_s;
}

const fp_kind_t fp_kinds[FP_CONN_KIND_N] = {
    /*               name     route         cap         counted hands_on per_address header_timeout */
    [FP_CONN_POLL] = {"poll", _route_poll, _poll_cap, 1, 1, 0, NULL},
    [FP_CONN_ADMIN] = {"admin", _route_admin, _admin_cap, 0, 1, 0, NULL},
    [FP_CONN_EDGE] = {"edge", _route_edge, _edge_cap, 1, 0, 1, _edge_header_timeout},
};

/* At the end of a request's head: decide what it gets (its kind's route). */
void fp_route(fp_conn_t *c, uint8_t method, const char *url, size_t url_len)
{
    fp_kinds[c->kind].route(c, method, url, url_len);
}

/* ---- deciding what a request gets ------------------------------------------------------- */

static void _decide(fp_conn_t *c, int code, const char *message, const char *cache)
{
    fp_request_t *rq = &c->in->req;
    rq->action = ACT_RESPOND;
    rq->answer_code = (int16_t)code;
    rq->answer_message = message;
    rq->answer_cache = cache;
}

/* A poll's path percent-decoded is read from a buffer of this size on the stack: a longer one
 * (with an escape) is no poll of fastpath's. */
#define FP_DECODED_PATH_MAX 256

/* What a poll's URL names: a user resource, or a per-object resource and its object. */
typedef struct {
    const char *res, *obj;           /* obj NULL: a user poll */
    size_t res_len, obj_len;
    const char *query;               /* after '?', or NULL */
    size_t query_len;
    uint8_t n_parts;                 /* several user resources (a stream's): how many, else 0;
                                        res is then the first */
    uint8_t parts[FP_STREAM_PARTS_MAX];
} _target_t;

/* s (len bytes) is one of names[0..n): its index, or -1 */
static int _find_name(const char *const *names, const size_t *lens, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++)
        if (lens[i] == len && memcmp(names[i], s, len) == 0)
            return i;
    return -1;
}

/* resource *( "," resource ): 2 to FP_STREAM_PARTS_MAX user resources, none repeated (a stream
 * of several, docs/contract.md section 9): 0 and t's parts, res the first; else -1. */
static int _find_parts(const fp_config_t *cfg, _target_t *t)
{
    const char *p = t->res, *end = t->res + t->res_len;
    uint8_t n = 0;

    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma != NULL ? comma : end;
        int i = _find_name(cfg->resources, cfg->resource_len, cfg->n_resources, p, (size_t)(stop - p));
        if (i < 0 || n == FP_STREAM_PARTS_MAX || memchr(t->parts, i, n) != NULL)
            return -1;
        t->parts[n++] = (uint8_t)i;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    t->n_parts = n;
    t->res_len = cfg->resource_len[t->parts[0]];
    return n > 1 ? 0 : -1;
}

/* url = path-prefix resource [ "/" object ] [ "?" query ]: resource one of cfg->resources, or
 * with an object one of cfg->object_resources; object = 1*64( ALPHA / DIGIT / "-" / "_" );
 * path-prefix is --path-prefix ("/Poll/").  Or path-prefix resource 1*( "," resource ), which
 * only a stream may be (_find_parts).  0, or -1 for anything else (Django's). */
static int _find_target(const fp_config_t *cfg, const char *url, size_t url_len, _target_t *t)
{
    const char *q = url_len > 0 ? memchr(url, '?', url_len) : NULL;
    size_t len = q ? (size_t)(q - url) : url_len, plen = cfg->path_prefix_len;
    const char *slash;

    t->query = q ? q + 1 : NULL;
    t->query_len = q ? url_len - len - 1 : 0;
    if (len <= plen || memcmp(url, cfg->path_prefix, plen) != 0)
        return -1;
    t->res = url + plen;
    t->res_len = len - plen;
    slash = memchr(t->res, '/', t->res_len);
    t->obj = NULL;
    t->obj_len = 0;
    t->n_parts = 0;
    if (slash == NULL && memchr(t->res, ',', t->res_len) != NULL)
        return _find_parts(cfg, t);
    if (slash == NULL)
        return _find_name(cfg->resources, cfg->resource_len, cfg->n_resources, t->res, t->res_len) < 0 ? -1 : 0;
    t->obj = slash + 1;
    t->obj_len = t->res_len - (size_t)(t->obj - t->res);
    t->res_len = (size_t)(slash - t->res);
    if (!fp_is_object_name(t->obj, t->obj_len))
        return -1;
    return _find_name(cfg->object_resources, cfg->object_resource_len, cfg->n_object_resources, t->res,
                      t->res_len) < 0 ? -1 : 0;
}

static int _hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = (char)(ch | 0x20);
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* As _find_target, on a path that Django and nginx read percent-decoded ("/Poll/a%2Cb" is
 * "/Poll/a,b" to both): the path, without its query, is decoded into buf (cap bytes) and read
 * there; the query stays the url's (a capability with a '%' is Django's anyway).  An escape that
 * decodes to a control byte, a space or a '%' or '?', or a path longer than buf, reads as no
 * target.  t points into buf: it is read before buf goes. */
static int _find_decoded_target(const fp_config_t *cfg, const char *url, size_t url_len, char *buf, size_t cap,
                                _target_t *t)
{
    const char *q = memchr(url, '?', url_len);
    size_t len = q ? (size_t)(q - url) : url_len, n = 0;

    if (memchr(url, '%', len) == NULL)
        return _find_target(cfg, url, url_len, t);
    for (size_t i = 0; i < len; i++) {
        char ch = url[i];
        if (ch == '%') {
            int hi = i + 2 < len ? _hex_digit(url[i + 1]) : -1, lo = hi >= 0 ? _hex_digit(url[i + 2]) : -1;
            if (lo < 0)
                return -1;
            ch = (char)(hi << 4 | lo);
            if ((unsigned char)ch <= ' ' || (unsigned char)ch >= 0x7f || ch == '%' || ch == '?')
                return -1;
            i += 2;
        }
        if (n == cap)
            return -1;
        buf[n++] = ch;
    }
    if (_find_target(cfg, buf, n, t) < 0)
        return -1;
    t->query = q ? q + 1 : NULL;
    t->query_len = q ? url_len - len - 1 : 0;
    return 0;
}

/* The query's one cap=<value>: 1 and *cap, or 0 if there is none or fastpath could read it
 * otherwise than Django (a repeated cap, any '%' or '+' in the query: Django decodes them). */
static int _query_cap(const char *q, size_t len, const char **cap, size_t *cap_len)
{
    int found = 0;
    if (q == NULL || memchr(q, '%', len) != NULL || memchr(q, '+', len) != NULL)
        return 0;
    while (len > 0) {
        const char *amp = memchr(q, '&', len);
        size_t pair_len = amp != NULL ? (size_t)(amp - q) : len;
        if (pair_len >= 4 && memcmp(q, "cap=", 4) == 0) {
            if (found++)
                return 0;
            *cap = q + 4;
            *cap_len = pair_len - 4;
        }
        if (amp == NULL)
            break;
        q = amp + 1;
        len -= pair_len + 1;
    }
    return found == 1 && *cap_len > 0;
}

static int _span_eq(const char *a, size_t a_len, const char *b, size_t b_len)
{
    return a_len == b_len && memcmp(a, b, a_len) == 0;
}

/* A per-object poll of a valid token: its capability, checked, turned into the object's key
 * and the user's epoch marker key (docs/contract.md section 8).  Anything wrong with the
 * capability is Django's to answer precisely (404 MISS), never another object's answer. */
static void _authorize_object(fp_conn_t *c, const _target_t *t, const fp_token_t *token, int64_t now)
{
    const fp_config_t *cfg = c->srv->cfg;
    fp_request_t *rq = &c->in->req;
    const char *cap = NULL;
    size_t cap_len = 0, key_len, marker_len;
    fp_cap_t cp;

    if (!_query_cap(t->query, t->query_len, &cap, &cap_len)) {
        _decide(c, 404, "no capability fastpath can read", "MISS");
        return;
    }
    fp_token_result_t r = fp_cap_check(&c->srv->hmac, cap, cap_len, now, &cp);
    if (r == FP_TOKEN_INTERNAL) {
        _decide(c, 503, fp_token_strerror(r), "MISS");
        return;
    }
    if (r != FP_TOKEN_OK || !_span_eq(cp.res, cp.res_len, t->res, t->res_len) ||
        !_span_eq(cp.obj, cp.obj_len, t->obj, t->obj_len) ||
        !_span_eq(cp.uid, cp.uid_len, token->uid_str, token->uid_len)) {
        _decide(c, 404, "capability refused", "MISS");
        return;
    }
    key_len = fp_make_object_key(rq->key, sizeof(rq->key), cfg->key_prefix, cfg->key_prefix_len,
                                 t->res, t->res_len, t->obj, t->obj_len);
    marker_len = fp_make_marker_key(rq->marker, sizeof(rq->marker), cfg->key_prefix, cfg->key_prefix_len, token);
    if (key_len == 0 || marker_len == 0) {
        _decide(c, 400, "bad key", NULL);
        return;
    }
    rq->key_len = (uint8_t)key_len;
    rq->marker_len = (uint8_t)marker_len;
    rq->action = ACT_OBJECT;
}

/* If-None-Match and Prefer of a poll that will ask memcached, not a stream (docs/contract.md
 * section 7).  Anything but one entity-tag in one If-None-Match, or a repeated Prefer, is
 * Django's to read. */
static void _conditional(fp_conn_t *c)
{
    const char *data = c->in->data;
    fp_request_t *rq = &c->in->req;
    if (rq->have[FP_HDR_IF_NONE_MATCH] > 1 || rq->have[FP_HDR_PREFER] > 1) {
        _decide(c, 404, "conditional headers fastpath cannot read", "MISS");
        return;
    }
    if (rq->have[FP_HDR_IF_NONE_MATCH]) {
        fp_span_t inm = rq->header[FP_HDR_IF_NONE_MATCH];
        c->inm = (uint8_t)fp_inm_parse(data + inm.off, inm.len, c->inm_tag);
        if (c->inm == FP_INM_UNREADABLE) {
            _decide(c, 404, "conditional headers fastpath cannot read", "MISS");
            return;
        }
    }
    if (rq->have[FP_HDR_PREFER] && c->srv->cfg->max_wait_s > 0) {
        fp_span_t prefer = rq->header[FP_HDR_PREFER];
        int32_t w = fp_prefer_wait(data + prefer.off, prefer.len);
        if (w >= 0)
            c->wait_s = w < c->srv->cfg->max_wait_s ? w : c->srv->cfg->max_wait_s;
    }
}

/* The first of a header the request carried (data NULL: none came). */
static fp_header_span_t _header(const fp_conn_t *c, fp_header_id_t id)
{
    const fp_request_t *rq = &c->in->req;
    fp_header_span_t h = {rq->have[id] ? c->in->data + rq->header[id].off : NULL, rq->header[id].len};
    return h;
}

/* The token of the request, checked, turned into the target's memcached key (and for an
 * object poll, its capability checked too). */
static void _authenticate(fp_conn_t *c, const _target_t *t)
{
    const fp_config_t *cfg = c->srv->cfg;
    const char *tok = NULL;
    size_t tok_len = 0;
    fp_token_t token;
    int64_t now;
    fp_request_t *rq = &c->in->req;

    /* read exactly as Django reads them (docs/contract.md, section 2) */
    fp_header_span_t auth = _header(c, FP_HDR_AUTHORIZATION), cookie = _header(c, FP_HDR_COOKIE);
    fp_cred_result_t found = fp_credentials(&auth, rq->have[FP_HDR_AUTHORIZATION], &cookie, rq->have[FP_HDR_COOKIE],
                                            cfg->cookie_name, cfg->cookie_name_len, &tok, &tok_len);
    if (found == FP_CRED_AMBIGUOUS) {   /* Django could read them otherwise: let it decide */
        _decide(c, 404, "ambiguous credentials", "MISS");
        return;
    }
    if (found != FP_CRED_FOUND) {
        _decide(c, 401, "authentication required", NULL);
        return;
    }
    if (fp_wall_s(c->srv->base, &now) != 0) {
        _decide(c, 503, "clock unavailable", "MISS");    /* expiry cannot be checked: fall back */
        return;
    }
    fp_token_result_t tr = fp_token_check(&c->srv->hmac, tok, tok_len, now, &token);
    if (tr == FP_TOKEN_INTERNAL) {
        _decide(c, 503, fp_token_strerror(tr), "MISS");  /* libcrypto failed, not the client */
        return;
    }
    if (tr != FP_TOKEN_OK) {
        _decide(c, 401, fp_token_strerror(tr), NULL);
        return;
    }
    memcpy(rq->uid, token.uid_str, token.uid_len);      /* whose hold it would be */
    rq->uid_len = (uint8_t)token.uid_len;
    if (t->obj != NULL) {
        _authorize_object(c, t, &token, now);
        return;
    }
    size_t key_len = fp_make_key(rq->key, sizeof(rq->key), cfg->key_prefix, cfg->key_prefix_len,
                                 t->res, t->res_len, &token);
    if (key_len == 0 || key_len > FP_KEY_CAP) {
        _decide(c, 400, "bad key", NULL);
        return;
    }
    rq->key_len = (uint8_t)key_len;
    rq->action = ACT_MEMCACHED;
}

/* A GET poll that will ask memcached and accepts text/event-stream is a stream (docs/contract.md
 * section 9): its events are named after its resource, and Last-Event-ID (in c->inm_tag, as
 * FP_INM_TAG) spares the client the first event when it already has that answer.  A repeated
 * Accept is Django's to read.  If-None-Match and Prefer mean nothing to a stream (_poll_mode
 * does not read them: a list or a repeat of them that a poll hands to Django is streamed). */
static void _stream(fp_conn_t *c, const _target_t *t)
{
    const fp_config_t *cfg = c->srv->cfg;
    fp_request_t *rq = &c->in->req;
    const char *data = c->in->data;
    int i;

    if (!rq->have[FP_HDR_ACCEPT])
        return;
    if (rq->have[FP_HDR_ACCEPT] > 1) {
        _decide(c, 404, "accept fastpath cannot read", "MISS");
        return;
    }
    fp_span_t accept = rq->header[FP_HDR_ACCEPT];
    if (!fp_accept_event_stream(data + accept.off, accept.len))
        return;
    if (t->n_parts > 1) {
        i = FP_RESOURCE_SET;         /* Last-Event-ID is read when the stream starts */
        rq->n_parts = t->n_parts;
        memcpy(rq->parts, t->parts, t->n_parts);
    } else if (t->obj == NULL)
        i = _find_name(cfg->resources, cfg->resource_len, cfg->n_resources, t->res, t->res_len);
    else
        i = FP_MAX_RESOURCES + _find_name(cfg->object_resources, cfg->object_resource_len,
                                          cfg->n_object_resources, t->res, t->res_len);
    rq->stream = 1;
    rq->resource = (uint8_t)i;
    c->wait_s = -1;
    c->inm = FP_INM_NONE;
    if (rq->have[FP_HDR_LAST_EVENT_ID] == 1 && i != FP_RESOURCE_SET) {
        fp_span_t id = rq->header[FP_HDR_LAST_EVENT_ID];
        if (fp_last_event_id(data + id.off, id.len, c->inm_tag))
            c->inm = FP_INM_TAG;
    }
}

/* How a request that will ask memcached is answered (after _authenticate): a stream, or a poll
 * whose If-None-Match and Prefer say whether it is held. */
static void _poll_mode(fp_conn_t *c, uint8_t method, const _target_t *t)
{
    fp_request_t *rq = &c->in->req;

    if (rq->action != ACT_MEMCACHED && rq->action != ACT_OBJECT)
        return;
    if (method == HTTP_GET)
        _stream(c, t);
    if (!rq->stream && (rq->action == ACT_MEMCACHED || rq->action == ACT_OBJECT))
        _conditional(c);
}

/* A GET whose one Accept lists text/event-stream: what asks for a stream (section 9). */
static int _asks_stream(const fp_conn_t *c, uint8_t method)
{
    const fp_request_t *rq = &c->in->req;
    fp_span_t accept = rq->header[FP_HDR_ACCEPT];
    return method == HTTP_GET && rq->have[FP_HDR_ACCEPT] == 1 &&
           fp_accept_event_stream(c->in->data + accept.off, accept.len);
}

/* Several resources are only ever a stream: any other request naming them names no resource. */
static int _several_not_stream(const fp_conn_t *c, uint8_t method, const _target_t *t)
{
    return t->n_parts > 1 && !_asks_stream(c, method);
}

static void _route_poll(fp_conn_t *c, uint8_t method, const char *url, size_t url_len)
{
    _target_t t;
    char path[FP_DECODED_PATH_MAX];

    if (method != HTTP_GET && method != HTTP_POST) {
        /* HEAD (a read, contract.md 7) and the methods Django refuses, with its own 405 and
         * Allow, or its 404 for a path that names no resource: Django's to answer */
        _decide(c, 404, "method is Django's to answer", "MISS");
        return;
    }
    if (_find_decoded_target(c->srv->cfg, url, url_len, path, sizeof(path), &t) < 0 ||
        _several_not_stream(c, method, &t)) {
        _decide(c, 404, "unknown poll resource", "MISS");    /* nginx lets Django answer */
        return;
    }
    _authenticate(c, &t);
    _poll_mode(c, method, &t);
}

/* ---- the edge (docs/contract.md section 10) ----------------------------------------------- *
 *
 * Clients come straight, from a page on another origin: only the poll path is served (GET and
 * HEAD: short polls, long-polls, streams), CORS for the origins of --edge-origins, and
 * everything else is refused here, never handed on (there is nothing behind the edge). */

/* The request's Origin is one of --edge-origins (exactly, once): 1 + its index, else 0. */
static uint8_t _allowed_origin(const fp_conn_t *c)
{
    const fp_config_t *cfg = c->srv->cfg;
    const fp_request_t *rq = &c->in->req;
    if (rq->have[FP_HDR_ORIGIN] != 1)
        return 0;
    fp_span_t o = rq->header[FP_HDR_ORIGIN];
    int i = _find_name(cfg->edge_origins, cfg->edge_origin_len, cfg->n_edge_origins, c->in->data + o.off, o.len);
    return (uint8_t)(i + 1);
}

/* OPTIONS from a page of an allowed origin that asks to GET (or HEAD) a poll: 204 with what it
 * may send; anything else is refused, without CORS headers. */
static void _preflight(fp_conn_t *c, const _target_t *t)
{
    const fp_request_t *rq = &c->in->req;
    fp_span_t m = rq->header[FP_HDR_AC_REQUEST_METHOD];
    const char *method = c->in->data + m.off;

    if (c->origin == 0 || rq->have[FP_HDR_AC_REQUEST_METHOD] != 1 ||
        !(_span_eq(method, m.len, "GET", 3) || _span_eq(method, m.len, "HEAD", 4))) {
        c->origin = 0;
        _decide(c, 403, "preflight refused", NULL);
        return;
    }
    c->in->req.action = ACT_PREFLIGHT;
}

/* A stream decided a miss before it asked memcached (a refused capability, credentials fastpath
 * does not read as Django would, ...) is still a stream on the edge: 200 text/event-stream with
 * `event: miss` (docs/contract.md section 10; fp_stream.c's prepare answers it), as one that
 * misses in memcached; a poll keeps its 409. */
static void _edge_stream_miss(fp_conn_t *c, uint8_t method)
{
    fp_request_t *rq = &c->in->req;

    if (rq->action == ACT_RESPOND && rq->answer_cache != NULL && strncmp(rq->answer_cache, "MISS", sizeof("MISS")) == 0 &&
        _asks_stream(c, method))
        rq->stream = 1;
}

static void _route_edge(fp_conn_t *c, uint8_t method, const char *url, size_t url_len)
{
    _target_t t;
    char path[FP_DECODED_PATH_MAX];

    c->origin = _allowed_origin(c);
    if (method != HTTP_GET && method != HTTP_HEAD && method != HTTP_OPTIONS) {
        _decide(c, 405, "method not allowed", NULL);
        return;
    }
    if (_find_decoded_target(c->srv->cfg, url, url_len, path, sizeof(path), &t) < 0) {
        _decide(c, 404, "not found", NULL);
        return;
    }
    if (method == HTTP_OPTIONS) {
        _preflight(c, &t);
        return;
    }
    if (_several_not_stream(c, method, &t)) {
        _decide(c, 404, "not found", NULL);
        return;
    }
    _authenticate(c, &t);
    _poll_mode(c, method, &t);
    _edge_stream_miss(c, method);
}

static void _route_admin(fp_conn_t *c, uint8_t method, const char *url, size_t url_len)
{
    if (method == HTTP_GET && url_len == 8 && memcmp(url, "/metrics", 8) == 0)
        c->in->req.action = ACT_METRICS;
    else
        _decide(c, 404, "not found", NULL);
}
