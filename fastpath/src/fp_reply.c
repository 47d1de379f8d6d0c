/* Replies: what status, headers and body answer a request (fp_reply_t), and the bytes of the
 * head.  fp_conn.c sends them; nothing here touches a socket or a connection's state.
 *
 * Every answer is Cache-Control: no-store; a 200 or 204 carries the ETag of its body, a 304 the
 * tag the client sent; errors are a small JSON object whose message is always one of our
 * literals, never request data.
 */
#include <string.h>

#include "fp_internal.h"

/* ---- text with a cap ------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
} _text_t;

/* Bytes that would pass the cap are dropped (the callers' caps are well above what they put). */
static void _put(_text_t *t, const char *s, size_t n)
{
    if (t->len + n <= t->cap) {
        memcpy(t->p + t->len, s, n);
        t->len += n;
    }
}

#define PUT_LIT(t, s) _put((t), (s), sizeof(s) - 1)

static void _put_str(_text_t *t, const char *s, size_t max)
{
    _put(t, s, strnlen(s, max));
}

static void _put_uint(_text_t *t, uint64_t v)
{
    char tmp[24];
    size_t i = sizeof(tmp);
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0 && i > 0);
    _put(t, tmp + i, sizeof(tmp) - i);
}

/* ---- what answers a request ---------------------------------------------------------- */

void fp_reply_set(fp_reply_t *a, int code, const char *ctype, const char *cache, const char *etag,
                  const char *body, size_t body_len)
{
    a->code = code;
    a->ctype = ctype;
    a->cache = cache;
    a->etag = etag;
    a->body = body;
    a->body_len = body_len;
    a->preflight = 0;
}

/* {"error":"<message>"} */
void fp_reply_error(fp_reply_t *a, int code, const char *message, const char *cache)
{
    _text_t b = {a->error, 0, sizeof(a->error)};
    PUT_LIT(&b, "{\"error\":\"");
    _put_str(&b, message, 128);
    PUT_LIT(&b, "\"}");
    fp_reply_set(a, code, "application/json", cache, NULL, b.p, b.len);
}

/* On the edge (docs/contract.md section 10) there is no nginx to hand an answer with X-Cache:
 * MISS to Django (a miss, what fastpath does not read as Django would, memcached unavailable):
 * the client is told to ask the site once, which fills the cache, and to come back.  409 and
 * not 404, which on the edge means a path it does not serve; the reason stays, "retry" says
 * where to go: {"error":"<why>","retry":"site"}. */
#define EDGE_MISS_STATUS 409

void fp_reply_site(fp_reply_t *a)
{
    static const char retry[] = ",\"retry\":\"site\"}";
    size_t len = a->body_len;

    if (a->cache == NULL || strncmp(a->cache, "MISS", sizeof("MISS")) != 0)
        return;
    a->code = EDGE_MISS_STATUS;
    /* the body is fp_reply_error's {"error":"..."} in a->error: its "}" becomes retry */
    if (a->body == a->error && len > 0 && len - 1 + sizeof(retry) - 1 <= sizeof(a->error)) {
        memcpy(a->error + len - 1, retry, sizeof(retry) - 1);
        a->body_len = len - 1 + sizeof(retry) - 1;
    }
}

int fp_reply_not_modified(const fp_conn_t *c, const char *etag)
{
    return c->inm == FP_INM_TAG && memcmp(c->inm_tag, etag, FP_ETAG_LEN) == 0;
}

/* What memcached said, as the answer to c's request (tag: the answer's ETag if known, else
 * NULL): 200 with the value, 204 for the empty value, 304 when it is the client's, 404 MISS
 * (Django's) or 503. */
