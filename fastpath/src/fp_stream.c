/* STREAM, a connection's answer mode for Server-Sent Events (docs/contract.md section 9); its row
 * (fp_stream_mode, at the end) is the only way fp_conn.c reaches the functions here.
 *
 * The stream's waiter is registered with a tag no answer has, so the wait table's first read
 * wakes it with the current answer: a miss or an error then is an ordinary answer (404 MISS or
 * 503: nginx hands the request to Django, as for a poll); an answer opens the stream (the head
 * with its retry: line, and the first event unless Last-Event-ID names it).  From then on the waiter stays in the
 * table with the tag of the last event, and every answer that differs is one more event.  A
 * miss or an error sends `event: miss` and ends the stream; so do --max-stream (without the
 * event) and a draining worker.  A comment line every --stream-heartbeat keeps proxies and
 * clients from taking the stream for dead.  An object stream also waits on the user's epoch
 * marker, whose change ends it as a miss does.
 *
 * A stream of several user resources (GET <prefix>a,b: resource FP_RESOURCE_SET) has a part per
 * resource in c->set, each with its own persistent waiter, and opens once every part's first
 * answer is in (those that came before are kept): the head, then in path order an event for
 * each part whose answer is not the client's part of Last-Event-ID.  Each event's id is every
 * part's tag as the client has it after that event, joined by "," ("" for a part it has
 * none of yet), so that an EventSource's Last-Event-ID resumes every resource.  A miss of any
 * part is the whole stream's. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fp_internal.h"
#include "fp_conn.h"

#define STREAM_BACKLOG_MAX (256 * 1024)  /* unsent event bytes a slow reader may pile up */
/* The kernel's share of the same: a stream's socket gets SO_SNDBUF this (the kernel doubles it
 * for its bookkeeping, and the data it holds is less than that).  Left alone the kernel
 * autotunes a TCP send buffer up to tcp_wmem's max (4 MB): a client that never reads would
 * hold ~2.8 MB there (ss's Send-Q), beyond what STREAM_BACKLOG_MAX counts.  Setting SO_SNDBUF
 * turns that autotuning off for the socket and bounds what the kernel queues, on TCP and on
 * unix sockets (nginx's upstream may be one) alike.  TCP_NOTSENT_LOWAT would not do: it does
 * not exist for unix sockets, and it is a wake-up threshold rather than a bound.  Events are
 * small (a count, a page of messages); a big one still goes, its rest waiting in user space. */
#define STREAM_SNDBUF (16 * 1024)
#define EVENT_STACK 2048                 /* events up to this size are built on the stack */

static const char _never_tag[FP_ETAG_LEN];   /* zeros: no answer's tag (they are quoted hex) */

/* The stream's timer: its next heartbeat or its end, whichever is sooner (as HOLD's, in
 * hold_until_us, so that a client's bytes re-arm it the same way). */
static int _stream_arm(fp_conn_t *c)
{
    c->hold_until_us = c->beat_us < c->stream_end_us ? c->beat_us : c->stream_end_us;
    return fp_conn_hold_arm(c);
}

/* The stream's waiters leave the table, and it is no longer counted as open. */
static void _set_free(fp_conn_t *c);

static void _stream_release(fp_conn_t *c)
{
    _set_free(c);
    fp_wait_remove(&c->srv->waits, &c->waiter);
    fp_wait_remove(&c->srv->waits, &c->marker_waiter);
    c->waiter.persistent = c->waiter.secondary = 0;   /* the connection's next poll may hold */
    if (c->stream_open) {
        c->stream_open = 0;
        c->srv->st->streams--;
    }
}

/* Send stream bytes: after what is still unsent, if anything is (a reader that lets
 * STREAM_BACKLOG_MAX pile up is closed).  -1: the connection was closed or is closing. */
