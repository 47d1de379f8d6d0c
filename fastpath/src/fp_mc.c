/* The memcached client: one persistent non-blocking connection per server, text protocol
 * (the interface is fp_mc.h; this file knows nothing of HTTP connections).
 *
 * Gets queue up during a loop pass and leave together in one write at its end, as multi-key
 * "get k1 k2 ...\r\n" commands (memcached answers VALUE for the keys it has, in order, then one
 * END).  Every reply is matched against the key we asked for, so a reply can never be given to
 * another user's request.  A server that errs, times out or says something unexpected is
 * dropped: its waiting requests get 503 (nginx falls back to Django) and it is retried after a
 * backoff that doubles from 50 ms to 1 s.  So is one whose deadline timer libevent cannot set:
 * a get without a deadline could wait forever.  One entry the client cannot serve (flags that
 * are not a 32-bit number, a value larger than it buffers) fails only its own key: its bytes
 * are dropped as they pass, and the connection stays up for every other key on the server.
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

#include "fp_mc.h"
#include "fp_stats.h"
#include "fp_util.h"

#define MC_LINE_MAX 512              /* longest reply line we accept */
#define MC_CMD_MAX 1024              /* longest "get" line we send */
#define MC_MAX_PENDING 65536
#define MC_REQ_SLAB_CHUNK (64 * 1024) /* request records mapped at a time (~400) */
#define MC_IN_START 65536            /* read buffer, and what it shrinks back to */
#define MC_IN_MAX (2u << 20)         /* largest reply buffered: a 1 MiB item plus its framing */
#define MC_VALUE_MAX (1u << 30)      /* memcached's largest item (-I 1g): beyond, not memcached */
#define MC_BACKOFF_MIN_MS 50
#define MC_BACKOFF_MAX_MS 1000

static void _mc_read_cb(evutil_socket_t fd, short what, void *arg);
static void _mc_write_cb(evutil_socket_t fd, short what, void *arg);
static void _mc_flush_cb(evutil_socket_t fd, short what, void *arg);
static void _mc_timer_cb(evutil_socket_t fd, short what, void *arg);

/* ---- requests ---------------------------------------------------------------------- */

/* One get waiting in a server's queue. */
struct fp_mc_req {
    fp_mc_req_t *prev, *next;        /* in its server's queue (next also links the free list) */
    fp_mc_t *mc;
    fp_mc_done_fn done;              /* NULL once answered or cancelled: nobody to tell */
    void *ctx;
    int64_t start_us, deadline_us;
    uint8_t sent;                    /* part of a "get" command already written */
    uint8_t batch_end;               /* last key of its "get" command */
    uint8_t answered;                /* its reply has been seen (a cancelled one still is matched) */
    size_t key_len;
    char key[FP_KEY_CAP];
};

static fp_mc_req_t *_req_get(fp_mc_pool_t *pool)
{
    return fp_slab_alloc(&pool->req_slab);       /* zeroed */
}

static void _req_put(fp_mc_pool_t *pool, fp_mc_req_t *p)
{
    fp_slab_free(&pool->req_slab, p);
}

/* Tell the requester (if it has not cancelled).  done is cleared first: the callback may cancel
 * or queue other gets, and this one is never answered twice. */
static void _answer(fp_mc_t *mc, fp_mc_req_t *p, fp_mc_result_t r, const char *data, size_t len)
{
    fp_stats_t *st = mc->pool->st;
    fp_mc_done_fn done = p->done;
    if (p->answered)
        return;
    p->answered = 1;
    p->done = NULL;
    if (r == FP_MC_HIT || r == FP_MC_EMPTY || r == FP_MC_MISS) {
        fp_stats_latency(st, fp_now_us() - p->start_us);
        if (r == FP_MC_HIT)
            st->hits++;
        else if (r == FP_MC_EMPTY)
            st->empty_hits++;
        else
            st->misses++;
    }
    if (done != NULL)
        done(p->ctx, r, data, len);
}

