/* Structures shared by the parts of a worker: fp_server.c (lifecycle, listeners) calls fp_conn.c
 * (HTTP connections), which calls fp_http.c (llhttp's callbacks; it calls fp_route.c, what a
 * request gets), fp_reply.c (answers) and fp_mc.c (the memcached client); all of them use
 * fp_util.c and fp_stats.c.  Calls only go down that list: answers and events come back up
 * through callbacks with a context pointer (docs/fastpath.md draws it).  Each file's non-static
 * functions are declared once, in its section at the end.  Not part of the Cython API.
 *
 * One worker = one event base = one thread: nothing here is locked.
 */
#ifndef FP_INTERNAL_H
#define FP_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <llhttp.h>

#include "fp_debug.h"
#include "fp_etag.h"
#include "fp_limit.h"
#include "fp_mc.h"
#include "fp_notify.h"
#include "fp_server.h"
#include "fp_slab.h"
#include "fp_stats.h"
#include "fp_token.h"
#include "fp_util.h"
#include "fp_wait.h"

#define FP_BUF_POOL_MAX 256          /* idle read buffers kept for reuse */
#define FP_STREAM_PARTS_MAX 4        /* resources one stream may carry (docs/contract.md section 9) */
#define FP_RESOURCE_SET 255          /* fp_conn_t.resource of a stream of several resources */

struct fp_server;
struct fp_conn;

/* How a request that has been read is answered (decided at the end of its head). */
typedef enum {
    ACT_RESPOND = 0,                 /**< answer_code and answer_message, no lookup (a zeroed request) */
    ACT_METRICS,                     /**< the Prometheus text */
    ACT_MEMCACHED,                   /**< get key from memcached, answer with what it says */
    ACT_OBJECT,                      /**< get key (an object's) and marker together: the object's
                                          answer if the user's epoch marker is there */
    ACT_PREFLIGHT                    /**< a CORS preflight of an allowed origin (the edge): 204 */
} fp_conn_action_t;

/* The request headers fastpath reads: id, name (lower case), and the fp_http.c function that
 * keeps it.  fp_http.c's table is made from this list (nginx's ngx_http_headers_in); a header
 * that is not in it is skipped. */
#define FP_REQUEST_HEADERS(X)                                  \
    X(FP_HDR_AUTHORIZATION, "authorization", _header_unique)   \
    X(FP_HDR_COOKIE, "cookie", _header_unique)                 \
    X(FP_HDR_PREFER, "prefer", _header_unique)                 \
    X(FP_HDR_IF_NONE_MATCH, "if-none-match", _header_unique)  \
    X(FP_HDR_ACCEPT, "accept", _header_unique)                 \
    X(FP_HDR_LAST_EVENT_ID, "last-event-id", _header_unique)  \
    X(FP_HDR_ORIGIN, "origin", _header_unique)                 \
    X(FP_HDR_AC_REQUEST_METHOD, "access-control-request-method", _header_unique)

typedef enum {
#define FP_HDR_ENUM(id, name, handler) id,
    FP_REQUEST_HEADERS(FP_HDR_ENUM)
#undef FP_HDR_ENUM
    FP_HDR_N
} fp_header_id_t;

/* Bytes of the read buffer's data: offset and length. */
typedef struct {
    size_t off, len;
} fp_span_t;

/* The request being read: where its head's parts are (spans of the buffer's data, from
 * start), what they decided, and why parsing failed.  A connection keeps its read buffer
 * from a request's first byte until the request is dispatched, so all of this lives with the
 * buffer and not in every connection: an idle or held connection holds none of it. */
typedef struct fp_request {
    size_t start;                    /* the head's first byte */
    fp_span_t url;
    fp_span_t field, value;          /* the header being read */
    fp_span_t header[FP_HDR_N];      /* the first of each header fastpath reads */
    uint8_t have[FP_HDR_N];          /* how often each came (2: repeated) */
    uint8_t action;                  /* fp_conn_action_t */
    uint8_t key_len;
    int16_t answer_code;             /* ACT_RESPOND's status */
    int16_t error_status;            /* set by a parser callback: answer this and close */
    const char *answer_message, *answer_cache;
    const char *error_message, *error_cache;
    uint8_t marker_len;
    uint8_t stream;                  /* a GET that accepts text/event-stream: answered as a stream */
    uint8_t resource;                /* the index of its resource (fp_reply_resource_name), or
                                        FP_RESOURCE_SET: a stream of the n_parts in parts */
    uint8_t n_parts;                 /* a stream of several user resources: how many (else 0) */
    uint8_t parts[FP_STREAM_PARTS_MAX];   /* ... their indexes, in path order (key: parts[0]'s) */
    uint8_t uid_len;                 /* the token's uid (ACT_MEMCACHED, ACT_OBJECT): whose hold */
    char uid[FP_UID_MAX_LEN];
    char key[FP_KEY_CAP];            /* ACT_MEMCACHED's and ACT_OBJECT's key */
    char marker[FP_KEY_CAP];         /* ACT_OBJECT: the user's epoch marker key */
} fp_request_t;

