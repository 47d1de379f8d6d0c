/* The wait table (fp_wait.h). */
#include <stdlib.h>
#include <string.h>

#include "fp_hash.h"
#include "fp_util.h"
#include "fp_wait.h"

/* Buckets start few and double as keys come (at most one key per bucket on average): a worker
 * holding a few hundred polls does not touch a table sized for fifty thousand. */
#define WAIT_BUCKETS_START 256
#define WAIT_KEY_CHUNK (16 * 1024)   /* key records mapped at a time (fp_slab.h) */
/* The re-read queue is served in ticks of interval / TICK_DIVISOR (10-100 ms): one timer wake
 * and one batch of gets for every key that fell due meanwhile, each read at most a tick late
 * (0.1 s on the default 5 s).  At 10 ms a tick, 40,000 held polls on 4 workers woke each worker
 * 100 times a second for ~20 keys, and memcached as often: 6.6% + 6.0% of a core while nothing
 * changed.  At most reads_per_s (--reread-rate, this worker's share) start per second: a burst
 * (every key due at once after a gap) is spread out, and past rate x interval held keys the
 * sweep stretches beyond the interval instead of costing more CPU (issue 31: the safety net
 * must not grow with the held connections; notices, which carry the real changes, are never
 * rate-limited). */
#define TICK_DIVISOR 50
#define TICK_MIN_US 10000
#define TICK_MAX_US 100000
/* After a notice gap (a change is known to be lost, and which key is not) the keys are read at
 * GAP_BURST times the rate until every one has been: that is not the safety net but the repair
 * of a known loss. */
#define GAP_BURST 8

static void _read(fp_wait_table_t *t, fp_wait_key_t *k);

static fp_wait_key_t **_slot(fp_wait_table_t *t, const char *key, size_t len)
{
    return &t->buckets[fp_murmur3_32(key, len, 0) & t->mask];
}

static fp_wait_key_t *_find(fp_wait_table_t *t, const char *key, size_t len)
{
    for (fp_wait_key_t *k = *_slot(t, key, len); k != NULL; k = k->hnext)
        if (k->key_len == len && memcmp(k->key, key, len) == 0)
            return k;
    return NULL;
}

/* ---- the re-read queue: FIFO by due time (every key waits the same interval) ---------- */

/* The tick, for when the head of the queue falls due and min_us from now at the soonest; a tick
 * already armed for no later than that stays. */
static void _arm_tick(fp_wait_table_t *t, int64_t now_us, int64_t min_us)
{
    if (t->qhead == NULL)
        return;
    int64_t wait_us = t->qhead->due_us - now_us;
    if (wait_us < min_us)
        wait_us = min_us;
    if (evtimer_pending(t->tick, NULL)) {
        if (t->tick_at_us <= now_us + wait_us)
            return;
        if (evtimer_del(t->tick) < 0)
            fp_log("cannot re-arm the re-read timer");
    }
    struct timeval tv = {(time_t)(wait_us / 1000000), (suseconds_t)(wait_us % 1000000)};
    if (evtimer_add(t->tick, &tv) < 0)
        fp_log("cannot arm the re-read timer; held polls rely on notices and their own timeout");
    else
        t->tick_at_us = now_us + wait_us;
}

static void _queue_remove(fp_wait_table_t *t, fp_wait_key_t *k)
{
    if (!k->queued)
        return;
    if (k->qprev != NULL)
        k->qprev->qnext = k->qnext;
    else
        t->qhead = k->qnext;
    if (k->qnext != NULL)
        k->qnext->qprev = k->qprev;
    else
        t->qtail = k->qprev;
    k->qprev = k->qnext = NULL;
    k->queued = 0;
}

static void _queue_append(fp_wait_table_t *t, fp_wait_key_t *k)
{
    int64_t now = fp_now_us();
    k->due_us = now + t->interval_us;
    k->qnext = NULL;
    k->qprev = t->qtail;
    if (t->qtail != NULL)
        t->qtail->qnext = k;
    else
        t->qhead = k;
    t->qtail = k;
    k->queued = 1;
    _arm_tick(t, now, t->tick_us);
}

static void _on_tick(evutil_socket_t fd, short what, void *arg)
{
    fp_wait_table_t *t = arg;
    int64_t now = fp_now_us();
    int n = 0;
    int reads = now < t->burst_until_us ? t->tick_reads * GAP_BURST : t->tick_reads;
    for (; n < reads && t->qhead != NULL && t->qhead->due_us <= now; n++) {
        t->st->wait_rereads++;
        _read(t, t->qhead);          /* takes it off the queue */
    }
    if (n > 0)
        t->st->wait_reread_ticks++;
    _arm_tick(t, now, t->tick_us);
}

/* ---- keys ----------------------------------------------------------------------------- */

/* Twice the buckets, every key moved over.  Out of memory, the table keeps its size: chains get
 * longer, nothing fails. */
