/* fastpath worker lifecycle: event base, listeners, signals, draining; and the stats text.
 *
 * The request path lives in fp_conn.c (HTTP, llhttp) and fp_mc.c (memcached); everything runs on
 * one event base per worker process, without the GIL.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fp_internal.h"

#define ACCEPT_PAUSE_US 100000       /* after a failed accept() */
#define ACCEPT_RETRIES 20            /* re-enabling accepting fails this often (2 s): give up */
#define LOG_WINDOW_S 10
#define LOG_BURST 10                 /* log lines per LOG_WINDOW_S; the rest are only counted */

const double fp_lat_bounds[FP_LAT_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 1e300};

/* ---- small helpers shared by the request path -------------------------------------- */

void fp_log(const char *fmt, ...)
{
    static time_t window;
    static unsigned int in_window, suppressed;
    time_t now = time(NULL) / LOG_WINDOW_S;    /* time() fails only for a bad pointer */
    va_list ap;

    if (now != window) {
        window = now;
        in_window = 0;
    }
    if (++in_window > LOG_BURST) {
        suppressed++;
        return;
    }
    /* nowhere is left to report a failed write to stderr: these results are not used */
    if (suppressed > 0) {
        (void)fprintf(stderr, "fastpath[%ld]: (%u similar lines not shown)\n", (long)getpid(), suppressed);
        suppressed = 0;
    }
    (void)fprintf(stderr, "fastpath[%ld]: ", (long)getpid());
    va_start(ap, fmt);
    (void)vfprintf(stderr, fmt, ap);
    va_end(ap);
    (void)fputc('\n', stderr);
}

/* CLOCK_MONOTONIC and CLOCK_MONOTONIC_COARSE fail only when the kernel lacks the clock (EINVAL),
 * which fp_server_init rules out before anything is served.  Should one fail later all the same,
 * no deadline can be kept: the worker stops at once (the parent starts a new one, whose init
 * then says what is wrong). */
static void _clock_failed(const char *which)
{
    fp_log("clock_gettime(%s) failed: %s; worker stops", which, strerror(errno));
    abort();
}

int64_t fp_now_us(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        _clock_failed("CLOCK_MONOTONIC");
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t fp_now_s(fp_server_t *srv)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        _clock_failed("CLOCK_MONOTONIC_COARSE");
    return (int64_t)ts.tv_sec;
}

static int _clocks_work(void)
{
    struct timespec ts;
    return clock_gettime(CLOCK_MONOTONIC, &ts) == 0 && clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0;
}

int fp_wall_s(fp_server_t *srv, int64_t *now)
{
    struct timeval tv;
    if (event_base_gettimeofday_cached(srv->base, &tv) != 0)
        return -1;
    *now = (int64_t)tv.tv_sec;
    return 0;
}

int fp_status_slot(int code)
{
    switch (code) {
    case 200: return FP_ST_200;
    case 204: return FP_ST_204;
    case 400: return FP_ST_400;
    case 401: return FP_ST_401;
    case 404: return FP_ST_404;
    case 405: return FP_ST_405;
    case 413: return FP_ST_413;
    case 414: return FP_ST_414;
    case 431: return FP_ST_431;
    case 503: return FP_ST_503;
    case 505: return FP_ST_505;
    }
    return FP_ST_OTHER;
}

/* "Sun, 06 Nov 1994 08:49:37 GMT" (RFC 9110 IMF-fixdate), remade once a second. */
const char *fp_date_header(fp_server_t *srv, size_t *len)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct timeval now;
    struct tm tm;
    /* if the time cannot be read, the last Date made is sent again */
    if (event_base_gettimeofday_cached(srv->base, &now) == 0 && (int64_t)now.tv_sec != srv->date_s &&
        gmtime_r(&now.tv_sec, &tm) != NULL) {
        int n = snprintf(srv->date, sizeof(srv->date), "%s, %02d %s %04d %02d:%02d:%02d GMT",
                         days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900,
                         tm.tm_hour, tm.tm_min, tm.tm_sec);
        srv->date_len = n > 0 && (size_t)n < sizeof(srv->date) ? (size_t)n : 0;
        srv->date_s = (int64_t)now.tv_sec;
    }
    *len = srv->date_len;
    return srv->date;
}