/* An object poll (ACT_OBJECT) from its dispatch to its answer: two gets in flight together,
 * the object's key and the user's epoch marker (docs/contract.md section 8).  Allocated per
 * object poll, so that a user poll or an idle connection pays one pointer for it. */
typedef struct fp_stream_set fp_stream_set_t;   /* a stream's parts (fp_stream.c) */

typedef struct fp_object_poll {
    fp_mc_req_t *marker_req;         /* the marker's get in flight (the object's is c->mc_req) */
    uint8_t marker_r, obj_r;         /* fp_mc_result_t; FP_MC_QUEUED: not answered yet */
    uint8_t key_len, marker_len;
    char *data;                      /* the object's value when it came before the marker */
    size_t len;
    char key[FP_KEY_CAP];
    char marker[FP_KEY_CAP];
} fp_object_poll_t;

/* A read buffer lent to a connection while it has unparsed bytes or a request not yet
 * dispatched (idle and held connections hold none). */
typedef struct fp_buf {
    struct fp_buf *next;             /* in the pool */
    size_t len;                      /* bytes read */
    size_t pos;                      /* bytes the parser has consumed */
    fp_request_t req;                /* the request being read */
    char data[];                     /* srv->buf_cap bytes */
} fp_buf_t;

/* A connection's state; fp_conn_set_state (fp_conn.c) is the only writer, and builds with
 * FASTPATH_CHECKS (fp_debug.h) check every transition against its table.  READING is 0: a new
 * connection starts there. */
typedef enum {
    CONN_READING,                    /**< reading a request, or idle between requests */
    CONN_WAITING,                    /**< a request is waiting for memcached (mc_req set) */
    CONN_WRITING,                    /**< an answer is partly sent; waiting until writable */
    CONN_LINGERING,                  /**< answered with "Connection: close": FIN sent, input dropped */
    CONN_HELD,                       /**< a poll held until its answer changes (waiter set) */
    CONN_STATE_N
} fp_conn_state_t;

/* How a connection answers a poll (fp_conn.c's _modes: a row of handlers per mode). */
typedef enum {
    FP_MODE_ONCE,                    /**< what memcached says now */
    FP_MODE_HOLD,                    /**< held until the answer is not the client's, or the wait ends */
    FP_MODE_STREAM,                  /**< Server-Sent Events: one event per answer until the stream ends */
    FP_MODE_N
} fp_mode_t;

/* What a listener's connections are for (fp_route.c's fp_kinds: what each kind may do). */
typedef enum {
    FP_CONN_POLL,                    /**< /Poll/<resource> from nginx; capped by --max-connections */
    FP_CONN_ADMIN,                   /**< /metrics on the loopback stats listener; small fixed cap */
    FP_CONN_EDGE,                    /**< /Poll/<resource> from clients, no nginx (--edge): CORS,
                                          caps per address, misses sent to the site */
    FP_CONN_KIND_N
} fp_conn_kind_t;

/* What a listener's connections may do: one row per kind (fp_route.c's fp_kinds). */
typedef struct {
    const char *name;
    /* at the end of the head: decide the request's action (and the key or the answer) */
    void (*route)(struct fp_conn *c, uint8_t method, const char *url, size_t url_len);
    int (*cap)(const fp_config_t *cfg);      /* open connections of this kind per worker */
    uint8_t counted;                         /* answers count in fastpath_requests_total */
    /* 1: behind nginx, which hands a 404 X-Cache: MISS to Django (what fastpath cannot read or
     * does not hold is answered so).  0: clients come straight: such an answer tells the client
     * to ask the site once (fp_reply_site), and what fastpath cannot read is refused. */
    uint8_t hands_on;
    uint8_t per_address;                     /* held and open connections count per client address */
    int (*header_timeout)(const fp_config_t *cfg);  /* a request must arrive within this many s of
                                                       its first byte; NULL: the idle timeout's */
} fp_kind_t;

/* How a listener's connections get Nagle turned off (fp_server.c _tune_listener). */
typedef enum {
    FP_NODELAY_NONE,                 /**< a unix socket: no Nagle to turn off */
    FP_NODELAY_CHECK,                /**< set on the listener: the first connection checks it came along */
    FP_NODELAY_INHERITED,            /**< ... and it did: nothing to do per connection */
    FP_NODELAY_SET                   /**< one setsockopt per connection */
} fp_nodelay_t;

