/* atr_client: the load generator of bench/atr.py (active ratio) and bench/connbench.py (new
 * connections per second).  One process, one epoll instance, level-triggered.
 *
 * Keep-alive mode: opens --connections N keep-alive connections and primes each with one request
 * (so every connection has been through the server's parser), then --active A of them, spread
 * evenly over the N, send requests back to back with --pipeline D in flight each, while the
 * other N-A stay idle.  Close mode (--close, N == A): each of the A slots connects, sends one
 * request with "Connection: close", reads the answer and the server's FIN, and connects again.
 *
 * stdout, one line each: "measure" when the measured window opens (after --warmup), then one
 * JSON object with the window's figures.  The caller reads the server's counters at both lines.
 * Errors go to stderr and exit 1.
 *
 * Responses are framed by Content-Length (204, 304 and 1xx have no body); chunked bodies are
 * refused.  Every buffer is handled as (pointer, length).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_tool.h"

#define RBUF_CAP 4096                /* a poll answer and its head fit many times over */
#define MAX_PIPELINE 64
#define MAX_EVENTS 4096              /* libevent's epoll backend grows to the same cap */
#define MAX_PENDING_CONNECTS 1000    /* well below the servers' listen backlog (4096) */
#define WAIT_MS 50                   /* phase changes are checked at least this often */
#define STALL_S 30                   /* no answer at all for this long: give up */
#define HIST_BUCKETS (64 + 40 * 32)  /* log-linear, 32 steps per octave (~3%) */

typedef enum { C_FREE, C_CONNECTING, C_OPEN, C_DRAINING } conn_state_t;
typedef enum { P_CONNECT, P_WARMUP, P_MEASURE } phase_t;

typedef struct {
    int fd;
    conn_state_t state;
    uint8_t active;                  /* sends back to back once every connection is primed */
    uint8_t primed;                  /* its first answer arrived */
    uint32_t inflight;               /* requests sent whose answers have not arrived */
    uint32_t unsent;                 /* whole requests still to send */
    uint32_t sent_off;               /* bytes of the current request already sent */
    uint32_t want_out;               /* EPOLLOUT is in the interest set */
    uint32_t rlen;                   /* bytes in rbuf */
    uint64_t started_ns;             /* close mode: when connect() was called */
    uint64_t *sent_ns;               /* ring of D send times */
    uint32_t ring_head, ring_tail;
    const char *req;
    uint32_t req_len;
    char *rbuf;
} conn_t;

typedef struct {
    /* options */
    struct sockaddr_in dst;
    uint32_t n, active, pipeline, sources;
    double warmup_s, duration_s;
    int close_mode;
    const char *path, *tokens_file, *host;
    /* state */
    int ep;
    conn_t *conns;
    uint32_t pending_connects, next_connect, open, primed;
    uint32_t *free_slots, nfree;     /* close mode: slots whose connection has ended */
    phase_t phase;
    uint64_t phase_ns, last_answer_ns;
    /* counters of the current phase */
    uint64_t answers, non_2xx, closed, errors, waits, events, connections_done;
    uint64_t hist[HIST_BUCKETS];
    uint64_t max_ns;
    /* the requests: one per token line (or one without a token) */
    char *arena;
    size_t arena_len;
    uint32_t *req_off, *req_len, nreq;
} client_t;

/* ---- latency histogram (microseconds) ----------------------------------------------- */

static unsigned _bucket(uint64_t us)
{
    if (us < 64)
        return (unsigned)us;
    unsigned e = 63u - (unsigned)__builtin_clzll(us);           /* >= 6 */
    unsigned b = 64 + (e - 6) * 32 + (unsigned)((us >> (e - 5)) & 31);
    return b < HIST_BUCKETS ? b : HIST_BUCKETS - 1;
}

static uint64_t _bucket_top(unsigned b)                        /* the bucket's largest value */
{
    if (b < 64)
        return b;
    unsigned e = (b - 64) / 32 + 6, m = (b - 64) % 32;
    return ((uint64_t)(33 + m) << (e - 5)) - 1;
}

static double _percentile_ms(const client_t *cl, double p)
{
    uint64_t total = 0, seen = 0;
    for (unsigned b = 0; b < HIST_BUCKETS; b++)
        total += cl->hist[b];
    if (total == 0)
        return -1;
    uint64_t rank = (uint64_t)(p * (double)total + 0.999999);
    for (unsigned b = 0; b < HIST_BUCKETS; b++) {
        seen += cl->hist[b];
        if (seen >= rank && seen > 0)
            return _bucket_top(b) / 1000.0;
    }
    return _bucket_top(HIST_BUCKETS - 1) / 1000.0;
}

