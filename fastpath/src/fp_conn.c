/* HTTP connections: llhttp parses, this file decides and answers.
 *
 * A connection costs its struct and one event while idle; a read buffer (max_headers + 1 KiB)
 * is lent from a pool only while it has unparsed bytes.  Requests on one connection are
 * answered one at a time and in order: after each complete request the parser pauses, the
 * request is answered (at once, or when memcached replies), and only then does parsing go on
 * with any pipelined bytes.
 *
 * Request data is only ever handled as (offset, length) into the read buffer; nothing here
 * relies on NUL termination.
 *
 * close()'s result is not used: Linux releases the descriptor even when close reports an error,
 * and nothing unsent could be saved by then.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fp_internal.h"

#define HEAD_CAP 512                 /* our response head, always well below */
#define BUF_SLACK 1024
#define STATS_CAP 8192
#define LINGER_S 2                   /* how long a closing connection's input is still read */
#define LINGER_MAX_BYTES (1u << 20)

/* ---- read buffers ------------------------------------------------------------------ */

static fp_buf_t *_buf_get(fp_server_t *srv)
{
    fp_buf_t *b = srv->buf_pool;
    if (b != NULL) {
        srv->buf_pool = b->next;
        srv->buf_pool_n--;
    } else if ((b = malloc(sizeof(*b) + srv->buf_cap)) == NULL) {
        return NULL;
    }
    b->next = NULL;
    b->len = b->pos = 0;
    return b;
}

static void _buf_put(fp_server_t *srv, fp_buf_t *b)
{
    if (srv->buf_pool_n >= FP_BUF_POOL_MAX) {
        free(b);
        return;
    }
    b->next = srv->buf_pool;
    srv->buf_pool = b;
    srv->buf_pool_n++;
}

void fp_buf_pool_free(fp_server_t *srv)
{
    while (srv->buf_pool != NULL) {
        fp_buf_t *next = srv->buf_pool->next;
        free(srv->buf_pool);
        srv->buf_pool = next;
    }
    srv->buf_pool_n = 0;
}

/* ---- connection lifecycle ---------------------------------------------------------- */

static void _conn_event_cb(evutil_socket_t fd, short what, void *arg);

static void _conn_close(fp_conn_t *c)
{
    fp_server_t *srv = c->srv;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    fp_mc_cancel(c->mc_req);         /* its memcached answer, if it still comes, is dropped */
    event_free(c->ev);
    close(c->fd);
    if (c->in != NULL)
        _buf_put(srv, c->in);
    srv->n_conns--;
    srv->n_polls -= !c->admin;
    srv->st->connections--;
    free(c->out);
    free(c);
    fp_maybe_finish_drain(srv);
}

/* Watch the socket for `what` (EV_READ or EV_WRITE), with the idle timeout. */
static int _conn_watch(fp_conn_t *c, short what)
{
    if (event_del(c->ev) < 0)
        return -1;
    if (event_assign(c->ev, c->srv->base, c->fd, what | EV_PERSIST, _conn_event_cb, c) < 0)
        return -1;
    return event_add(c->ev, c->srv->idle_tv);
}

/* Nagle off, so that an answer leaves at once.  A unix socket has no Nagle to turn off. */
static int _set_nodelay(evutil_socket_t fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0 || errno == EOPNOTSUPP)
        return 0;
    return -1;
}

static void _conn_new(fp_server_t *srv, evutil_socket_t fd, int admin)
{
    const fp_config_t *cfg = srv->cfg;
    /* the cap is for poll connections: an operator can still read /metrics at the cap */
    if (srv->stopping || (!admin && srv->n_polls >= cfg->max_connections) || _set_nodelay(fd) != 0) {
        close(fd);                   /* nginx falls back to Django at once, instead of queueing */
        srv->st->conn_rejected++;
        return;
    }
    fp_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        srv->st->conn_rejected++;
        return;
    }
    c->srv = srv;
    c->fd = fd;
    c->admin = (uint8_t)admin;
    c->state = CONN_READING;
    c->deadline_s = fp_now_s(srv) + cfg->idle_timeout_s;
    llhttp_init(&c->parser, HTTP_REQUEST, &srv->http_settings);
    c->parser.data = c;
    c->ev = event_new(srv->base, fd, EV_READ | EV_PERSIST, _conn_event_cb, c);
    if (c->ev == NULL || event_add(c->ev, srv->idle_tv) < 0) {
        if (c->ev != NULL)
            event_free(c->ev);
        close(fd);
        free(c);
        srv->st->conn_rejected++;
        return;
    }
    c->next = srv->conns;
    if (srv->conns != NULL)
        srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    srv->n_polls += !admin;
    srv->st->connections++;
    srv->st->conn_accepted++;
}