/* Leave the loop once the current callbacks are done.  loopexit needs an allocation
 * (event_base_once); loopbreak, its fallback, needs none and fails only without a base. */
static void _leave_loop(fp_server_t *srv)
{
    if (event_base_loopexit(srv->base, NULL) != 0 && event_base_loopbreak(srv->base) != 0)
        fp_log("cannot leave the event loop");
}

void fp_maybe_finish_drain(fp_server_t *srv)
{
    if (srv->stopping && srv->n_conns <= 0)
        _leave_loop(srv);
}

/* ---- stats ------------------------------------------------------------------------------ */

static const int fp_status_codes[FP_ST_N] = {200, 204, 400, 401, 404, 405, 413, 414, 431, 503, 505, 0};

#define FP_APPEND(...)                                                              \
    do {                                                                            \
        if (len < cap) {                                                            \
            int n_ = snprintf(buf + len, cap - len, __VA_ARGS__);                   \
            if (n_ > 0)                                                             \
                len += (size_t)n_ < cap - len ? (size_t)n_ : cap - len - 1;         \
        }                                                                           \
    } while (0)

size_t fp_stats_render(const fp_stats_t *slots, int n, char *buf, size_t cap)
{
    fp_stats_t sum;
    size_t len = 0;
    memset(&sum, 0, sizeof(sum));
    for (int w = 0; w < n; w++) {
        for (int i = 0; i < FP_ST_N; i++)
            sum.status[i] += slots[w].status[i];
        sum.hits += slots[w].hits;
        sum.empty_hits += slots[w].empty_hits;
        sum.misses += slots[w].misses;
        sum.mc_errors += slots[w].mc_errors;
        sum.mc_timeouts += slots[w].mc_timeouts;
        sum.mc_connects += slots[w].mc_connects;
        sum.inflight += slots[w].inflight;
        sum.connections += slots[w].connections;
        sum.conn_accepted += slots[w].conn_accepted;
        sum.conn_rejected += slots[w].conn_rejected;
        for (int i = 0; i < FP_LAT_BUCKETS; i++)
            sum.lat_bucket[i] += slots[w].lat_bucket[i];
        sum.lat_sum_us += slots[w].lat_sum_us;
        sum.lat_count += slots[w].lat_count;
    }
    if (cap == 0)
        return 0;
    buf[0] = '\0';
    FP_APPEND("# HELP fastpath_requests_total Poll requests answered, by HTTP status.\n"
              "# TYPE fastpath_requests_total counter\n");
    for (int i = 0; i < FP_ST_N; i++) {
        if (fp_status_codes[i])
            FP_APPEND("fastpath_requests_total{status=\"%d\"} %llu\n", fp_status_codes[i],
                      (unsigned long long)sum.status[i]);
        else
            FP_APPEND("fastpath_requests_total{status=\"other\"} %llu\n",
                      (unsigned long long)sum.status[i]);
    }
    FP_APPEND("# TYPE fastpath_cache_hits_total counter\nfastpath_cache_hits_total %llu\n"
              "# TYPE fastpath_cache_empty_hits_total counter\nfastpath_cache_empty_hits_total %llu\n"
              "# TYPE fastpath_cache_misses_total counter\nfastpath_cache_misses_total %llu\n"
              "# TYPE fastpath_memcached_errors_total counter\nfastpath_memcached_errors_total %llu\n"
              "# TYPE fastpath_memcached_timeouts_total counter\nfastpath_memcached_timeouts_total %llu\n"
              "# TYPE fastpath_memcached_connects_total counter\nfastpath_memcached_connects_total %llu\n"
              "# TYPE fastpath_inflight_requests gauge\nfastpath_inflight_requests %lld\n"
              "# TYPE fastpath_workers gauge\nfastpath_workers %d\n"
              "# TYPE fastpath_connections gauge\nfastpath_connections %lld\n"
              "# TYPE fastpath_connections_accepted_total counter\nfastpath_connections_accepted_total %llu\n"
              "# HELP fastpath_connections_rejected_total Connections closed at once: over --max-connections, draining, or accept() failed.\n"
              "# TYPE fastpath_connections_rejected_total counter\nfastpath_connections_rejected_total %llu\n",
              (unsigned long long)sum.hits, (unsigned long long)sum.empty_hits,
              (unsigned long long)sum.misses, (unsigned long long)sum.mc_errors,
              (unsigned long long)sum.mc_timeouts, (unsigned long long)sum.mc_connects,
              (long long)sum.inflight, n, (long long)sum.connections,
              (unsigned long long)sum.conn_accepted, (unsigned long long)sum.conn_rejected);
    if (n > 0 && slots[0].backend[0] != '\0')
        FP_APPEND("# TYPE fastpath_info gauge\nfastpath_info{backend=\"%.15s\"} 1\n", slots[0].backend);
    FP_APPEND("# HELP fastpath_memcached_seconds memcached round trip of answered gets.\n"
              "# TYPE fastpath_memcached_seconds histogram\n");
    for (int i = 0; i < FP_LAT_BUCKETS - 1; i++)
        FP_APPEND("fastpath_memcached_seconds_bucket{le=\"%g\"} %llu\n", fp_lat_bounds[i],
                  (unsigned long long)sum.lat_bucket[i]);
    FP_APPEND("fastpath_memcached_seconds_bucket{le=\"+Inf\"} %llu\n"
              "fastpath_memcached_seconds_sum %.6f\nfastpath_memcached_seconds_count %llu\n",
              (unsigned long long)sum.lat_bucket[FP_LAT_BUCKETS - 1], (double)sum.lat_sum_us / 1e6,
              (unsigned long long)sum.lat_count);
    return len;
}