static void _record(client_t *cl, uint64_t started_ns, uint64_t now)
{
    uint64_t ns = now > started_ns ? now - started_ns : 0;
    cl->hist[_bucket(ns / 1000)]++;
    if (ns > cl->max_ns)
        cl->max_ns = ns;
}

/* ---- options and requests ----------------------------------------------------------- */

static uint32_t _u32(const char *opt, const char *text, uint32_t lo, uint32_t hi)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "atr_client: %s wants an integer in %u..%u, not '%s'\n", opt, lo, hi, text);
        exit(2);
    }
    return (uint32_t)v;
}

static double _seconds(const char *opt, const char *text)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || v < 0 || v > 86400) {
        fprintf(stderr, "atr_client: %s wants seconds, not '%s'\n", opt, text);
        exit(2);
    }
    return v;
}

static void _parse_addr(client_t *cl, const char *text)
{
    const char *colon = strrchr(text, ':');
    char host[64];
    size_t hlen = colon ? (size_t)(colon - text) : 0;
    if (colon == NULL || hlen == 0 || hlen >= sizeof(host))
        fail("--connect wants host:port (an IPv4 address)");
    memcpy(host, text, hlen);
    host[hlen] = '\0';
    memset(&cl->dst, 0, sizeof(cl->dst));
    cl->dst.sin_family = AF_INET;
    cl->dst.sin_port = htons((uint16_t)_u32("--connect port", colon + 1, 1, 65535));
    if (inet_pton(AF_INET, host, &cl->dst.sin_addr) != 1)
        fail("--connect wants an IPv4 address");
}

/* Append bytes to the request arena (grown by doubling). */
static void _arena_put(client_t *cl, size_t *cap, const char *p, size_t len)
{
    if (cl->arena_len + len > *cap) {
        size_t want = *cap ? *cap : 65536;
        while (want < cl->arena_len + len)
            want *= 2;
        char *a = realloc(cl->arena, want);
        if (a == NULL)
            die("realloc");
        cl->arena = a;
        *cap = want;
    }
    memcpy(cl->arena + cl->arena_len, p, len);
    cl->arena_len += len;
}

static void _add_request(client_t *cl, size_t *cap, uint32_t *slots, const char *tok, size_t tok_len)
{
    static const char auth[] = "Authorization: Bearer ";
    static const char closing[] = "Connection: close\r\n";
    if (cl->nreq == *slots) {
        *slots = *slots ? *slots * 2 : 1024;
        cl->req_off = realloc(cl->req_off, *slots * sizeof(uint32_t));
        cl->req_len = realloc(cl->req_len, *slots * sizeof(uint32_t));
        if (cl->req_off == NULL || cl->req_len == NULL)
            die("realloc");
    }
    size_t start = cl->arena_len;
    _arena_put(cl, cap, "GET ", 4);
    _arena_put(cl, cap, cl->path, strnlen(cl->path, 1024));
    _arena_put(cl, cap, " HTTP/1.1\r\nHost: ", 17);
    _arena_put(cl, cap, cl->host, strnlen(cl->host, 256));
    _arena_put(cl, cap, "\r\n", 2);
    if (tok_len) {
        _arena_put(cl, cap, auth, sizeof(auth) - 1);
        _arena_put(cl, cap, tok, tok_len);
        _arena_put(cl, cap, "\r\n", 2);
    }
    if (cl->close_mode)
        _arena_put(cl, cap, closing, sizeof(closing) - 1);
    _arena_put(cl, cap, "\r\n", 2);
    cl->req_off[cl->nreq] = (uint32_t)start;
    cl->req_len[cl->nreq] = (uint32_t)(cl->arena_len - start);
    cl->nreq++;
}

/* --tokens FILE: lines "uid token" (bench/throughput.py's tokens.txt); one request per line. */
static void _load_requests(client_t *cl)
{
    size_t cap = 0;
    uint32_t slots = 0;
    if (cl->tokens_file == NULL) {
        _add_request(cl, &cap, &slots, NULL, 0);
        return;
    }
    FILE *fh = fopen(cl->tokens_file, "r");
    if (fh == NULL)
        die(cl->tokens_file);
    char line[1024];
    while (fgets(line, sizeof(line), fh) != NULL) {
        size_t len = strnlen(line, sizeof(line));
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        const char *sp = memchr(line, ' ', len);
        if (sp == NULL)
            continue;
        const char *tok = sp + 1;
        _add_request(cl, &cap, &slots, tok, len - (size_t)(tok - line));
    }
    if (ferror(fh))
        die(cl->tokens_file);
    fclose(fh);
    if (cl->nreq == 0)
        fail("--tokens file has no 'uid token' line");
}

