/* fastpath request path: evhttp in front, a non-blocking pipelined memcached client behind.
 *
 * Everything here runs on one event base per worker process, without the GIL.  Request data is
 * handled as (pointer, length): header values come NUL-terminated from evhttp, bounded by
 * evhttp_set_max_headers_size, and are measured with strnlen against that bound.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/util.h>

#include "fp_server.h"
#include "fp_token.h"

#define FP_KEY_CAP 80
#define FP_MC_LINE_MAX 512
#define FP_MC_MAX_PENDING 65536
#define FP_BACKOFF_MIN_MS 50
#define FP_BACKOFF_MAX_MS 1000
#define FP_HEADER_VALUE_MAX 8192

const double fp_lat_bounds[FP_LAT_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 1e300};

typedef struct fp_pending {
    struct fp_pending *next;
    struct evhttp_request *req;
    int64_t start_us, deadline_us;
    size_t key_len;
    char key[FP_KEY_CAP];
} fp_pending_t;

typedef enum { MC_DOWN, MC_CONNECTING, MC_UP } fp_mc_state_t;

struct fp_server;

typedef struct {
    struct fp_server *srv;
    int index;
    struct bufferevent *bev;
    fp_mc_state_t state;
    int64_t retry_at_us;
    int backoff_ms;
    fp_pending_t *head, *tail;
    int n_pending;
    struct event *timer;
    struct sockaddr_storage addr;
    int addr_len;
} fp_mc_t;

typedef struct fp_server {
    const fp_config_t *cfg;
    struct event_base *base;
    struct evhttp *http, *admin;
    struct evhttp_bound_socket *bound;
    fp_mc_t mc[FP_MAX_SERVERS];
    fp_pending_t *free_list;
    fp_stats_t *st;
    fp_hmac_key_t hmac;
    int stopping;
    struct event *sig_term, *sig_int;
} fp_server_t;

/* ---- small helpers ---------------------------------------------------------------------- */

static int64_t _now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static fp_pending_t *_pending_get(fp_server_t *srv)
{
    fp_pending_t *p = srv->free_list;
    if (p != NULL) {
        srv->free_list = p->next;
        return p;
    }
    return malloc(sizeof(*p));      /* grows to the peak in-flight count, then reused */
}

static void _pending_put(fp_server_t *srv, fp_pending_t *p)
{
    p->next = srv->free_list;
    srv->free_list = p;
}

static int _status_slot(int code)
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
    case 503: return FP_ST_503;
    }
    return FP_ST_OTHER;
}

static void _maybe_finish_drain(fp_server_t *srv)
{
    if (srv->stopping && srv->st->inflight <= 0)
        event_base_loopexit(srv->base, NULL);
}

/* Every answer leaves through here: status counters and the headers of docs/contract.md s. 6.
 * body may be NULL (no body); cache is "HIT", "MISS" or NULL. */
static void _reply(fp_server_t *srv, struct evhttp_request *req, int code, const char *reason,
                   struct evbuffer *body, const char *cache)
{
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);
    if (code != 204)
        evhttp_add_header(out, "Content-Type", "application/json");
    evhttp_add_header(out, "Cache-Control", "no-store");
    if (cache != NULL)
        evhttp_add_header(out, "X-Cache", cache);
    srv->st->status[_status_slot(code)]++;
    evhttp_send_reply(req, code, reason, code == 204 ? NULL : body);
}

static void _reply_json_error(fp_server_t *srv, struct evhttp_request *req, int code,
                              const char *reason, const char *message, const char *cache)
{
    struct evbuffer *body = evbuffer_new();
    if (body == NULL) {
        srv->st->status[_status_slot(code)]++;
        evhttp_send_error(req, code, reason);
        return;
    }
    /* message is always one of our literals, never request data */
    evbuffer_add(body, "{\"error\":\"", 10);
    evbuffer_add(body, message, strnlen(message, 128));
    evbuffer_add(body, "\"}", 2);
    _reply(srv, req, code, reason, body, cache);
    evbuffer_free(body);
}

/* ---- the memcached client --------------------------------------------------------------- */

static void _mc_read_cb(struct bufferevent *bev, void *arg);
static void _mc_event_cb(struct bufferevent *bev, short what, void *arg);

