/* The wait table of one worker (long-polling, docs/fastpath.md): memcached key -> the held polls
 * that wait for its answer to change.
 *
 * A waiter is registered before the get that compares its tag (so a store after the
 * registration is either seen by that get or followed by a notice that reads again: no lost
 * wake-up).  There is at most one get per key however many wait on it; a key that is noticed
 * while its get is in flight is marked dirty and read once more afterwards.  Every key is also
 * read again every reread interval (a FIFO by due time, served in ticks of a fiftieth of it, at
 * most reads_per_s a second), so a lost notice costs at most that long, or held keys / rate
 * when there are more than the rate reads in an interval.  It knows nothing of HTTP: a waiter is woken through its
 * callback and context, as fp_mc.c answers a get.
 */
#ifndef FP_WAIT_H
#define FP_WAIT_H
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "fp_etag.h"
#include "fp_mc.h"
#include "fp_slab.h"
#include "fp_stats.h"

typedef struct fp_wait_key fp_wait_key_t;

/* The key's answer no longer carries the waiter's tag (r FP_MC_HIT/EMPTY, data/len valid during
 * the call, and tag its ETag, FP_ETAG_LEN bytes, computed once for every waiter it wakes), or
 * the key is gone (FP_MC_MISS) or cannot be read (UNAVAILABLE/OVERLOADED; tag NULL).  The
 * waiter is already out of the table (a persistent one woken with an answer stays in it, and
 * must take the new tag: w->tag then points at a copy of it); the callback may free its ctx and
 * may call fp_wait_add and fp_wait_remove. */
typedef void (*fp_wake_fn)(void *ctx, fp_mc_result_t r, const char *data, size_t len, const char *tag);

typedef struct fp_waiter {
    fp_wait_key_t *key;              /* NULL: not waiting */
    struct fp_waiter *prev, *next;   /* the key's waiters */
    const char *tag;                 /* FP_ETAG_LEN bytes, the caller's (If-None-Match) */
    fp_wake_fn wake;
    void *ctx;
    unsigned char secondary;         /* the caller's: a second waiter of one held poll (an object
                                        poll's epoch marker), left out of the hold counters */
    unsigned char persistent;        /* the caller's: a stream's waiter stays in the table when
                                        woken with an answer (its wake points w->tag at the new
                                        answer's tag); a miss or an error still takes it out */
} fp_waiter_t;

struct fp_wait_key {
    struct fp_wait_table *table;     /* the get's callback context is the key */
    fp_wait_key_t *hnext;            /* hash chain */
    fp_wait_key_t *qprev, *qnext;    /* re-read queue (only while no get is in flight) */
    fp_waiter_t *head, *tail;
    fp_mc_req_t *req;                /* the get in flight */
    int64_t due_us;                  /* in the queue: read again then */
    uint8_t queued, dirty, busy, key_len;
    char key[FP_KEY_CAP];
};

typedef struct fp_wait_table {
    struct event_base *base;
    fp_mc_pool_t *mc;
    fp_stats_t *st;
    struct event *tick;              /* the head of the re-read queue is due */
    int64_t interval_us;
    int64_t tick_us;                 /* the re-read queue is served this often at most */
    int64_t tick_at_us;              /* when the armed tick fires */
    int tick_reads;                  /* ... starting at most this many reads a tick */
    int64_t burst_until_us;          /* after a notice gap: GAP_BURST x tick_reads until then */
    fp_wait_key_t **buckets;
    uint32_t mask;                   /* buckets - 1 (a power of two) */
    fp_wait_key_t *qhead, *qtail;
    uint32_t n_keys;                 /* in the buckets; they double when it passes their count */
    fp_slab_t key_slab;              /* key records (fp_slab.h) */
} fp_wait_table_t;

/* -1 when out of memory or libevent fails; fp_wait_fini must be called either way (on a table
 * zeroed before init, it does nothing). */
int fp_wait_init(fp_wait_table_t *t, struct event_base *base, fp_mc_pool_t *mc, fp_stats_t *st,
                 int reread_s, int reads_per_s);
/* Every waiter must have been removed. */
void fp_wait_fini(fp_wait_table_t *t);
/* Registers w on key, then (or by joining the key's get) compares tag with the key's answer.
 * FP_MC_QUEUED: registered, wake will be called when the answer differs.  Anything else: not
 * registered, the answer to give now (no memory: FP_MC_OVERLOADED; the key's server failed at
 * once: its result). */
fp_mc_result_t fp_wait_add(fp_wait_table_t *t, fp_waiter_t *w, const char *key, size_t key_len,
                           const char *tag, fp_wake_fn wake, void *ctx);
/* w leaves the table (nothing if it is not in it); wake is not called. */
void fp_wait_remove(fp_wait_table_t *t, fp_waiter_t *w);
/* Something may have stored key: read it again if anyone waits on it.  1 if someone does. */
int fp_wait_notice(fp_wait_table_t *t, const char *key, size_t key_len);
/* A notice may have been lost: read every key that has waiters again. */
void fp_wait_reread_all(fp_wait_table_t *t);

#endif
