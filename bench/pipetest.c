/* pipetest: the kernel-only control of bench/atr.py, in the spirit of Red Hat's pipetest.
 *
 * N descriptors, T of them active, no other work: raw poll() or select() over all N against
 * epoll_wait() (level-triggered, at most 4096 events per call as libevent's epoll backend).
 * The N descriptors are both ends of N/2 AF_UNIX socketpairs, so N descriptors cost N file
 * descriptors.  Each active descriptor holds one token (one byte): when it is readable the token
 * is read and written back through its peer, which makes the same descriptor readable again, so
 * exactly T descriptors stay active, as T connections sending back to back do.
 *
 *     pipetest --backend epoll|poll|select --descriptors N --active T [--duration S] [--warmup S]
 *
 * stdout: one JSON object; "rate" is tokens handled per second (one read and one write each).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_tool.h"

#define MAX_EVENTS 4096

typedef enum { B_EPOLL, B_POLL, B_SELECT } backend_t;

typedef struct {
    backend_t backend;
    uint32_t n, active;
    double warmup_s, duration_s;
    int *fd;                         /* descriptor i; its peer is fd[i ^ 1] */
    int ep;
    struct pollfd *pfd;
    struct epoll_event *evs;
    int *ready;                      /* descriptors found ready by one wait */
    uint64_t tokens, waits;
} test_t;

static void usage(void)
{
    fprintf(stderr, "usage: pipetest --backend epoll|poll|select --descriptors N --active T "
                    "[--duration S] [--warmup S]\n");
    exit(2);
}

static double number(const char *opt, const char *text, double lo, double hi)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "pipetest: %s wants a number in %g..%g, not '%s'\n", opt, lo, hi, text);
        exit(2);
    }
    return v;
}