/* ---- connections -------------------------------------------------------------------- */

static void _watch(client_t *cl, conn_t *c, int op, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.ptr = c };
    if (epoll_ctl(cl->ep, op, c->fd, &ev) < 0)
        die("epoll_ctl");
}

/* Spread over 127.0.0.x when one source address has too few ephemeral ports for N (half the
 * range is left to everything else on the machine). */
static uint32_t _sources_needed(uint32_t n)
{
    unsigned lo = 32768, hi = 60999;
    FILE *fh = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (fh != NULL) {
        if (fscanf(fh, "%u %u", &lo, &hi) != 2 || hi <= lo)
            lo = 32768, hi = 60999;
        fclose(fh);
    }
    uint32_t usable = (hi - lo + 1) / 2;
    uint32_t k = (n + usable - 1) / usable;
    return k < 1 ? 1 : k > 250 ? 250 : k;
}

static void _connect(client_t *cl, conn_t *c, uint32_t index)
{
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (c->fd < 0)
        die("socket (raise RLIMIT_NOFILE?)");
    int one = 1;
    if (!cl->close_mode) {
        /* requests leave one by one, each at once (close mode sends only one: no Nagle wait) */
        if (setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
            die("TCP_NODELAY");
        /* keep-alive connections end with RST: no TIME_WAIT left behind to eat ports */
        struct linger lg = { .l_onoff = 1, .l_linger = 0 };
        if (setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
            die("SO_LINGER");
    }
    if (cl->sources > 1) {
        struct sockaddr_in src = { .sin_family = AF_INET };
        src.sin_addr.s_addr = htonl(0x7f000001u + index % cl->sources);
        if (setsockopt(c->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one)) < 0 ||
            bind(c->fd, (struct sockaddr *)&src, sizeof(src)) < 0)
            die("bind 127.0.0.x");
    }
    c->started_ns = now_ns();
    c->rlen = c->inflight = c->unsent = c->sent_off = 0;
    c->ring_head = c->ring_tail = 0;
    if (connect(c->fd, (struct sockaddr *)&cl->dst, sizeof(cl->dst)) < 0 && errno != EINPROGRESS)
        die("connect");
    c->state = C_CONNECTING;
    c->want_out = 1;
    cl->pending_connects++;
    _watch(cl, c, EPOLL_CTL_ADD, EPOLLOUT);
}

static void _close(client_t *cl, conn_t *c)
{
    if (c->state == C_CONNECTING)
        cl->pending_connects--;
    else if (c->state != C_FREE)
        cl->open--;
    close(c->fd);                    /* close() releases the descriptor even when it fails */
    c->fd = -1;
    c->state = C_FREE;
    if (cl->close_mode)
        cl->free_slots[cl->nfree++] = (uint32_t)(c - cl->conns);
}

/* Send whole requests while the socket takes them; EPOLLOUT only while some are held back. */
static int _flush(client_t *cl, conn_t *c)
{
    while (c->unsent > 0) {
        const char *p = c->req + c->sent_off;
        size_t left = c->req_len - c->sent_off;
        ssize_t n = send(c->fd, p, left, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -1;
        }
        if (c->sent_off == 0) {                   /* a request starts leaving: time it */
            c->sent_ns[c->ring_head] = now_ns();
            c->ring_head = (c->ring_head + 1) % cl->pipeline;
            c->inflight++;
        }
        c->sent_off += (uint32_t)n;
        if (c->sent_off == c->req_len) {
            c->sent_off = 0;
            c->unsent--;
        }
    }
    uint32_t want = c->unsent > 0;
    if (want != c->want_out) {
        _watch(cl, c, EPOLL_CTL_MOD, want ? EPOLLIN | EPOLLOUT : EPOLLIN);
        c->want_out = want;
    }
    return 0;
}

static void _queue(client_t *cl, conn_t *c, uint32_t requests)
{
    c->unsent += requests;
    if (_flush(cl, c) < 0) {
        cl->errors++;
        _close(cl, c);
    }
}

/* The first request: keep-alive mode primes every connection with one request; in close mode a
 * connection carries exactly one. */
static void _on_connected(client_t *cl, conn_t *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err != 0) {
        errno = err;
        if (!cl->close_mode)
            die("connect");
        cl->errors++;
        _close(cl, c);
        return;
    }
    cl->pending_connects--;
    c->state = C_OPEN;
    cl->open++;
    c->want_out = 0;
    _watch(cl, c, EPOLL_CTL_MOD, EPOLLIN);
    _queue(cl, c, 1);
}

