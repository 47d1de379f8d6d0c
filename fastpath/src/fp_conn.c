/* HTTP connections: their lifecycle, their socket, their state machine, and how each answers.
 *
 * The jobs around it have rooms of their own, and calls go one way: this file calls fp_http.c
 * (llhttp's callbacks, the headers fastpath reads), which calls fp_route.c (what a request gets,
 * by the kind of its listener) at the end of a head; this file carries the decision out and
 * sends what fp_reply.c builds.
 *
 * A connection costs its struct and one event while idle or held; a read buffer (max_headers +
 * 1 KiB) is lent from a pool only while it has unparsed bytes or a request under way, and what
 * the request's head said (fp_request_t) lives in it, not in the connection.  Requests on one
 * connection are answered one at a time and in order: after each complete request the parser
 * pauses, the request is answered (at once, or when memcached replies), and only then does
 * parsing go on with any pipelined bytes.
 *
 * A connection is a small state machine (fp_conn_state_t): fp_conn_set_state is the only writer
 * of c->state, and builds with FASTPATH_CHECKS (debug, ASan, fuzz) check each transition against
 * _legal below.  How it answers a poll is its mode (fp_mode_t), one row of handlers in _modes:
 * no other code asks which mode a connection is in.  STREAM's handlers live in fp_stream.c, and
 * call the helpers fp_conn.h declares.
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
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fp_internal.h"
#include "fp_conn.h"

#define STATS_CAP 16384
#define LINGER_S 2                   /* how long a closing connection's input is still read */
#define LINGER_MAX_BYTES (1u << 20)

static void _conn_event_cb(evutil_socket_t fd, short what, void *arg);
static int _conn_after_response(fp_conn_t *c);
static void _conn_readable(fp_conn_t *c);
static void _object_free(fp_conn_t *c);
static void _held_put(fp_conn_t *c);
static size_t _fd_address_key(evutil_socket_t fd, char *buf);

/* ---- answer modes ----------------------------------------------------------------------- *
 *
 * How a connection answers a poll is its mode (c->mode, chosen by _dispatch), a row of handlers
 * (fp_mode_ops_t, fp_conn.h): ONCE answers what memcached says now; HOLD (Prefer: wait, with an
 * If-None-Match that may be the answer's) waits in the wait table until the answer differs from
 * the client's or the wait runs out; STREAM (fp_stream.c) keeps its waiter in the wait table (a
 * persistent one) and sends one event per answer until --max-stream or a miss ends it.  This
 * file calls a mode only through its row. */

static int _once_start(fp_conn_t *c, const fp_keys_t *k);
static int _once_fetched(fp_conn_t *c, const fp_keys_t *k, fp_mc_result_t r, const char *data, size_t len);
static int _hold_start(fp_conn_t *c, const fp_keys_t *k);
static int _hold_fetched(fp_conn_t *c, const fp_keys_t *k, fp_mc_result_t r, const char *data, size_t len);
static void _hold_on_change(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag);
static void _hold_over(fp_conn_t *c);

static const fp_mode_ops_t _once_mode = {
    .name = "once", .start = _once_start, .on_fetched = _once_fetched, .after_write = fp_conn_next_request,
};
static const fp_mode_ops_t _hold_mode = {
    .name = "hold", .start = _hold_start, .on_fetched = _hold_fetched, .on_change = _hold_on_change,
    .on_timeout = _hold_over, .on_drain = _hold_over, .after_write = fp_conn_next_request,
};
static const fp_mode_ops_t *const _modes[FP_MODE_N] = {
    [FP_MODE_ONCE] = &_once_mode,
    [FP_MODE_HOLD] = &_hold_mode,
    [FP_MODE_STREAM] = &fp_stream_mode,
};

/* ---- states ---------------------------------------------------------------------------- */

/* (used only by debug builds' checks) */
__attribute__((unused)) static const char *const _state_names[CONN_STATE_N] = {"reading", "waiting", "writing", "lingering", "held"};

/* _legal[from][to]: the transitions fp_conn_set_state accepts (checked in debug builds). */
__attribute__((unused)) static const uint8_t _legal[CONN_STATE_N][CONN_STATE_N] = {
    /*                   READING WAITING WRITING LINGERING HELD */
    [CONN_READING]   = {0,      1,      1,      1,        1},
    [CONN_WAITING]   = {1,      0,      1,      1,        1},   /* an object poll's gets, then held */
    [CONN_WRITING]   = {1,      0,      0,      1,        1},   /* a stream's backlog is out */
    [CONN_LINGERING] = {0,      0,      0,      0,        0},
    [CONN_HELD]      = {1,      0,      1,      1,        0},
};

void fp_conn_set_state(fp_conn_t *c, fp_conn_state_t to)
{
    FP_ASSERT(to < CONN_STATE_N && _legal[c->state][to], "connection %d: %s -> %s", c->fd,
              _state_names[c->state], to < CONN_STATE_N ? _state_names[to] : "?");
#if FASTPATH_DEBUG
    fp_log("connection %d (%s): %s -> %s", c->fd, _modes[c->mode]->name, _state_names[c->state], _state_names[to]);
#endif
    c->state = (uint8_t)to;
}

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
    memset(&b->req, 0, sizeof(b->req));      /* a pooled buffer carries its last request */
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