#define FP_LISTENERS_MAX 4

/* A socket a worker accepts on, and what its connections are for (fp_server.c fills
 * srv->listeners from the configuration; fp_conn_accept is every listener's callback). */
typedef struct fp_listener {
    struct fp_server *srv;
    int fd;                          /* bound and listening (the Python supervisor's) */
    uint8_t kind;                    /* fp_conn_kind_t */
    uint8_t nodelay;                 /* fp_nodelay_t */
    uint8_t read_on_accept;          /* accept is deferred until the first bytes came: a new
                                        connection is read at once, not armed first */
    uint8_t drains;                  /* stops accepting when the worker drains (the poll
                                        listener; the admin one accepts and closes at once) */
    struct evconnlistener *ev;
} fp_listener_t;

/* One client connection.  Requests on it are answered one at a time, in order (pipelined ones
 * wait in the read buffer), so responses never need reordering. */
typedef struct fp_conn {
    struct fp_server *srv;
    struct fp_conn *prev, *next;     /* every open connection, for draining */
    int fd;
    uint8_t kind;                    /* fp_conn_kind_t */
    uint8_t state;                   /* fp_conn_state_t; only fp_conn_set_state writes it */
    uint8_t keep_alive;
    uint8_t in_head;                 /* between the first byte of a request and its blank line */
    uint8_t is_head;                 /* HEAD request: no body in the answer */
    uint8_t in_message;              /* a request has begun and not yet ended */
    uint8_t inm;                     /* fp_inm_t of the request */
    uint8_t mode;                    /* fp_mode_t of the request (ONCE until it is dispatched) */
    uint8_t resource;                /* STREAM: its resource (the events' name), or
                                        FP_RESOURCE_SET: several, in set */
    uint8_t stream_open;             /* STREAM: the head is out, events follow (counted in streams) */
    uint8_t stream_chunked;          /* STREAM: HTTP/1.1, chunked (else HTTP/1.0, ended by close) */
    uint8_t origin;                  /* the edge: 1 + the index of the request's allowed Origin
                                        (cfg->edge_origins), or 0: no CORS headers */
    int32_t wait_s;                  /* Prefer: wait=N as applied; -1: no wait */
    char inm_tag[FP_ETAG_LEN];       /* If-None-Match's opaque-tag (inm == FP_INM_TAG) */
    int64_t deadline_s;              /* READING: the request must have arrived by then;
                                        LINGERING: reading stops then, however much still comes */
    llhttp_t parser;
    fp_buf_t *in;
    fp_mc_req_t *mc_req;             /* the get this connection waits for (cancelled on close) */
    fp_waiter_t waiter;              /* HELD: in the wait table (removed on close) */
    fp_waiter_t marker_waiter;       /* HELD object poll: on the user's epoch marker */
    union {
        fp_object_poll_t *obj;       /* an object poll waiting for its two gets */
        fp_stream_set_t *set;        /* STREAM of several resources (resource FP_RESOURCE_SET):
                                        its parts (fp_stream.c) */
    };
    fp_limit_entry_t *held_by[FP_LIMIT_HELD_N];   /* HOLD, STREAM: what its hold counts in (NULL: none) */
    fp_limit_entry_t *open_by;       /* the edge: its address's count of open connections (NULL: none) */
    int64_t hold_until_us;           /* HELD: answered 304 then (STREAM: its next timer) */
    int64_t stream_end_us;           /* STREAM: ended then (--max-stream, jittered) */
    int64_t beat_us;                 /* STREAM: the next heartbeat */
    char *out;                       /* response bytes the socket would not take yet */
    size_t out_len, out_sent;
    uint64_t body_len;               /* body, chunk extensions and trailers; dropped bytes when
                                        LINGERING */
    /* its struct event (read, or write while the socket is full, with a timeout) follows in
     * the same conn_slab object, at FP_CONN_EV_OFFSET: libevent sizes it at run time */
} fp_conn_t;

/* Where a connection's struct event sits in its conn_slab object (libevent sizes it at run time:
 * event_get_struct_event_size()); fp_conn.c's _ev() finds it. */
#define FP_CONN_EV_OFFSET ((sizeof(fp_conn_t) + 15) & ~(size_t)15)
#define FP_CONN_SLAB_CHUNK (64 * 1024)