/* ---- lifecycle -------------------------------------------------------------------- */

/* Stop accepting; in-flight requests finish (at most --drain-timeout), then the loop ends. */
static void _begin_drain(fp_server_t *srv)
{
    struct timeval grace = {srv->cfg->drain_timeout_s, 0};

    srv->stopping = 1;
    if (srv->listener != NULL && evconnlistener_disable(srv->listener) != 0)
        fp_log("cannot stop accepting; connections that still arrive are closed at once");
    if (event_base_loopexit(srv->base, &grace) != 0) {
        /* no deadline for the drain: stop now; fp_server_fini answers waiting requests 503 */
        fp_log("cannot schedule the end of the drain; stopping without draining");
        _leave_loop(srv);
        return;
    }
    fp_conn_close_idle(srv);
    fp_maybe_finish_drain(srv);
}

static void _on_stop_signal(evutil_socket_t sig, short what, void *arg)
{
    fp_server_t *srv = arg;
    if (!srv->stopping)
        _begin_drain(srv);
}

void fp_server_fail(fp_server_t *srv, const char *why)
{
    if (srv->fatal == NULL)
        srv->fatal = why;
    fp_log("%s: draining, then this worker exits (its parent starts a new one)", why);
    if (!srv->stopping)
        _begin_drain(srv);
}

static int _add_pause_timer(fp_server_t *srv)
{
    struct timeval pause = {0, ACCEPT_PAUSE_US};
    return event_add(srv->pause_accept, &pause);
}