/* The connection's struct event, right after it in its conn_slab object. */
static struct event *_ev(fp_conn_t *c)
{
    return (struct event *)((char *)c + FP_CONN_EV_OFFSET);
}

void fp_conn_close(fp_conn_t *c)
{
    fp_server_t *srv = c->srv;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    fp_mc_cancel(c->mc_req);         /* its memcached answer, if it still comes, is dropped */
    for (int m = 0; m < FP_MODE_N; m++) {      /* a stream's parts (before c->obj: they share a pointer) */
        if (_modes[m]->release != NULL)
            _modes[m]->release(c);
    }
    _object_free(c);                 /* ... and an object poll's marker get */
    fp_wait_remove(&srv->waits, &c->waiter);     /* a held poll's client left */
    fp_wait_remove(&srv->waits, &c->marker_waiter);
    _held_put(c);
    fp_limit_put(&srv->limits, FP_LIMIT_OPEN, c->open_by);
    if (c->stream_open)
        srv->st->streams--;
    event_del(_ev(c));               /* its memory goes with c's: nothing of it may stay armed */
    close(c->fd);
    if (c->in != NULL)
        _buf_put(srv, c->in);
    srv->n_conns--;
    srv->n_kind[c->kind]--;
    srv->st->connections--;
    free(c->out);
    fp_slab_free(&srv->conn_slab, c);
    if (srv->stopping && srv->n_conns <= 0 && srv->drained != NULL)
        srv->drained(srv->drained_arg);
}

/* Watch the socket for `what` (EV_READ or EV_WRITE) with timeout `tv`.  The event is assigned
 * again only when `what` changes: a new timeout alone is event_add's to reschedule, with no
 * epoll_ctl (a held poll's answer used to cost two, DEL and ADD, for the same EV_READ). */
static int _conn_arm(fp_conn_t *c, short what, const struct timeval *tv)
{
    struct event *ev = _ev(c);
    if ((event_get_events(ev) & (EV_READ | EV_WRITE)) != what &&
        (event_del(ev) < 0 ||
         event_assign(ev, c->srv->base, c->fd, what | EV_PERSIST, _conn_event_cb, c) < 0))
        return -1;
    return event_add(ev, tv);
}

/* Watch the socket for `what`, with the idle timeout. */
static int _conn_watch(fp_conn_t *c, short what)
{
    return _conn_arm(c, what, c->srv->idle_tv);
}

/* Nagle off, so that an answer leaves at once.  A tuned listener's connections inherit it from
 * the listener (fp_server.c _tune_listener; the first one checks); a unix socket has no Nagle to
 * turn off; any other listener's connections get one setsockopt each. */
static int _set_nodelay(fp_listener_t *ls, evutil_socket_t fd)
{
    int one = 1, on = 0;
    socklen_t len = sizeof(on);

    if (ls->nodelay == FP_NODELAY_CHECK)
        ls->nodelay = getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len) == 0 && on
                          ? FP_NODELAY_INHERITED : FP_NODELAY_SET;
    if (ls->nodelay != FP_NODELAY_SET)
        return 0;                    /* inherited, or a unix socket */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0 || errno == EOPNOTSUPP)
        return 0;
    return -1;
}

/* Nothing armed on the socket: a connection read at once when accepted, or waiting for
 * memcached since (_conn_after_response arms it when it waits for the client again). */
static int _conn_unarmed(fp_conn_t *c)
{
    return !event_pending(_ev(c), EV_READ | EV_WRITE, NULL);
}

/* Over a kind's cap (or while draining) a connection is closed at once: nginx falls back to
 * Django instead of queueing, and an operator can still read /metrics at the poll cap.  So is
 * an edge connection beyond --edge-max-conns-per-address from its client's address: one address
 * trickling heads cannot keep every edge connection busy (docs/contract.md section 10).  A
 * connection whose listener defers accept until data came is read at once: the gets of every
 * connection accepted in this pass leave together, and one that is answered and closed before
 * it ever waits for the client costs no epoll_ctl at all. */
