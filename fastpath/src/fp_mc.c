/* The memcached client: one persistent non-blocking connection per server, text protocol.
 *
 * Gets queue up during a loop pass and leave together in one write at its end, as multi-key
 * "get k1 k2 ...\r\n" commands (memcached answers VALUE for the keys it has, in order, then one
 * END).  Every reply is matched against the key we asked for, so a reply can never be given to
 * another user's request.  A server that errs, times out or says something unexpected is
 * dropped: its waiting requests get 503 (nginx falls back to Django) and it is retried after a
 * backoff that doubles from 50 ms to 1 s.  So is one whose deadline timer libevent cannot set:
 * a get without a deadline could wait forever.
 *
 * close()'s result is not used: Linux releases the descriptor even when close reports an error.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp_internal.h"

#define MC_LINE_MAX 512              /* longest reply line we accept */
#define MC_CMD_MAX 1024              /* longest "get" line we send */
#define MC_MAX_PENDING 65536
#define MC_IN_START 65536
#define MC_IN_MAX (2u << 20)         /* a 1 MiB item plus its framing fits */
#define MC_BACKOFF_MIN_MS 50
#define MC_BACKOFF_MAX_MS 1000

static void _mc_read_cb(evutil_socket_t fd, short what, void *arg);
static void _mc_write_cb(evutil_socket_t fd, short what, void *arg);
static void _mc_flush_cb(evutil_socket_t fd, short what, void *arg);
static void _mc_timer_cb(evutil_socket_t fd, short what, void *arg);

/* ---- pending requests ---------------------------------------------------------------- */

static fp_pending_t *_pending_get(fp_server_t *srv)
{
    fp_pending_t *p = srv->pending_pool;
    if (p != NULL) {
        srv->pending_pool = p->next;
        return p;
    }
    return malloc(sizeof(*p));       /* grows to the peak in-flight count, then reused */
}

static void _pending_put(fp_server_t *srv, fp_pending_t *p)
{
    p->next = srv->pending_pool;
    srv->pending_pool = p;
}

static void _record_latency(fp_server_t *srv, int64_t start_us)
{
    int64_t us = fp_now_us() - start_us;
    double s = (double)us / 1e6;
    for (int i = 0; i < FP_LAT_BUCKETS; i++)
        if (s <= fp_lat_bounds[i])
            srv->st->lat_bucket[i]++;
    srv->st->lat_sum_us += (uint64_t)(us > 0 ? us : 0);
    srv->st->lat_count++;
}

/* Hand an answer to the waiting connection (if it is still there). */
static void _answer(fp_mc_t *mc, fp_pending_t *p, fp_mc_result_t r, const char *data, size_t len)
{
    fp_server_t *srv = mc->srv;
    if (p->answered)
        return;
    p->answered = 1;
    if (r == FP_MC_HIT || r == FP_MC_EMPTY || r == FP_MC_MISS) {
        _record_latency(srv, p->start_us);
        if (r == FP_MC_HIT)
            srv->st->hits++;
        else if (r == FP_MC_EMPTY)
            srv->st->empty_hits++;
        else
            srv->st->misses++;
    }
    if (p->conn != NULL)
        fp_conn_mc_answer(p, r, data, len);
}

static void _pop_head(fp_mc_t *mc)
{
    fp_pending_t *p = mc->head;
    mc->head = p->next;
    if (mc->head == NULL)
        mc->tail = NULL;
    mc->n_pending--;
    mc->srv->st->inflight--;
    _pending_put(mc->srv, p);
}

/* ---- connection state -------------------------------------------------------------- */

/* Set the timer to fire at deadline_us (now_us: the time now).  -1: libevent could not (out
 * of memory for its timer heap). */
static int _timer_at(fp_mc_t *mc, int64_t deadline_us, int64_t now_us)
{
    int64_t left = deadline_us - now_us;
    if (left < 0)
        left = 0;
    struct timeval tv = {(time_t)(left / 1000000), (suseconds_t)(left % 1000000)};
    return evtimer_add(mc->timer, &tv);
}

/* Nothing waits: stop the timer.  libevent fails to remove a timer only if it was never set
 * up; one left behind would find nothing waiting, and _mc_timer_cb would try again. */