void fp_server_pause_accepting(fp_server_t *srv, struct evconnlistener *l)
{
    int err = EVUTIL_SOCKET_ERROR();
    if (_add_pause_timer(srv) != 0) {
        /* nothing would turn accepting back on: keep it on (the next failed accept tries again) */
        fp_log("accept failed (%s) and no pause can be scheduled; accepting on", strerror(err));
        return;
    }
    if (evconnlistener_disable(l) != 0)
        fp_log("accept failed (%s) and accepting cannot be paused", strerror(err));
    else
        fp_log("accept failed (%s); accepting again in %d ms", strerror(err), ACCEPT_PAUSE_US / 1000);
}

static int _enable(struct evconnlistener *l)
{
    return l == NULL ? 0 : evconnlistener_enable(l);
}

/* A worker that never accepts again would sit idle while the kernel still queues connections
 * for it (SO_REUSEPORT): re-enabling is retried every 100 ms, and after ACCEPT_RETRIES failures
 * the worker drains and exits so that its parent starts a new one. */
static void _on_accept_pause_over(evutil_socket_t fd, short what, void *arg)
{
    fp_server_t *srv = arg;
    if (srv->stopping)
        return;
    if (_enable(srv->listener) == 0 && _enable(srv->admin_listener) == 0) {
        srv->accept_retries = 0;
        return;
    }
    if (srv->accept_retries++ == 0)
        fp_log("cannot resume accepting (%s); retrying for %d ms", strerror(EVUTIL_SOCKET_ERROR()),
               ACCEPT_RETRIES * ACCEPT_PAUSE_US / 1000);
    if (srv->accept_retries > ACCEPT_RETRIES || _add_pause_timer(srv) != 0)
        fp_server_fail(srv, "cannot resume accepting connections");
}

/* (snprintf's result is not needed here and below: cutting a message short at the buffer's
 * size is what is meant) */
static int _fail(char *err, size_t err_len, const char *what)
{
    snprintf(err, err_len, "%s", what);
    return -1;
}

static struct evconnlistener *_listen(fp_server_t *srv, int fd, evconnlistener_cb cb)
{
    /* the socket is Python's (bound, listening): no LEV_OPT_CLOSE_ON_FREE.  Created disabled
     * and enabled here, because evconnlistener_new ignores a failure to enable it.  Backlog 0:
     * "already listening" -- -1 would call listen(fd, 128) again and shrink Python's 4096, and a
     * burst of new upstream connections from nginx would then fail (EAGAIN on a unix socket). */
    struct evconnlistener *l = evconnlistener_new(srv->base, cb, srv, LEV_OPT_REUSEABLE | LEV_OPT_DISABLED, 0, fd);
    if (l == NULL)
        return NULL;
    evconnlistener_set_error_cb(l, fp_conn_accept_error);
    if (evconnlistener_enable(l) != 0) {
        evconnlistener_free(l);
        return NULL;
    }
    return l;
}

/* Everything but the signals and the loop: event base, memcached clients, listeners (when
 * cfg->listen_fd >= 0; the fuzz target adopts sockets itself).  On failure, err says why and
 * fp_server_fini must still be called. */