static void setup(test_t *t)
{
    need_descriptors((uint64_t)t->n + 16);
    t->fd = calloc(t->n, sizeof(int));
    t->pfd = calloc(t->n, sizeof(struct pollfd));
    t->evs = calloc(MAX_EVENTS, sizeof(struct epoll_event));
    t->ready = calloc(t->n, sizeof(int));
    if (t->fd == NULL || t->pfd == NULL || t->evs == NULL || t->ready == NULL)
        die("calloc");
    for (uint32_t i = 0; i < t->n; i += 2)
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, &t->fd[i]) < 0)
            die("socketpair");
    if (t->backend == B_SELECT && t->fd[t->n - 1] >= FD_SETSIZE) {
        fprintf(stderr, "pipetest: select() takes descriptors below %d only\n", FD_SETSIZE);
        exit(2);
    }
    if (t->backend == B_EPOLL && (t->ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
        die("epoll_create1");
    for (uint32_t i = 0; i < t->n; i++) {
        t->pfd[i].fd = t->fd[i];
        t->pfd[i].events = POLLIN;
        if (t->backend == B_EPOLL) {
            struct epoll_event ev = { .events = EPOLLIN, .data.u32 = i };
            if (epoll_ctl(t->ep, EPOLL_CTL_ADD, t->fd[i], &ev) < 0)
                die("epoll_ctl");
        }
    }
    /* exactly T active descriptors, spread evenly over the N */
    for (uint32_t i = 0; i < t->n; i++)
        if ((uint64_t)(i + 1) * t->active / t->n > (uint64_t)i * t->active / t->n &&
            write(t->fd[i ^ 1], "x", 1) != 1)
            die("write");
}

/* One wait: fill t->ready with the descriptors that are readable; returns how many. */
static uint32_t wait_ready(test_t *t)
{
    uint32_t k = 0;
    int n;
    switch (t->backend) {
    case B_EPOLL:
        do {
            n = epoll_wait(t->ep, t->evs, MAX_EVENTS, -1);
        } while (n < 0 && errno == EINTR);
        if (n < 0)
            die("epoll_wait");
        for (int i = 0; i < n; i++)
            t->ready[k++] = (int)t->evs[i].data.u32;
        break;
    case B_POLL:
        do {
            n = poll(t->pfd, t->n, -1);
        } while (n < 0 && errno == EINTR);
        if (n < 0)
            die("poll");
        for (uint32_t i = 0; i < t->n && k < (uint32_t)n; i++)
            if (t->pfd[i].revents)
                t->ready[k++] = (int)i;
        break;
    case B_SELECT: {
        fd_set rd;
        FD_ZERO(&rd);
        int maxfd = 0;
        for (uint32_t i = 0; i < t->n; i++) {
            FD_SET(t->fd[i], &rd);
            maxfd = t->fd[i] > maxfd ? t->fd[i] : maxfd;
        }
        do {
            n = select(maxfd + 1, &rd, NULL, NULL, NULL);
        } while (n < 0 && errno == EINTR);
        if (n < 0)
            die("select");
        for (uint32_t i = 0; i < t->n && k < (uint32_t)n; i++)
            if (FD_ISSET(t->fd[i], &rd))
                t->ready[k++] = (int)i;
        break;
    }
    }
    return k;
}

/* Pass every ready descriptor's token back through its peer: the descriptor is readable again. */
static void run(test_t *t, double seconds)
{
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    char byte;
    t->tokens = t->waits = 0;
    while (now_ns() < end) {
        uint32_t k = wait_ready(t);
        t->waits++;
        for (uint32_t j = 0; j < k; j++) {
            int i = t->ready[j];
            ssize_t r = read(t->fd[i], &byte, 1);
            if (r != 1) {
                if (r < 0 && (errno == EAGAIN || errno == EINTR))
                    continue;
                die("read");
            }
            if (write(t->fd[i ^ 1], &byte, 1) != 1)
                die("write");
            t->tokens++;
        }
    }
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "backend", required_argument, NULL, 'b' }, { "descriptors", required_argument, NULL, 'n' },
        { "active", required_argument, NULL, 'a' }, { "duration", required_argument, NULL, 'd' },
        { "warmup", required_argument, NULL, 'w' }, { NULL, 0, NULL, 0 },
    };
    static const char *names[] = { "epoll", "poll", "select" };
    test_t t = { .backend = B_EPOLL, .duration_s = 1, .warmup_s = 0.2 };
    int opt, have_backend = 0;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'b':
            for (int b = 0; b < 3; b++)
                if (strncmp(optarg, names[b], 7) == 0 && optarg[strnlen(names[b], 7)] == '\0') {
                    t.backend = (backend_t)b;
                    have_backend = 1;
                }
            if (!have_backend)
                usage();
            break;
        case 'n': t.n = (uint32_t)number("--descriptors", optarg, 2, 1000000); break;
        case 'a': t.active = (uint32_t)number("--active", optarg, 1, 1000000); break;
        case 'd': t.duration_s = number("--duration", optarg, 0.01, 3600); break;
        case 'w': t.warmup_s = number("--warmup", optarg, 0, 3600); break;
        default: usage();
        }
    }
    if (!have_backend || t.n == 0 || t.active == 0 || optind != argc)
        usage();
    t.n += t.n & 1;                  /* whole socketpairs */
    if (t.active > t.n) {
        fprintf(stderr, "pipetest: --active must not exceed --descriptors\n");
        exit(2);
    }
    setup(&t);
    run(&t, t.warmup_s);
    double cpu0 = cpu_s();
    uint64_t t0 = now_ns();
    run(&t, t.duration_s);
    double elapsed = (now_ns() - t0) / 1e9, cpu = cpu_s() - cpu0;
    printf("{\"backend\": \"%s\", \"descriptors\": %u, \"active\": %u, \"seconds\": %.4f, "
           "\"tokens\": %llu, \"rate\": %.1f, \"waits\": %llu, \"events_per_wait\": %.3f, "
           "\"cpu_s\": %.4f, \"cpu_us_per_token\": %.4f}\n",
           names[t.backend], t.n, t.active, elapsed, (unsigned long long)t.tokens, t.tokens / elapsed,
           (unsigned long long)t.waits, t.waits ? (double)t.tokens / t.waits : 0.0, cpu,
           t.tokens ? cpu * 1e6 / t.tokens : 0.0);
    return fflush(stdout) == 0 ? 0 : 1;
}
