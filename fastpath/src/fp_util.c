/* Clocks, the Date header and rate-limited logging (fp_util.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fp_util.h"

#define LOG_WINDOW_S 10
#define LOG_BURST 10                 /* log lines per LOG_WINDOW_S; the rest are only counted */

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
 * which fp_clocks_work rules out before anything is served.  Should one fail later all the same,
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

int64_t fp_now_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        _clock_failed("CLOCK_MONOTONIC_COARSE");
    return (int64_t)ts.tv_sec;
}

int fp_clocks_work(void)
{
    struct timespec ts;
    return clock_gettime(CLOCK_MONOTONIC, &ts) == 0 && clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0;
}

int fp_wall_s(struct event_base *base, int64_t *now)
{
    struct timeval tv;
    if (event_base_gettimeofday_cached(base, &tv) != 0)
        return -1;
    *now = (int64_t)tv.tv_sec;
    return 0;
}

const char *fp_date_header(fp_date_t *d, struct event_base *base, size_t *len)
{
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct timeval now;
    struct tm tm;

    if (event_base_gettimeofday_cached(base, &now) == 0 && (int64_t)now.tv_sec != d->second &&
        gmtime_r(&now.tv_sec, &tm) != NULL) {
        int n = snprintf(d->text, sizeof(d->text), "%s, %02d %s %04d %02d:%02d:%02d GMT",
                         days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900,
                         tm.tm_hour, tm.tm_min, tm.tm_sec);
        d->len = n > 0 && (size_t)n < sizeof(d->text) ? (size_t)n : 0;
        d->second = (int64_t)now.tv_sec;
    }
    *len = d->len;
    return d->text;
}

static unsigned char _ascii_lower(unsigned char ch)
{
    return ch >= 'A' && ch <= 'Z' ? (unsigned char)(ch + ('a' - 'A')) : ch;
}

int fp_ascii_casecmp(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char x = _ascii_lower((unsigned char)a[i]), y = _ascii_lower((unsigned char)b[i]);
        if (x != y)
            return x < y ? -1 : 1;
    }
    return 0;
}
