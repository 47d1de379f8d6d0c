/* Between fp_conn.c (connections: lifecycle, sending, the ONCE and HOLD modes, the modes' table)
 * and the answer modes that live in rooms of their own (fp_stream.c: STREAM).  A mode's file
 * calls these helpers of fp_conn.c; fp_conn.c calls a mode only through its row in _modes.
 * Not used by anything else.
 *
 * Every function that returns int here returns -1 when the connection was closed or is closing
 * (the caller must not touch it), as fp_conn.c's own do.
 */
#ifndef FP_CONN_H
#define FP_CONN_H
#include <stddef.h>
#include <stdint.h>

#include "fp_internal.h"

#define FP_HEAD_CAP 1536             /* our response head, always well below (an edge answer
                                        carries an origin of up to 255 bytes) */

/* The memcached keys a poll reads: its answer's, and an object poll's epoch marker (NULL: a
 * user poll). */
typedef struct {
    const char *key, *marker;
    size_t key_len, marker_len;
    const fp_request_t *rq;          /* a user poll's request (its stream's resources), or NULL */
} fp_keys_t;

/* the ETag of the empty value: a present epoch marker's (docs/contract.md sections 7-8) */
extern const char fp_empty_tag[];

/* fp_conn.c */
void fp_conn_set_state(fp_conn_t *c, fp_conn_state_t to);   /* the only writer of c->state */
void fp_conn_close(fp_conn_t *c);
int fp_conn_send(fp_conn_t *c, const char *head, size_t head_len, const char *body, size_t body_len);
int fp_conn_respond_error(fp_conn_t *c, int code, const char *message, const char *cache);
int fp_conn_answer_result(fp_conn_t *c, fp_mc_result_t r, const char *data, size_t len, const char *tag);
int fp_conn_next_request(fp_conn_t *c);       /* the answer is out: the next request, or close */
int fp_conn_process(fp_conn_t *c);            /* parse and answer what the read buffer holds */
int fp_conn_hold_arm(fp_conn_t *c);           /* the timer: hold_until_us */
uint64_t fp_conn_rand(fp_server_t *srv);      /* xorshift: jitter */

/* How a connection answers a poll: a row of handlers (fp_conn.c's _modes[c->mode]), each called
 * from one place in fp_conn.c:
 *
 *   prepare      (optional) before a poll of this mode is dispatched: 0, or 1 when it is
 *                answered already, or -1
 *   start        a user poll is dispatched (k: its key): ask for its answer
 *   on_fetched   an object poll's gets are in (k: its keys; r: what answers it, the marker
 *                checked): answer, or wait
 *   on_change    held: the key's answer is no longer the client's, or cannot be read
 *                (fp_wake_fn; ctx is the connection)
 *   on_timeout   held: the connection's time is up
 *   on_drain     held: the worker stops
 *   after_write  the answer is out
 *   release      (optional) the connection closes, whatever its mode now: free what the mode
 *                keeps beside fp_conn_t
 *
 * A mode that never holds has no on_change, on_timeout or on_drain. */
typedef struct {
    const char *name;
    int (*prepare)(fp_conn_t *c);
    int (*start)(fp_conn_t *c, const fp_keys_t *k);
    int (*on_fetched)(fp_conn_t *c, const fp_keys_t *k, fp_mc_result_t r, const char *data, size_t len);
    fp_wake_fn on_change;
    void (*on_timeout)(fp_conn_t *c);
    void (*on_drain)(fp_conn_t *c);
    int (*after_write)(fp_conn_t *c);
    void (*release)(fp_conn_t *c);
} fp_mode_ops_t;

/* fp_stream.c: STREAM (Accept: text/event-stream on a GET) */
extern const fp_mode_ops_t fp_stream_mode;

#endif