void fp_conn_open(fp_listener_t *ls, evutil_socket_t fd)
{
    fp_server_t *srv = ls->srv;
    const fp_config_t *cfg = srv->cfg;
    fp_conn_kind_t kind = (fp_conn_kind_t)ls->kind;
    int read_now = ls->read_on_accept;
    fp_conn_t *c = NULL;
    fp_limit_entry_t *open_by = NULL;
    char key[FP_LIMIT_KEY_MAX];
    size_t key_len;

    if (srv->stopping || srv->n_kind[kind] >= fp_kinds[kind].cap(cfg))
        goto reject;
    if (fp_kinds[kind].per_address && cfg->edge_max_conns_per_address > 0 &&
        (key_len = _fd_address_key(fd, key)) > 0 &&
        (open_by = fp_limit_take(&srv->limits, FP_LIMIT_OPEN, key, key_len,
                                 (uint32_t)cfg->edge_max_conns_per_address)) == NULL)
        goto reject;
    if (_set_nodelay(ls, fd) != 0 || (c = fp_slab_alloc(&srv->conn_slab)) == NULL)
        goto reject;
    c->srv = srv;
    c->open_by = open_by;
    c->fd = fd;
    c->kind = (uint8_t)kind;
    c->deadline_s = fp_now_s() + cfg->idle_timeout_s;
    llhttp_init(&c->parser, HTTP_REQUEST, &srv->http_settings);
    c->parser.data = c;
    if (event_assign(_ev(c), srv->base, fd, EV_READ | EV_PERSIST, _conn_event_cb, c) < 0 ||
        (!read_now && event_add(_ev(c), srv->idle_tv) < 0)) {
        fp_slab_free(&srv->conn_slab, c);
        goto reject;
    }
    c->next = srv->conns;
    if (srv->conns != NULL)
        srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    srv->n_kind[kind]++;
    srv->st->connections++;
    srv->st->conn_accepted++;
    if (read_now)
        _conn_readable(c);           /* arms the event when it must wait for the client */
    return;
reject:
    fp_limit_put(&srv->limits, FP_LIMIT_OPEN, open_by);
    close(fd);
    srv->st->conn_rejected++;
}

void fp_conn_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg)
{
    fp_conn_open(arg, fd);
}

/* Draining: idle keep-alive connections go now; busy ones close after their answer. */
void fp_conn_close_idle(fp_server_t *srv)
{
    fp_conn_t *c = srv->conns, *next;
    for (; c != NULL; c = next) {
        next = c->next;
        if (c->state == CONN_READING && !c->in_message)
            fp_conn_close(c);
        else if (c->state == CONN_HELD)
            _modes[c->mode]->on_drain(c);     /* HOLD: answered now, with "Connection: close" */
    }
}

void fp_conn_close_all(fp_server_t *srv)
{
    while (srv->conns != NULL)
        fp_conn_close(srv->conns);
}

/* ---- responses: sending ------------------------------------------------------------ */

/* Keep what the socket did not take (sent bytes of head + body so far: n) and wait until it is
 * writable.  -1: the connection was closed. */
static int _conn_keep_rest(fp_conn_t *c, const char *head, size_t head_len, const char *body, size_t body_len,
                           size_t n)
{
    size_t total = head_len + body_len, rest = total - n;
    size_t from_head = n < head_len ? head_len - n : 0;
    size_t from_body = rest - from_head;

    c->out = malloc(rest);
    if (c->out == NULL) {
        fp_conn_close(c);
        return -1;
    }
    memcpy(c->out, head + (head_len - from_head), from_head);
    if (from_body > 0)               /* body may be NULL when there is none (204) */
        memcpy(c->out + from_head, body + (body_len - from_body), from_body);
    c->out_len = rest;
    c->out_sent = 0;
    fp_conn_set_state(c, CONN_WRITING);
    if (_conn_watch(c, EV_WRITE) < 0) {
        fp_conn_close(c);
        return -1;
    }
    return 0;
}

/* Head and body in one sendmsg in the common case.  -1: the connection was closed or is
 * closing (the caller must not touch it). */
int fp_conn_send(fp_conn_t *c, const char *head, size_t head_len, const char *body, size_t body_len)
{
    struct iovec iov[2] = {{(void *)head, head_len}, {(void *)body, body_len}};
    struct msghdr msg;
    ssize_t n;

    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = body_len > 0 ? 2 : 1;
    do {
        n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            fp_conn_close(c);
            return -1;
        }
        n = 0;
    }
    if ((size_t)n == head_len + body_len)
        return _conn_after_response(c);
    return _conn_keep_rest(c, head, head_len, body, body_len, (size_t)n);
}

/* Send a reply (fp_reply.c built it; on a listener that hands nothing on, an answer for Django
 * becomes one that sends the client to the site).  -1: the connection was closed or is closing. */
static int _conn_reply(fp_conn_t *c, fp_reply_t *a)
{
    char head[FP_HEAD_CAP];

    if (!fp_kinds[c->kind].hands_on)
        fp_reply_site(a);
    size_t body_len = a->code == 204 || a->code == 304 ? 0 : a->body_len;
    if (fp_kinds[c->kind].counted)
        c->srv->st->status[fp_status_slot(a->code)]++;
    size_t head_len = fp_reply_head(c, a, body_len, head, sizeof(head));
    /* HEAD: the head a GET would get, Content-Length included, and no content (RFC 9110 9.3.2) */
    return fp_conn_send(c, head, head_len, a->body, c->is_head ? 0 : body_len);
}

int fp_conn_respond_error(fp_conn_t *c, int code, const char *message, const char *cache)
{
    fp_reply_t a;
    fp_reply_error(&a, code, message, cache);
    return _conn_reply(c, &a);
}

/* An allowed origin's CORS preflight (the edge): 204 with what its page may send. */
static int _conn_respond_preflight(fp_conn_t *c)
{
    fp_reply_t a;
    fp_reply_set(&a, 204, NULL, NULL, NULL, NULL, 0);
    a.preflight = 1;
    return _conn_reply(c, &a);
}