static void _mc_record_latency(fp_server_t *srv, int64_t start_us)
{
    int64_t us = _now_us() - start_us;
    double s = (double)us / 1e6;
    for (int i = 0; i < FP_LAT_BUCKETS; i++)
        if (s <= fp_lat_bounds[i])
            srv->st->lat_bucket[i]++;
    srv->st->lat_sum_us += (uint64_t)(us > 0 ? us : 0);
    srv->st->lat_count++;
}

/* Remove the head request and hand its memory back; the caller has replied to it. */
static fp_pending_t *_mc_pop(fp_mc_t *mc)
{
    fp_pending_t *p = mc->head;
    if (p == NULL)
        return NULL;
    mc->head = p->next;
    if (mc->head == NULL)
        mc->tail = NULL;
    mc->n_pending--;
    mc->srv->st->inflight--;
    return p;
}

static void _mc_arm_timer(fp_mc_t *mc)
{
    if (mc->head == NULL) {
        evtimer_del(mc->timer);
        return;
    }
    int64_t left = mc->head->deadline_us - _now_us();
    if (left < 0)
        left = 0;
    struct timeval tv = {(time_t)(left / 1000000), (suseconds_t)(left % 1000000)};
    evtimer_add(mc->timer, &tv);
}

/* Connection lost, timed out or out of step: every waiting request gets 503 (nginx falls back
 * to Django), and the server is retried after a backoff that doubles up to a second. */
static void _mc_reset(fp_mc_t *mc, int is_timeout)
{
    fp_server_t *srv = mc->srv;
    fp_pending_t *p;

    if (mc->bev != NULL) {
        bufferevent_free(mc->bev);
        mc->bev = NULL;
    }
    mc->state = MC_DOWN;
    mc->retry_at_us = _now_us() + (int64_t)mc->backoff_ms * 1000;
    mc->backoff_ms = mc->backoff_ms * 2 > FP_BACKOFF_MAX_MS ? FP_BACKOFF_MAX_MS : mc->backoff_ms * 2;
    if (is_timeout)
        srv->st->mc_timeouts++;
    else
        srv->st->mc_errors++;
    while ((p = _mc_pop(mc)) != NULL) {
        _reply_json_error(srv, p->req, 503, "Service Unavailable", "memcached unavailable", "MISS");
        _pending_put(srv, p);
    }
    evtimer_del(mc->timer);
    _maybe_finish_drain(srv);
}

static int _mc_connect(fp_mc_t *mc)
{
    fp_server_t *srv = mc->srv;
    mc->bev = bufferevent_socket_new(srv->base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (mc->bev == NULL)
        return -1;
    bufferevent_setcb(mc->bev, _mc_read_cb, NULL, _mc_event_cb, mc);
    if (bufferevent_enable(mc->bev, EV_READ | EV_WRITE) < 0 ||
        bufferevent_socket_connect(mc->bev, (struct sockaddr *)&mc->addr, mc->addr_len) < 0) {
        bufferevent_free(mc->bev);
        mc->bev = NULL;
        return -1;
    }
    mc->state = MC_CONNECTING;
    srv->st->mc_connects++;
    return 0;
}

static void _mc_event_cb(struct bufferevent *bev, short what, void *arg)
{
    fp_mc_t *mc = arg;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        evutil_socket_t fd = bufferevent_getfd(bev);
        if (fd >= 0)
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        mc->state = MC_UP;
        return;
    }
    if (what & (BEV_EVENT_ERROR | BEV_EVENT_EOF | BEV_EVENT_TIMEOUT))
        _mc_reset(mc, 0);
}

static void _mc_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    fp_mc_t *mc = arg;
    if (mc->head != NULL && mc->head->deadline_us <= _now_us())
        _mc_reset(mc, 1);
    else
        _mc_arm_timer(mc);
}

/* Parse "<digits>" in line[*i..len) as a size; -1 when absent or too large. */
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

/* One reply to the head request, if it is complete in the input buffer.
 *   END\r\n                                         -> miss
 *   VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n -> hit (empty data: nothing new)
 * Returns 1 when a request was answered, 0 when more input is needed, -1 on a protocol error. */
