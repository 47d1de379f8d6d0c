/* The memcached client of one worker: pipelined multi-key gets over one persistent connection
 * per server, each get answered through a completion callback (docs/fastpath.md).
 *
 * It knows nothing of HTTP: a caller queues a get with a callback and a context, and may cancel
 * it (a client connection that closes cancels its get), in the style of nginx's upstream
 * callbacks.  One pool = every server of one worker + the free list of request records; one
 * event base = one thread: nothing here is locked.
 */
#ifndef FP_MC_H
#define FP_MC_H
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "fp_server.h"
#include "fp_slab.h"

/* longest key a get takes: a user key of the longest key prefix, resource, uid and epoch,
 * 16 + 1 + 32 + 1 + 64 + 1 + 19 = 134 (docs/contract.md section 3) */
#define FP_KEY_CAP 136

typedef enum {
    FP_MC_QUEUED,                    /* the answer comes later, through the callback */
    FP_MC_HIT,                       /* a value (data, len > 0) */
    FP_MC_EMPTY,                     /* an empty value: nothing new */
    FP_MC_MISS,                      /* no value, or one this client cannot serve (see fp_mc.c) */
    FP_MC_UNAVAILABLE,               /* server down, in its backoff, out of step or too slow */
    FP_MC_OVERLOADED                 /* too many gets queued for the server (or no memory) */
} fp_mc_result_t;

typedef struct fp_mc_req fp_mc_req_t;              /* opaque to callers */

/* Called once per get that returned FP_MC_QUEUED, from the event loop (never from inside
 * fp_mc_get), never after fp_mc_cancel.  data/len valid only during the call.  The callback
 * may call fp_mc_get and fp_mc_cancel (other requests) and may free its ctx.  Once it has been
 * called, the request handle is no longer the caller's (do not cancel it). */
typedef void (*fp_mc_done_fn)(void *ctx, fp_mc_result_t r, const char *data, size_t len);

typedef enum { MC_DOWN, MC_CONNECTING, MC_UP } fp_mc_state_t;

/* One server's connection.  Private to fp_mc.c (here only so that a pool can be embedded). */
typedef struct fp_mc {
    struct fp_mc_pool *pool;
    int fd;
    fp_mc_state_t state;
    struct event *rev, *wev;         /* per connection; wev only while the socket is full */
    struct event *flush_ev;          /* deferred: one write of every queued get per loop pass */
    struct event *timer;             /* deadline of the oldest get */
    int64_t retry_at_us;
    int backoff_ms;
    fp_mc_req_t *head, *tail;        /* in command order; sent ones first */
    int n_pending;
    char *out;                       /* commands not yet taken by the socket */
    size_t out_len, out_sent, out_cap;
    char *in;                        /* replies not yet parsed */
    size_t in_len, in_cap;
    uint64_t skip;                   /* bytes of a value not buffered still to drop as they pass */
    uint8_t skip_crlf;               /* ... and then its "\r\n" */
    struct sockaddr_storage addr;
    int addr_len;
} fp_mc_t;

typedef struct fp_mc_pool {
    struct event_base *base;
    fp_stats_t *st;
    const fp_config_t *cfg;          /* nodes, node_addr, timeout_ms */
    int n;                           /* servers set up (fp_mc_pool_fini frees these) */
    int closing;                     /* in fp_mc_pool_fini: gets answer FP_MC_UNAVAILABLE */
    size_t in_start, in_max;         /* read buffer: usual size (it shrinks back to it), and the
                                      * largest reply buffered (larger: a miss for its key); the
                                      * fuzz target lowers both, in_max >= in_start >= 512 */
    fp_slab_t req_slab;              /* request records: a worker keeps its peak in flight */
    fp_mc_t mc[FP_MAX_SERVERS];
} fp_mc_pool_t;

/* Connects to every cfg->node_addr (failures are retried on demand).  -1 with err on failure;
 * fp_mc_pool_fini must be called either way (on a pool zeroed before init, it does nothing). */
int fp_mc_pool_init(fp_mc_pool_t *pool, struct event_base *base, fp_stats_t *st,
                    const fp_config_t *cfg, char *err, size_t err_len);
/* Queued gets are answered FP_MC_UNAVAILABLE, then everything is freed. */
void fp_mc_pool_fini(fp_mc_pool_t *pool);
/* FP_MC_QUEUED (and *req set: done is called later), or the answer at once without calling
 * done: FP_MC_UNAVAILABLE (server in its backoff), FP_MC_OVERLOADED, FP_MC_MISS (bad key). */
fp_mc_result_t fp_mc_get(fp_mc_pool_t *pool, const char *key, size_t key_len,
                         fp_mc_done_fn done, void *ctx, fp_mc_req_t **req);
/* done will not be called; safe inside a callback.  A get not yet written is freed at once; one
 * already written stays queued (unanswered) until its reply has gone by, to keep in step. */
void fp_mc_cancel(fp_mc_req_t *req);
/* Use fd (connected, non-blocking; the pool closes it) as server index's connection: the fuzz
 * target's and the tests' socketpair.  -1 if libevent cannot watch it. */
int fp_mc_adopt(fp_mc_pool_t *pool, int index, int fd);
/* The size of server index's read buffer now (tests: it shrinks back after a large value). */
size_t fp_mc_in_cap(const fp_mc_pool_t *pool, int index);

#endif
