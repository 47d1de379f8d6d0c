/* Structures shared by fp_conn.c (HTTP connections, llhttp) and fp_server.c (lifecycle, stats);
 * the memcached client (fp_mc.c) has its own interface, fp_mc.h.  Not part of the Cython API.
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

#include "fp_mc.h"
#include "fp_server.h"
#include "fp_token.h"

#define FP_BUF_POOL_MAX 256          /* idle read buffers kept for reuse */

struct fp_server;
struct fp_conn;

/* A read buffer lent to a connection while it has unparsed bytes (idle connections hold none). */
typedef struct fp_buf {
    struct fp_buf *next;             /* in the pool */
    size_t len;                      /* bytes read */
    size_t pos;                      /* bytes the parser has consumed */
    char data[];                     /* srv->buf_cap bytes */
} fp_buf_t;

typedef enum { CONN_READING, CONN_WAITING, CONN_WRITING, CONN_LINGERING } fp_conn_state_t;

/* One client connection.  Requests on it are answered one at a time, in order (pipelined ones
 * wait in the read buffer), so responses never need reordering. */
typedef struct fp_conn {
    struct fp_server *srv;
    struct fp_conn *prev, *next;     /* every open connection, for draining */
    int fd;
    uint8_t admin;                   /* the loopback stats listener */
    uint8_t state;                   /* fp_conn_state_t */
    uint8_t keep_alive;
    uint8_t in_head;                 /* between the first byte of a request and its blank line */
    uint8_t field_kind;              /* header being parsed: 0 other, 1 Authorization, 2 Cookie */
    uint8_t is_head;                 /* HEAD request: no body in the answer */
    uint8_t in_message;              /* a request has begun and not yet ended */
    uint8_t read_paused;             /* read buffer full while waiting: stop reading */
    uint8_t have_auth, have_cookie;
    int16_t error_status;            /* set by a parser callback: answer this and close */
    const char *error_message;
    int16_t answer_code;             /* decided at the end of the head; 0: ask memcached */
    const char *answer_message;
    const char *answer_cache;
    uint8_t key_len;
    char key[FP_KEY_CAP];
    int64_t deadline_s;              /* the current request must have arrived by then */
    struct event *ev;                /* read (or write while the socket is full), with timeout */
    llhttp_t parser;
    fp_buf_t *in;
    fp_mc_req_t *mc_req;             /* the get this connection waits for (cancelled on close) */
    char *out;                       /* response bytes the socket would not take yet */
    size_t out_len, out_sent;
    /* the request being parsed: offsets into in->data from head_start */
    size_t head_start;
    size_t url_off, url_len;
    size_t field_off, field_len;
    size_t value_off, value_len;
    size_t auth_off, auth_len;
    size_t cookie_off, cookie_len;
    uint64_t body_len;
} fp_conn_t;

typedef struct fp_server {
    const fp_config_t *cfg;
    struct event_base *base;
    struct evconnlistener *listener, *admin_listener;
    fp_mc_pool_t mc;                 /* the memcached servers */
    fp_buf_t *buf_pool;
    int buf_pool_n;
    size_t buf_cap;
    fp_conn_t *conns;                /* list head */
    int n_conns;                     /* all open connections */
    int n_polls;                     /* those on the poll listener (what --max-connections caps) */
    fp_stats_t *st;
    fp_hmac_key_t hmac;
    llhttp_settings_t http_settings;
    const struct timeval *idle_tv;   /* a libevent common timeout */
    struct event *pause_accept;      /* re-enables accepting after EMFILE */
    int accept_retries;              /* failed attempts to re-enable accepting, in a row */
    int stopping;
    const char *fatal;               /* why this worker gave up (fp_server_run returns -1) */
    struct event *sig_term, *sig_int;
    int64_t date_s;                  /* second the Date header below was made for */
    char date[40];
    size_t date_len;
} fp_server_t;

/* fp_server.c */
int fp_server_init(fp_server_t *srv, const fp_config_t *cfg, char *err, size_t err_len);
void fp_server_fini(fp_server_t *srv);
int64_t fp_now_us(void);
int64_t fp_now_s(fp_server_t *srv);
/* The loop's cached wall-clock second (token expiry); -1 if libevent cannot tell it. */
int fp_wall_s(fp_server_t *srv, int64_t *now);
/* One line "fastpath[pid]: ..." on stderr; beyond 10 lines in 10 s the rest are only counted. */
void fp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* accept() failed on l: stop accepting on it for a moment (then fp_server.c resumes it). */
void fp_server_pause_accepting(fp_server_t *srv, struct evconnlistener *l);
/* This worker cannot go on: drain as on SIGTERM, then fp_server_run returns -1 with why, the
 * worker exits 1 and the parent starts a new one. */
void fp_server_fail(fp_server_t *srv, const char *why);
int fp_status_slot(int code);
void fp_maybe_finish_drain(fp_server_t *srv);
const char *fp_date_header(fp_server_t *srv, size_t *len);

/* fp_conn.c */
void fp_conn_settings_init(llhttp_settings_t *s);
void fp_conn_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg);
void fp_conn_admin_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len, void *arg);
void fp_conn_open(fp_server_t *srv, evutil_socket_t fd, int admin);    /* adopt a socket */
void fp_conn_accept_error(struct evconnlistener *l, void *arg);
void fp_conn_close_idle(fp_server_t *srv);
void fp_conn_close_all(fp_server_t *srv);
void fp_buf_pool_free(fp_server_t *srv);

#endif