static void _timer_off(fp_mc_t *mc)
{
    if (evtimer_del(mc->timer) != 0)
        fp_log("memcached: cannot stop a deadline timer");
}

/* Keep the timer on the oldest waiting get's deadline (off when none waits).  -1: it could not
 * be set, and the gets waiting would have no deadline: the caller resets the connection. */
static int _arm_timer(fp_mc_t *mc)
{
    if (mc->head == NULL) {
        _timer_off(mc);
        return 0;
    }
    return _timer_at(mc, mc->head->deadline_us, fp_now_us());
}

static void _drop_socket(fp_mc_t *mc)
{
    if (mc->rev != NULL) {
        event_free(mc->rev);
        mc->rev = NULL;
    }
    if (mc->wev != NULL) {
        event_free(mc->wev);
        mc->wev = NULL;
    }
    if (mc->fd >= 0) {
        close(mc->fd);
        mc->fd = -1;
    }
    mc->in_len = 0;
    mc->out_len = mc->out_sent = 0;
    mc->state = MC_DOWN;
}

/* Lost, timed out or out of step: every waiting request gets 503, and a backoff starts. */
static void _reset(fp_mc_t *mc, int is_timeout)
{
    fp_server_t *srv = mc->srv;

    _drop_socket(mc);
    mc->retry_at_us = fp_now_us() + (int64_t)mc->backoff_ms * 1000;
    mc->backoff_ms = mc->backoff_ms * 2 > MC_BACKOFF_MAX_MS ? MC_BACKOFF_MAX_MS : mc->backoff_ms * 2;
    if (is_timeout)
        srv->st->mc_timeouts++;
    else
        srv->st->mc_errors++;
    while (mc->head != NULL) {
        _answer(mc, mc->head, FP_MC_UNAVAILABLE, NULL, 0);
        _pop_head(mc);
    }
    _timer_off(mc);

}

static int _connect(fp_mc_t *mc)
{
    fp_server_t *srv = mc->srv;
    int fd = socket(mc->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    /* with Nagle, a get written while the last one is unanswered would wait for its ACK */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
        (connect(fd, (struct sockaddr *)&mc->addr, (socklen_t)mc->addr_len) < 0 && errno != EINPROGRESS)) {
        close(fd);
        return -1;
    }
    mc->fd = fd;
    mc->rev = event_new(srv->base, fd, EV_READ | EV_PERSIST, _mc_read_cb, mc);
    mc->wev = event_new(srv->base, fd, EV_WRITE | EV_PERSIST, _mc_write_cb, mc);
    if (mc->rev == NULL || mc->wev == NULL || event_add(mc->rev, NULL) < 0 || event_add(mc->wev, NULL) < 0) {
        _drop_socket(mc);
        return -1;
    }
    mc->state = MC_CONNECTING;       /* writable means connected (or failed: SO_ERROR says) */
    srv->st->mc_connects++;
    return 0;
}

/* ---- writing ----------------------------------------------------------------------- */

static int _out_reserve(fp_mc_t *mc, size_t more)
{
    if (mc->out_sent > 0 && mc->out_sent == mc->out_len)
        mc->out_len = mc->out_sent = 0;
    if (mc->out_len + more <= mc->out_cap)
        return 0;
    size_t cap = mc->out_cap ? mc->out_cap : 16384;
    while (cap < mc->out_len + more)
        cap *= 2;
    char *grown = realloc(mc->out, cap);
    if (grown == NULL)
        return -1;
    mc->out = grown;
    mc->out_cap = cap;
    return 0;
}

/* Turn every queued (unsent) get into "get k1 k2 ...\r\n" lines of at most MC_CMD_MAX bytes. */
static int _encode_unsent(fp_mc_t *mc)
{
    fp_pending_t *p = mc->head;
    while (p != NULL && p->sent)
        p = p->next;
    while (p != NULL) {
        if (_out_reserve(mc, MC_CMD_MAX + 2) < 0)
            return -1;
        char *line = mc->out + mc->out_len;
        size_t n = 3;
        memcpy(line, "get", 3);
        fp_pending_t *last = NULL;
        while (p != NULL && n + 1 + p->key_len <= MC_CMD_MAX) {
            line[n++] = ' ';
            memcpy(line + n, p->key, p->key_len);
            n += p->key_len;
            p->sent = 1;
            p->batch_end = 0;
            last = p;
            p = p->next;
        }
        last->batch_end = 1;         /* one key always fits: keys are at most FP_KEY_CAP bytes */
        line[n++] = '\r';
        line[n++] = '\n';
        mc->out_len += n;
    }
    return 0;
}