int fp_server_init(fp_server_t *srv, const fp_config_t *cfg, char *err, size_t err_len)
{
    struct event_config *ecfg;
    struct timeval idle = {cfg->idle_timeout_s, 0};

    memset(srv, 0, sizeof(*srv));
    srv->cfg = cfg;
    srv->st = &cfg->stats[cfg->worker_index];
    srv->st->pid = (uint64_t)getpid();
    srv->buf_cap = cfg->max_headers + 1024;
    fp_conn_settings_init(&srv->http_settings);
    if (!_clocks_work())
        return _fail(err, err_len, "clock_gettime: CLOCK_MONOTONIC or CLOCK_MONOTONIC_COARSE unavailable");
    if (fp_hmac_prepare(&srv->hmac, cfg->secret, cfg->secret_len) != 0)
        return _fail(err, err_len, "cannot prepare the HMAC key (libcrypto SHA-256 failed)");
    if (cfg->n_nodes <= 0 || cfg->n_nodes > FP_MAX_SERVERS)
        return _fail(err, err_len, "need 1..64 memcached servers");
    if (cfg->max_connections <= 0)
        return _fail(err, err_len, "max_connections must be positive");

    ecfg = event_config_new();
    if (ecfg == NULL)
        return _fail(err, err_len, "event_config_new failed");
    for (int i = 0; i < 4 && cfg->backend_avoid[i] != NULL; i++) {
        if (event_config_avoid_method(ecfg, cfg->backend_avoid[i]) != 0) {
            event_config_free(ecfg);
            return _fail(err, err_len, "event_config_avoid_method failed (out of memory)");
        }
    }
    srv->base = event_base_new_with_config(ecfg);
    event_config_free(ecfg);
    if (srv->base == NULL)
        return _fail(err, err_len, "cannot create an event base (backend unavailable?)");
    /* every connection shares one timeout: libevent keeps them in an O(1) queue, not a heap */
    snprintf(srv->st->backend, sizeof(srv->st->backend), "%s", event_base_get_method(srv->base));
    srv->idle_tv = event_base_init_common_timeout(srv->base, &idle);
    srv->pause_accept = evtimer_new(srv->base, _on_accept_pause_over, srv);
    if (srv->idle_tv == NULL || srv->pause_accept == NULL)
        return _fail(err, err_len, "cannot set up timers");

    if (fp_mc_pool_init(&srv->mc, srv->base, srv->st, cfg, err, err_len) < 0)
        return -1;
    if (cfg->listen_fd >= 0) {
        srv->listener = _listen(srv, cfg->listen_fd, fp_conn_accept);
        if (srv->listener == NULL)
            return _fail(err, err_len, "cannot accept on the listening socket");
    }
    if (cfg->admin_fd >= 0) {
        srv->admin_listener = _listen(srv, cfg->admin_fd, fp_conn_admin_accept);
        if (srv->admin_listener == NULL)
            return _fail(err, err_len, "cannot accept on the admin socket");
    }
    return 0;
}

void fp_server_fini(fp_server_t *srv)
{
    if (srv->listener != NULL)
        evconnlistener_free(srv->listener);
    if (srv->admin_listener != NULL)
        evconnlistener_free(srv->admin_listener);
    srv->listener = srv->admin_listener = NULL;
    srv->stopping = 1;
    fp_mc_pool_fini(&srv->mc);       /* waiting requests get 503 ("Connection: close") */
    fp_conn_close_all(srv);
    fp_buf_pool_free(srv);
    if (srv->pause_accept != NULL)
        event_free(srv->pause_accept);
    if (srv->sig_term != NULL)
        event_free(srv->sig_term);
    if (srv->sig_int != NULL)
        event_free(srv->sig_int);
    if (srv->base != NULL)
        event_base_free(srv->base);
    srv->pause_accept = srv->sig_term = srv->sig_int = NULL;
    srv->base = NULL;
}

int fp_server_run(const fp_config_t *cfg, char *err, size_t err_len)
{
    fp_server_t srv;
    int rc = -1;

    if (fp_server_init(&srv, cfg, err, err_len) < 0)
        goto out;
    srv.sig_term = evsignal_new(srv.base, SIGTERM, _on_stop_signal, &srv);
    srv.sig_int = evsignal_new(srv.base, SIGINT, _on_stop_signal, &srv);
    if (srv.sig_term == NULL || srv.sig_int == NULL ||
        event_add(srv.sig_term, NULL) < 0 || event_add(srv.sig_int, NULL) < 0) {
        _fail(err, err_len, "cannot install signal events");
        goto out;
    }
    if (event_base_dispatch(srv.base) < 0) {
        _fail(err, err_len, "event loop failed");
        goto out;
    }
    if (srv.fatal != NULL) {
        _fail(err, err_len, srv.fatal);
        goto out;
    }
    rc = 0;
out:
    fp_server_fini(&srv);
    return rc;
}