static int _mc_parse_one(fp_mc_t *mc, struct evbuffer *in)
{
    fp_server_t *srv = mc->srv;
    fp_pending_t *p = mc->head;
    char line[FP_MC_LINE_MAX];
    size_t eol_len = 0, line_len, i;
    struct evbuffer_ptr eol = evbuffer_search_eol(in, NULL, &eol_len, EVBUFFER_EOL_CRLF_STRICT);

    if (eol.pos < 0)
        return evbuffer_get_length(in) > FP_MC_LINE_MAX ? -1 : 0;
    if (p == NULL || (size_t)eol.pos >= sizeof(line))
        return -1;
    line_len = (size_t)eol.pos;
    if (evbuffer_copyout(in, line, line_len) != (ev_ssize_t)line_len)
        return -1;

    if (line_len == 3 && memcmp(line, "END", 3) == 0) {
        evbuffer_drain(in, line_len + eol_len);
        _mc_record_latency(srv, p->start_us);
        srv->st->misses++;
        _reply_json_error(srv, p->req, 404, "Not Found", "miss", "MISS");
        return 1;
    }
    if (line_len < 6 || memcmp(line, "VALUE ", 6) != 0)
        return -1;                                 /* SERVER_ERROR, ERROR, garbage: out of step */
    i = 6;
    /* the key must be the one we asked for: never another user's entry */
    if (line_len - i < p->key_len + 1 || memcmp(line + i, p->key, p->key_len) != 0 ||
        line[i + p->key_len] != ' ')
        return -1;
    i += p->key_len + 1;
    if (_parse_size(line, line_len, &i) < 0 || i >= line_len || line[i] != ' ')
        return -1;
    i++;
    int64_t n_bytes = _parse_size(line, line_len, &i);
    if (n_bytes < 0)
        return -1;
    while (i < line_len && line[i] == ' ')   /* "gets"-style trailing fields are not expected */
        i++;
    if (i != line_len)
        return -1;
    size_t need = line_len + eol_len + (size_t)n_bytes + 2 + 5;
    if (evbuffer_get_length(in) < need)
        return 0;

    evbuffer_drain(in, line_len + eol_len);
    struct evbuffer *body = evbuffer_new();
    if (body == NULL)
        return -1;
    if (evbuffer_remove_buffer(in, body, (size_t)n_bytes) != (int)n_bytes) {
        evbuffer_free(body);
        return -1;
    }
    char tail[7];
    if (evbuffer_remove(in, tail, 7) != 7 || memcmp(tail, "\r\nEND\r\n", 7) != 0) {
        evbuffer_free(body);
        return -1;
    }
    _mc_record_latency(srv, p->start_us);
    if (n_bytes == 0) {
        srv->st->empty_hits++;
        _reply(srv, p->req, 204, "No Content", NULL, "HIT");
    } else {
        srv->st->hits++;
        _reply(srv, p->req, 200, "OK", body, "HIT");
    }
    evbuffer_free(body);
    return 1;
}

static void _mc_read_cb(struct bufferevent *bev, void *arg)
{
    fp_mc_t *mc = arg;
    fp_server_t *srv = mc->srv;
    struct evbuffer *in = bufferevent_get_input(bev);
    int r;

    while (evbuffer_get_length(in) > 0) {
        if (mc->head == NULL) {            /* bytes nobody asked for */
            _mc_reset(mc, 0);
            return;
        }
        r = _mc_parse_one(mc, in);
        if (r < 0) {
            _mc_reset(mc, 0);
            return;
        }
        if (r == 0)
            break;
        _pending_put(srv, _mc_pop(mc));
        mc->backoff_ms = FP_BACKOFF_MIN_MS;
    }
    _mc_arm_timer(mc);
    _maybe_finish_drain(srv);
}

/* Queue a get for req on the server that owns key; answers 503 at once if that server is in
 * its backoff window. */