static void _grow(fp_wait_table_t *t)
{
    uint32_t n = (t->mask + 1) * 2;
    fp_wait_key_t **old = t->buckets, **fresh = calloc(n, sizeof(*fresh));
    if (fresh == NULL)
        return;
    uint32_t old_n = t->mask + 1;
    t->buckets = fresh;
    t->mask = n - 1;
    for (uint32_t i = 0; i < old_n; i++) {
        for (fp_wait_key_t *k = old[i], *next; k != NULL; k = next) {
            next = k->hnext;
            fp_wait_key_t **slot = _slot(t, k->key, k->key_len);
            k->hnext = *slot;
            *slot = k;
        }
    }
    free(old);
}

static fp_wait_key_t *_key_new(fp_wait_table_t *t, const char *key, size_t len)
{
    fp_wait_key_t *k = fp_slab_alloc(&t->key_slab);      /* zeroed */
    if (k == NULL)
        return NULL;
    memcpy(k->key, key, len);
    k->key_len = (uint8_t)len;
    if (++t->n_keys > t->mask + 1)
        _grow(t);
    fp_wait_key_t **slot = _slot(t, key, len);
    k->hnext = *slot;
    *slot = k;
    return k;
}

static void _key_free(fp_wait_table_t *t, fp_wait_key_t *k)
{
    fp_wait_key_t **p = _slot(t, k->key, k->key_len);
    while (*p != k)
        p = &(*p)->hnext;
    *p = k->hnext;
    _queue_remove(t, k);
    fp_mc_cancel(k->req);
    t->n_keys--;
    fp_slab_free(&t->key_slab, k);
}

static void _unlink(fp_wait_table_t *t, fp_waiter_t *w)
{
    fp_wait_key_t *k = w->key;
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        k->head = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    else
        k->tail = w->prev;
    w->key = NULL;
    w->prev = w->next = NULL;
    if (!w->secondary)
        t->st->held--;
}

/* Every waiter of k whose tag this answer does not carry is woken (all of them when the key is
 * gone or unreadable); the others stay, and so does a persistent one woken with an answer (a
 * stream: its new tag is this answer's, so nothing is read again for it).  Afterwards k is read
 * again if it was noticed meanwhile, queued for its periodic re-read, or freed when nobody waits any more. */
static void _answer(fp_wait_table_t *t, fp_wait_key_t *k, fp_mc_result_t r, const char *data, size_t len)
{
    char tag[FP_ETAG_LEN];
    int have_tag = (r == FP_MC_HIT || r == FP_MC_EMPTY) && fp_etag_of(data != NULL ? data : "",
                                                                      r == FP_MC_HIT ? len : 0, tag) == 0;
    if ((r == FP_MC_HIT || r == FP_MC_EMPTY) && !have_tag)
        r = FP_MC_UNAVAILABLE;       /* libcrypto failed: the waiters fall back to Django */
    k->busy = 1;
    for (fp_waiter_t *w = k->head, *next; w != NULL; w = next) {
        next = w->next;
        if (have_tag && memcmp(w->tag, tag, FP_ETAG_LEN) == 0)
            continue;
        if (have_tag && w->persistent) {
            w->wake(w->ctx, r, data, len, tag);   /* a stream: stays, with the new tag */
            continue;
        }
        _unlink(t, w);
        if (have_tag && !w->secondary)
            t->st->holds_woken++;
        w->wake(w->ctx, r, data, len, have_tag ? tag : NULL);
    }
    k->busy = 0;
    if (k->head == NULL)
        _key_free(t, k);
    else if (k->dirty)
        _read(t, k);
    else
        _queue_append(t, k);
}

static void _on_read(void *ctx, fp_mc_result_t r, const char *data, size_t len)
{
    fp_wait_key_t *k = ctx;
    k->req = NULL;
    _answer(k->table, k, r, data, len);
}


/* One get for k (it leaves the re-read queue while in flight).  A get already in flight is
 * not repeated: k is read once more after it.  A get that fails at once answers the waiters
 * now, unless they are being answered (busy): then the next tick tries again. */
static void _read(fp_wait_table_t *t, fp_wait_key_t *k)
{
    if (k->req != NULL) {
        k->dirty = 1;
        return;
    }
    _queue_remove(t, k);
    k->dirty = 0;
    fp_mc_result_t r = fp_mc_get(t->mc, k->key, k->key_len, _on_read, k, &k->req);
    if (r == FP_MC_QUEUED)
        return;
    k->req = NULL;
    if (k->busy)
        _queue_append(t, k);
    else
        _answer(t, k, r, NULL, 0);
}

/* ---- the API ---------------------------------------------------------------------------- */