static int _stream_send(fp_conn_t *c, const char *bytes, size_t n)
{
    if (c->state != CONN_WRITING)
        return fp_conn_send(c, bytes, n, NULL, 0);
    size_t pending = c->out_len - c->out_sent;
    char *out;
    if (pending + n > STREAM_BACKLOG_MAX) {
        fp_conn_close(c);
        return -1;
    }
    memmove(c->out, c->out + c->out_sent, pending);
    if ((out = realloc(c->out, pending + n)) == NULL) {
        fp_conn_close(c);
        return -1;
    }
    memcpy(out + pending, bytes, n);
    c->out = out;
    c->out_len = pending + n;
    c->out_sent = 0;
    return 0;
}

/* The edge: a stream that cannot start (a miss, an error, a drain) is a stream of one
 * `event: miss`, then its end, with X-Cache: MISS as every miss the edge answers: the client
 * asks the site once (which fills the cache), then comes back (docs/contract.md section 10). */
static int _stream_miss(fp_conn_t *c)
{
    static const char miss_event[] = "event: miss\ndata: \n\n";
    char head[FP_HEAD_CAP], buf[96];
    size_t head_len = fp_reply_stream_head(c, "MISS", head, sizeof(head));
    size_t n = fp_reply_stream_text(c, miss_event, sizeof(miss_event) - 1, buf, sizeof(buf));

    if (c->stream_chunked)
        n += fp_reply_stream_text(c, "", 0, buf + n, sizeof(buf) - n);
    c->srv->st->stream_misses++;
    if (fp_kinds[c->kind].counted)
        c->srv->st->status[fp_status_slot(200)]++;
    return fp_conn_send(c, head, head_len, buf, n);
}

/* Not opened after all (a miss, an error, no memory, a drain): the poll's ordinary answer
 * (nginx hands it to Django), or on the edge a stream of one miss. */
static int _stream_fail(fp_conn_t *c, fp_mc_result_t r)
{
    _stream_release(c);
    if (!fp_kinds[c->kind].hands_on)
        return _stream_miss(c);
    return fp_conn_answer_result(c, r, NULL, 0, NULL);
}

/* End an open stream: `event: miss` first if miss, then the last chunk (chunked) or the close. */
static int _stream_end(fp_conn_t *c, int miss)
{
    static const char miss_event[] = "event: miss\ndata: \n\n";
    char buf[64];
    size_t n = 0;

    _stream_release(c);
    if (miss) {
        c->srv->st->stream_misses++;
        n = fp_reply_stream_text(c, miss_event, sizeof(miss_event) - 1, buf, sizeof(buf));
    }
    if (c->stream_chunked)
        n += fp_reply_stream_text(c, "", 0, buf + n, sizeof(buf) - n);
    if (n == 0)
        return fp_conn_next_request(c);    /* HTTP/1.0: closed */
    return _stream_send(c, buf, n);
}

/* One event of resource's answer (data, len) with this id, after the head if there is one. */
static int _stream_event(fp_conn_t *c, const char *head, size_t head_len, uint8_t resource, const char *id,
                         size_t id_len, const char *data, size_t len)
{
    char stack[EVENT_STACK], *buf = stack;
    size_t cap = fp_reply_event_size(c, resource, id_len, data, len);
    int rc;

    if (cap > sizeof(stack) && (buf = malloc(cap)) == NULL) {
        fp_conn_close(c);
        return -1;
    }
    size_t n = fp_reply_event(c, resource, id, id_len, data, len, buf, cap);
    c->srv->st->stream_events++;
    rc = head != NULL ? fp_conn_send(c, head, head_len, buf, n) : _stream_send(c, buf, n);
    if (buf != stack)
        free(buf);
    return rc;
}

/* The first answer: open the stream (its head, and the answer's event unless the client's
 * Last-Event-ID is its tag); the waiter takes the answer's tag. */
static int _stream_open(fp_conn_t *c, const char *tag, const char *data, size_t len)
{
    char head[FP_HEAD_CAP];
    size_t head_len = fp_reply_stream_head(c, "HIT", head, sizeof(head));
    int known = fp_reply_not_modified(c, tag);

    memcpy(c->inm_tag, tag, FP_ETAG_LEN);
    c->inm = FP_INM_TAG;
    c->waiter.tag = c->inm_tag;      /* the table compares the next answers with this one */
    c->stream_open = 1;
    c->srv->st->streams++;
    c->srv->st->streams_started++;
    if (fp_kinds[c->kind].counted)
        c->srv->st->status[fp_status_slot(200)]++;
    if (known)
        return fp_conn_send(c, head, head_len, NULL, 0);
    return _stream_event(c, head, head_len, c->resource, tag, FP_ETAG_LEN, data, len);
}