/* Write what the socket takes; returns -1 when the connection is broken. */
static int _write_out(fp_mc_t *mc)
{
    while (mc->out_sent < mc->out_len) {
        ssize_t n = send(mc->fd, mc->out + mc->out_sent, mc->out_len - mc->out_sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (event_add(mc->wev, NULL) < 0)
                    return -1;
                return 0;
            }
            return -1;
        }
        mc->out_sent += (size_t)n;
    }
    mc->out_len = mc->out_sent = 0;
    return event_del(mc->wev) < 0 ? -1 : 0;
}

static void _flush(fp_mc_t *mc)
{
    if (mc->state != MC_UP)
        return;                       /* sent once connected */
    if (_encode_unsent(mc) < 0 || _write_out(mc) < 0)
        _reset(mc, 0);
}

static void _mc_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    _flush(arg);
}

static void _mc_write_cb(evutil_socket_t fd, short what, void *arg)
{
    fp_mc_t *mc = arg;
    if (mc->state == MC_CONNECTING) {
        int soerr = 0;
        socklen_t len = sizeof(soerr);
        if (getsockopt(mc->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0 || soerr != 0) {
            _reset(mc, 0);
            return;
        }
        mc->state = MC_UP;
        if (event_del(mc->wev) < 0) {
            _reset(mc, 0);
            return;
        }
        _flush(mc);
        return;
    }
    if (_write_out(mc) < 0)
        _reset(mc, 0);
}

/* ---- reading ----------------------------------------------------------------------- */

/* Parse "<digits>" at line[*i..len) as a size; -1 when absent or too large. */
static int64_t _parse_size(const char *line, size_t len, size_t *i)
{
    int64_t v = 0;
    size_t start = *i;
    while (*i < len && line[*i] >= '0' && line[*i] <= '9') {
        v = v * 10 + (line[*i] - '0');
        if (v > (1 << 30))
            return -1;
        (*i)++;
    }
    return *i > start ? v : -1;
}

/* The first sent, unanswered request of the current batch, or NULL. */
static fp_pending_t *_batch_cursor(fp_mc_t *mc)
{
    for (fp_pending_t *p = mc->head; p != NULL && p->sent; p = p->next) {
        if (!p->answered)
            return p;
        if (p->batch_end)
            return NULL;
    }
    return NULL;
}

/* END: whatever of the head batch was not answered was not found; the batch is done. */
static int _on_end(fp_mc_t *mc)
{
    if (mc->head == NULL || !mc->head->sent)
        return -1;
    for (;;) {
        fp_pending_t *p = mc->head;
        int last = p->batch_end;
        _answer(mc, p, FP_MC_MISS, NULL, 0);
        _pop_head(mc);
        if (last)
            return 0;
        if (mc->head == NULL || !mc->head->sent)
            return -1;
    }
}

/* VALUE <key> ...: skip (as misses) the batch's requests before the one that asked for key. */
static int _on_value(fp_mc_t *mc, const char *key, size_t key_len, const char *data, size_t n)
{
    for (;;) {
        fp_pending_t *p = _batch_cursor(mc);
        if (p == NULL)
            return -1;               /* a key we did not ask for: out of step */
        if (p->key_len == key_len && memcmp(p->key, key, key_len) == 0) {
            _answer(mc, p, n == 0 ? FP_MC_EMPTY : FP_MC_HIT, data, n);
            return 0;
        }
        _answer(mc, p, FP_MC_MISS, NULL, 0);
    }
}

/* One reply at in[*pos..len): 1 consumed, 0 incomplete, -1 protocol error. */
static int _parse_one(fp_mc_t *mc, size_t *pos)
{
    const char *buf = mc->in + *pos;
    size_t avail = mc->in_len - *pos;
    size_t scan = avail < MC_LINE_MAX ? avail : MC_LINE_MAX;
    const char *nl = memchr(buf, '\n', scan);

    if (nl == NULL)
        return avail >= MC_LINE_MAX ? -1 : 0;
    size_t line_len = (size_t)(nl - buf);
    if (line_len == 0 || buf[line_len - 1] != '\r')
        return -1;
    line_len--;                      /* without CR */

    if (line_len == 3 && memcmp(buf, "END", 3) == 0) {
        *pos += line_len + 2;
        return _on_end(mc) < 0 ? -1 : 1;
    }
    if (line_len < 6 || memcmp(buf, "VALUE ", 6) != 0)
        return -1;                   /* SERVER_ERROR, ERROR, garbage */
    size_t i = 6, key_start = 6;
    while (i < line_len && buf[i] != ' ')
        i++;
    size_t key_len = i - key_start;
    if (key_len == 0 || key_len > FP_KEY_CAP || i >= line_len)
        return -1;
    i++;
    if (_parse_size(buf, line_len, &i) < 0 || i >= line_len || buf[i] != ' ')
        return -1;                   /* flags */
    i++;
    int64_t n_bytes = _parse_size(buf, line_len, &i);
    if (n_bytes < 0 || i != line_len)
        return -1;
    size_t need = line_len + 2 + (size_t)n_bytes + 2;
    if (need > MC_IN_MAX)
        return -1;
    if (avail < need)
        return 0;
    const char *data = buf + line_len + 2;
    if (data[n_bytes] != '\r' || data[n_bytes + 1] != '\n')
        return -1;
    if (_on_value(mc, buf + key_start, key_len, data, (size_t)n_bytes) < 0)
        return -1;
    *pos += need;
    return 1;
}

static void _mc_read_cb(evutil_socket_t fd, short what, void *arg)
{
    fp_mc_t *mc = arg;

    if (mc->in_len == mc->in_cap) {
        size_t cap = mc->in_cap * 2;
        char *grown = cap <= MC_IN_MAX ? realloc(mc->in, cap) : NULL;
        if (grown == NULL) {
            _reset(mc, 0);
            return;
        }
        mc->in = grown;
        mc->in_cap = cap;
    }
    ssize_t n = recv(mc->fd, mc->in + mc->in_len, mc->in_cap - mc->in_len, 0);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        _reset(mc, 0);               /* closed or failed */
        return;
    }
    mc->in_len += (size_t)n;

    size_t pos = 0;
    int r;
    while (pos < mc->in_len && (r = _parse_one(mc, &pos)) != 0) {
        if (r < 0) {
            _reset(mc, 0);
            return;
        }
        mc->backoff_ms = MC_BACKOFF_MIN_MS;
    }
    if (pos > 0) {
        memmove(mc->in, mc->in + pos, mc->in_len - pos);
        mc->in_len -= pos;
    }
    if (mc->in_len > 0 && (mc->head == NULL || !mc->head->sent)) {
        _reset(mc, 0);               /* bytes nobody asked for */
        return;
    }
    if (_arm_timer(mc) != 0) {
        fp_log("memcached: cannot set a deadline timer; answering the waiting requests 503");
        _reset(mc, 0);
        return;
    }

}

