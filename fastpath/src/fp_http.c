/* Reading HTTP: the llhttp callbacks, and the table of the request headers fastpath reads.
 *
 * Parsing writes only into the request (fp_request_t, in the connection's read buffer) and the
 * connection's per-request fields: where the URL and the kept headers are (offset, length into
 * the buffer's data; nothing here relies on NUL termination), the request's framing, and why it
 * failed.  At the end of the head fp_route.c decides what the request gets; at the end of the
 * message the parser pauses, and fp_conn.c answers before parsing goes on.
 *
 * What a request may make us read is capped: its head by --max-headers (beyond it, Django's:
 * 404 MISS), its body, chunk extensions and trailers together by --max-body (413).
 */
#include <string.h>

#include "fp_internal.h"

/* ---- the request headers fastpath reads ------------------------------------------------ */

typedef void (*_header_fn)(fp_request_t *rq, fp_header_id_t id);

/* The first is kept; a second only marks it repeated (have = 2), for its reader to refuse:
 * Django would see both joined, or the last. */
static void _header_unique(fp_request_t *rq, fp_header_id_t id)
{
    if (rq->have[id]++ == 0)
        rq->header[id] = rq->value;
    else
        rq->have[id] = 2;
}

/* name (lower case), its length, and what a header of that name does (nginx's
 * ngx_http_headers_in) */
static const struct {
    const char *name;
    size_t len;
    _header_fn handler;
} _headers[FP_HDR_N] = {
#define _HEADER_ROW(id, name, handler) [id] = {name, sizeof(name) - 1, handler},
    FP_REQUEST_HEADERS(_HEADER_ROW)
#undef _HEADER_ROW
};

/* The row of a header field (len bytes, any case), or FP_HDR_N: not one fastpath reads. */
static fp_header_id_t _header_find(const char *field, size_t len)
{
    for (int i = 0; i < FP_HDR_N; i++)
        if (_headers[i].len == len && fp_ascii_casecmp(field, _headers[i].name, len) == 0)
            return (fp_header_id_t)i;
    return FP_HDR_N;
}

/* ---- failing --------------------------------------------------------------------------- */

/* Stop parsing: answer (status, message) and close.  A request fastpath cannot take in whole
 * (a head beyond --max-headers) is handed to Django as a MISS rather than refused: fastpath
 * must never refuse what nginx forwards. */
static int _http_fail(fp_conn_t *c, int status, const char *message, const char *cache)
{
    fp_request_t *rq = &c->in->req;
    rq->error_status = (int16_t)status;
    rq->error_message = message;
    rq->error_cache = cache;
    return -1;
}

static size_t _off(fp_conn_t *c, const char *at)
{
    return (size_t)(at - c->in->data);
}

static int _head_too_big(fp_conn_t *c, const char *at, size_t len)
{
    return _off(c, at) + len - c->in->req.start > c->srv->cfg->max_headers;
}

/* What fastpath cannot read as Django would: handed to Django behind nginx (404 MISS), refused
 * with `status` on a listener clients reach straight (the edge: nothing is behind it). */
static int _unreadable(fp_conn_t *c, int status, const char *message)
{
    if (fp_kinds[c->kind].hands_on)
        return _http_fail(c, 404, message, "MISS");
    return _http_fail(c, status, message, NULL);
}

static int _head_too_big_fail(fp_conn_t *c)
{
    return _unreadable(c, 431, "request head too large for fastpath");
}

void fp_http_head_too_big(fp_conn_t *c)
{
    (void)_head_too_big_fail(c);
}

/* Bytes after the head that are not body (chunk extensions, trailers) count as body: the cap
 * on what a request may make us read is --max-body, whatever the bytes are called. */
static int _count_body(fp_conn_t *c, size_t len)
{
    c->body_len += len;
    if (c->body_len > c->srv->cfg->max_body)
        return _http_fail(c, 413, "body too large", NULL);
    return 0;
}

/* A control byte in a header value: llhttp refuses it, but nginx forwards it and gunicorn and
 * Django read it (Django strips some of them around a cookie), so it is Django's to answer.
 * llhttp gives field and value characters one errno; its reason tells them apart.  A bare CR
 * or LF is framing, not a value byte: that stays a 400 (nginx never forwards one). */