/* The key's answer is not the last event's (the first read's always is not), or the key is
 * gone or unreadable (fp_wake_fn). */
static void _stream_on_change(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag)
{
    fp_conn_t *c = ctx;
    int rc;
    if (r != FP_MC_HIT && r != FP_MC_EMPTY) {
        rc = c->stream_open ? _stream_end(c, 1) : _stream_fail(c, r);
    } else {
        if (data == NULL || r == FP_MC_EMPTY) {
            data = "";
            len = 0;
        }
        if (!c->stream_open) {
            rc = _stream_open(c, tag, data, len);
        } else {
            memcpy(c->inm_tag, tag, FP_ETAG_LEN);    /* the waiter's tag: the new answer's */
            rc = _stream_event(c, NULL, 0, c->resource, tag, FP_ETAG_LEN, data, len);
        }
    }
    if (rc == 0 && c->state == CONN_READING)
        fp_conn_process(c);            /* ended: pipelined requests */
}

/* An object stream's epoch marker is gone or not the empty value: the end, as a miss. */
static void _stream_on_marker(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag)
{
    fp_conn_t *c = ctx;
    if (r == FP_MC_HIT || r == FP_MC_EMPTY)
        r = FP_MC_MISS;
    int rc = c->stream_open ? _stream_end(c, 1) : _stream_fail(c, r);
    if (rc == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

/* ---- several resources in one stream ------------------------------------------------------ */

#define SET_ID_MAX (FP_STREAM_PARTS_MAX * (FP_ETAG_LEN + 1))

typedef struct {
    fp_waiter_t waiter;              /* on the part's key: persistent, as a stream's own */
    fp_conn_t *c;
    char seen[FP_ETAG_LEN];          /* the last answer read (the waiter's tag) */
    char sent[FP_ETAG_LEN];          /* the client's: its Last-Event-ID part or the last event's
                                        (zeros: none yet) */
    char *first;                     /* before the stream opens: the answer read, kept */
    size_t first_len;
    uint8_t resource, ready;         /* ready: its first answer is in */
} _part_t;

struct fp_stream_set {
    uint8_t n, ready;                /* parts; those whose first answer is in */
    _part_t part[];
};

static void _set_free(fp_conn_t *c)
{
    fp_stream_set_t *s = c->set;
    if (c->resource != FP_RESOURCE_SET)
        return;
    for (int i = 0; i < s->n; i++) {
        fp_wait_remove(&c->srv->waits, &s->part[i].waiter);
        free(s->part[i].first);
    }
    free(s);
    c->set = NULL;
    c->resource = 0;
}

/* The connection closes (its row's release): a set's parts go. */
static void _stream_release_all(fp_conn_t *c)
{
    _set_free(c);
}

/* The id of the client's answers: every part's tag, "" for none, joined by ",". */
static size_t _set_id(const fp_stream_set_t *s, char *buf)
{
    size_t n = 0;
    for (int i = 0; i < s->n; i++) {
        if (i > 0)
            buf[n++] = ',';
        if (memcmp(s->part[i].sent, _never_tag, FP_ETAG_LEN) == 0) {
            memcpy(buf + n, "\"\"", 2);
            n += 2;
        } else {
            memcpy(buf + n, s->part[i].sent, FP_ETAG_LEN);
            n += FP_ETAG_LEN;
        }
    }
    return n;
}

/* Last-Event-ID as the parts' tags (an id _set_id wrote, OWS around it): what the client has.
 * Anything else is read as nothing (every part is sent). */
static void _set_last_event_id(fp_stream_set_t *s, const char *v, size_t len)
{
    const char *end = v + len;
    int i;

    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    for (i = 0; i < s->n; i++) {
        if (i > 0 && (v == end || *v++ != ','))
            break;
        if (end - v >= 2 && v[0] == '"' && v[1] == '"') {
            v += 2;
        } else if (end - v >= FP_ETAG_LEN && v[0] == '"' && v[FP_ETAG_LEN - 1] == '"') {
            memcpy(s->part[i].sent, v, FP_ETAG_LEN);
            v += FP_ETAG_LEN;
        } else {
            break;
        }
    }
    if (i < s->n || v != end)
        for (i = 0; i < s->n; i++)
            memset(s->part[i].sent, 0, FP_ETAG_LEN);
}

static void _part_on_change(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag);

/* The parts of a stream of several resources, each waiting on its key (the request's key is
 * the first part's; the others' differ only in the resource).  FP_MC_QUEUED, or what to
 * answer (the parts made so far go with _stream_release). */
static fp_mc_result_t _set_start(fp_conn_t *c, const fp_keys_t *k)
{
    const fp_request_t *rq = k->rq;
    const fp_config_t *cfg = c->srv->cfg;
    size_t pre = cfg->key_prefix_len + 1, res0 = cfg->resource_len[rq->parts[0]];
    const char *rest = k->key + pre + res0;         /* ":<uid>:<epoch>" */
    size_t rest_len = k->key_len - pre - res0;
    fp_stream_set_t *s = calloc(1, sizeof(*s) + rq->n_parts * sizeof(_part_t));
    char key[FP_KEY_CAP];

    if (s == NULL)
        return FP_MC_OVERLOADED;
    s->n = rq->n_parts;
    c->set = s;
    c->resource = FP_RESOURCE_SET;
    if (rq->have[FP_HDR_LAST_EVENT_ID] == 1)
        _set_last_event_id(s, c->in->data + rq->header[FP_HDR_LAST_EVENT_ID].off,
                           rq->header[FP_HDR_LAST_EVENT_ID].len);
    for (int i = 0; i < s->n; i++) {
        _part_t *p = &s->part[i];
        size_t res_len = cfg->resource_len[rq->parts[i]], key_len = pre + res_len + rest_len;
        fp_mc_result_t r;
        if (key_len > sizeof(key))
            return FP_MC_MISS;       /* a key Django cannot make either: its 404 */
        memcpy(key, k->key, pre);
        memcpy(key + pre, cfg->resources[rq->parts[i]], res_len);
        memcpy(key + pre + res_len, rest, rest_len);
        p->c = c;
        p->resource = rq->parts[i];
        p->waiter.persistent = p->waiter.secondary = 1;
        r = fp_wait_add(&c->srv->waits, &p->waiter, key, key_len, _never_tag, _part_on_change, p);
        if (r != FP_MC_QUEUED)
            return r;
        p->waiter.tag = p->seen;     /* zeros until the first answer: no answer's tag */
    }
    return FP_MC_QUEUED;
}

/* Every part's first answer is in (last's is data, len): the head, and an event for each part
 * whose answer the client does not have, in path order, in one write. */
static int _set_open(fp_conn_t *c, const _part_t *last, const char *data, size_t len)
{
    fp_stream_set_t *s = c->set;
    char head[FP_HEAD_CAP], id[SET_ID_MAX], stack[EVENT_STACK], *buf = stack;
    size_t head_len = fp_reply_stream_head(c, "HIT", head, sizeof(head)), cap = 0, n = 0, id_len;
    int rc;

    c->stream_open = 1;
    c->srv->st->streams++;
    c->srv->st->streams_started++;
    if (fp_kinds[c->kind].counted)
        c->srv->st->status[fp_status_slot(200)]++;
    for (int i = 0; i < s->n; i++) {
        const _part_t *p = &s->part[i];
        cap += fp_reply_event_size(c, p->resource, SET_ID_MAX, p == last ? data : p->first,
                                   p == last ? len : p->first_len);
    }
    if (cap > sizeof(stack) && (buf = malloc(cap)) == NULL) {
        fp_conn_close(c);
        return -1;
    }
    for (int i = 0; i < s->n; i++) {
        _part_t *p = &s->part[i];
        if (memcmp(p->sent, p->seen, FP_ETAG_LEN) == 0)
            continue;                /* the client has it */
        memcpy(p->sent, p->seen, FP_ETAG_LEN);
        id_len = _set_id(s, id);
        n += fp_reply_event(c, p->resource, id, id_len, p == last ? data : p->first,
                            p == last ? len : p->first_len, buf + n, cap - n);
        c->srv->st->stream_events++;
    }
    for (int i = 0; i < s->n; i++) {
        free(s->part[i].first);
        s->part[i].first = NULL;
    }
    rc = fp_conn_send(c, head, head_len, buf, n);
    if (buf != stack)
        free(buf);
    return rc;
}

/* A part's answer is not its last one (the first read's always is not), or its key is gone or
 * unreadable (fp_wake_fn; ctx is the part). */
static void _part_on_change(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag)
{
    _part_t *p = ctx;
    fp_conn_t *c = p->c;
    fp_stream_set_t *s = c->set;
    char id[SET_ID_MAX];
    int rc;

    if (r != FP_MC_HIT && r != FP_MC_EMPTY) {
        rc = c->stream_open ? _stream_end(c, 1) : _stream_fail(c, r);
        goto done;
    }
    if (data == NULL || r == FP_MC_EMPTY) {
        data = "";
        len = 0;
    }
    memcpy(p->seen, tag, FP_ETAG_LEN);   /* the waiter's tag: the new answer's */
    if (c->stream_open) {
        memcpy(p->sent, tag, FP_ETAG_LEN);
        size_t id_len = _set_id(s, id);
        rc = _stream_event(c, NULL, 0, p->resource, id, id_len, data, len);
        goto done;
    }
    if (!p->ready) {
        p->ready = 1;
        s->ready++;
    }
    if (s->ready == s->n) {
        rc = _set_open(c, p, data, len);
        goto done;
    }
    free(p->first);                      /* kept until every part's first answer is in */
    if ((p->first = malloc(len > 0 ? len : 1)) == NULL) {
        rc = _stream_fail(c, FP_MC_OVERLOADED);
        goto done;
    }
    memcpy(p->first, data, len);
    p->first_len = len;
    return;
done:
    if (rc == 0 && c->state == CONN_READING)
        fp_conn_process(c);            /* ended: pipelined requests */
}

static int _stream_start(fp_conn_t *c, const fp_keys_t *k)
{
    fp_server_t *srv = c->srv;
    const fp_config_t *cfg = srv->cfg;
    int64_t now = fp_now_us(), max_us = (int64_t)cfg->max_stream_s * 1000000;
    fp_mc_result_t r;

    max_us -= (int64_t)(fp_conn_rand(srv) % (uint64_t)(max_us / 10 + 1));     /* as a hold's */
    c->stream_end_us = now + max_us;
    c->beat_us = now + (int64_t)cfg->stream_heartbeat_s * 1000000;
    if (k->rq != NULL && k->rq->resource == FP_RESOURCE_SET) {
        if ((r = _set_start(c, k)) != FP_MC_QUEUED)
            return _stream_fail(c, r);
        goto held;
    }
    c->waiter.persistent = c->waiter.secondary = 1;   /* counted in streams, not held polls */
    r = fp_wait_add(&srv->waits, &c->waiter, k->key, k->key_len, _never_tag, _stream_on_change, c);
    if (r != FP_MC_QUEUED)
        return _stream_fail(c, r);
    if (k->marker != NULL) {
        c->marker_waiter.secondary = 1;
        r = fp_wait_add(&srv->waits, &c->marker_waiter, k->marker, k->marker_len, fp_empty_tag,
                        _stream_on_marker, c);
        if (r != FP_MC_QUEUED)
            return _stream_fail(c, r);
    }
held:
    fp_conn_set_state(c, CONN_HELD);
    if (_stream_arm(c) < 0) {
        fp_conn_close(c);
        return -1;
    }
    return 0;
}

/* An object stream's gets are in: a present answer (its marker checked) starts the stream. */
static int _stream_fetched(fp_conn_t *c, const fp_keys_t *k, fp_mc_result_t r, const char *data, size_t len)
{
    if (r == FP_MC_HIT || r == FP_MC_EMPTY)
        return _stream_start(c, k);
    return _stream_fail(c, r);
}

/* The timer: the stream's end, or a heartbeat (a comment line) and the timer again. */
static void _stream_on_timeout(fp_conn_t *c)
{
    static const char beat[] = ": \n\n";
    char buf[32];
    int64_t now = fp_now_us();
    int rc;

    if (now >= c->stream_end_us)
        rc = c->stream_open ? _stream_end(c, 0) : _stream_fail(c, FP_MC_UNAVAILABLE);
    else if (!c->stream_open || now < c->beat_us)
        rc = _stream_arm(c) < 0 ? (fp_conn_close(c), -1) : 0;
    else {
        c->beat_us = now + (int64_t)c->srv->cfg->stream_heartbeat_s * 1000000;
        c->srv->st->stream_heartbeats++;
        rc = _stream_send(c, buf, fp_reply_stream_text(c, beat, sizeof(beat) - 1, buf, sizeof(buf)));
        if (rc == 0 && c->state == CONN_HELD && _stream_arm(c) < 0) {
            fp_conn_close(c);
            return;
        }
    }
    if (rc == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

static void _stream_on_drain(fp_conn_t *c)
{
    int rc = c->stream_open ? _stream_end(c, 0) : _stream_fail(c, FP_MC_UNAVAILABLE);
    if (rc == 0 && c->state == CONN_READING)
        fp_conn_process(c);
}

/* Bytes are out: a stream goes on (held again once a backlog is written, or ended if its time
 * is up or the worker drains); an answer that was not a stream, or the end, as a poll's. */
static int _stream_after_write(fp_conn_t *c)
{
    if (!c->stream_open)
        return fp_conn_next_request(c);
    if (c->state != CONN_WRITING)
        return 0;                    /* sent at once from HELD: still armed */
    fp_conn_set_state(c, CONN_HELD);
    if (c->srv->stopping || fp_now_us() >= c->stream_end_us)
        return _stream_end(c, 0);
    if (_stream_arm(c) < 0) {
        fp_conn_close(c);
        return -1;
    }
    return 0;
}

/* A stream is about to be dispatched: its events' name and framing.  1: a draining worker
 * opens none (503 MISS: nginx hands it to Django, whose one event and retry: bring the client
 * back to another worker), and on the edge neither it nor a stream already decided a miss
 * (ACT_RESPOND: fp_route) does (a stream of one `event: miss`); the connection was answered.
 * -1: it was closed. */
static int _stream_prepare(fp_conn_t *c)
{
    int sndbuf = STREAM_SNDBUF;

    (void)setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));   /* cannot fail on a socket */
    if (c->in->req.resource != FP_RESOURCE_SET)
        c->resource = c->in->req.resource;   /* a set's when its parts are made (_set_start) */
    c->stream_chunked = c->parser.http_major == 1 && c->parser.http_minor >= 1;
    if (!c->stream_chunked)
        c->keep_alive = 0;           /* HTTP/1.0: the stream ends when the connection does */
    if ((c->srv->stopping || c->in->req.action == ACT_RESPOND) && !fp_kinds[c->kind].hands_on)
        return _stream_miss(c) < 0 ? -1 : 1;     /* the edge: to the site, then back */
    if (c->srv->stopping) {
        c->mode = FP_MODE_ONCE;
        return fp_conn_respond_error(c, 503, "draining", "MISS") < 0 ? -1 : 1;
    }
    return 0;
}

const fp_mode_ops_t fp_stream_mode = {
    .name = "stream", .prepare = _stream_prepare, .start = _stream_start, .on_fetched = _stream_fetched,
    .on_change = _stream_on_change, .on_timeout = _stream_on_timeout, .on_drain = _stream_on_drain,
    .after_write = _stream_after_write, .release = _stream_release_all,
};