/* Length of a complete response at the start of buf, 0 if more bytes are needed, -1 if it
 * cannot be framed.  Sets *status. */
static ssize_t _frame(const char *buf, size_t len, int *status)
{
    static const char cl_name[] = "content-length:";
    static const char te_name[] = "transfer-encoding:";
    const char *end = memmem(buf, len, "\r\n\r\n", 4);
    if (end == NULL)
        return len >= RBUF_CAP ? -1 : 0;
    size_t head = (size_t)(end - buf) + 4;
    if (head < 12 || memcmp(buf, "HTTP/1.", 7) != 0 || buf[9] < '1' || buf[9] > '5' ||
        buf[10] < '0' || buf[10] > '9' || buf[11] < '0' || buf[11] > '9')
        return -1;
    *status = (buf[9] - '0') * 100 + (buf[10] - '0') * 10 + (buf[11] - '0');
    long body = -1;
    const char *line = memchr(buf, '\n', head);
    while (line != NULL && (size_t)(line + 1 - buf) < head) {
        line++;
        size_t rest = head - (size_t)(line - buf);
        if (rest > sizeof(cl_name) - 1 && strncasecmp(line, cl_name, sizeof(cl_name) - 1) == 0) {
            const char *p = line + sizeof(cl_name) - 1, *stop = buf + head;
            while (p < stop && *p == ' ')
                p++;
            body = 0;
            while (p < stop && *p >= '0' && *p <= '9' && body < RBUF_CAP)
                body = body * 10 + (*p++ - '0');
        } else if (rest > sizeof(te_name) - 1 && strncasecmp(line, te_name, sizeof(te_name) - 1) == 0) {
            return -1;
        }
        line = memchr(line, '\n', rest);
    }
    if (body < 0) {
        if (*status == 204 || *status == 304 || *status < 200)
            body = 0;
        else
            return -1;
    }
    if (head + (size_t)body > RBUF_CAP)
        return -1;
    return head + (size_t)body <= len ? (ssize_t)(head + (size_t)body) : 0;
}

static void _on_answer(client_t *cl, conn_t *c, int status, uint64_t now)
{
    uint64_t sent = cl->close_mode ? c->started_ns : c->sent_ns[c->ring_tail];
    c->ring_tail = (c->ring_tail + 1) % cl->pipeline;
    c->inflight--;
    cl->last_answer_ns = now;
    if (cl->phase == P_MEASURE) {
        _record(cl, sent, now);
        cl->answers++;
        cl->non_2xx += status < 200 || status > 299;
    }
    if (!c->primed) {
        c->primed = 1;
        cl->primed++;
    }
    if (c->active && cl->phase != P_CONNECT && !cl->close_mode)
        _queue(cl, c, 1);
}

