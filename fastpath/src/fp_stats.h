/* Status codes and counters, each declared once (memcached's THREAD_STATS_FIELDS style): the
 * lists below generate the per-worker stats slot, the reason phrases, the sum over workers and
 * the Prometheus text.  A new counter is one line here and one `st->name++` where it happens. */
#ifndef FP_STATS_H
#define FP_STATS_H
#include <stddef.h>
#include <stdint.h>

/* X(code, reason phrase): every status fastpath answers; anything else counts as "other". */
#define FP_STATUSES(X)                                  \
    X(200, "OK")                                        \
    X(204, "No Content")                                \
    X(304, "Not Modified")                              \
    X(400, "Bad Request")                               \
    X(401, "Unauthorized")                              \
    X(403, "Forbidden")                                 \
    X(404, "Not Found")                                 \
    X(405, "Method Not Allowed")                        \
    X(409, "Conflict")                                  \
    X(413, "Content Too Large")                         \
    X(414, "URI Too Long")                              \
    X(429, "Too Many Requests")                         \
    X(431, "Request Header Fields Too Large")           \
    X(503, "Service Unavailable")                       \
    X(505, "HTTP Version Not Supported")

/* X(field, metric, help): monotonic counters, summed over workers. */
#define FP_COUNTERS(X)                                                                            \
    X(hits, "fastpath_cache_hits_total", "Polls answered from memcached with a body (200).")      \
    X(empty_hits, "fastpath_cache_empty_hits_total", "Polls answered from an empty entry (204).") \
    X(misses, "fastpath_cache_misses_total", "Polls whose key memcached did not hold (404).")     \
    X(mc_errors, "fastpath_memcached_errors_total",                                               \
      "memcached connections lost, refused or out of step.")                                      \
    X(mc_timeouts, "fastpath_memcached_timeouts_total", "memcached answers later than --timeout-ms.") \
    X(mc_bad_entries, "fastpath_memcached_bad_entries_total",                                     \
      "memcached entries fastpath cannot serve (flags out of range, value too large).")          \
    X(mc_connects, "fastpath_memcached_connects_total", "Connections opened to memcached.")       \
    X(conn_accepted, "fastpath_connections_accepted_total", "Client connections accepted.")       \
    X(conn_rejected, "fastpath_connections_rejected_total",                                       \
      "Connections closed at once: over --max-connections, draining, or accept() failed.")       \
    X(loop_waits, "fastpath_loop_waits_total", "Times the event loop waited for the backend.")     \
    X(loop_events, "fastpath_loop_events_total", "Client socket events handled.")                 \
    X(holds_started, "fastpath_holds_total", "Polls held until their answer changes (Prefer: wait).") \
    X(holds_woken, "fastpath_holds_woken_total", "Held polls answered because the answer changed.") \
    X(hold_timeouts, "fastpath_hold_timeouts_total", "Held polls answered 304 when their wait ran out.") \
    X(notices, "fastpath_notices_total", "Notice datagrams received from plurkcore.")             \
    X(notice_keys, "fastpath_notice_keys_total", "Keys named by the notices received.")           \
    X(notice_gaps, "fastpath_notice_gaps_total",                                                  \
      "Notices lost (a sender's sequence skipped): every held key is read again.")                \
    X(notices_malformed, "fastpath_notices_malformed_total", "Notice datagrams dropped as malformed.") \
    X(notice_udp_datagrams, "fastpath_notice_udp_datagrams_total",                                \
      "Notice datagrams received over UDP (--notify-udp), well-formed or not.")                   \
    X(wait_rereads, "fastpath_wait_rereads_total",                                                \
      "Held keys read again (noticed, after a gap, or every --reread-interval).")                 \
    X(wait_reread_ticks, "fastpath_wait_reread_ticks_total",                                      \
      "Re-read queue ticks that started reads (each one batch of gets).")                         \
    X(held_refused, "fastpath_held_refused_total",                                                \
      "Holds and streams refused 429 at a cap (--max-held-per-user, --edge-max-per-address).")    \
    X(streams_started, "fastpath_streams_total", "Streams opened (Accept: text/event-stream).")   \
    X(stream_events, "fastpath_stream_events_total", "Events sent on streams (one per answer).")  \
    X(stream_heartbeats, "fastpath_stream_heartbeats_total", "Heartbeat comments sent on streams.") \
    X(stream_misses, "fastpath_stream_misses_total",                                              \
      "Streams ended with event: miss (the key gone or unreadable).")

/* X(field, metric, help): gauges (each worker's slot goes up and down), summed over workers. */
#define FP_GAUGES(X)                                                                              \
    X(inflight, "fastpath_inflight_requests", "Gets waiting for memcached.")                      \
    X(connections, "fastpath_connections", "Open client connections.")                            \
    X(held, "fastpath_held_polls", "Polls held now, waiting for their answer to change.")        \
    X(streams, "fastpath_streams", "Streams open now (their head sent).")

#define FP_LAT_BUCKETS 10

enum fp_status_slot {
#define FP_X_SLOT(code, reason) FP_ST_##code,
    FP_STATUSES(FP_X_SLOT)
#undef FP_X_SLOT
    FP_ST_OTHER,
    FP_ST_N
};

/* One worker's counters, in memory shared by every worker (mmap before fork), so that any
 * worker's /metrics reports the sum.  Each worker writes only its own slot. */
typedef struct {
    uint64_t status[FP_ST_N];
#define FP_X_FIELD(field, metric, help) uint64_t field;
    FP_COUNTERS(FP_X_FIELD)
#undef FP_X_FIELD
#define FP_X_FIELD(field, metric, help) int64_t field;
    FP_GAUGES(FP_X_FIELD)
#undef FP_X_FIELD
    uint64_t lat_bucket[FP_LAT_BUCKETS];   /* memcached round trip, cumulative by bound */
    uint64_t lat_sum_us, lat_count;
    uint64_t pid;
    char backend[16];                      /* libevent's method: "epoll", "poll", ... */
} fp_stats_t;

extern const double fp_lat_bounds[FP_LAT_BUCKETS];   /* seconds; last is +Inf */

/* The slot of a status code (FP_ST_OTHER for codes not listed). */
int fp_status_slot(int code);
/* The reason phrase of a status code ("Error" for codes not listed). */
const char *fp_status_reason(int code);
/* Count one memcached round trip of `us` microseconds. */
void fp_stats_latency(fp_stats_t *st, int64_t us);
/* Prometheus text of the summed counters of n slots into buf; returns its length (truncated
 * to cap). */
size_t fp_stats_render(const fp_stats_t *slots, int n, char *buf, size_t cap);

#endif
