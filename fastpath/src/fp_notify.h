/* Notices from plurkcore (docs/contract.md section 7): each worker reads its own unix datagram
 * socket <--notify-dir>/<worker index>.sock, its own UDP port (--notify-udp HOST:PORT, worker i
 * on PORT+i: notices from other hosts), or both, and re-reads the held keys a notice names.  Both
 * sources feed one parser and one table of senders.  Notices are hints: memcached stays the
 * truth, and a lost one costs at most --reread-interval (or less: a sender's sequence that skips
 * makes every held key be read again). */
#ifndef FP_NOTIFY_H
#define FP_NOTIFY_H
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include <event2/event.h>

#include "fp_stats.h"
#include "fp_wait.h"

#define FP_NOTIFY_MAX 65536          /* a datagram's largest size (plurkcore sends unix ones up to
                                      * this, UDP ones up to 4096) */
#define FP_NOTIFY_SENDERS 64         /* senders whose sequence is tracked (least recent replaced) */

typedef struct {
    uint64_t id;                     /* the 16 hex digits, as a number */
    uint64_t seq;                    /* the last sequence number seen */
    int64_t seen_us;
} fp_notify_sender_t;

struct fp_notify;

/* One socket notices arrive on. */
typedef struct {
    int fd;                          /* -1: none */
    int udp;                         /* counted in notice_udp_datagrams too */
    struct event *ev;
    struct fp_notify *owner;
    char name[sizeof(((struct sockaddr_un *)0)->sun_path)];   /* the path, or udp:host:port */
} fp_notify_source_t;

typedef struct fp_notify {
    fp_notify_source_t unix_src;     /* --notify-dir */
    fp_notify_source_t udp_src;      /* --notify-udp */
    fp_wait_table_t *waits;
    fp_stats_t *st;
    uint64_t ino;                    /* the socket file bound (unlinked at exit if still ours) */
    int n_senders;
    fp_notify_sender_t senders[FP_NOTIFY_SENDERS];
} fp_notify_t;

/* No source yet (fp_notify_fini on it does nothing). */
void fp_notify_init(fp_notify_t *n, fp_wait_table_t *waits, fp_stats_t *st);
/* Makes dir (0755) if missing, replaces a stale <dir>/<index>.sock and reads it on base.  -1
 * with err; fp_notify_fini must be called either way. */
int fp_notify_listen_unix(fp_notify_t *n, struct event_base *base, const char *dir, int index,
                          char *err, size_t err_len);
/* Binds a UDP socket to host (numeric IPv4 or IPv6, no brackets) and port and reads it on base.
 * -1 with err; fp_notify_fini must be called either way. */
int fp_notify_listen_udp(fp_notify_t *n, struct event_base *base, const char *host, int port,
                         char *err, size_t err_len);
void fp_notify_fini(fp_notify_t *n);
/* One datagram (tests and the fuzz target): acted on, or counted as malformed and dropped. */
void fp_notify_datagram(fp_notify_t *n, const char *data, size_t len);

#endif