void fp_reply_result(fp_reply_t *a, const fp_conn_t *c, fp_mc_result_t r, const char *data, size_t len,
                     const char *tag)
{
    switch (r) {
    case FP_MC_HIT:
    case FP_MC_EMPTY:
        if (tag == NULL) {           /* a wake computed it once for all its waiters */
            if (fp_etag_of(data != NULL ? data : "", r == FP_MC_HIT ? len : 0, a->tag) != 0) {
                fp_reply_error(a, 503, "etag failed", "MISS");
                return;
            }
            tag = a->tag;
        }
        if (fp_reply_not_modified(c, tag))
            fp_reply_set(a, 304, NULL, "HIT", tag, NULL, 0);
        else if (r == FP_MC_EMPTY)
            fp_reply_set(a, 204, NULL, "HIT", tag, NULL, 0);
        else
            fp_reply_set(a, 200, "application/json", "HIT", tag, data, len);
        return;
    case FP_MC_MISS:
        fp_reply_error(a, 404, "miss", "MISS");
        return;
    case FP_MC_OVERLOADED:
        fp_reply_error(a, 503, "overloaded", "MISS");
        return;
    default:
        fp_reply_error(a, 503, "memcached unavailable", "MISS");
        return;
    }
}

/* ---- the head ---------------------------------------------------------------------------- */

/* Headers a status always carries: what a 405 allows (only the edge refuses methods), when to
 * come back after a 429 (a cap on held connections). */
#define RETRY_AFTER_S "5"
static const struct {
    int code;
    const char *text;
    size_t len;
} _status_headers[] = {
#define _ROW(code, text) {code, text, sizeof(text) - 1}
    _ROW(405, "Allow: GET, HEAD, OPTIONS\r\n"),
    _ROW(429, "Retry-After: " RETRY_AFTER_S "\r\n"),
#undef _ROW
};

/* The edge's CORS headers (docs/contract.md section 10): for a request whose Origin is one of
 * --edge-origins, that origin with credentials, and the headers a page's script may read. */
static void _put_cors(_text_t *h, const fp_conn_t *c)
{
    const fp_config_t *cfg = c->srv->cfg;
    if (c->kind != FP_CONN_EDGE)
        return;
    PUT_LIT(h, "Vary: Origin\r\n");
    if (c->origin == 0)
        return;
    PUT_LIT(h, "Access-Control-Allow-Origin: ");
    _put(h, cfg->edge_origins[c->origin - 1], cfg->edge_origin_len[c->origin - 1]);
    PUT_LIT(h, "\r\nAccess-Control-Allow-Credentials: true\r\n"
               "Access-Control-Expose-Headers: ETag, Preference-Applied, Retry-After, X-Cache\r\n");
}

/* A preflight's answer: what an allowed origin's page may send, cached by the browser. */
static void _put_preflight(_text_t *h)
{
    PUT_LIT(h, "Access-Control-Allow-Methods: GET, HEAD\r\n"
               "Access-Control-Allow-Headers: Authorization, If-None-Match, Prefer, Last-Event-ID\r\n"
               "Access-Control-Max-Age: 600\r\n");
}

/* Status line and headers of a with body_len bytes of body (0 for 204 and 304) into buf: its
 * length. */