static void _mc_get(fp_server_t *srv, struct evhttp_request *req, const char *key, size_t key_len)
{
    int idx = fp_rendezvous_pick(srv->cfg->nodes, srv->cfg->n_nodes, key, key_len);
    fp_mc_t *mc;
    fp_pending_t *p;
    int64_t now = _now_us();

    if (idx < 0 || key_len > FP_KEY_CAP) {
        _reply_json_error(srv, req, 400, "Bad Request", "bad key", NULL);
        return;
    }
    mc = &srv->mc[idx];
    if (mc->state == MC_DOWN) {
        if (now >= mc->retry_at_us && _mc_connect(mc) < 0) {
            mc->retry_at_us = now + (int64_t)mc->backoff_ms * 1000;
            srv->st->mc_errors++;
        }
        if (mc->state == MC_DOWN) {
            _reply_json_error(srv, req, 503, "Service Unavailable", "memcached unavailable", "MISS");
            return;
        }
    }
    if (mc->n_pending >= FP_MC_MAX_PENDING || (p = _pending_get(srv)) == NULL) {
        _reply_json_error(srv, req, 503, "Service Unavailable", "overloaded", "MISS");
        return;
    }
    p->next = NULL;
    p->req = req;
    p->start_us = now;
    p->deadline_us = now + (int64_t)srv->cfg->timeout_ms * 1000;
    memcpy(p->key, key, key_len);
    p->key_len = key_len;

    struct evbuffer *out = bufferevent_get_output(mc->bev);
    if (evbuffer_add(out, "get ", 4) < 0 || evbuffer_add(out, key, key_len) < 0 ||
        evbuffer_add(out, "\r\n", 2) < 0) {
        _pending_put(srv, p);
        _mc_reset(mc, 0);
        _reply_json_error(srv, req, 503, "Service Unavailable", "memcached unavailable", "MISS");
        return;
    }
    if (mc->tail != NULL)
        mc->tail->next = p;
    else
        mc->head = p;
    mc->tail = p;
    mc->n_pending++;
    srv->st->inflight++;
    if (mc->n_pending == 1)
        _mc_arm_timer(mc);
}

/* ---- the HTTP side ---------------------------------------------------------------------- */

/* credentials = "Bearer" 1SP token  (scheme case-insensitive) */
static int _bearer_token(const char *value, size_t len, const char **tok, size_t *tok_len)
{
    if (len < 7 || strncasecmp(value, "bearer ", 7) != 0)
        return -1;
    *tok = value + 7;
    *tok_len = len - 7;
    return 0;
}

/* cookie-string = cookie-pair *( ";" SP cookie-pair ); we look for plurk_token=<value> */
static int _cookie_token(const char *value, size_t len, const char **tok, size_t *tok_len)
{
    static const char name[] = "plurk_token=";
    const size_t name_len = sizeof(name) - 1;
    size_t i = 0;

    while (i < len) {
        while (i < len && (value[i] == ' ' || value[i] == '\t'))
            i++;
        const char *pair = value + i;
        const char *semi = memchr(pair, ';', len - i);
        size_t pair_len = semi ? (size_t)(semi - pair) : len - i;
        if (pair_len >= name_len && memcmp(pair, name, name_len) == 0) {
            *tok = pair + name_len;
            *tok_len = pair_len - name_len;
            while (*tok_len > 0 && ((*tok)[*tok_len - 1] == ' ' || (*tok)[*tok_len - 1] == '\t'))
                (*tok_len)--;
            return 0;
        }
        i += pair_len + 1;
    }
    return -1;
}

static int _find_token(struct evhttp_request *req, const char **tok, size_t *tok_len)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *auth = evhttp_find_header(in, "Authorization");
    if (auth != NULL && _bearer_token(auth, strnlen(auth, FP_HEADER_VALUE_MAX), tok, tok_len) == 0)
        return 0;
    const char *cookie = evhttp_find_header(in, "Cookie");
    if (cookie != NULL && _cookie_token(cookie, strnlen(cookie, FP_HEADER_VALUE_MAX), tok, tok_len) == 0)
        return 0;
    return -1;
}

/* path = "/Poll/" resource ; resource = 1*32(ALPHA / DIGIT / "_"), one of cfg->resources */
static int _find_resource(const fp_config_t *cfg, const char *path, size_t len)
{
    static const char prefix[] = "/Poll/";
    const size_t plen = sizeof(prefix) - 1;
    if (len <= plen || len - plen > FP_MAX_RESOURCE_LEN || memcmp(path, prefix, plen) != 0)
        return -1;
    for (int i = 0; i < cfg->n_resources; i++)
        if (cfg->resource_len[i] == len - plen && memcmp(cfg->resources[i], path + plen, len - plen) == 0)
            return i;
    return -1;
}

