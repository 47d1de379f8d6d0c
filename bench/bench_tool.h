/* What bench/atr_client.c and bench/pipetest.c share: fatal errors, the clocks they measure with,
 * and the descriptor limit they need.  Header-only: each tool is one translation unit. */
#ifndef BENCH_TOOL_H
#define BENCH_TOOL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

extern char *program_invocation_short_name;     /* glibc */

/* A failed system call: name it and its errno, exit 1. */
static inline void die(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, strerror(errno));
    exit(1);
}

/* Anything else that ends the run. */
static inline void fail(const char *what)
{
    fprintf(stderr, "%s: %s\n", program_invocation_short_name, what);
    exit(1);
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0)
        die("clock_gettime");
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* User + system CPU seconds this process has used. */
static inline double cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) < 0)
        die("getrusage");
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* Lift the soft descriptor limit to the hard one when `needed` descriptors do not fit. */
static inline void need_descriptors(uint64_t needed)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        die("getrlimit");
    if (rl.rlim_cur >= needed)
        return;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < needed) {
        fprintf(stderr, "%s: needs %llu descriptors; the hard limit is %llu\n", program_invocation_short_name,
                (unsigned long long)needed, (unsigned long long)rl.rlim_max);
        exit(1);
    }
}

#endif