size_t fp_reply_head(fp_conn_t *c, const fp_reply_t *a, size_t body_len, char *buf, size_t cap)
{
    _text_t h = {buf, 0, cap};
    size_t date_len;
    const char *date = fp_date_header(&c->srv->date, c->srv->base, &date_len);

    PUT_LIT(&h, "HTTP/1.1 ");
    _put_uint(&h, (uint64_t)a->code);
    PUT_LIT(&h, " ");
    _put_str(&h, fp_status_reason(a->code), 31);   /* the longest reason is 31 */
    PUT_LIT(&h, "\r\nDate: ");
    _put(&h, date, date_len);
    PUT_LIT(&h, "\r\n");
    if (a->code != 204 && a->code != 304) {
        PUT_LIT(&h, "Content-Type: ");
        _put_str(&h, a->ctype, 64);
        PUT_LIT(&h, "\r\nContent-Length: ");
        _put_uint(&h, body_len);
        PUT_LIT(&h, "\r\n");
    }
    PUT_LIT(&h, "Cache-Control: no-store\r\n");
    if (a->etag != NULL) {
        PUT_LIT(&h, "ETag: ");
        _put(&h, a->etag, FP_ETAG_LEN);
        PUT_LIT(&h, "\r\n");
    }
    if (c->wait_s >= 0) {
        PUT_LIT(&h, "Preference-Applied: wait=");
        _put_uint(&h, (uint64_t)c->wait_s);
        PUT_LIT(&h, "\r\n");
    }
    if (a->cache != NULL) {
        PUT_LIT(&h, "X-Cache: ");
        _put_str(&h, a->cache, 8);
        PUT_LIT(&h, "\r\n");
    }
    for (size_t i = 0; i < sizeof(_status_headers) / sizeof(_status_headers[0]); i++)
        if (_status_headers[i].code == a->code)
            _put(&h, _status_headers[i].text, _status_headers[i].len);
    _put_cors(&h, c);
    if (a->preflight)
        _put_preflight(&h);
    if (!c->keep_alive || c->srv->stopping)
        PUT_LIT(&h, "Connection: close\r\n");
    else if (c->parser.http_major == 1 && c->parser.http_minor == 0)
        PUT_LIT(&h, "Connection: keep-alive\r\n");
    PUT_LIT(&h, "\r\n");
    return h.len;
}

/* ---- streams (Server-Sent Events, docs/contract.md section 9) ---------------------------- *
 *
 * A stream's head is a 200 text/event-stream without a length: chunked on HTTP/1.1 (every write
 * one chunk, the end the last chunk, the connection kept), else ended by closing.  Its first
 * bytes are STREAM_RETRY, then each event:
 *
 *   id: <the answer's ETag>\n  event: <resource>\n  data: <line>\n (one per line of the body)  \n
 *
 * (a stream of several resources: the id is every resource's ETag, in path order, joined by ",")
 *
 * the body's lines split at CRLF, CR or LF as an EventSource splits them, so that the client's
 * data is the body (an empty body is one empty data line: still an event). */

/* Every stream's first block, sent with its head: the ms an EventSource waits before it comes
 * back once the stream ends (--max-stream, a drain, a miss), instead of its own default (3 s in
 * browsers).  Byte for byte Django's (fastpoll/http.py STREAM_PREFIX); tests/vectors/contract.json
 * ("streams" "prefix") pins both. */
#define STREAM_RETRY "retry: 1000\n\n"

#define CHUNK_FRAME_MAX (16 + 2 + 2)     /* hex size, CRLF, and the CRLF after the data */

static void _put_hex(_text_t *t, size_t v)
{
    static const char hex[] = "0123456789abcdef";
    char tmp[16];
    size_t i = sizeof(tmp);
    do {
        tmp[--i] = hex[v & 15];
        v >>= 4;
    } while (v != 0 && i > 0);
    _put(t, tmp + i, sizeof(tmp) - i);
}

/* Stream text (len 0: the end), framed as the stream is. */
static void _put_stream_text(_text_t *t, const fp_conn_t *c, const char *text, size_t len)
{
    if (!c->stream_chunked) {
        _put(t, text, len);
        return;
    }
    _put_hex(t, len);
    PUT_LIT(t, "\r\n");
    _put(t, text, len);
    PUT_LIT(t, "\r\n");
}

/* The head, and the stream's first block (STREAM_RETRY): its length. */
size_t fp_reply_stream_head(fp_conn_t *c, const char *cache, char *buf, size_t cap)
{
    _text_t h = {buf, 0, cap};
    size_t date_len;
    const char *date = fp_date_header(&c->srv->date, c->srv->base, &date_len);

    PUT_LIT(&h, "HTTP/1.1 200 OK\r\nDate: ");
    _put(&h, date, date_len);
    PUT_LIT(&h, "\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
                "X-Accel-Buffering: no\r\nX-Cache: ");
    _put_str(&h, cache, 8);
    PUT_LIT(&h, "\r\n");
    _put_cors(&h, c);
    if (c->stream_chunked)
        PUT_LIT(&h, "Transfer-Encoding: chunked\r\n");
    if (!c->keep_alive || !c->stream_chunked || c->srv->stopping)
        PUT_LIT(&h, "Connection: close\r\n");
    PUT_LIT(&h, "\r\n");
    _put_stream_text(&h, c, STREAM_RETRY, sizeof(STREAM_RETRY) - 1);
    return h.len;
}

