/* fastpath worker lifecycle: event base, listeners, signals, draining.
 *
 * The request path lives in fp_conn.c (connections; fp_http.c, fp_route.c and fp_reply.c below
 * it) and fp_mc.c (memcached); this file calls into them and they call nothing here: the end of
 * a drain comes back through srv->drained.  A worker accepts on a table of listeners
 * (srv->listeners: a descriptor and the kind of its connections), one row per configured socket.
 * Everything runs on one event base per worker process, without the GIL.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
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
/* Leave the loop once the current callbacks are done.  loopexit needs an allocation
 * (event_base_once); loopbreak, its fallback, needs none and fails only without a base. */
static void _leave_loop(fp_server_t *srv)
{
    if (event_base_loopexit(srv->base, NULL) != 0 && event_base_loopbreak(srv->base) != 0)
        fp_log("cannot leave the event loop");
}

static void _maybe_finish_drain(fp_server_t *srv)
{
    if (srv->stopping && srv->n_conns <= 0)
        _leave_loop(srv);
}

/* srv->drained: the last connection closed while stopping */
static void _on_drained(void *arg)
{
    _leave_loop(arg);
}

/* ---- lifecycle -------------------------------------------------------------------- */

/* Stop accepting; in-flight requests finish (at most --drain-timeout), then the loop ends. */
static void _begin_drain(fp_server_t *srv)
{
    struct timeval grace = {srv->cfg->drain_timeout_s, 0};

    srv->stopping = 1;
    for (int i = 0; i < srv->n_listeners; i++)
        if (srv->listeners[i].drains && evconnlistener_disable(srv->listeners[i].ev) != 0)
            fp_log("cannot stop accepting; connections that still arrive are closed at once");
    if (event_base_loopexit(srv->base, &grace) != 0) {
        /* no deadline for the drain: stop now; fp_server_fini answers waiting requests 503 */
        fp_log("cannot schedule the end of the drain; stopping without draining");
        _leave_loop(srv);
        return;
    }
    fp_conn_close_idle(srv);
    _maybe_finish_drain(srv);
}

static void _on_stop_signal(evutil_socket_t sig, short what, void *arg)
{
    fp_server_t *srv = arg;
    if (!srv->stopping)
        _begin_drain(srv);
}

static void _server_fail(fp_server_t *srv, const char *why)
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

/* accept() failed (EMFILE, ENFILE, ENOMEM...) on l: stop accepting on it for a moment instead of
 * spinning (_on_accept_pause_over resumes it). */