static int _bad_value_char(const llhttp_t *p, llhttp_errno_t err)
{
    static const char reason[] = "Invalid header value char";
    const char *r = llhttp_get_error_reason(p), *at = llhttp_get_error_pos(p);
    return err == HPE_INVALID_HEADER_TOKEN && r != NULL && at != NULL && *at != '\r' && *at != '\n' &&
           strnlen(r, sizeof(reason)) == sizeof(reason) - 1 && memcmp(r, reason, sizeof(reason) - 1) == 0;
}

/* Parsing stopped with err (or a callback's reason): the answer, given with "Connection: close". */
void fp_http_error(fp_conn_t *c, llhttp_errno_t err, fp_reply_t *a)
{
    fp_request_t *rq = &c->in->req;
    if (rq->error_status == 0 && _bad_value_char(&c->parser, err))
        (void)_unreadable(c, 400, "header value fastpath cannot read");
    if (rq->error_status != 0)
        fp_reply_error(a, rq->error_status, rq->error_message, rq->error_cache);
    else
        fp_reply_error(a, err == HPE_INVALID_VERSION ? 505 : 400, "bad request", NULL);
}

/* ---- llhttp callbacks -------------------------------------------------------------------- */

static int _on_message_begin(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    fp_request_t *rq = &c->in->req;
    size_t start = rq->start;        /* set by fp_conn.c before parsing began */

    memset(rq, 0, sizeof(*rq));      /* nothing decided yet: ACT_RESPOND, code 0, no error */
    rq->start = start;
    c->in_message = 1;
    c->in_head = 1;
    c->inm = FP_INM_NONE;
    c->wait_s = -1;
    c->body_len = 0;
    c->is_head = 0;
    c->mode = FP_MODE_ONCE;
    c->origin = 0;
    if (fp_kinds[c->kind].header_timeout != NULL)     /* from its first byte (slowloris) */
        c->deadline_s = fp_now_s() + fp_kinds[c->kind].header_timeout(c->srv->cfg);
    return 0;
}

static int _on_url(llhttp_t *p, const char *at, size_t len)
{
    fp_conn_t *c = p->data;
    fp_request_t *rq = &c->in->req;
    if (_head_too_big(c, at, len))
        return _head_too_big_fail(c);
    if (rq->url.len == 0)
        rq->url.off = _off(c, at);
    rq->url.len += len;
    c->is_head = llhttp_get_method(p) == HTTP_HEAD;   /* known from here: errors too go bodiless */
    return 0;
}

static int _on_header_field(llhttp_t *p, const char *at, size_t len)
{
    fp_conn_t *c = p->data;
    fp_request_t *rq = &c->in->req;
    if (!c->in_head)
        return _count_body(c, len);  /* a trailer */
    if (_head_too_big(c, at, len))
        return _head_too_big_fail(c);
    if (rq->field.len == 0)
        rq->field.off = _off(c, at);
    rq->field.len += len;
    return 0;
}

/* RFC 9112 5.1: whitespace between a field name and its colon MUST be refused with 400 (llhttp
 * takes a space as part of the name).  Two readers could disagree on whose header it is: nginx
 * drops such a line, another server might read "Authorization".  The name ends at the colon
 * llhttp has just read, still in the buffer. */
static int _on_header_field_complete(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    fp_request_t *rq = &c->in->req;
    if (!c->in_head || rq->field.len == 0)
        return 0;
    const char *end = c->in->data + rq->field.off + rq->field.len;
    if (end[-1] == ' ' || end[-1] == '\t' || (end < c->in->data + c->in->len && *end != ':'))
        return _unreadable(c, 400, "whitespace before a header's colon");
    return 0;
}

/* Obsolete line folding (RFC 9112 5.2): llhttp takes a line that starts with SP or HT as more
 * of the previous header's value and hands it on as another piece of that value, which we would
 * misread.  nginx and gunicorn refuse it, and so do we.  A piece of a value begins after the
 * field's ':' and optional whitespace, or right after the end of the previous piece (a read
 * split it); a folded line's piece begins after a line feed and whitespace.  The whole head
 * stays in the buffer while it is parsed, so looking back is safe. */