static int _conn_respond_metrics(fp_conn_t *c)
{
    fp_reply_t a;
    char *text = malloc(STATS_CAP);
    if (text == NULL)
        return fp_conn_respond_error(c, 503, "out of memory", NULL);
    size_t n = fp_stats_render(c->srv->cfg->stats, c->srv->cfg->n_workers, text, STATS_CAP);
    fp_reply_set(&a, 200, "text/plain; version=0.0.4", NULL, NULL, text, n);
    int rc = _conn_reply(c, &a);
    free(text);
    return rc;
}

/* Answer what memcached said (tag: the answer's ETag if known, else NULL). */
int fp_conn_answer_result(fp_conn_t *c, fp_mc_result_t r, const char *data, size_t len,
                               const char *tag)
{
    fp_reply_t a;
    fp_reply_result(&a, c, r, data, len, tag);
    return _conn_reply(c, &a);
}

/* ---- closing ----------------------------------------------------------------------- */

/* Closing with unread input would make the kernel send RST, which can destroy the answer
 * before the client reads it (nginx's lingering_close): send FIN, read and drop what still
 * comes for at most LINGER_S in all (a client that trickles bytes does not extend it), then
 * close. */
static void _conn_linger(fp_conn_t *c)
{
    struct timeval linger = {LINGER_S, 0};
    if (c->in != NULL) {
        _buf_put(c->srv, c->in);
        c->in = NULL;
    }
    fp_conn_set_state(c, CONN_LINGERING);
    c->body_len = 0;                 /* now counts dropped bytes */
    c->deadline_s = fp_now_s() + LINGER_S;
    if (shutdown(c->fd, SHUT_WR) < 0 || _conn_arm(c, EV_READ, &linger) < 0)
        fp_conn_close(c);
}

/* Linger only when the client may still be sending (nginx's `lingering_close on`): bytes not
 * yet parsed, a request not read to its end, or bytes already waiting in the socket.  Otherwise
 * close at once: the kernel still delivers the answer, and a one-request connection (HTTP/1.0,
 * Connection: close) costs no shutdown, no second wait and no extra read. */
static int _conn_may_send_more(fp_conn_t *c)
{
    int waiting = 0;
    if (c->in_message || (c->in != NULL && c->in->pos < c->in->len))
        return 1;
    return ioctl(c->fd, FIONREAD, &waiting) != 0 || waiting > 0;   /* cannot tell: linger */
}

static void _conn_lingering_readable(fp_conn_t *c)
{
    char sink[4096];
    ssize_t n = recv(c->fd, sink, sizeof(sink), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    c->body_len += n > 0 ? (uint64_t)n : 0;
    /* each read re-arms the event's timeout, so the absolute deadline is checked here */
    if (n <= 0 || c->body_len > LINGER_MAX_BYTES || fp_now_s() >= c->deadline_s)
        fp_conn_close(c);
}

/* The answer is out: wait for the next request on this connection, or close it (every mode's
 * after_write today).  -1: the connection is closed or closing (the caller must not touch it). */
int fp_conn_next_request(fp_conn_t *c)
{
    fp_server_t *srv = c->srv;
    /* WRITING watched for writes, HELD with the hold's timeout; a paused reader, or one read
     * when accepted and not armed since, watches nothing */
    int rewatch = c->state == CONN_WRITING || c->state == CONN_HELD || _conn_unarmed(c);

    if (!c->keep_alive || srv->stopping) {
        if (_conn_may_send_more(c))
            _conn_linger(c);
        else
            fp_conn_close(c);
        return -1;
    }
    _held_put(c);                    /* a hold's answer is out: it no longer counts */
    if (c->state != CONN_READING)
        fp_conn_set_state(c, CONN_READING);
    c->deadline_s = fp_now_s() + srv->cfg->idle_timeout_s;
    if (rewatch) {
        if (_conn_watch(c, EV_READ) < 0) {
            fp_conn_close(c);
            return -1;
        }
    }
    return 0;
}

/* ---- answer modes (their table is at the top) ------------------------------------------ */

/* The answer is out: what comes next is the mode's.  -1: the connection is closed or closing
 * (the caller must not touch it). */
static int _conn_after_response(fp_conn_t *c)
{
    return _modes[c->mode]->after_write(c);
}

/* wait=0 is compared once, as without Prefer; a draining worker holds nothing new */
static int _conn_wants_hold(const fp_conn_t *c)
{
    return c->wait_s > 0 && c->inm == FP_INM_TAG && !c->srv->stopping;
}

/* The mode of a poll about to be dispatched. */
static fp_mode_t _conn_mode_of(const fp_conn_t *c)
{
    if (c->in->req.stream)
        return FP_MODE_STREAM;
    return _conn_wants_hold(c) ? FP_MODE_HOLD : FP_MODE_ONCE;
}

/* ---- caps on held connections (fp_limit.c; docs/contract.md section 10) ------------------ *
 *
 * A poll about to be held or streamed counts, until its answer is out or its connection
 * closes, toward the user's held connections (every listener) and toward its client
 * address's (the edge).  Beyond a cap it is answered 429 at once, never queued.  (An edge
 * connection also counts toward its address's open connections from accept to close:
 * fp_conn_open.) */

static int _address_cap(const fp_config_t *cfg)
{
    return cfg->edge_max_per_address;
}

static int _user_cap(const fp_config_t *cfg)
{
    return cfg->max_held_per_user;
}

/* The client's address of socket fd as a key (a family byte, then its bytes: IPv4's 4, IPv6's
 * /64, as one host is often given a whole /64; IPv4-mapped IPv6 as IPv4), or 0 when it cannot
 * be known (a unix socket, a socketpair). */
static size_t _fd_address_key(evutil_socket_t fd, char *buf)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET) {
        buf[0] = 4;
        memcpy(buf + 1, &((struct sockaddr_in *)&ss)->sin_addr, 4);
        return 5;
    }
    if (ss.ss_family == AF_INET6) {
        const unsigned char *a = ((struct sockaddr_in6 *)&ss)->sin6_addr.s6_addr;
        if (memcmp(a, mapped, sizeof(mapped)) == 0) {
            buf[0] = 4;
            memcpy(buf + 1, a + 12, 4);
            return 5;
        }
        buf[0] = 6;
        memcpy(buf + 1, a, 8);
        return 9;
    }
    return 0;
}