void fp_conn_open(fp_server_t *srv, evutil_socket_t fd, int admin)
{
    _conn_new(srv, fd, admin);
}

void fp_conn_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
    _conn_new(arg, fd, 0);
}

void fp_conn_admin_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
    _conn_new(arg, fd, 1);
}

/* accept() failed (EMFILE, ENFILE, ENOMEM...): stop accepting for a moment instead of spinning. */
void fp_conn_accept_error(struct evconnlistener *l, void *arg)
{
    fp_server_t *srv = arg;
    srv->st->conn_rejected++;
    fp_server_pause_accepting(srv, l);
}

/* Draining: idle keep-alive connections go now; busy ones close after their answer. */
void fp_conn_close_idle(fp_server_t *srv)
{
    fp_conn_t *c = srv->conns, *next;
    for (; c != NULL; c = next) {
        next = c->next;
        if (c->state == CONN_READING && !c->in_message)
            _conn_close(c);
    }
}

void fp_conn_close_all(fp_server_t *srv)
{
    while (srv->conns != NULL)
        _conn_close(srv->conns);
}

/* ---- responses --------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
} _text_t;

static void _put(_text_t *t, const char *s, size_t n)
{
    if (t->len + n <= t->cap) {
        memcpy(t->p + t->len, s, n);
        t->len += n;
    }
}

#define PUT_LIT(t, s) _put((t), (s), sizeof(s) - 1)

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

static const char *_reason(int code)
{
    switch (code) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    }
    return "Error";
}

static int _conn_after_response(fp_conn_t *c);

/* Send status, headers and body (one sendmsg in the common case).  Returns -1 when the
 * connection was closed (the caller must not touch it), else 0. */
static int _conn_respond(fp_conn_t *c, int code, const char *ctype, const char *cache,
                         const char *body, size_t body_len)
{
    fp_server_t *srv = c->srv;
    char head_buf[HEAD_CAP];
    _text_t h = {head_buf, 0, sizeof(head_buf)};
    size_t date_len;
    const char *date = fp_date_header(srv, &date_len);
    const char *reason = _reason(code);

    if (code == 204 || c->is_head)
        body_len = 0;
    if (!c->admin)
        srv->st->status[fp_status_slot(code)]++;
    PUT_LIT(&h, "HTTP/1.1 ");
    _put_uint(&h, (uint64_t)code);
    PUT_LIT(&h, " ");
    _put(&h, reason, strnlen(reason, 31));   /* the longest reason is 31 */
    PUT_LIT(&h, "\r\nDate: ");
    _put(&h, date, date_len);
    PUT_LIT(&h, "\r\n");
    if (code != 204) {
        PUT_LIT(&h, "Content-Type: ");
        _put(&h, ctype, strnlen(ctype, 64));
        PUT_LIT(&h, "\r\nContent-Length: ");
        _put_uint(&h, body_len);
        PUT_LIT(&h, "\r\n");
    }
    PUT_LIT(&h, "Cache-Control: no-store\r\n");
    if (cache != NULL) {
        PUT_LIT(&h, "X-Cache: ");
        _put(&h, cache, strnlen(cache, 8));
        PUT_LIT(&h, "\r\n");
    }
    if (code == 405)
        PUT_LIT(&h, "Allow: GET, POST\r\n");
    if (!c->keep_alive || srv->stopping)
        PUT_LIT(&h, "Connection: close\r\n");
    else if (c->parser.http_major == 1 && c->parser.http_minor == 0)
        PUT_LIT(&h, "Connection: keep-alive\r\n");
    PUT_LIT(&h, "\r\n");

    struct iovec iov[2] = {{h.p, h.len}, {(void *)body, body_len}};
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = body_len > 0 ? 2 : 1;
    size_t total = h.len + body_len;
    ssize_t n;
    do {
        n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            _conn_close(c);
            return -1;
        }
        n = 0;
    }
    if ((size_t)n == total)
        return _conn_after_response(c);

    /* the socket is full: keep the rest and wait until it is writable */
    size_t rest = total - (size_t)n;
    c->out = malloc(rest);
    if (c->out == NULL) {
        _conn_close(c);
        return -1;
    }
    size_t from_head = (size_t)n < h.len ? h.len - (size_t)n : 0;
    memcpy(c->out, h.p + (h.len - from_head), from_head);
    memcpy(c->out + from_head, body + (body_len - (rest - from_head)), rest - from_head);
    c->out_len = rest;
    c->out_sent = 0;
    c->state = CONN_WRITING;
    if (_conn_watch(c, EV_WRITE) < 0) {
        _conn_close(c);
        return -1;
    }
    return 0;
}