typedef struct fp_server {
    const fp_config_t *cfg;
    struct event_base *base;
    fp_listener_t listeners[FP_LISTENERS_MAX];
    int n_listeners;
    fp_mc_pool_t mc;                 /* the memcached servers */
    fp_wait_table_t waits;           /* held polls by key */
    fp_limits_t limits;              /* held connections per client address and per user, open
                                        edge connections per client address */
    fp_notify_t notify;              /* its sources: --notify-dir, --notify-udp */
    uint64_t rng;                    /* xorshift: hold jitter */
    fp_slab_t conn_slab;             /* fp_conn_t, each followed by its struct event */
    fp_buf_t *buf_pool;
    int buf_pool_n;
    size_t buf_cap;
    fp_conn_t *conns;                /* list head */
    int n_conns;                     /* all open connections */
    int n_kind[FP_CONN_KIND_N];      /* open connections of each kind (each kind has its cap) */
    fp_stats_t *st;
    fp_hmac_key_t hmac;
    llhttp_settings_t http_settings;
    const struct timeval *idle_tv;   /* a libevent common timeout */
    fp_date_t date;
    /* set by fp_server.c: called when the last connection closes while stopping */
    void (*drained)(void *arg);
    void *drained_arg;
    struct event *pause_accept;      /* re-enables accepting after EMFILE */
    int accept_retries;              /* failed attempts to re-enable accepting, in a row */
    int stopping;
    const char *fatal;               /* why this worker gave up (fp_server_run returns -1) */
    struct event *sig_term, *sig_int;
} fp_server_t;

/* An answer: status, headers and body (fp_reply.c decides them and writes the head; fp_conn.c
 * sends it).  Pointers stay valid while it is sent; tag and error hold what fp_reply.c made. */
typedef struct fp_reply {
    int code;
    const char *ctype;               /* Content-Type of a 200 or an error */
    const char *cache;               /* X-Cache, or NULL */
    const char *etag;                /* FP_ETAG_LEN bytes, or NULL: no ETag */
    const char *body;                /* body_len bytes (none for 204, 304) */
    size_t body_len;
    uint8_t preflight;               /* a CORS preflight's 204: its Access-Control-Allow-* too */
    char tag[FP_ETAG_LEN];           /* the body's ETag, when fp_reply_result computed it */
    char error[160];                 /* an error's JSON body */
} fp_reply_t;

/* fp_server.c */
int fp_server_init(fp_server_t *srv, const fp_config_t *cfg, char *err, size_t err_len);
void fp_server_fini(fp_server_t *srv);

/* fp_conn.c */
/* every listener's evconnlistener callback: arg is its fp_listener_t */
void fp_conn_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg);
void fp_conn_open(fp_listener_t *ls, evutil_socket_t fd);   /* adopt a socket accepted on ls */
void fp_conn_close_idle(fp_server_t *srv);
void fp_conn_close_all(fp_server_t *srv);
void fp_buf_pool_free(fp_server_t *srv);

/* fp_http.c: reading requests */
void fp_http_settings_init(llhttp_settings_t *s);
void fp_http_compact(fp_conn_t *c);                      /* the read buffer's needed bytes to its front */
void fp_http_head_too_big(fp_conn_t *c);                 /* the head outgrew the read buffer */
void fp_http_error(fp_conn_t *c, llhttp_errno_t err, fp_reply_t *a);   /* the answer when parsing stops */

/* fp_route.c: what a request gets */
extern const fp_kind_t fp_kinds[FP_CONN_KIND_N];
void fp_route(fp_conn_t *c, uint8_t method, const char *url, size_t url_len);

/* fp_reply.c: what answers a request, and the head's bytes */
void fp_reply_set(fp_reply_t *a, int code, const char *ctype, const char *cache, const char *etag,
                  const char *body, size_t body_len);
void fp_reply_error(fp_reply_t *a, int code, const char *message, const char *cache);
void fp_reply_site(fp_reply_t *a);    /* the edge: an answer nginx would hand to Django, for the client */
void fp_reply_result(fp_reply_t *a, const fp_conn_t *c, fp_mc_result_t r, const char *data, size_t len,
                     const char *tag);
int fp_reply_not_modified(const fp_conn_t *c, const char *etag);   /* If-None-Match names etag */
size_t fp_reply_head(fp_conn_t *c, const fp_reply_t *a, size_t body_len, char *buf, size_t cap);
/* Server-Sent Events (docs/contract.md section 9): the head of a stream with its first block
 * (retry:), and its events, each framed as a chunk when chunked */
size_t fp_reply_stream_head(fp_conn_t *c, const char *cache, char *buf, size_t cap);
const char *fp_reply_resource_name(const fp_config_t *cfg, uint8_t resource, size_t *len);
size_t fp_reply_event_size(const fp_conn_t *c, uint8_t resource, size_t id_len, const char *data, size_t len);
size_t fp_reply_event(const fp_conn_t *c, uint8_t resource, const char *id, size_t id_len, const char *data,
                      size_t len, char *buf, size_t cap);
size_t fp_reply_stream_text(const fp_conn_t *c, const char *text, size_t len, char *buf, size_t cap);

#endif