static void _mc_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    fp_mc_t *mc = arg;
    if (mc->head != NULL && mc->head->deadline_us <= fp_now_us() && mc->state == MC_UP) {
        /* A busy loop can run this timer before the read event of replies that are already in
         * the socket: take those first, so that only a get memcached has really not answered
         * in time counts as a timeout (a 503 under CPU load, not a slow memcached). */
        _mc_read_cb(mc->fd, EV_READ, mc);
    }
    if (mc->head != NULL && mc->head->deadline_us <= fp_now_us())
        _reset(mc, 1);
    else if (_arm_timer(mc) != 0) {
        fp_log("memcached: cannot set a deadline timer; answering the waiting requests 503");
        _reset(mc, 0);
    }
}

/* ---- public -------------------------------------------------------------------------- */

fp_mc_result_t fp_mc_get(fp_server_t *srv, fp_conn_t *conn, const char *key, size_t key_len)
{
    int idx = fp_rendezvous_pick(srv->cfg->nodes, srv->cfg->n_nodes, key, key_len);
    int64_t now = fp_now_us();
    fp_pending_t *p;
    fp_mc_t *mc;

    if (idx < 0 || key_len == 0 || key_len > FP_KEY_CAP)
        return FP_MC_MISS;
    mc = &srv->mc[idx];
    if (mc->state == MC_DOWN) {
        if (now >= mc->retry_at_us && _connect(mc) < 0) {
            mc->retry_at_us = now + (int64_t)mc->backoff_ms * 1000;
            srv->st->mc_errors++;
        }
        if (mc->state == MC_DOWN)
            return FP_MC_UNAVAILABLE;
    }
    if (mc->n_pending >= MC_MAX_PENDING || (p = _pending_get(srv)) == NULL)
        return FP_MC_OVERLOADED;
    memset(p, 0, offsetof(fp_pending_t, key));
    p->conn = conn;
    p->start_us = now;
    p->deadline_us = now + (int64_t)srv->cfg->timeout_ms * 1000;
    /* the first get in the queue sets the deadline timer (later ones are behind it); without a
     * timer it could wait forever, so it is answered 503 at once instead (nothing else waits) */
    if (mc->head == NULL && _timer_at(mc, p->deadline_us, now) != 0) {
        _pending_put(srv, p);
        srv->st->mc_errors++;
        fp_log("memcached: cannot set a deadline timer; answering 503");
        return FP_MC_UNAVAILABLE;
    }
    memcpy(p->key, key, key_len);
    p->key_len = key_len;
    if (mc->tail != NULL)
        mc->tail->next = p;
    else
        mc->head = p;
    mc->tail = p;
    mc->n_pending++;
    srv->st->inflight++;
    conn->pending = p;
    event_active(mc->flush_ev, EV_WRITE, 0);     /* runs once, after this loop pass */
    return FP_MC_QUEUED;
}