static int _conn_respond_error(fp_conn_t *c, int code, const char *message, const char *cache)
{
    char body_buf[160];
    _text_t b = {body_buf, 0, sizeof(body_buf)};
    /* message is always one of our literals, never request data */
    PUT_LIT(&b, "{\"error\":\"");
    _put(&b, message, strnlen(message, 128));
    PUT_LIT(&b, "\"}");
    return _conn_respond(c, code, "application/json", cache, b.p, b.len);
}

/* Closing with unread input would make the kernel send RST, which can destroy the answer
 * before the client reads it (nginx's lingering_close): send FIN, read and drop what still
 * comes for a moment, then close. */
static void _conn_linger(fp_conn_t *c)
{
    struct timeval linger = {LINGER_S, 0};
    if (c->in != NULL) {
        _buf_put(c->srv, c->in);
        c->in = NULL;
    }
    c->state = CONN_LINGERING;
    c->body_len = 0;                 /* now counts dropped bytes */
    if (shutdown(c->fd, SHUT_WR) < 0 || event_del(c->ev) < 0 ||
        event_assign(c->ev, c->srv->base, c->fd, EV_READ | EV_PERSIST, _conn_event_cb, c) < 0 ||
        event_add(c->ev, &linger) < 0)
        _conn_close(c);
}