/* p leaves its queue, wherever it is in it, and goes back to the free list. */
static void _remove(fp_mc_t *mc, fp_mc_req_t *p)
{
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        mc->head = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    else
        mc->tail = p->prev;
    mc->n_pending--;
    mc->pool->st->inflight--;
    _req_put(mc->pool, p);
}

static void _pop_head(fp_mc_t *mc)
{
    _remove(mc, mc->head);
}

/* Every waiting get of this server gets r (the callbacks cannot add to the queue meanwhile: the
 * server is down or the pool closing, so fp_mc_get answers at once). */
static void _answer_all(fp_mc_t *mc, fp_mc_result_t r)
{
    while (mc->head != NULL) {
        _answer(mc, mc->head, r, NULL, 0);
        _pop_head(mc);
    }
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

/* Back to the usual size once a large value has been parsed (memcached's conn_shrink), instead
 * of keeping the peak for the life of the worker.  A failed realloc keeps the larger buffer. */
static void _in_shrink(fp_mc_t *mc)
{
    size_t start = mc->pool->in_start;
    if (mc->in_cap <= start || mc->in_len > start)
        return;
    char *smaller = realloc(mc->in, start);
    if (smaller == NULL)
        return;
    mc->in = smaller;
    mc->in_cap = start;
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
    mc->skip = 0;
    mc->skip_crlf = 0;
    _in_shrink(mc);
    mc->out_len = mc->out_sent = 0;
    mc->state = MC_DOWN;
}

/* Lost, timed out or out of step: every waiting request gets 503, and a backoff starts. */
static void _reset(fp_mc_t *mc, int is_timeout)
{
    fp_stats_t *st = mc->pool->st;

    _drop_socket(mc);
    mc->retry_at_us = fp_now_us() + (int64_t)mc->backoff_ms * 1000;
    mc->backoff_ms = mc->backoff_ms * 2 > MC_BACKOFF_MAX_MS ? MC_BACKOFF_MAX_MS : mc->backoff_ms * 2;
    if (is_timeout)
        st->mc_timeouts++;
    else
        st->mc_errors++;
    _answer_all(mc, FP_MC_UNAVAILABLE);
    _timer_off(mc);
}

static int _connect(fp_mc_t *mc)
{
    fp_mc_pool_t *pool = mc->pool;
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
    mc->rev = event_new(pool->base, fd, EV_READ | EV_PERSIST, _mc_read_cb, mc);
    mc->wev = event_new(pool->base, fd, EV_WRITE | EV_PERSIST, _mc_write_cb, mc);
    if (mc->rev == NULL || mc->wev == NULL || event_add(mc->rev, NULL) < 0 || event_add(mc->wev, NULL) < 0) {
        _drop_socket(mc);
        return -1;
    }
    mc->state = MC_CONNECTING;       /* writable means connected (or failed: SO_ERROR says) */
    pool->st->mc_connects++;
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
    fp_mc_req_t *p = mc->head;
    while (p != NULL && p->sent)
        p = p->next;
    while (p != NULL) {
        if (_out_reserve(mc, MC_CMD_MAX + 2) < 0)
            return -1;
        char *line = mc->out + mc->out_len;
        size_t n = 3;
        memcpy(line, "get", 3);
        fp_mc_req_t *last = NULL;
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

/* "<digits>" at line[*i..len) into *v, *i moved past them: 0, or -1 when absent or above max. */
static int _parse_uint(const char *line, size_t len, size_t *i, uint64_t max, uint64_t *v)
{
    size_t start = *i;
    *v = 0;
    while (*i < len && line[*i] >= '0' && line[*i] <= '9') {
        *v = *v * 10 + (uint64_t)(line[*i] - '0');
        if (*v > max)
            return -1;
        (*i)++;
    }
    return *i > start ? 0 : -1;
}

/* The first sent, unanswered request of the current batch, or NULL. */
static fp_mc_req_t *_batch_cursor(fp_mc_t *mc)
{
    for (fp_mc_req_t *p = mc->head; p != NULL && p->sent; p = p->next) {
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
        fp_mc_req_t *p = mc->head;
        int last = p->batch_end;
        _answer(mc, p, FP_MC_MISS, NULL, 0);
        _pop_head(mc);
        if (last)
            return 0;
        if (mc->head == NULL || !mc->head->sent)
            return -1;
    }
}

/* VALUE <key> ...: skip (as misses) the batch's requests before the one that asked for key,
 * and answer that one r. */
static int _on_value(fp_mc_t *mc, const char *key, size_t key_len, fp_mc_result_t r,
                     const char *data, size_t n)
{
    for (;;) {
        fp_mc_req_t *p = _batch_cursor(mc);
        if (p == NULL)
            return -1;               /* a key we did not ask for: out of step */
        if (p->key_len == key_len && memcmp(p->key, key, key_len) == 0) {
            _answer(mc, p, r, data, n);
            return 0;
        }
        _answer(mc, p, FP_MC_MISS, NULL, 0);
    }
}

/* The rest of a value that is not buffered (_parse_one), then its "\r\n", dropped as it
 * passes: 1 progress, 0 incomplete, -1 out of step. */
static int _skip(fp_mc_t *mc, size_t *pos)
{
    size_t avail = mc->in_len - *pos;
    if (mc->skip > 0) {
        size_t n = avail < mc->skip ? avail : (size_t)mc->skip;
        mc->skip -= n;
        *pos += n;
        return n > 0;
    }
    if (avail < 2)
        return avail == 1 && mc->in[*pos] != '\r' ? -1 : 0;
    if (mc->in[*pos] != '\r' || mc->in[*pos + 1] != '\n')
        return -1;
    *pos += 2;
    mc->skip_crlf = 0;
    return 1;
}

/* One reply at in[*pos..len): 1 consumed, 0 incomplete, -1 out of step (a protocol error).
 *
 *   END\r\n
 *   VALUE <key> <flags> <bytes>\r\n<data>\r\n
 *
 * A VALUE for a key we asked for that this client cannot serve -- flags that are not a 32-bit
 * number (memcached's flags are), or more data than it buffers -- answers that key alone
 * FP_MC_MISS and drops its data as it passes (_skip): the connection stays up and in step, so
 * the other keys on the server are not failed with it.  A miss and not FP_MC_UNAVAILABLE:
 * memcached is up and in step, so this is no memcached error (nor counted as one), and the poll
 * goes to Django all the same (nginx falls back on 404 as on 503), which answers it from the
 * database. */
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
    size_t flags_start = i;
    uint64_t flags, n_bytes;
    int flags_ok = _parse_uint(buf, line_len, &i, UINT32_MAX, &flags) == 0 && i < line_len && buf[i] == ' ';
    while (i < line_len && buf[i] != ' ')
        i++;                         /* past flags we cannot read, to the size */
    if (i == flags_start || i >= line_len)
        return -1;
    i++;
    if (_parse_uint(buf, line_len, &i, MC_VALUE_MAX, &n_bytes) < 0 || i != line_len)
        return -1;                   /* without a size, nothing after this line can be read */
    size_t head = line_len + 2, need = head + (size_t)n_bytes + 2;
    const char *key = buf + key_start;

    if (flags_ok && need <= mc->pool->in_max) {
        if (avail < need)
            return 0;
        const char *data = buf + head;
        if (data[n_bytes] != '\r' || data[n_bytes + 1] != '\n')
            return -1;
        if (_on_value(mc, key, key_len, n_bytes == 0 ? FP_MC_EMPTY : FP_MC_HIT, data, (size_t)n_bytes) < 0)
            return -1;
        *pos += need;
        return 1;
    }
    if (_on_value(mc, key, key_len, FP_MC_MISS, NULL, 0) < 0)
        return -1;
    mc->pool->st->mc_bad_entries++;
    if (flags_ok)
        fp_log("memcached: the value of %.*s is %llu bytes, more than the %zu buffered: a miss",
               (int)key_len, key, (unsigned long long)n_bytes, mc->pool->in_max);
    else
        fp_log("memcached: the flags of %.*s are not a 32-bit number: a miss", (int)key_len, key);
    *pos += head;
    mc->skip = n_bytes;
    mc->skip_crlf = 1;
    return 1;
}

static void _mc_read_cb(evutil_socket_t fd, short what, void *arg)
{
    fp_mc_t *mc = arg;

    if (mc->in_len == mc->in_cap) {
        size_t cap = mc->in_cap * 2 < mc->pool->in_max ? mc->in_cap * 2 : mc->pool->in_max;
        char *grown = cap > mc->in_cap ? realloc(mc->in, cap) : NULL;
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
    while (pos < mc->in_len &&
           (r = mc->skip > 0 || mc->skip_crlf ? _skip(mc, &pos) : _parse_one(mc, &pos)) != 0) {
        if (r < 0) {
            _reset(mc, 0);
            return;
        }
        mc->backoff_ms = MC_BACKOFF_MIN_MS;
    }
    if (pos > 0) {
        memmove(mc->in, mc->in + pos, mc->in_len - pos);
        mc->in_len -= pos;
        _in_shrink(mc);
    }
    if (mc->in_len > 0 && (mc->head == NULL || !mc->head->sent)) {
        _reset(mc, 0);               /* bytes nobody asked for */
        return;
    }
    if (_arm_timer(mc) != 0) {
        fp_log("memcached: cannot set a deadline timer; answering the waiting requests 503");
        _reset(mc, 0);
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

fp_mc_result_t fp_mc_get(fp_mc_pool_t *pool, const char *key, size_t key_len,
                         fp_mc_done_fn done, void *ctx, fp_mc_req_t **req)
{
    const fp_config_t *cfg = pool->cfg;
    int64_t now = fp_now_us();
    fp_mc_req_t *p;
    fp_mc_t *mc;
    int idx;

    if (pool->closing || pool->n <= 0)
        return FP_MC_UNAVAILABLE;
    idx = fp_rendezvous_pick(cfg->nodes, pool->n, key, key_len);
    if (idx < 0 || key_len == 0 || key_len > FP_KEY_CAP)
        return FP_MC_MISS;
    mc = &pool->mc[idx];
    if (mc->state == MC_DOWN) {
        /* a queue on a server that is down is being answered 503 (_reset): a callback that asks
         * again meanwhile gets its 503 at once, instead of a connection made under its feet */
        if (mc->head == NULL && now >= mc->retry_at_us && _connect(mc) < 0) {
            mc->retry_at_us = now + (int64_t)mc->backoff_ms * 1000;
            pool->st->mc_errors++;
        }
        if (mc->state == MC_DOWN)
            return FP_MC_UNAVAILABLE;
    }
    if (mc->n_pending >= MC_MAX_PENDING || (p = _req_get(pool)) == NULL)
        return FP_MC_OVERLOADED;
    p->mc = mc;
    p->done = done;
    p->ctx = ctx;
    p->start_us = now;
    p->deadline_us = now + (int64_t)cfg->timeout_ms * 1000;
    /* the first get in the queue sets the deadline timer (later ones are behind it); without a
     * timer it could wait forever, so it is answered 503 at once instead (nothing else waits) */
    if (mc->head == NULL && _timer_at(mc, p->deadline_us, now) != 0) {
        _req_put(pool, p);
        pool->st->mc_errors++;
        fp_log("memcached: cannot set a deadline timer; answering 503");
        return FP_MC_UNAVAILABLE;
    }
    memcpy(p->key, key, key_len);
    p->key_len = key_len;
    p->prev = mc->tail;
    if (mc->tail != NULL)
        mc->tail->next = p;
    else
        mc->head = p;
    mc->tail = p;
    mc->n_pending++;
    pool->st->inflight++;
    *req = p;
    event_active(mc->flush_ev, EV_WRITE, 0);     /* runs once, after this loop pass */
    return FP_MC_QUEUED;
}

/* A get not yet written leaves the queue now.  One already written must stay until its reply
 * has gone by (memcached answers in order: dropping it would put the replies out of step), so
 * it is only muted.  The timer may still be set for a get cancelled here: it then finds a later
 * deadline, or nothing, and re-arms or stops. */
void fp_mc_cancel(fp_mc_req_t *req)
{
    if (req == NULL || req->answered)
        return;                      /* answered: being told now (or already), nothing to undo */
    req->done = NULL;
    req->ctx = NULL;
    if (!req->sent)
        _remove(req->mc, req);
}

static int _mc_init(fp_mc_pool_t *pool, int index, const char *addr, char *err, size_t err_len)
{
    fp_mc_t *mc = &pool->mc[index];
    mc->pool = pool;
    mc->fd = -1;
    mc->state = MC_DOWN;
    mc->backoff_ms = MC_BACKOFF_MIN_MS;
    mc->addr_len = (int)sizeof(mc->addr);
    if (evutil_parse_sockaddr_port(addr, (struct sockaddr *)&mc->addr, &mc->addr_len) < 0) {
        snprintf(err, err_len, "bad memcached address: %.200s", addr);
        return -1;
    }
    mc->in = malloc(pool->in_start);
    mc->in_cap = pool->in_start;
    mc->timer = evtimer_new(pool->base, _mc_timer_cb, mc);
    mc->flush_ev = event_new(pool->base, -1, 0, _mc_flush_cb, mc);
    if (mc->in == NULL || mc->timer == NULL || mc->flush_ev == NULL) {
        snprintf(err, err_len, "out of memory setting up memcached %.200s", addr);
        return -1;
    }
    (void)_connect(mc);              /* warm the connection; failure is retried on demand */
    return 0;
}

int fp_mc_pool_init(fp_mc_pool_t *pool, struct event_base *base, fp_stats_t *st,
                    const fp_config_t *cfg, char *err, size_t err_len)
{
    memset(pool, 0, sizeof(*pool));
    pool->base = base;
    pool->st = st;
    pool->cfg = cfg;
    pool->in_start = MC_IN_START;
    pool->in_max = MC_IN_MAX;
    fp_slab_init(&pool->req_slab, sizeof(fp_mc_req_t), MC_REQ_SLAB_CHUNK);
    if (cfg->n_nodes <= 0 || cfg->n_nodes > FP_MAX_SERVERS) {
        snprintf(err, err_len, "need 1..%d memcached servers", FP_MAX_SERVERS);
        return -1;
    }
    for (int i = 0; i < cfg->n_nodes; i++) {
        pool->n = i + 1;             /* fp_mc_pool_fini frees what this one set up, too */
        if (_mc_init(pool, i, cfg->node_addr[i], err, err_len) < 0)
            return -1;
    }
    return 0;
}

int fp_mc_adopt(fp_mc_pool_t *pool, int index, int fd)
{
    if (index < 0 || index >= pool->n)
        return -1;
    fp_mc_t *mc = &pool->mc[index];
    _drop_socket(mc);
    _answer_all(mc, FP_MC_UNAVAILABLE);   /* gets written to the old socket are lost with it */
    mc->fd = fd;
    mc->rev = event_new(pool->base, fd, EV_READ | EV_PERSIST, _mc_read_cb, mc);
    mc->wev = event_new(pool->base, fd, EV_WRITE | EV_PERSIST, _mc_write_cb, mc);
    if (mc->rev == NULL || mc->wev == NULL || event_add(mc->rev, NULL) < 0) {
        _drop_socket(mc);
        return -1;
    }
    mc->state = MC_UP;
    mc->retry_at_us = 0;
    mc->backoff_ms = MC_BACKOFF_MIN_MS;
    return 0;
}

size_t fp_mc_in_cap(const fp_mc_pool_t *pool, int index)
{
    return index >= 0 && index < pool->n ? pool->mc[index].in_cap : 0;
}

static void _mc_free(fp_mc_t *mc)
{
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

/* At exit: every waiting get is answered 503 first (its callbacks may still look at other
 * servers' queues), then everything is freed. */
void fp_mc_pool_fini(fp_mc_pool_t *pool)
{
    pool->closing = 1;
    for (int i = 0; i < pool->n; i++)
        _answer_all(&pool->mc[i], FP_MC_UNAVAILABLE);
    for (int i = 0; i < pool->n; i++)
        _mc_free(&pool->mc[i]);
    fp_slab_fini(&pool->req_slab);
    pool->n = 0;
}