/* The name of resource index i (fp_request_t.resource): a user resource below
 * FP_MAX_RESOURCES, an object resource from there. */
const char *fp_reply_resource_name(const fp_config_t *cfg, uint8_t i, size_t *len)
{
    if (i < FP_MAX_RESOURCES) {
        *len = cfg->resource_len[i];
        return cfg->resources[i];
    }
    *len = cfg->object_resource_len[i - FP_MAX_RESOURCES];
    return cfg->object_resources[i - FP_MAX_RESOURCES];
}

/* Lines of data (CRLF, CR and LF each end one; the last needs none) and the bytes of their
 * breaks. */
static size_t _lines(const char *data, size_t len, size_t *break_bytes)
{
    size_t n = 1, b = 0;
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\r' && i + 1 < len && data[i + 1] == '\n') {
            n++;
            b += 2;
            i++;
        } else if (data[i] == '\r' || data[i] == '\n') {
            n++;
            b++;
        }
    }
    *break_bytes = b;
    return n;
}

static size_t _event_payload(const fp_conn_t *c, uint8_t resource, size_t id_len, const char *data, size_t len)
{
    size_t name_len, b, n = _lines(data, len, &b);
    (void)fp_reply_resource_name(c->srv->cfg, resource, &name_len);
    return (sizeof("id: ") - 1 + id_len + 1) + (sizeof("event: ") - 1 + name_len + 1) +
           n * (sizeof("data: ") - 1 + 1) + (len - b) + 1;
}

/* The bytes fp_reply_event writes for this body, at most. */
size_t fp_reply_event_size(const fp_conn_t *c, uint8_t resource, size_t id_len, const char *data, size_t len)
{
    return _event_payload(c, resource, id_len, data, len) + CHUNK_FRAME_MAX;
}

/* One event of resource's answer (data, len) with this id, framed: its length. */
size_t fp_reply_event(const fp_conn_t *c, uint8_t resource, const char *id, size_t id_len, const char *data,
                      size_t len, char *buf, size_t cap)
{
    _text_t t = {buf, 0, cap};
    size_t name_len, start = 0;
    const char *name = fp_reply_resource_name(c->srv->cfg, resource, &name_len);

    if (c->stream_chunked) {
        _put_hex(&t, _event_payload(c, resource, id_len, data, len));
        PUT_LIT(&t, "\r\n");
    }
    PUT_LIT(&t, "id: ");
    _put(&t, id, id_len);
    PUT_LIT(&t, "\nevent: ");
    _put(&t, name, name_len);
    PUT_LIT(&t, "\ndata: ");
    for (size_t i = 0; i < len; i++) {
        if (data[i] != '\r' && data[i] != '\n')
            continue;
        _put(&t, data + start, i - start);
        PUT_LIT(&t, "\ndata: ");
        if (data[i] == '\r' && i + 1 < len && data[i + 1] == '\n')
            i++;
        start = i + 1;
    }
    _put(&t, data + start, len - start);
    PUT_LIT(&t, "\n\n");
    if (c->stream_chunked)
        PUT_LIT(&t, "\r\n");
    return t.len;
}

/* Other stream text (a comment, event: miss; len 0: the end), framed: its length. */
size_t fp_reply_stream_text(const fp_conn_t *c, const char *text, size_t len, char *buf, size_t cap)
{
    _text_t t = {buf, 0, cap};
    _put_stream_text(&t, c, text, len);
    return t.len;
}