int fp_wait_init(fp_wait_table_t *t, struct event_base *base, fp_mc_pool_t *mc, fp_stats_t *st,
                 int reread_s, int reads_per_s)
{
    memset(t, 0, sizeof(*t));
    t->base = base;
    t->mc = mc;
    t->st = st;
    t->interval_us = (int64_t)reread_s * 1000000;
    t->tick_us = t->interval_us / TICK_DIVISOR;
    if (t->tick_us < TICK_MIN_US)
        t->tick_us = TICK_MIN_US;
    if (t->tick_us > TICK_MAX_US)
        t->tick_us = TICK_MAX_US;
    t->tick_reads = (int)((int64_t)reads_per_s * t->tick_us / 1000000);
    if (t->tick_reads < 1)
        t->tick_reads = 1;
    t->mask = WAIT_BUCKETS_START - 1;
    t->buckets = calloc(WAIT_BUCKETS_START, sizeof(*t->buckets));
    fp_slab_init(&t->key_slab, sizeof(fp_wait_key_t), WAIT_KEY_CHUNK);
    t->tick = evtimer_new(base, _on_tick, t);
    return t->buckets != NULL && t->tick != NULL ? 0 : -1;
}

void fp_wait_fini(fp_wait_table_t *t)
{
    if (t->buckets != NULL) {
        for (uint32_t i = 0; i <= t->mask; i++) {
            while (t->buckets[i] != NULL) {
                fp_wait_key_t *k = t->buckets[i];
                while (k->head != NULL)
                    _unlink(t, k->head);
                _key_free(t, k);
            }
        }
    }
    fp_slab_fini(&t->key_slab);
    free(t->buckets);
    if (t->tick != NULL)
        event_free(t->tick);
    memset(t, 0, sizeof(*t));
}

fp_mc_result_t fp_wait_add(fp_wait_table_t *t, fp_waiter_t *w, const char *key, size_t key_len,
                           const char *tag, fp_wake_fn wake, void *ctx)
{
    if (key_len == 0 || key_len > FP_KEY_CAP)
        return FP_MC_MISS;
    fp_wait_key_t *k = _find(t, key, key_len);
    if (k == NULL && (k = _key_new(t, key, key_len)) == NULL)
        return FP_MC_OVERLOADED;
    k->table = t;
    w->key = k;
    w->tag = tag;
    w->wake = wake;
    w->ctx = ctx;
    w->next = NULL;
    w->prev = k->tail;
    if (k->tail != NULL)
        k->tail->next = w;
    else
        k->head = w;
    k->tail = w;
    if (!w->secondary) {             /* one held poll, one count, however many keys it waits on */
        t->st->held++;
        t->st->holds_started++;
    }
    if (k->busy || k->req != NULL) {
        /* a get that may predate w is in flight (or being answered): one more after it */
        k->dirty = 1;
        return FP_MC_QUEUED;
    }
    _queue_remove(t, k);
    k->dirty = 0;
    fp_mc_result_t r = fp_mc_get(t->mc, k->key, k->key_len, _on_read, k, &k->req);
    if (r == FP_MC_QUEUED)
        return r;
    k->req = NULL;
    _unlink(t, w);                   /* the caller answers w now; the others see it next read */
    if (!w->secondary)
        t->st->holds_started--;
    if (k->head == NULL)
        _key_free(t, k);
    else
        _queue_append(t, k);
    return r;
}

void fp_wait_remove(fp_wait_table_t *t, fp_waiter_t *w)
{
    fp_wait_key_t *k = w->key;
    if (k == NULL)
        return;
    _unlink(t, w);
    if (k->head == NULL && !k->busy)
        _key_free(t, k);             /* its get, if any, is cancelled */
}

int fp_wait_notice(fp_wait_table_t *t, const char *key, size_t key_len)
{
    fp_wait_key_t *k;
    if (key_len == 0 || key_len > FP_KEY_CAP || (k = _find(t, key, key_len)) == NULL)
        return 0;
    t->st->wait_rereads++;
    if (k->busy)
        k->dirty = 1;
    else
        _read(t, k);
    return 1;
}

/* A gap: every key is read again, spread over ticks (GAP_BURST x tick_reads each) rather than
 * at once, the first within TICK_MIN_US (a tick already armed sooner stays: gaps that come faster than
 * ticks never push the reads back).  A key with a get in flight is marked dirty; the others are
 * moved to the front of the queue, due now. */
void fp_wait_reread_all(fp_wait_table_t *t)
{
    fp_wait_key_t *due = NULL, *k, *next;
    for (k = t->qhead; k != NULL; k = next) {
        next = k->qnext;
        _queue_remove(t, k);
        k->qnext = due;              /* a temporary list through qnext */
        due = k;
    }
    for (uint32_t i = 0; i <= t->mask; i++) {
        for (k = t->buckets[i]; k != NULL; k = k->hnext) {
            if (k->req != NULL || k->busy) {
                k->dirty = 1;
                t->st->wait_rereads++;   /* (the queued ones count when their tick reads them) */
            }
        }
    }
    uint32_t n = 0;
    for (k = due; k != NULL; k = next, n++) {
        next = k->qnext;
        _queue_append(t, k);
        k->due_us = 0;
    }
    int64_t now = fp_now_us(), ticks = n / ((uint32_t)t->tick_reads * GAP_BURST) + 1;
    t->burst_until_us = now + ticks * t->tick_us + TICK_MIN_US;
    _arm_tick(t, now, TICK_MIN_US);
}