int fp_mc_init(fp_server_t *srv, int index, const char *addr, char *err, size_t err_len)
{
    fp_mc_t *mc = &srv->mc[index];
    mc->srv = srv;
    mc->fd = -1;
    mc->state = MC_DOWN;
    mc->backoff_ms = MC_BACKOFF_MIN_MS;
    mc->addr_len = (int)sizeof(mc->addr);
    if (evutil_parse_sockaddr_port(addr, (struct sockaddr *)&mc->addr, &mc->addr_len) < 0) {
        snprintf(err, err_len, "bad memcached address: %.200s", addr);
        return -1;
    }
    mc->in = malloc(MC_IN_START);
    mc->in_cap = MC_IN_START;
    mc->timer = evtimer_new(srv->base, _mc_timer_cb, mc);
    mc->flush_ev = event_new(srv->base, -1, 0, _mc_flush_cb, mc);
    if (mc->in == NULL || mc->timer == NULL || mc->flush_ev == NULL) {
        snprintf(err, err_len, "out of memory setting up memcached %.200s", addr);
        return -1;
    }
    (void)_connect(mc);              /* warm the connection; failure is retried on demand */
    return 0;
}

int fp_mc_adopt(fp_server_t *srv, int index, int fd)
{
    fp_mc_t *mc = &srv->mc[index];
    _drop_socket(mc);
    mc->fd = fd;
    mc->rev = event_new(srv->base, fd, EV_READ | EV_PERSIST, _mc_read_cb, mc);
    mc->wev = event_new(srv->base, fd, EV_WRITE | EV_PERSIST, _mc_write_cb, mc);
    if (mc->rev == NULL || mc->wev == NULL || event_add(mc->rev, NULL) < 0) {
        _drop_socket(mc);
        return -1;
    }
    mc->state = MC_UP;
    mc->retry_at_us = 0;
    mc->backoff_ms = MC_BACKOFF_MIN_MS;
    return 0;
}

/* At exit: waiting requests get 503, everything is freed. */
void fp_mc_close(fp_mc_t *mc)
{
    if (mc->srv == NULL)
        return;
    while (mc->head != NULL) {
        _answer(mc, mc->head, FP_MC_UNAVAILABLE, NULL, 0);
        _pop_head(mc);
    }
    _drop_socket(mc);
    if (mc->timer != NULL)
        event_free(mc->timer);
    if (mc->flush_ev != NULL)
        event_free(mc->flush_ev);
    free(mc->in);
    free(mc->out);
    mc->timer = mc->flush_ev = NULL;
    mc->in = mc->out = NULL;
}
