/* Counters: status slots, latency buckets and the Prometheus text, all from fp_stats.h's lists. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fp_stats.h"

const double fp_lat_bounds[FP_LAT_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 1e300};

static const int _status_codes[FP_ST_N] = {
#define FP_X_CODE(code, reason) code,
    FP_STATUSES(FP_X_CODE)
#undef FP_X_CODE
    0};

int fp_status_slot(int code)
{
    switch (code) {
#define FP_X_CASE(c, reason) case c: return FP_ST_##c;
    FP_STATUSES(FP_X_CASE)
#undef FP_X_CASE
    }
    return FP_ST_OTHER;
}

const char *fp_status_reason(int code)
{
    switch (code) {
#define FP_X_CASE(c, reason) case c: return reason;
    FP_STATUSES(FP_X_CASE)
#undef FP_X_CASE
    }
    return "Error";
}

void fp_stats_latency(fp_stats_t *st, int64_t us)
{
    double s = (double)us / 1e6;
    for (int i = 0; i < FP_LAT_BUCKETS; i++)
        if (s <= fp_lat_bounds[i])
            st->lat_bucket[i]++;
    st->lat_sum_us += (uint64_t)(us > 0 ? us : 0);
    st->lat_count++;
}

static void _sum(const fp_stats_t *slots, int n, fp_stats_t *sum)
{
    memset(sum, 0, sizeof(*sum));
    for (int w = 0; w < n; w++) {
        const fp_stats_t *s = &slots[w];
        for (int i = 0; i < FP_ST_N; i++)
            sum->status[i] += s->status[i];
#define FP_X_ADD(field, metric, help) sum->field += s->field;
        FP_COUNTERS(FP_X_ADD)
        FP_GAUGES(FP_X_ADD)
#undef FP_X_ADD
        for (int i = 0; i < FP_LAT_BUCKETS; i++)
            sum->lat_bucket[i] += s->lat_bucket[i];
        sum->lat_sum_us += s->lat_sum_us;
        sum->lat_count += s->lat_count;
    }
}

/* Appends to a fixed buffer; text that does not fit is cut off (cap bounds /metrics). */
typedef struct {
    char *buf;
    size_t len, cap;
} _out_t;

static void _append(_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void _append(_out_t *o, const char *fmt, ...)
{
    va_list ap;
    if (o->len + 1 >= o->cap)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n < o->cap - o->len ? (size_t)n : o->cap - o->len - 1;
}

static void _render_statuses(_out_t *o, const fp_stats_t *sum)
{
    _append(o, "# HELP fastpath_requests_total Poll requests answered, by HTTP status.\n"
               "# TYPE fastpath_requests_total counter\n");
    for (int i = 0; i < FP_ST_N; i++) {
        if (_status_codes[i])
            _append(o, "fastpath_requests_total{status=\"%d\"} %llu\n", _status_codes[i],
                    (unsigned long long)sum->status[i]);
        else
            _append(o, "fastpath_requests_total{status=\"other\"} %llu\n",
                    (unsigned long long)sum->status[i]);
    }
}

static void _render_counters(_out_t *o, const fp_stats_t *sum, int n_workers)
{
#define FP_X_COUNTER(field, metric, help) \
    _append(o, "# HELP " metric " " help "\n# TYPE " metric " counter\n" metric " %llu\n", \
            (unsigned long long)sum->field);
    FP_COUNTERS(FP_X_COUNTER)
#undef FP_X_COUNTER
#define FP_X_GAUGE(field, metric, help) \
    _append(o, "# HELP " metric " " help "\n# TYPE " metric " gauge\n" metric " %lld\n", \
            (long long)sum->field);
    FP_GAUGES(FP_X_GAUGE)
#undef FP_X_GAUGE
    _append(o, "# HELP fastpath_workers Worker processes.\n# TYPE fastpath_workers gauge\n"
               "fastpath_workers %d\n", n_workers);
}

static void _render_histogram(_out_t *o, const fp_stats_t *sum)
{
    _append(o, "# HELP fastpath_memcached_seconds memcached round trip of answered gets.\n"
               "# TYPE fastpath_memcached_seconds histogram\n");
    for (int i = 0; i < FP_LAT_BUCKETS - 1; i++)
        _append(o, "fastpath_memcached_seconds_bucket{le=\"%g\"} %llu\n", fp_lat_bounds[i],
                (unsigned long long)sum->lat_bucket[i]);
    _append(o, "fastpath_memcached_seconds_bucket{le=\"+Inf\"} %llu\n"
               "fastpath_memcached_seconds_sum %.6f\nfastpath_memcached_seconds_count %llu\n",
            (unsigned long long)sum->lat_bucket[FP_LAT_BUCKETS - 1], (double)sum->lat_sum_us / 1e6,
            (unsigned long long)sum->lat_count);
}

size_t fp_stats_render(const fp_stats_t *slots, int n, char *buf, size_t cap)
{
    fp_stats_t sum;
    _out_t o = {buf, 0, cap};

    if (cap == 0)
        return 0;
    buf[0] = '\0';
    _sum(slots, n, &sum);
    _render_statuses(&o, &sum);
    _render_counters(&o, &sum, n);
    if (n > 0 && slots[0].backend[0] != '\0')
        _append(&o, "# HELP fastpath_info The event backend in use.\n# TYPE fastpath_info gauge\n"
                    "fastpath_info{backend=\"%.15s\"} 1\n", slots[0].backend);
    _render_histogram(&o, &sum);
    return o.len;
}