static void _conn_lingering_readable(fp_conn_t *c)
{
    char sink[4096];
    ssize_t n = recv(c->fd, sink, sizeof(sink), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    c->body_len += n > 0 ? (uint64_t)n : 0;
    if (n <= 0 || c->body_len > LINGER_MAX_BYTES)
        _conn_close(c);
}

/* The answer is out: wait for the next request on this connection, or close it.  -1: the
 * connection is closed or closing (the caller must not touch it). */
static int _conn_after_response(fp_conn_t *c)
{
    fp_server_t *srv = c->srv;
    int was_writing = c->state == CONN_WRITING;

    if (!c->keep_alive || srv->stopping) {
        _conn_linger(c);
        return -1;
    }
    c->state = CONN_READING;
    c->deadline_s = fp_now_s(srv) + srv->cfg->idle_timeout_s;
    if (was_writing || c->read_paused) {
        c->read_paused = 0;
        if (_conn_watch(c, EV_READ) < 0) {
            _conn_close(c);
            return -1;
        }
    }
    return 0;
}

static int _conn_answer_result(fp_conn_t *c, fp_mc_result_t r, const char *data, size_t len)
{
    switch (r) {
    case FP_MC_HIT:
        return _conn_respond(c, 200, "application/json", "HIT", data, len);
    case FP_MC_EMPTY:
        return _conn_respond(c, 204, NULL, "HIT", NULL, 0);
    case FP_MC_MISS:
        return _conn_respond_error(c, 404, "miss", "MISS");
    case FP_MC_OVERLOADED:
        return _conn_respond_error(c, 503, "overloaded", "MISS");
    default:
        return _conn_respond_error(c, 503, "memcached unavailable", "MISS");
    }
}

static int _conn_respond_metrics(fp_conn_t *c)
{
    char *text = malloc(STATS_CAP);
    if (text == NULL)
        return _conn_respond_error(c, 503, "out of memory", NULL);
    size_t n = fp_stats_render(c->srv->cfg->stats, c->srv->cfg->n_workers, text, STATS_CAP);
    int rc = _conn_respond(c, 200, "text/plain; version=0.0.4", NULL, text, n);
    free(text);
    return rc;
}

static void _conn_process(fp_conn_t *c);

/* memcached answered the get this connection waits for (fp_mc_done_fn). */
static void _conn_on_answer(void *ctx, fp_mc_result_t r, const char *data, size_t len)
{
    fp_conn_t *c = ctx;
    c->mc_req = NULL;
    if (_conn_answer_result(c, r, data, len) == 0 && c->state == CONN_READING)
        _conn_process(c);            /* pipelined requests waiting in the buffer */
}

/* ---- deciding what a request gets ---------------------------------------------------- */

/* Credentials are read exactly as Django reads them (docs/contract.md, section 2); where the two
 * could disagree -- a repeated header, a repeated or quoted plurk_token cookie -- fastpath does
 * not guess: it answers MISS and nginx lets Django decide. */
enum { CRED_NONE = -1, CRED_FOUND = 0, CRED_AMBIGUOUS = -2 };

static int _is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* credentials = "Bearer" 1SP token  (scheme case-insensitive; trailing OWS is not part of the
 * value, so "Bearer " alone is no Bearer credential, as for Django) */
static int _bearer_token(const char *value, size_t len, const char **tok, size_t *tok_len)
{
    while (len > 0 && _is_ows(value[len - 1]))
        len--;
    if (len < 7 || strncasecmp(value, "bearer ", 7) != 0)
        return CRED_NONE;
    *tok = value + 7;
    *tok_len = len - 7;
    return CRED_FOUND;
}

/* cookie-string = cookie-pair *( ";" cookie-pair ); each pair is name "=" value with optional
 * whitespace around both, the last pair of a name wins (Django's parse_cookie).  We want
 * plurk_token; a quoted value (Django would unquote it) or a second plurk_token is ambiguous. */
static int _cookie_token(const char *value, size_t len, const char **tok, size_t *tok_len)
{
    static const char name[] = "plurk_token";
    const size_t name_len = sizeof(name) - 1;
    int found = CRED_NONE;
    size_t i = 0;

    while (i < len) {
        const char *pair = value + i;
        const char *semi = memchr(pair, ';', len - i);
        size_t pair_len = semi ? (size_t)(semi - pair) : len - i;
        const char *eq = memchr(pair, '=', pair_len);
        i += pair_len + 1;
        if (eq == NULL)
            continue;
        const char *key = pair, *val = eq + 1;
        size_t key_len = (size_t)(eq - pair), val_len = pair_len - key_len - 1;
        while (key_len > 0 && _is_ows(*key)) { key++; key_len--; }
        while (key_len > 0 && _is_ows(key[key_len - 1])) key_len--;
        if (key_len != name_len || memcmp(key, name, name_len) != 0)
            continue;
        if (found == CRED_FOUND)
            return CRED_AMBIGUOUS;
        while (val_len > 0 && _is_ows(*val)) { val++; val_len--; }
        while (val_len > 0 && _is_ows(val[val_len - 1])) val_len--;
        if (val_len > 0 && val[0] == '"')
            return CRED_AMBIGUOUS;
        *tok = val;
        *tok_len = val_len;
        found = CRED_FOUND;
    }
    return found;
}

/* path = "/Poll/" resource ; resource = 1*32(ALPHA / DIGIT / "_"), one of cfg->resources */
static int _find_resource(const fp_config_t *cfg, const char *path, size_t len)
{
    static const char prefix[] = "/Poll/";
    const size_t plen = sizeof(prefix) - 1;
    if (len <= plen || len - plen > FP_MAX_RESOURCE_LEN || memcmp(path, prefix, plen) != 0)
        return -1;
    for (int i = 0; i < cfg->n_resources; i++)
        if (cfg->resource_len[i] == len - plen && memcmp(cfg->resources[i], path + plen, len - plen) == 0)
            return i;
    return -1;
}

static void _decide(fp_conn_t *c, int code, const char *message, const char *cache)
{
    c->answer_code = (int16_t)code;
    c->answer_message = message;
    c->answer_cache = cache;
}

/* At the end of the head: method, resource and token decide the answer (or a memcached key). */
static void _examine(fp_conn_t *c)
{
    const fp_config_t *cfg = c->srv->cfg;
    const char *data = c->in->data;
    const char *url = data + c->url_off, *tok = NULL, *q;
    size_t url_len = c->url_len, path_len, tok_len = 0;
    uint8_t method = llhttp_get_method(&c->parser);
    fp_token_t token;

    c->is_head = method == HTTP_HEAD;
    if (c->is_head)
        c->keep_alive = 0;           /* we answer HEAD with 405; no body framing doubts */
    if (c->admin) {
        if (method == HTTP_GET && url_len == 8 && memcmp(url, "/metrics", 8) == 0)
            _decide(c, 200, NULL, NULL);
        else
            _decide(c, 404, "not found", NULL);
        return;
    }
    if (method != HTTP_GET && method != HTTP_POST) {
        _decide(c, 405, "method not allowed", NULL);
        return;
    }
    q = url_len > 0 ? memchr(url, '?', url_len) : NULL;
    path_len = q ? (size_t)(q - url) : url_len;
    int res = _find_resource(cfg, url, path_len);
    if (res < 0) {                   /* 404 + MISS: nginx lets Django answer unknown resources */
        _decide(c, 404, "unknown poll resource", "MISS");
        return;
    }
    int found = CRED_NONE;
    if (c->have_auth > 1 || c->have_cookie > 1)
        found = CRED_AMBIGUOUS;      /* a repeated header: Django sees them joined */
    if (found == CRED_NONE && c->have_auth)
        found = _bearer_token(data + c->auth_off, c->auth_len, &tok, &tok_len);
    if (found == CRED_NONE && c->have_cookie)
        found = _cookie_token(data + c->cookie_off, c->cookie_len, &tok, &tok_len);
    if (found == CRED_AMBIGUOUS) {
        _decide(c, 404, "ambiguous credentials", "MISS");
        return;
    }
    if (found != CRED_FOUND) {
        _decide(c, 401, "authentication required", NULL);
        return;
    }
    int64_t now;
    if (fp_wall_s(c->srv, &now) != 0) {
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
    size_t key_len = fp_make_key(c->key, sizeof(c->key), cfg->resources[res], cfg->resource_len[res], &token);
    if (key_len == 0 || key_len > FP_KEY_CAP) {
        _decide(c, 400, "bad key", NULL);
        return;
    }
    c->key_len = (uint8_t)key_len;
    _decide(c, 0, NULL, NULL);
}

/* A whole request has been read: answer it, or ask memcached.  -1: connection closed. */
static int _dispatch(fp_conn_t *c)
{
    if (c->answer_code == 200 && c->admin)
        return _conn_respond_metrics(c);
    if (c->answer_code != 0)
        return _conn_respond_error(c, c->answer_code, c->answer_message, c->answer_cache);
    fp_mc_result_t r = fp_mc_get(&c->srv->mc, c->key, c->key_len, _conn_on_answer, c, &c->mc_req);
    if (r == FP_MC_QUEUED) {
        c->state = CONN_WAITING;
        return 0;
    }
    return _conn_answer_result(c, r, NULL, 0);
}

/* ---- llhttp callbacks ---------------------------------------------------------------- */

static int _fail(fp_conn_t *c, int status, const char *message)
{
    c->error_status = (int16_t)status;
    c->error_message = message;
    return -1;
}

static size_t _off(fp_conn_t *c, const char *at)
{
    return (size_t)(at - c->in->data);
}

static int _head_too_big(fp_conn_t *c, const char *at, size_t len)
{
    return _off(c, at) + len - c->head_start > c->srv->cfg->max_headers;
}

static int _on_message_begin(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    c->in_message = 1;
    c->in_head = 1;
    c->url_len = c->field_len = c->value_len = c->auth_len = c->cookie_len = 0;
    c->have_auth = c->have_cookie = 0;
    c->field_kind = 0;
    c->body_len = 0;
    c->is_head = 0;
    c->key_len = 0;
    _decide(c, 0, NULL, NULL);
    return 0;
}

static int _on_url(llhttp_t *p, const char *at, size_t len)
{
    fp_conn_t *c = p->data;
    if (c->url_len == 0)
        c->url_off = _off(c, at);
    c->url_len += len;
    if (c->url_len > FP_MAX_URI)
        return _fail(c, 414, "uri too long");
    return 0;
}

static int _on_header_field(llhttp_t *p, const char *at, size_t len)
{
    fp_conn_t *c = p->data;
    if (_head_too_big(c, at, len))
        return _fail(c, 431, "headers too large");
    if (c->field_len == 0)
        c->field_off = _off(c, at);
    c->field_len += len;
    return 0;
}

static int _on_header_value(llhttp_t *p, const char *at, size_t len)
{
    fp_conn_t *c = p->data;
    if (_head_too_big(c, at, len))
        return _fail(c, 431, "headers too large");
    if (c->value_len == 0)
        c->value_off = _off(c, at);
    c->value_len += len;
    return 0;
}

static int _on_header_value_complete(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    const char *field = c->in->data + c->field_off;
    /* a second Authorization or Cookie header only marks the request ambiguous (have_* = 2) */
    if (c->field_len == 13 && strncasecmp(field, "authorization", 13) == 0) {
        if (c->have_auth++ == 0) {
            c->auth_off = c->value_off;
            c->auth_len = c->value_len;
        } else {
            c->have_auth = 2;
        }
    } else if (c->field_len == 6 && strncasecmp(field, "cookie", 6) == 0) {
        if (c->have_cookie++ == 0) {
            c->cookie_off = c->value_off;
            c->cookie_len = c->value_len;
        } else {
            c->have_cookie = 2;
        }
    }
    c->field_len = c->value_len = 0;
    return 0;
}

static int _on_headers_complete(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->srv->cfg->max_body)
        return _fail(c, 413, "body too large");
    c->keep_alive = (uint8_t)llhttp_should_keep_alive(p);
    _examine(c);
    c->in_head = 0;                  /* from here on the head's bytes are no longer needed */
    return 0;
}

static int _on_body(llhttp_t *p, const char *at, size_t len)
{
    fp_conn_t *c = p->data;
    c->body_len += len;              /* polls ignore the body; it is only counted */
    if (c->body_len > c->srv->cfg->max_body)
        return _fail(c, 413, "body too large");
    return 0;
}

static int _on_message_complete(llhttp_t *p)
{
    fp_conn_t *c = p->data;
    c->in_message = 0;
    if (!llhttp_should_keep_alive(p) || p->upgrade)
        c->keep_alive = 0;
    return HPE_PAUSED;               /* answer this one before parsing the next */
}

void fp_conn_settings_init(llhttp_settings_t *s)
{
    llhttp_settings_init(s);
    s->on_message_begin = _on_message_begin;
    s->on_url = _on_url;
    s->on_header_field = _on_header_field;
    s->on_header_value = _on_header_value;
    s->on_header_value_complete = _on_header_value_complete;
    s->on_headers_complete = _on_headers_complete;
    s->on_body = _on_body;
    s->on_message_complete = _on_message_complete;
}

/* ---- reading and parsing ------------------------------------------------------------- */

/* Move the bytes still needed to the front of the buffer (offsets follow). */
static void _compact(fp_conn_t *c)
{
    fp_buf_t *b = c->in;
    size_t keep = c->in_head ? c->head_start : b->pos;
    if (keep == 0)
        return;
    memmove(b->data, b->data + keep, b->len - keep);
    b->len -= keep;
    b->pos -= keep;
    if (c->in_head) {
        c->head_start -= keep;
        if (c->url_len)
            c->url_off -= keep;
        if (c->field_len)
            c->field_off -= keep;
        if (c->value_len)
            c->value_off -= keep;
        if (c->have_auth)
            c->auth_off -= keep;
        if (c->have_cookie)
            c->cookie_off -= keep;
    }
}

/* A request we cannot parse: answer it with the reason and close. */
static void _parse_error(fp_conn_t *c, llhttp_errno_t err)
{
    int code = c->error_status;
    const char *message = c->error_message;
    if (code == 0) {
        code = err == HPE_INVALID_VERSION ? 505 : 400;
        message = "bad request";
    }
    c->keep_alive = 0;
    c->is_head = 0;
    c->state = CONN_READING;
    (void)_conn_respond_error(c, code, message, NULL);
}

static void _conn_process(fp_conn_t *c)
{
    while (c->state == CONN_READING && c->in != NULL && c->in->pos < c->in->len) {
        fp_buf_t *b = c->in;
        if (!c->in_message)
            c->head_start = b->pos;
        llhttp_errno_t err = llhttp_execute(&c->parser, b->data + b->pos, b->len - b->pos);
        if (err == HPE_OK) {
            b->pos = b->len;
        } else if (err == HPE_PAUSED) {
            b->pos = (size_t)(llhttp_get_error_pos(&c->parser) - b->data);
            llhttp_resume(&c->parser);
            if (_dispatch(c) < 0)
                return;
        } else {
            _parse_error(c, err);
            return;
        }
    }
    fp_buf_t *b = c->in;
    if (b != NULL && b->pos == b->len && !c->in_head) {
        _buf_put(c->srv, b);         /* nothing left that we need: idle connections hold no buffer */
        c->in = NULL;
    }
}

static void _conn_readable(fp_conn_t *c)
{
    fp_server_t *srv = c->srv;

    if (c->state == CONN_READING && fp_now_s(srv) > c->deadline_s) {
        _conn_close(c);              /* the request is too slow to arrive (slowloris) */
        return;
    }
    if (c->in == NULL && (c->in = _buf_get(srv)) == NULL) {
        _conn_close(c);
        return;
    }
    fp_buf_t *b = c->in;
    if (b->len == srv->buf_cap)
        _compact(c);
    if (b->len == srv->buf_cap) {
        if (c->state == CONN_WAITING) {          /* pipelined bytes pile up: read them later */
            c->read_paused = 1;
            if (event_del(c->ev) < 0)
                _conn_close(c);
            return;
        }
        c->error_status = 431;
        c->error_message = "headers too large";
        _parse_error(c, HPE_USER);
        return;
    }
    ssize_t n;
    do {
        n = recv(c->fd, b->data + b->len, srv->buf_cap - b->len, 0);
    } while (n < 0 && errno == EINTR);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        _conn_close(c);              /* the client went away (an answer in flight is dropped) */
        return;
    }
    if (n > 0)
        b->len += (size_t)n;
    if (c->state == CONN_READING)
        _conn_process(c);
}

static void _conn_writable(fp_conn_t *c)
{
    while (c->out_sent < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            _conn_close(c);
            return;
        }
        c->out_sent += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_sent = 0;
    if (_conn_after_response(c) == 0)
        _conn_process(c);
}

static void _conn_event_cb(evutil_socket_t fd, short what, void *arg)
{
    fp_conn_t *c = arg;
    if (what & EV_TIMEOUT) {
        if (c->state != CONN_WAITING)
            _conn_close(c);          /* idle keep-alive, slow request, slow reader, linger over */
        return;
    }
    if (c->state == CONN_LINGERING)
        _conn_lingering_readable(c);
    else if (c->state == CONN_WRITING)
        _conn_writable(c);
    else
        _conn_readable(c);
}
