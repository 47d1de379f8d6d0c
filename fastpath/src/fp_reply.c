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
    if (!c->keep_alive || c->srv->stopping)
        PUT_LIT(&h, "Connection: close\r\n");
    else if (c->parser.http_major == 1 && c->parser.http_minor == 0)
        PUT_LIT(&h, "Connection: keep-alive\r\n");
    PUT_LIT(&h, "\r\n");
    return h.len;
}