static void _handle_poll(struct evhttp_request *req, void *arg)
{
    fp_server_t *srv = arg;
    const fp_config_t *cfg = srv->cfg;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const char *uri = evhttp_request_get_uri(req), *tok = NULL, *q;
    size_t uri_len, path_len, tok_len = 0, key_len;
    fp_token_t token;
    char key[FP_KEY_CAP];
    int res;

    /* any body was read (bounded by max_body_size); polls ignore it */
    evbuffer_drain(evhttp_request_get_input_buffer(req),
                   evbuffer_get_length(evhttp_request_get_input_buffer(req)));
    if (uri == NULL) {
        _reply_json_error(srv, req, 400, "Bad Request", "bad request line", NULL);
        return;
    }
    uri_len = strnlen(uri, FP_MAX_URI + 1);
    if (uri_len > FP_MAX_URI) {
        _reply_json_error(srv, req, 414, "URI Too Long", "uri too long", NULL);
        return;
    }
    if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_POST) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, POST");
        _reply_json_error(srv, req, 405, "Method Not Allowed", "method not allowed", NULL);
        return;
    }
    q = memchr(uri, '?', uri_len);
    path_len = q ? (size_t)(q - uri) : uri_len;
    res = _find_resource(cfg, uri, path_len);
    if (res < 0) {           /* 404 + MISS: nginx lets Django answer unknown resources */
        _reply_json_error(srv, req, 404, "Not Found", "unknown poll resource", "MISS");
        return;
    }
    if (_find_token(req, &tok, &tok_len) < 0) {
        _reply_json_error(srv, req, 401, "Unauthorized", "authentication required", NULL);
        return;
    }
    struct timeval now;
    event_base_gettimeofday_cached(srv->base, &now);
    fp_token_result_t tr = fp_token_check(&srv->hmac, tok, tok_len, (int64_t)now.tv_sec, &token);
    if (tr != FP_TOKEN_OK) {
        _reply_json_error(srv, req, 401, "Unauthorized", fp_token_strerror(tr), NULL);
        return;
    }
    key_len = fp_make_key(key, sizeof(key), cfg->resources[res], cfg->resource_len[res], &token);
    if (key_len == 0) {
        _reply_json_error(srv, req, 400, "Bad Request", "bad key", NULL);
        return;
    }
    _mc_get(srv, req, key, key_len);
}

/* ---- stats ------------------------------------------------------------------------------ */

static const int fp_status_codes[FP_ST_N] = {200, 204, 400, 401, 404, 405, 413, 414, 503, 0};

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
              "# TYPE fastpath_workers gauge\nfastpath_workers %d\n",
              (unsigned long long)sum.hits, (unsigned long long)sum.empty_hits,
              (unsigned long long)sum.misses, (unsigned long long)sum.mc_errors,
              (unsigned long long)sum.mc_timeouts, (unsigned long long)sum.mc_connects,
              (long long)sum.inflight, n);
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

static void _handle_admin(struct evhttp_request *req, void *arg)
{
    fp_server_t *srv = arg;
    const char *uri = evhttp_request_get_uri(req);
    struct evbuffer *body;
    char text[8192];

    if (uri == NULL || strnlen(uri, 16) != 8 || memcmp(uri, "/metrics", 8) != 0) {
        evhttp_send_error(req, 404, "Not Found");
        return;
    }
    body = evbuffer_new();
    if (body == NULL) {
        evhttp_send_error(req, 500, "Internal Server Error");
        return;
    }
    size_t n = fp_stats_render(srv->cfg->stats, srv->cfg->n_workers, text, sizeof(text));
    evbuffer_add(body, text, n);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", body);
    evbuffer_free(body);
}

/* ---- lifecycle -------------------------------------------------------------------------- */

static void _on_stop_signal(evutil_socket_t sig, short what, void *arg)
{
    fp_server_t *srv = arg;
    struct timeval grace = {srv->cfg->drain_timeout_s, 0};
    if (srv->stopping)
        return;
    srv->stopping = 1;
    if (srv->bound != NULL) {          /* stop accepting; in-flight requests still finish */
        evhttp_del_accept_socket(srv->http, srv->bound);
        srv->bound = NULL;
    }
    event_base_loopexit(srv->base, &grace);
    _maybe_finish_drain(srv);
}

static int _fail(char *err, size_t err_len, const char *what)
{
    snprintf(err, err_len, "%s", what);
    return -1;
}