static void _on_accept_error(struct evconnlistener *l, void *arg)
{
    fp_listener_t *ls = arg;
    fp_server_t *srv = ls->srv;
    int err = EVUTIL_SOCKET_ERROR();
    srv->st->conn_rejected++;
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

/* Every listener accepts (again).  -1 if one cannot. */
static int _enable_all(fp_server_t *srv)
{
    int rc = 0;
    for (int i = 0; i < srv->n_listeners; i++)
        if (evconnlistener_enable(srv->listeners[i].ev) != 0)
            rc = -1;
    return rc;
}

/* A worker that never accepts again would sit idle while the kernel still queues connections
 * for it (SO_REUSEPORT): re-enabling is retried every 100 ms, and after ACCEPT_RETRIES failures
 * the worker drains and exits so that its parent starts a new one. */
static void _on_accept_pause_over(evutil_socket_t fd, short what, void *arg)
{
    fp_server_t *srv = arg;
    if (srv->stopping)
        return;
    if (_enable_all(srv) == 0) {
        srv->accept_retries = 0;
        return;
    }
    if (srv->accept_retries++ == 0)
        fp_log("cannot resume accepting (%s); retrying for %d ms", strerror(EVUTIL_SOCKET_ERROR()),
               ACCEPT_RETRIES * ACCEPT_PAUSE_US / 1000);
    if (srv->accept_retries > ACCEPT_RETRIES || _add_pause_timer(srv) != 0)
        _server_fail(srv, "cannot resume accepting connections");
}

/* (snprintf's result is not needed here and below: cutting a message short at the buffer's
 * size is what is meant) */
static int _init_fail(char *err, size_t err_len, const char *what)
{
    snprintf(err, err_len, "%s", what);
    return -1;
}

/* A TCP listener: Nagle off on the listening socket, which accepted sockets inherit on Linux
 * (one setsockopt per worker instead of one per connection), and accept() only once a
 * connection's first bytes have come (TCP_DEFER_ACCEPT, nginx's `listen ... deferred`), so that
 * fp_conn.c reads a new connection at once instead of arming it and waiting for epoll to say
 * what is already known.  A connection that sends nothing is accepted when the deferral runs
 * out, and the idle timeout applies from then.  A unix socket has neither (no Nagle; a
 * connection is read when epoll reports it).  Any failure keeps the per-connection way. */
static void _tune_listener(fp_listener_t *ls)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int one = 1, defer_s = 1;

    ls->nodelay = FP_NODELAY_SET;    /* unless known otherwise below */
    ls->read_on_accept = 0;
    if (getsockname(ls->fd, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) {
        ls->nodelay = FP_NODELAY_NONE;
        return;
    }
    ls->nodelay = setsockopt(ls->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0 ? FP_NODELAY_CHECK
                                                                                         : FP_NODELAY_SET;
    ls->read_on_accept = setsockopt(ls->fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer_s, sizeof(defer_s)) == 0;
}

/* A listener's options */
enum {
    _LISTEN_TUNED = 1,               /* _tune_listener: Nagle off once, accept deferred */
    _LISTEN_DRAINS = 2               /* stops accepting when the worker drains */
};

/* Accept on fd, for connections of kind: a new row of srv->listeners.  -1 on failure. */
static int _listen(fp_server_t *srv, int fd, fp_conn_kind_t kind, int options)
{
    fp_listener_t *ls;

    if (srv->n_listeners >= FP_LISTENERS_MAX)
        return -1;
    ls = &srv->listeners[srv->n_listeners];
    ls->srv = srv;
    ls->fd = fd;
    ls->kind = (uint8_t)kind;
    ls->nodelay = FP_NODELAY_SET;    /* one setsockopt per connection, unless tuned */
    ls->read_on_accept = 0;
    ls->drains = (options & _LISTEN_DRAINS) != 0;
    if (options & _LISTEN_TUNED)
        _tune_listener(ls);
    /* the socket is Python's (bound, listening): no LEV_OPT_CLOSE_ON_FREE.  Created disabled
     * and enabled here, because evconnlistener_new ignores a failure to enable it.  Backlog 0:
     * "already listening" -- -1 would call listen(fd, 128) again and shrink Python's backlog, and a
     * burst of new upstream connections from nginx would then fail (EAGAIN on a unix socket). */
    ls->ev = evconnlistener_new(srv->base, fp_conn_accept, ls, LEV_OPT_REUSEABLE | LEV_OPT_DISABLED, 0, fd);
    if (ls->ev == NULL)
        return -1;
    evconnlistener_set_error_cb(ls->ev, _on_accept_error);
    if (evconnlistener_enable(ls->ev) != 0) {
        evconnlistener_free(ls->ev);
        ls->ev = NULL;
        return -1;
    }
    srv->n_listeners++;
    return 0;
}

/* Check one well-formed token and hash one body now, so that each worker faults in the code a
 * request runs (libcrypto's SHA-256, about 100 KB of shared pages per process) at start and
 * not under its first request: the results are not used. */
static void _warm_up(fp_server_t *srv)
{
    static const char token[] = "v1.1.1.1.0000000000000000000000000000000000000000000000000000000000000000";
    char tag[FP_ETAG_LEN];
    fp_token_t t;

    (void)fp_token_check(&srv->hmac, token, sizeof(token) - 1, 0, &t);
    (void)fp_etag_of("", 0, tag);
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
    /* A restarted worker takes the slot as the one before it left it: the gauges counted what
     * died with that worker (its connections, streams, held polls, gets), so they start again
     * from 0; the counters go on (a *_total never goes down). */
#define FP_X_ZERO(field, metric, help) srv->st->field = 0;
    FP_GAUGES(FP_X_ZERO)
#undef FP_X_ZERO
    fp_notify_init(&srv->notify, &srv->waits, srv->st);      /* no source yet: fini is safe */
    srv->buf_cap = cfg->max_headers + 1024;
    fp_slab_init(&srv->conn_slab, FP_CONN_EV_OFFSET + event_get_struct_event_size(), FP_CONN_SLAB_CHUNK);
    srv->drained = _on_drained;
    srv->drained_arg = srv;
    fp_http_settings_init(&srv->http_settings);
    if (!fp_clocks_work())
        return _init_fail(err, err_len, "clock_gettime: CLOCK_MONOTONIC or CLOCK_MONOTONIC_COARSE unavailable");
    if (fp_hmac_prepare(&srv->hmac, cfg->secret, cfg->secret_len) != 0)
        return _init_fail(err, err_len, "cannot prepare the HMAC key (libcrypto SHA-256 failed)");
    _warm_up(srv);
    if (cfg->n_nodes <= 0 || cfg->n_nodes > FP_MAX_SERVERS)
        return _init_fail(err, err_len, "need 1..64 memcached servers");
    if (cfg->max_connections <= 0)
        return _init_fail(err, err_len, "max_connections must be positive");

    ecfg = event_config_new();
    if (ecfg == NULL)
        return _init_fail(err, err_len, "event_config_new failed");
    for (int i = 0; i < 4 && cfg->backend_avoid[i] != NULL; i++) {
        if (event_config_avoid_method(ecfg, cfg->backend_avoid[i]) != 0) {
            event_config_free(ecfg);
            return _init_fail(err, err_len, "event_config_avoid_method failed (out of memory)");
        }
    }
    srv->base = event_base_new_with_config(ecfg);
    event_config_free(ecfg);
    if (srv->base == NULL)
        return _init_fail(err, err_len, "cannot create an event base (backend unavailable?)");
    /* every connection shares one timeout: libevent keeps them in an O(1) queue, not a heap */
    snprintf(srv->st->backend, sizeof(srv->st->backend), "%s", event_base_get_method(srv->base));
    srv->idle_tv = event_base_init_common_timeout(srv->base, &idle);
    srv->pause_accept = evtimer_new(srv->base, _on_accept_pause_over, srv);
    if (srv->idle_tv == NULL || srv->pause_accept == NULL)
        return _init_fail(err, err_len, "cannot set up timers");

    if (fp_mc_pool_init(&srv->mc, srv->base, srv->st, cfg, err, err_len) < 0)
        return -1;
    srv->rng = ((uint64_t)getpid() << 32) ^ (uint64_t)fp_now_us() ^ 0x9e3779b97f4a7c15u;
    if (fp_wait_init(&srv->waits, srv->base, &srv->mc, srv->st, cfg->reread_interval_s,
                     cfg->reread_rate / (cfg->n_workers > 0 ? cfg->n_workers : 1)) < 0)
        return _init_fail(err, err_len, "cannot set up the wait table (out of memory)");
    if (cfg->notify_dir != NULL &&
        fp_notify_listen_unix(&srv->notify, srv->base, cfg->notify_dir, cfg->worker_index, err, err_len) < 0)
        return -1;
    if (cfg->notify_udp_host != NULL &&
        fp_notify_listen_udp(&srv->notify, srv->base, cfg->notify_udp_host,
                             cfg->notify_udp_port + cfg->worker_index, err, err_len) < 0)
        return -1;
    /* the listeners: polls (which stop accepting when the worker drains), /metrics, the edge */
    if (cfg->listen_fd >= 0 && _listen(srv, cfg->listen_fd, FP_CONN_POLL, _LISTEN_TUNED | _LISTEN_DRAINS) < 0)
        return _init_fail(err, err_len, "cannot accept on the listening socket");
    if (cfg->admin_fd >= 0 && _listen(srv, cfg->admin_fd, FP_CONN_ADMIN, 0) < 0)
        return _init_fail(err, err_len, "cannot accept on the admin socket");
    /* the edge: polls from clients straight (docs/contract.md section 10), drained as polls */
    if (cfg->edge_fd >= 0 && _listen(srv, cfg->edge_fd, FP_CONN_EDGE, _LISTEN_TUNED | _LISTEN_DRAINS) < 0)
        return _init_fail(err, err_len, "cannot accept on the edge socket");
    return 0;
}

void fp_server_fini(fp_server_t *srv)
{
    for (int i = 0; i < srv->n_listeners; i++)
        evconnlistener_free(srv->listeners[i].ev);
    srv->n_listeners = 0;
    srv->stopping = 1;
    fp_mc_pool_fini(&srv->mc);       /* waiting requests get 503 ("Connection: close") */
    fp_notify_fini(&srv->notify);
    fp_conn_close_all(srv);          /* held polls leave the wait table */
    fp_limit_fini(&srv->limits);     /* ... and their counts (every one was given back) */
    fp_wait_fini(&srv->waits);
    fp_buf_pool_free(srv);
    fp_slab_fini(&srv->conn_slab);   /* every connection is closed */
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

/* event_base_dispatch, one pass at a time, counting the passes: each is one wait for the backend
 * (epoll_wait, poll...), so fastpath_loop_events_total / fastpath_loop_waits_total is the number
 * of ready client events per wait (bench/atr.py).  0 when the loop was asked to end, -1 on
 * failure. */
static int _run_loop(fp_server_t *srv)
{
    for (;;) {
        int rc = event_base_loop(srv->base, EVLOOP_ONCE);
        if (rc < 0)
            return -1;
        if (rc == 1)
            return 0;                /* nothing left to wait for */
        srv->st->loop_waits++;
        if (event_base_got_exit(srv->base) || event_base_got_break(srv->base))
            return 0;
    }
}

static int _serve(const fp_config_t *cfg, char *err, size_t err_len)
{
    fp_server_t srv;
    int rc = -1;

    if (fp_server_init(&srv, cfg, err, err_len) < 0)
        goto out;
    srv.sig_term = evsignal_new(srv.base, SIGTERM, _on_stop_signal, &srv);
    srv.sig_int = evsignal_new(srv.base, SIGINT, _on_stop_signal, &srv);
    if (srv.sig_term == NULL || srv.sig_int == NULL ||
        event_add(srv.sig_term, NULL) < 0 || event_add(srv.sig_int, NULL) < 0) {
        _init_fail(err, err_len, "cannot install signal events");
        goto out;
    }
    if (_run_loop(&srv) < 0) {
        _init_fail(err, err_len, "event loop failed");
        goto out;
    }
    if (srv.fatal != NULL) {
        _init_fail(err, err_len, srv.fatal);
        goto out;
    }
    rc = 0;
out:
    fp_server_fini(&srv);
    return rc;
}

typedef struct {
    const fp_config_t *cfg;
    char *err;
    size_t err_len;
    int rc;
} _serve_args_t;

static void *_serve_thread(void *arg)
{
    _serve_args_t *a = arg;
    a->rc = _serve(a->cfg, a->err, a->err_len);
    return NULL;
}

/* The worker serves on a thread of its own, and the calling thread only waits for it.  A worker
 * is forked from the Python supervisor, and malloc in its first thread hands out the free
 * chunks of the heap it inherited: each small object that lands in one (libevent's record of
 * every descriptor, the wait table's buckets, read buffers) copies a page the supervisor and
 * the other workers still share, scattered one or two objects a page.  glibc gives a new
 * thread a malloc arena of its own, mapped after the fork, where the same objects sit packed.
 * bench/longpoll.py measures it (docs/benchmarks.md).  Without a thread, it serves here. */
int fp_server_run(const fp_config_t *cfg, char *err, size_t err_len)
{
    _serve_args_t a = {cfg, err, err_len, -1};
    pthread_t thread;

    if (pthread_create(&thread, NULL, _serve_thread, &a) != 0)
        return _serve(cfg, err, err_len);
    if (pthread_join(thread, NULL) != 0)
        return _init_fail(err, err_len, "cannot wait for the serving thread");
    return a.rc;
}