/* The client's address as a key, or 0 on a listener that does not count per address. */
static size_t _address_key(const fp_conn_t *c, char *buf)
{
    return fp_kinds[c->kind].per_address ? _fd_address_key(c->fd, buf) : 0;
}

/* The token's uid (kept in the request by fp_route.c). */
static size_t _user_key(const fp_conn_t *c, char *buf)
{
    const fp_request_t *rq = &c->in->req;
    memcpy(buf, rq->uid, rq->uid_len);
    return rq->uid_len;
}

static const struct {
    const char *refusal;                                 /* the 429's message */
    int (*cap)(const fp_config_t *cfg);                  /* 0: no cap, nothing counted */
    size_t (*key)(const fp_conn_t *c, char *buf);        /* FP_LIMIT_KEY_MAX bytes; 0: not counted */
} _held_limits[FP_LIMIT_HELD_N] = {
    [FP_LIMIT_ADDRESS] = {"too many held connections from this address", _address_cap, _address_key},
    [FP_LIMIT_USER] = {"too many held connections for this user", _user_cap, _user_key},
};

static void _held_put(fp_conn_t *c)
{
    for (int i = 0; i < FP_LIMIT_HELD_N; i++) {
        fp_limit_put(&c->srv->limits, (fp_limit_id_t)i, c->held_by[i]);
        c->held_by[i] = NULL;
    }
}

/* Count the hold about to start.  0, or 1 when a cap refused it (answered 429), or -1: the
 * connection was closed. */
static int _held_take(fp_conn_t *c)
{
    fp_server_t *srv = c->srv;
    char key[FP_LIMIT_KEY_MAX];

    for (int i = 0; i < FP_LIMIT_HELD_N; i++) {
        int cap = _held_limits[i].cap(srv->cfg);
        size_t len = cap > 0 ? _held_limits[i].key(c, key) : 0;
        if (len == 0)
            continue;
        c->held_by[i] = fp_limit_take(&srv->limits, (fp_limit_id_t)i, key, len, (uint32_t)cap);
        if (c->held_by[i] == NULL) {
            _held_put(c);
            srv->st->held_refused++;
            c->mode = FP_MODE_ONCE;
            c->wait_s = -1;          /* no Preference-Applied: nothing was held */
            return fp_conn_respond_error(c, 429, _held_limits[i].refusal, NULL) < 0 ? -1 : 1;
        }
    }
    return 0;
}

/* ---- ONCE: answer what memcached says now ------------------------------------------------ */

/* memcached answered the get this connection waits for (fp_mc_done_fn). */
static void _conn_on_answer(void *ctx, fp_mc_result_t r, const char *data, size_t len)
{
    fp_conn_t *c = ctx;
    c->mc_req = NULL;
    if (fp_conn_answer_result(c, r, data, len, NULL) == 0 && c->state == CONN_READING)
        fp_conn_process(c);            /* pipelined requests waiting in the buffer */
}

static int _once_start(fp_conn_t *c, const fp_keys_t *k)
{
    fp_mc_result_t r = fp_mc_get(&c->srv->mc, k->key, k->key_len, _conn_on_answer, c, &c->mc_req);
    if (r == FP_MC_QUEUED) {
        fp_conn_set_state(c, CONN_WAITING);
        return 0;
    }
    return fp_conn_answer_result(c, r, NULL, 0, NULL);
}

static int _once_fetched(fp_conn_t *c, const fp_keys_t *k, fp_mc_result_t r, const char *data, size_t len)
{
    return fp_conn_answer_result(c, r, data, len, NULL);
}

/* ---- HOLD: long-polling ------------------------------------------------------------------ */

/* The hold's timeout as an event timeout: what is left of it (a client's bytes re-arm a
 * persistent event's timeout, which must not extend the hold). */
