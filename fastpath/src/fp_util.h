/* Small helpers shared by every part of a worker: clocks, the Date header, logging.
 * They know nothing of connections, memcached or the server's lifecycle. */
#ifndef FP_UTIL_H
#define FP_UTIL_H
#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

/* Monotonic microseconds (deadlines, latency).  Never fails once fp_clocks_work() said yes. */
int64_t fp_now_us(void);
/* Monotonic seconds from the coarse clock (idle and request deadlines: cheap, 4 ms resolution). */
int64_t fp_now_s(void);
/* 1 if both monotonic clocks work on this kernel (checked once, before anything is served). */
int fp_clocks_work(void);
/* The loop's cached wall-clock second (token expiry); -1 if libevent cannot tell it. */
int fp_wall_s(struct event_base *base, int64_t *now);

/* The IMF-fixdate of the current second, remade at most once a second. */
typedef struct {
    int64_t second;                  /* the second `text` was made for */
    size_t len;
    char text[40];
} fp_date_t;

/* "Sun, 06 Nov 1994 08:49:37 GMT" for the loop's cached time; if the time cannot be read, the
 * last Date made is returned again. */
const char *fp_date_header(fp_date_t *d, struct event_base *base, size_t *len);

/* One line "fastpath[pid]: ..." on stderr; beyond 10 lines in 10 s the rest are only counted. */
void fp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ASCII-only case-insensitive comparison of n bytes (never the C locale's). */
int fp_ascii_casecmp(const char *a, const char *b, size_t n);

#endif