static struct evhttp *_new_http(fp_server_t *srv, const fp_config_t *cfg, void (*cb)(struct evhttp_request *, void *))
{
    struct evhttp *http = evhttp_new(srv->base);
    if (http == NULL)
        return NULL;
    evhttp_set_gencb(http, cb, srv);
    evhttp_set_timeout(http, cfg->idle_timeout_s);
    evhttp_set_max_headers_size(http, (ev_ssize_t)cfg->max_headers);
    evhttp_set_max_body_size(http, (ev_ssize_t)cfg->max_body);
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                     EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                                     EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
    evhttp_set_default_content_type(http, "application/json");
    return http;
}

int fp_server_run(const fp_config_t *cfg, char *err, size_t err_len)
{
    fp_server_t srv;
    struct event_config *ecfg;
    int rc = -1;

    memset(&srv, 0, sizeof(srv));
    srv.cfg = cfg;
    srv.st = &cfg->stats[cfg->worker_index];
    srv.st->pid = (uint64_t)getpid();
    fp_hmac_prepare(&srv.hmac, cfg->secret, cfg->secret_len);
    if (cfg->n_nodes <= 0 || cfg->n_nodes > FP_MAX_SERVERS)
        return _fail(err, err_len, "need 1..64 memcached servers");

    ecfg = event_config_new();
    if (ecfg == NULL)
        return _fail(err, err_len, "event_config_new failed");
    for (int i = 0; i < 4 && cfg->backend_avoid[i] != NULL; i++)
        event_config_avoid_method(ecfg, cfg->backend_avoid[i]);
    srv.base = event_base_new_with_config(ecfg);
    event_config_free(ecfg);
    if (srv.base == NULL)
        return _fail(err, err_len, "cannot create an event base (backend unavailable?)");

    for (int i = 0; i < cfg->n_nodes; i++) {
        fp_mc_t *mc = &srv.mc[i];
        mc->srv = &srv;
        mc->index = i;
        mc->state = MC_DOWN;
        mc->backoff_ms = FP_BACKOFF_MIN_MS;
        mc->addr_len = (int)sizeof(mc->addr);
        if (evutil_parse_sockaddr_port(cfg->node_addr[i], (struct sockaddr *)&mc->addr, &mc->addr_len) < 0) {
            snprintf(err, err_len, "bad memcached address: %.200s", cfg->node_addr[i]);
            goto out;
        }
        mc->timer = evtimer_new(srv.base, _mc_timer_cb, mc);
        if (mc->timer == NULL) {
            _fail(err, err_len, "evtimer_new failed");
            goto out;
        }
        (void)_mc_connect(mc);       /* warm the connection; failure is retried on demand */
    }

    srv.http = _new_http(&srv, cfg, _handle_poll);
    if (srv.http == NULL || (srv.bound = evhttp_accept_socket_with_handle(srv.http, cfg->listen_fd)) == NULL) {
        _fail(err, err_len, "cannot accept on the listening socket");
        goto out;
    }
    if (cfg->admin_fd >= 0) {
        srv.admin = _new_http(&srv, cfg, _handle_admin);
        if (srv.admin == NULL || evhttp_accept_socket(srv.admin, cfg->admin_fd) < 0) {
            _fail(err, err_len, "cannot accept on the admin socket");
            goto out;
        }
    }
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
    rc = 0;

out:
    for (int i = 0; i < cfg->n_nodes; i++) {
        fp_mc_t *mc = &srv.mc[i];
        fp_pending_t *p;
        while ((p = _mc_pop(mc)) != NULL) {
            _reply_json_error(&srv, p->req, 503, "Service Unavailable", "shutting down", "MISS");
            free(p);
        }
        if (mc->bev != NULL)
            bufferevent_free(mc->bev);
        if (mc->timer != NULL)
            event_free(mc->timer);
    }
    while (srv.free_list != NULL) {
        fp_pending_t *next = srv.free_list->next;
        free(srv.free_list);
        srv.free_list = next;
    }
    if (srv.sig_term != NULL)
        event_free(srv.sig_term);
    if (srv.sig_int != NULL)
        event_free(srv.sig_int);
    if (srv.http != NULL)
        evhttp_free(srv.http);
    if (srv.admin != NULL)
        evhttp_free(srv.admin);
    event_base_free(srv.base);
    return rc;
}