int fp_conn_hold_arm(fp_conn_t *c)
{
    int64_t left = c->hold_until_us - fp_now_us();
    if (left < 0)
        left = 0;
    struct timeval tv = {(time_t)(left / 1000000), (suseconds_t)(left % 1000000)};
    return _conn_arm(c, EV_READ, &tv);
}

/* xorshift64: jitter needs no quality, only spread */
uint64_t fp_conn_rand(fp_server_t *srv)
{
    uint64_t x = srv->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return srv->rng = x;
}

/* The key's answer changed, or the key is gone or unreadable (fp_wake_fn). */
static void _hold_on_change(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag)
{
    fp_conn_t *c = ctx;
    fp_wait_remove(&c->srv->waits, &c->marker_waiter);
    if (fp_conn_answer_result(c, r, data, len, tag) == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

/* A held object poll's epoch marker is gone (the user's epoch was revoked), or is no longer the
 * empty value, or cannot be read: Django decides (404 MISS), or 503. */
static void _conn_on_marker_wake(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag)
{
    fp_conn_t *c = ctx;
    fp_wait_remove(&c->srv->waits, &c->waiter);
    if (r == FP_MC_HIT || r == FP_MC_EMPTY)
        r = FP_MC_MISS;
    if (fp_conn_answer_result(c, r, NULL, 0, NULL) == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

/* The wait ran out (or the worker drains): 304 with the tag the client sent. */
static void _hold_over(fp_conn_t *c)
{
    fp_reply_t a;
    fp_wait_remove(&c->srv->waits, &c->waiter);
    fp_wait_remove(&c->srv->waits, &c->marker_waiter);
    c->srv->st->hold_timeouts++;
    fp_reply_set(&a, 304, NULL, "HIT", c->inm_tag, NULL, 0);
    if (_conn_reply(c, &a) == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

/* Prefer: wait and an If-None-Match that may be the answer's: hold until the answer differs
 * (the wait table compares, and reads again on notices and every --reread-interval) or until
 * the wait, jittered down by up to 10% so that polls started together do not all end
 * together, runs out.  The read event stays armed: a client that leaves is noticed at once. */
/* the ETag of the empty value: a present epoch marker's (docs/contract.md sections 7-8) */
const char fp_empty_tag[] = "\"e3b0c44298fc1c149afbf4c8996fb924\"";
_Static_assert(sizeof(fp_empty_tag) - 1 == FP_ETAG_LEN, "an ETag is FP_ETAG_LEN bytes");

/* An object poll (k->marker != NULL) also waits on the user's epoch marker, which must stay the
 * empty value: its deletion (a revoked epoch) ends the hold as soon as it is noticed.  The key's
 * change goes to the mode's on_change. */
static int _hold_start(fp_conn_t *c, const fp_keys_t *k)
{
    fp_server_t *srv = c->srv;
    int64_t wait_us = (int64_t)c->wait_s * 1000000;
    FP_ASSERT(_modes[c->mode]->on_change != NULL && _modes[c->mode]->on_timeout != NULL,
              "connection %d: mode %s cannot hold", c->fd, _modes[c->mode]->name);
    wait_us -= (int64_t)(fp_conn_rand(srv) % (uint64_t)(wait_us / 10 + 1));
    c->hold_until_us = fp_now_us() + wait_us;
    fp_mc_result_t r = fp_wait_add(&srv->waits, &c->waiter, k->key, k->key_len, c->inm_tag,
                                   _modes[c->mode]->on_change, c);
    if (r != FP_MC_QUEUED)
        return fp_conn_answer_result(c, r, NULL, 0, NULL);
    if (k->marker != NULL) {
        c->marker_waiter.secondary = 1;
        r = fp_wait_add(&srv->waits, &c->marker_waiter, k->marker, k->marker_len, fp_empty_tag,
                        _conn_on_marker_wake, c);
        if (r != FP_MC_QUEUED) {
            fp_wait_remove(&srv->waits, &c->waiter);
            return fp_conn_answer_result(c, r, NULL, 0, NULL);
        }
    }
    fp_conn_set_state(c, CONN_HELD);
    if (fp_conn_hold_arm(c) < 0) {
        fp_conn_close(c);              /* no timeout and no read event: it could hang forever */
        return -1;
    }
    return 0;
}

/* An object poll's answer is the client's: hold it (unless the worker began to drain since). */
static int _hold_fetched(fp_conn_t *c, const fp_keys_t *k, fp_mc_result_t r, const char *data, size_t len)
{
    char tag[FP_ETAG_LEN];
    if ((r == FP_MC_HIT || r == FP_MC_EMPTY) && _conn_wants_hold(c) &&
        fp_etag_of(data != NULL ? data : "", r == FP_MC_HIT ? len : 0, tag) == 0 && fp_reply_not_modified(c, tag))
        return _hold_start(c, k);
    return fp_conn_answer_result(c, r, data, len, NULL);
}

/* ---- object polls (docs/contract.md section 8) ------------------------------------------ *
 *
 * The object's key and the user's epoch marker are asked for together (one pipelined batch
 * per server).  The object's answer is given only once the marker is known to be there (the
 * empty value); a marker that is missing (the epoch was revoked) or not empty, and an object
 * key that is missing, are Django's to answer (404 MISS).  A value that comes before the
 * marker's answer is copied and kept until then. */

static void _object_free(fp_conn_t *c)
{
    fp_object_poll_t *o = c->obj;
    if (o == NULL)
        return;
    c->obj = NULL;
    fp_mc_cancel(o->marker_req);
    free(o->data);
    free(o);
}

/* Answer the object poll if what has come decides it (its mode's on_fetched): 1 while it waits
 * for the other get, else as _conn_reply (-1: the connection was closed).  data/len: the object's value at hand
 * (NULL: the copy, if any). */
static int _object_decide(fp_conn_t *c, const char *data, size_t len)
{
    fp_object_poll_t *o = c->obj;
    fp_mc_result_t m = (fp_mc_result_t)o->marker_r, r = (fp_mc_result_t)o->obj_r;
    int marker_known = m != FP_MC_QUEUED, obj_known = r != FP_MC_QUEUED;
    fp_keys_t k = {o->key, o->marker, o->key_len, o->marker_len, NULL};
    int rc;

    if (marker_known && m != FP_MC_EMPTY)
        r = m == FP_MC_HIT ? FP_MC_MISS : m;     /* no marker (a value is none): Django decides */
    else if (!(obj_known && (marker_known || (r != FP_MC_HIT && r != FP_MC_EMPTY))))
        return 1;                                /* the other answer decides */
    c->obj = NULL;                   /* o is ours now: answering may close the connection */
    if (o->marker_req != NULL)
        fp_mc_cancel(o->marker_req);
    if (c->mc_req != NULL) {
        fp_mc_cancel(c->mc_req);
        c->mc_req = NULL;
    }
    if (data == NULL) {
        data = o->data;
        len = o->len;
    }
    rc = _modes[c->mode]->on_fetched(c, &k, r, data, len);
    free(o->data);
    free(o);
    return rc;
}

static void _object_on_marker(void *ctx, fp_mc_result_t r, const char *data, size_t len)
{
    fp_conn_t *c = ctx;
    c->obj->marker_req = NULL;
    c->obj->marker_r = (uint8_t)r;
    if (_object_decide(c, NULL, 0) == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

static void _object_on_value(void *ctx, fp_mc_result_t r, const char *data, size_t len)
{
    fp_conn_t *c = ctx;
    fp_object_poll_t *o = c->obj;
    c->mc_req = NULL;
    if (r == FP_MC_HIT && o->marker_r == FP_MC_QUEUED) {   /* kept until the marker's answer */
        if ((o->data = malloc(len)) == NULL) {
            r = FP_MC_OVERLOADED;
        } else {
            memcpy(o->data, data, len);
            o->len = len;
        }
        data = NULL;
    }
    o->obj_r = (uint8_t)r;
    if (_object_decide(c, data, len) == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

/* Dispatch an ACT_OBJECT request: both gets, then wait.  -1: the connection was closed. */
static int _object_start(fp_conn_t *c)
{
    fp_request_t *rq = &c->in->req;
    fp_mc_pool_t *mc = &c->srv->mc;
    fp_object_poll_t *o = calloc(1, sizeof(*o));
    fp_mc_result_t r;
    int rc;

    if (o == NULL)
        return fp_conn_answer_result(c, FP_MC_OVERLOADED, NULL, 0, NULL);
    memcpy(o->key, rq->key, rq->key_len);
    o->key_len = rq->key_len;
    memcpy(o->marker, rq->marker, rq->marker_len);
    o->marker_len = rq->marker_len;
    o->marker_r = o->obj_r = FP_MC_QUEUED;
    c->obj = o;
    if ((r = fp_mc_get(mc, o->marker, o->marker_len, _object_on_marker, c, &o->marker_req)) != FP_MC_QUEUED)
        o->marker_r = (uint8_t)r;
    if ((r = fp_mc_get(mc, o->key, o->key_len, _object_on_value, c, &c->mc_req)) != FP_MC_QUEUED) {
        o->obj_r = (uint8_t)r;
        c->mc_req = NULL;
    }
    if (o->marker_r != FP_MC_QUEUED)
        o->marker_req = NULL;
    rc = _object_decide(c, NULL, 0);
    if (rc == 1) {
        fp_conn_set_state(c, CONN_WAITING);
        return 0;
    }
    return rc;
}

/* A whole request has been read: answer it, or ask memcached in the poll's mode.  -1:
 * connection closed. */
static int _dispatch(fp_conn_t *c)
{
    fp_request_t *rq = &c->in->req;
    int rc;
    switch (rq->action) {
    case ACT_METRICS:
        return _conn_respond_metrics(c);
    case ACT_PREFLIGHT:
        return _conn_respond_preflight(c);
    case ACT_MEMCACHED:
        break;
    case ACT_OBJECT:
        c->mode = (uint8_t)_conn_mode_of(c);
        if (_modes[c->mode]->prepare != NULL && (rc = _modes[c->mode]->prepare(c)) != 0)
            return rc < 0 ? -1 : 0;
        if (c->mode != FP_MODE_ONCE && (rc = _held_take(c)) != 0)
            return rc < 0 ? -1 : 0;
        return _object_start(c);
    default:
        if (rq->stream) {            /* the edge: a stream decided a miss (fp_route) */
            c->mode = FP_MODE_STREAM;
            rc = _modes[c->mode]->prepare(c);
            if (rc != 0)
                return rc < 0 ? -1 : 0;
        }
        return fp_conn_respond_error(c, rq->answer_code, rq->answer_message, rq->answer_cache);
    }
    fp_keys_t k = {rq->key, NULL, rq->key_len, 0, rq};
    c->mode = (uint8_t)_conn_mode_of(c);
    if (_modes[c->mode]->prepare != NULL && (rc = _modes[c->mode]->prepare(c)) != 0)
        return rc < 0 ? -1 : 0;
    if (c->mode != FP_MODE_ONCE && (rc = _held_take(c)) != 0)
        return rc < 0 ? -1 : 0;
    return _modes[c->mode]->start(c, &k);
}

/* ---- reading and parsing ------------------------------------------------------------- */

/* A request we cannot parse or take in: answer it with the reason and close. */
static void _parse_error(fp_conn_t *c, llhttp_errno_t err)
{
    fp_reply_t a;
    fp_http_error(c, err, &a);
    c->keep_alive = 0;
    (void)_conn_reply(c, &a);
}

/* Parse and answer what the buffer holds.  -1: the connection was closed or is closing (the
 * caller must not touch it). */
int fp_conn_process(fp_conn_t *c)
{
    while (c->state == CONN_READING && c->in != NULL && c->in->pos < c->in->len) {
        fp_buf_t *b = c->in;
        if (!c->in_message)
            c->in->req.start = b->pos;
        llhttp_errno_t err = llhttp_execute(&c->parser, b->data + b->pos, b->len - b->pos);
        if (err == HPE_OK) {
            b->pos = b->len;
        } else if (err == HPE_PAUSED) {
            b->pos = (size_t)(llhttp_get_error_pos(&c->parser) - b->data);
            llhttp_resume(&c->parser);
            if (_dispatch(c) < 0)
                return -1;
        } else {
            _parse_error(c, err);
            return -1;
        }
    }
    fp_buf_t *b = c->in;
    if (b != NULL && b->pos == b->len && !c->in_message) {
        _buf_put(c->srv, b);         /* nothing left that we need: idle connections hold no buffer */
        c->in = NULL;
    }
    return 0;
}

static void _conn_readable(fp_conn_t *c)
{
    fp_server_t *srv = c->srv;

    if (c->state == CONN_READING && fp_now_s() > c->deadline_s) {
        fp_conn_close(c);              /* the request is too slow to arrive (slowloris) */
        return;
    }
    if (c->in == NULL && (c->in = _buf_get(srv)) == NULL) {
        fp_conn_close(c);
        return;
    }
    fp_buf_t *b = c->in;
    if (b->len == srv->buf_cap)
        fp_http_compact(c);
    if (b->len == srv->buf_cap) {
        if (c->state == CONN_HELD) {
            fp_conn_close(c);          /* a held poll's client pipelines a buffer full: abusive */
            return;
        }
        if (c->state == CONN_WAITING) {          /* pipelined bytes pile up: read them later
                                                  * (unarmed: _conn_after_response re-arms) */
            if (event_del(_ev(c)) < 0)
                fp_conn_close(c);
            return;
        }
        fp_http_head_too_big(c);
        _parse_error(c, HPE_USER);
        return;
    }
    ssize_t n;
    do {
        n = recv(c->fd, b->data + b->len, srv->buf_cap - b->len, 0);
    } while (n < 0 && errno == EINTR);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        fp_conn_close(c);              /* the client went away (an answer in flight is dropped) */
        return;
    }
    if (n > 0)
        b->len += (size_t)n;
    if (c->state == CONN_READING) {
        /* read when accepted and still short of a request: now it waits for the client */
        if (fp_conn_process(c) == 0 && c->state == CONN_READING && _conn_unarmed(c) && _conn_watch(c, EV_READ) < 0)
            fp_conn_close(c);
    } else if (c->state == CONN_HELD && fp_conn_hold_arm(c) < 0) {
        fp_conn_close(c);
    }
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
            fp_conn_close(c);
            return;
        }
        c->out_sent += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_sent = 0;
    if (_conn_after_response(c) == 0)
        fp_conn_process(c);
}

static void _conn_event_cb(evutil_socket_t fd, short what, void *arg)
{
    fp_conn_t *c = arg;
    c->srv->st->loop_events++;
    if (what & EV_TIMEOUT) {
        if (c->state == CONN_HELD)
            _modes[c->mode]->on_timeout(c);
        else if (c->state != CONN_WAITING)
            fp_conn_close(c);          /* idle keep-alive, slow request, slow reader, linger over */
        return;
    }
    switch (c->state) {
    case CONN_LINGERING:
        _conn_lingering_readable(c);
        break;
    case CONN_WRITING:
        _conn_writable(c);
        break;
    default:
        _conn_readable(c);
        break;
    }
}