static void _on_readable(client_t *cl, conn_t *c)
{
    ssize_t n;
    do {
        n = recv(c->fd, c->rbuf + c->rlen, RBUF_CAP - c->rlen, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
    if (n <= 0) {
        /* close mode: the server's FIN after the answer ends a connection normally */
        if (cl->close_mode && n == 0 && c->state == C_DRAINING) {
            cl->connections_done += cl->phase == P_MEASURE;
        } else {
            cl->closed++;
        }
        _close(cl, c);
        return;
    }
    c->rlen += (uint32_t)n;
    uint64_t now = now_ns();
    size_t off = 0;
    for (;;) {
        int status = 0;
        ssize_t len = _frame(c->rbuf + off, c->rlen - off, &status);
        if (len == 0)
            break;
        if (len < 0 || c->inflight == 0) {
            cl->errors++;
            _close(cl, c);
            return;
        }
        off += (size_t)len;
        _on_answer(cl, c, status, now);
        if (c->state == C_FREE)
            return;
        if (cl->close_mode)
            c->state = C_DRAINING;
    }
    if (off > 0) {
        memmove(c->rbuf, c->rbuf + off, c->rlen - off);
        c->rlen -= (uint32_t)off;
    }
}

/* ---- the loop ----------------------------------------------------------------------- */

static void _open_more(client_t *cl)
{
    while (cl->next_connect < cl->n && cl->pending_connects < MAX_PENDING_CONNECTS) {
        conn_t *c = &cl->conns[cl->next_connect];
        _connect(cl, c, cl->next_connect);
        cl->next_connect++;
    }
}

/* Close mode: every slot whose connection ended connects again. */
static void _refill(client_t *cl)
{
    while (cl->nfree > 0) {
        uint32_t i = cl->free_slots[--cl->nfree];
        _connect(cl, &cl->conns[i], i);
    }
}

static void _start_phase(client_t *cl, phase_t phase, uint64_t now)
{
    cl->phase = phase;
    cl->phase_ns = now;
    cl->answers = cl->non_2xx = cl->closed = cl->errors = cl->waits = cl->events = 0;
    cl->connections_done = cl->max_ns = 0;
    memset(cl->hist, 0, sizeof(cl->hist));
}

static void _report(client_t *cl, double elapsed, double cpu)
{
    printf("{\"connections\": %u, \"active\": %u, \"pipeline\": %u, \"close\": %s, \"sources\": %u, "
           "\"seconds\": %.4f, \"answers\": %llu, \"rps\": %.1f, \"connections_per_s\": %.1f, "
           "\"p50_ms\": %.4f, \"p99_ms\": %.4f, \"max_ms\": %.4f, \"non_2xx\": %llu, "
           "\"closed\": %llu, \"errors\": %llu, \"waits\": %llu, \"events\": %llu, "
           "\"events_per_wait\": %.3f, \"cpu_s\": %.4f, \"cpu_pct\": %.1f, \"cpu_us_per_answer\": %.3f}\n",
           cl->n, cl->active, cl->pipeline, cl->close_mode ? "true" : "false", cl->sources, elapsed,
           (unsigned long long)cl->answers, cl->answers / elapsed, cl->connections_done / elapsed,
           _percentile_ms(cl, 0.50), _percentile_ms(cl, 0.99), cl->max_ns / 1e6,
           (unsigned long long)cl->non_2xx, (unsigned long long)cl->closed,
           (unsigned long long)cl->errors, (unsigned long long)cl->waits,
           (unsigned long long)cl->events, cl->waits ? (double)cl->events / cl->waits : 0.0,
           cpu, 100.0 * cpu / elapsed, cl->answers ? cpu * 1e6 / cl->answers : 0.0);
    if (fflush(stdout) != 0)
        die("stdout");
}

static void _run(client_t *cl)
{
    struct epoll_event *evs = calloc(MAX_EVENTS, sizeof(*evs));
    if (evs == NULL)
        die("calloc");
    uint64_t start = now_ns();
    double cpu0 = 0;
    cl->last_answer_ns = start;
    _start_phase(cl, cl->close_mode ? P_WARMUP : P_CONNECT, start);
    if (cl->close_mode) {
        cl->next_connect = cl->n;
        for (uint32_t i = 0; i < cl->n; i++)
            cl->free_slots[cl->nfree++] = cl->n - 1 - i;
    }
    for (;;) {
        if (cl->close_mode)
            _refill(cl);
        else
            _open_more(cl);
        int n = epoll_wait(cl->ep, evs, MAX_EVENTS, WAIT_MS);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        cl->waits++;
        cl->events += (uint64_t)n;
        for (int i = 0; i < n; i++) {
            conn_t *c = evs[i].data.ptr;
            if (c->state == C_CONNECTING) {
                _on_connected(cl, c);
                continue;
            }
            if (c->state == C_FREE)
                continue;                         /* closed earlier in this batch */
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                _on_readable(cl, c);
            if (c->state != C_FREE && (evs[i].events & EPOLLOUT) && _flush(cl, c) < 0) {
                cl->errors++;
                _close(cl, c);
            }
        }
        uint64_t now = now_ns();
        if (now - cl->last_answer_ns > (uint64_t)STALL_S * 1000000000u) {
            fprintf(stderr, "atr_client: no answer for %d s (%u of %u open, %u primed)\n",
                    STALL_S, cl->open, cl->n, cl->primed);
            exit(1);
        }
        if (cl->phase == P_CONNECT && cl->primed == cl->n) {
            /* every connection answered once: the active ones start, the rest stay idle */
            _start_phase(cl, P_WARMUP, now);
            for (uint32_t k = 0; k < cl->n; k++)
                if (cl->conns[k].active && cl->conns[k].state == C_OPEN)
                    _queue(cl, &cl->conns[k], cl->pipeline);
        } else if (cl->phase == P_CONNECT && (cl->closed || cl->errors)) {
            fail("the server closed a connection before answering its first request");
        } else if (cl->phase == P_WARMUP && now - cl->phase_ns >= (uint64_t)(cl->warmup_s * 1e9)) {
            _start_phase(cl, P_MEASURE, now);
            printf("measure\n");
            if (fflush(stdout) != 0)
                die("stdout");
            cpu0 = cpu_s();
        } else if (cl->phase == P_MEASURE && now - cl->phase_ns >= (uint64_t)(cl->duration_s * 1e9)) {
            double cpu = cpu_s() - cpu0;
            _report(cl, (now - cl->phase_ns) / 1e9, cpu);
            break;
        }
    }
    free(evs);
}

static void _usage(void)
{
    fprintf(stderr,
            "usage: atr_client --connect 127.0.0.1:PORT --connections N [--active A] [--pipeline D]\n"
            "                  [--duration S] [--warmup S] [--tokens FILE] [--path /Poll/getUnreadCount]\n"
            "                  [--host HOST] [--close]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "connect", required_argument, NULL, 'c' }, { "connections", required_argument, NULL, 'n' },
        { "active", required_argument, NULL, 'a' }, { "pipeline", required_argument, NULL, 'p' },
        { "duration", required_argument, NULL, 'd' }, { "warmup", required_argument, NULL, 'w' },
        { "tokens", required_argument, NULL, 't' }, { "path", required_argument, NULL, 'P' },
        { "host", required_argument, NULL, 'H' }, { "close", no_argument, NULL, 'C' },
        { NULL, 0, NULL, 0 },
    };
    client_t *cl = calloc(1, sizeof(*cl));
    if (cl == NULL)
        die("calloc");
    cl->pipeline = 1;
    cl->duration_s = 3;
    cl->warmup_s = 1;
    cl->path = "/Poll/getUnreadCount";
    cl->host = "127.0.0.1";
    int have_dst = 0, have_active = 0, opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': _parse_addr(cl, optarg); have_dst = 1; break;
        case 'n': cl->n = _u32("--connections", optarg, 1, 1000000); break;
        case 'a': cl->active = _u32("--active", optarg, 1, 1000000); have_active = 1; break;
        case 'p': cl->pipeline = _u32("--pipeline", optarg, 1, MAX_PIPELINE); break;
        case 'd': cl->duration_s = _seconds("--duration", optarg); break;
        case 'w': cl->warmup_s = _seconds("--warmup", optarg); break;
        case 't': cl->tokens_file = optarg; break;
        case 'P': cl->path = optarg; break;
        case 'H': cl->host = optarg; break;
        case 'C': cl->close_mode = 1; break;
        default: _usage();
        }
    }
    if (!have_dst || cl->n == 0 || optind != argc || cl->duration_s <= 0)
        _usage();
    if (!have_active)
        cl->active = cl->n;
    if (cl->active > cl->n)
        fail("--active must not exceed --connections");
    if (cl->close_mode && (cl->active != cl->n || cl->pipeline != 1))
        fail("--close runs every connection actively, one request each: --active N, --pipeline 1");

    need_descriptors((uint64_t)cl->n + 64);      /* one per connection, plus a few */
    _load_requests(cl);
    cl->sources = _sources_needed(cl->n);
    cl->conns = calloc(cl->n, sizeof(conn_t));
    char *rbufs = malloc((size_t)cl->n * RBUF_CAP);
    uint64_t *rings = calloc((size_t)cl->n * cl->pipeline, sizeof(uint64_t));
    cl->free_slots = calloc(cl->n, sizeof(uint32_t));
    if (cl->conns == NULL || rbufs == NULL || rings == NULL || cl->free_slots == NULL)
        die("calloc");
    for (uint32_t i = 0; i < cl->n; i++) {
        conn_t *c = &cl->conns[i];
        c->fd = -1;
        c->rbuf = rbufs + (size_t)i * RBUF_CAP;
        c->sent_ns = rings + (size_t)i * cl->pipeline;
        /* exactly A active connections, spread evenly over the N */
        c->active = (uint64_t)(i + 1) * cl->active / cl->n > (uint64_t)i * cl->active / cl->n;
        c->req = cl->arena + cl->req_off[i % cl->nreq];
        c->req_len = cl->req_len[i % cl->nreq];
    }
    cl->ep = epoll_create1(EPOLL_CLOEXEC);
    if (cl->ep < 0)
        die("epoll_create1");
    _run(cl);
    return 0;
}