static int _is_folded(fp_conn_t *c, const char *at)
{
    const char *p = at, *start = c->in->data + c->in->req.start;
    while (p > start && (p[-1] == ' ' || p[-1] == '\t'))
        p--;
    return p > start && p[-1] == '\n';
}

static int _on_header_value(llhttp_t *p, const char *at, size_t len)
{
    fp_conn_t *c = p->data;
    fp_request_t *rq = &c->in->req;
    if (!c->in_head)
        return _count_body(c, len);
    if (_head_too_big(c, at, len))
        return _head_too_big_fail(c);
    if (len == 0)
        return 0;                    /* an empty value: llhttp points it at the next line */
    if (_is_folded(c, at))
        return _http_fail(c, 400, "obsolete header line folding", NULL);
    if (rq->value.len == 0)
        rq->value.off = _off(c, at);
    rq->value.len += len;
    return 0;
}

/* A header is complete: one fastpath reads goes to its row's handler. */
static int _on_header_value_complete(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    fp_request_t *rq = &c->in->req;
    if (!c->in_head)
        return 0;                    /* trailers carry nothing fastpath reads */
    fp_header_id_t id = _header_find(c->in->data + rq->field.off, rq->field.len);
    if (id != FP_HDR_N)
        _headers[id].handler(rq, id);
    rq->field.len = rq->value.len = 0;
    return 0;
}

static int _on_headers_complete(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    fp_request_t *rq = &c->in->req;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->srv->cfg->max_body)
        return _http_fail(c, 413, "body too large", NULL);
    c->keep_alive = (uint8_t)llhttp_should_keep_alive(p);
    uint8_t method = llhttp_get_method(p);
    if (c->is_head && fp_kinds[c->kind].hands_on)
        c->keep_alive = 0;           /* HEAD goes to Django (404 MISS); no body framing doubts.
                                        The edge answers it with a GET's head, kept alive alike */
    fp_route(c, method, c->in->data + rq->url.off, rq->url.len);
    c->in_head = 0;                  /* from here on the head's bytes are no longer needed */
    return 0;
}

static int _on_body(llhttp_t *p, const char *at, size_t len)
{
    return _count_body(p->data, len);    /* polls ignore the body; it is only counted */
}

static int _on_chunk_extension(llhttp_t *p, const char *at, size_t len)
{
    return _count_body(p->data, len);
}

static int _on_message_complete(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    c->in_message = 0;
    if (!llhttp_should_keep_alive(p) || p->upgrade)
        c->keep_alive = 0;
    return HPE_PAUSED;               /* answer this one before parsing the next */
}

void fp_http_settings_init(llhttp_settings_t *s)
{
    llhttp_settings_init(s);
    s->on_message_begin = _on_message_begin;
    s->on_url = _on_url;
    s->on_header_field = _on_header_field;
    s->on_header_field_complete = _on_header_field_complete;
    s->on_header_value = _on_header_value;
    s->on_header_value_complete = _on_header_value_complete;
    s->on_headers_complete = _on_headers_complete;
    s->on_body = _on_body;
    s->on_chunk_extension_name = _on_chunk_extension;
    s->on_chunk_extension_value = _on_chunk_extension;
    s->on_message_complete = _on_message_complete;
}

/* ---- the buffer ------------------------------------------------------------------------ */

/* Move the bytes still needed to the front of the buffer (offsets follow): while a head is
 * read, all of it; after, only what is not parsed yet.  A span of no bytes has no offset to
 * follow. */
void fp_http_compact(fp_conn_t *c)
{
    fp_buf_t *b = c->in;
    fp_request_t *rq = &b->req;
    size_t keep = c->in_head ? rq->start : b->pos;
    if (keep == 0)
        return;
    memmove(b->data, b->data + keep, b->len - keep);
    b->len -= keep;
    b->pos -= keep;
    if (c->in_head) {
        rq->start -= keep;
        if (rq->url.len)
            rq->url.off -= keep;
        if (rq->field.len)
            rq->field.off -= keep;
        if (rq->value.len)
            rq->value.off -= keep;
        for (int i = 0; i < FP_HDR_N; i++)
            if (rq->header[i].len)
                rq->header[i].off -= keep;
    }
}
