/* libFuzzer target for the memcached client alone (fp_mc.h, no HTTP): a few gets (two users, two
 * resources, one key asked twice) wait in a real pool on a real event base, whose server is a
 * socketpair; the input decides which gets are cancelled and where "memcached"'s reply is split
 * into reads, and the rest of it is that reply.  Built with AddressSanitizer and UBSan by
 * `make fuzz`.
 *
 * Input: byte 0, bit i: get i is cancelled before it is written; byte 1, bit i: after it is
 * written; byte 2, bit i: get i's callback cancels the next get still waiting and asks again for
 * its own key (callbacks may do both); byte 3: how the reply is split (0: one write); the rest:
 * the reply.
 *
 * Findings: a sanitizer report, a crash, a get answered twice, a cancelled get answered, a get
 * never answered, a get written although it was cancelled first, a value handed to a get that
 * the input did not send under that get's own key (never another user's entry) with 32-bit flags,
 * or a read buffer left larger than its usual size.  The pool's buffer starts at IN_START and
 * holds replies of at most IN_MAX bytes here, so that growing, shrinking and larger values (a
 * miss for their key, dropped as they pass) are within the reach of inputs of a few KiB.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fp_mc.h"

#define N_FIRST 4                    /* gets made before the reply */
#define N_MAX 12                     /* ... plus those callbacks make */
#define HEADER 4
#define IN_START 1024                /* the pool's read buffer, lowered from 64 KiB */
#define IN_MAX 4096                  /* the pool's largest reply buffered, lowered from 2 MiB */

typedef struct {
    int index;
    int key_index;
    const char *key;
    size_t key_len;
    fp_mc_req_t *req;
    int answers;
    int cancelled;
    int again;                       /* byte 2: cancel the next one and ask again */
} get_t;

static const char *const keys[3] = {"p1:getMessages:1:0", "p1:getMessages:2:0", "p1:getUnreadCount:1:0"};
static const int first_keys[N_FIRST] = {0, 1, 2, 0};

static struct event_base *base;
static fp_mc_pool_t pool;
static fp_config_t cfg;
static fp_stats_t stats;
static get_t gets[N_MAX];
static int n_gets;
static const uint8_t *reply;         /* this input's reply (what the values must come from) */
static size_t reply_len;

static void _die(const char *why, const get_t *g)
{
    fprintf(stderr, "fuzz_memcached: %s (get %d, key %s)\n", why, g != NULL ? g->index : -1,
            g != NULL ? g->key : "-");
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const char node[] = "127.0.0.1:9";
    char err[256];

    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        abort();
    base = event_base_new();
    if (base == NULL)
        abort();
    fp_config_defaults(&cfg);
    cfg.n_nodes = 1;
    cfg.nodes[0].name = node;
    cfg.nodes[0].name_len = sizeof(node) - 1;
    cfg.node_addr[0] = node;
    cfg.timeout_ms = 10000;          /* never reached: each input takes milliseconds */
    if (fp_mc_pool_init(&pool, base, &stats, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "fuzz_memcached: %s\n", err);
        abort();
    }
    pool.in_start = IN_START;        /* inputs of a few KiB grow the buffer and reach the */
    pool.in_max = IN_MAX;            /* values not buffered */
    return 0;
}

static void _spin(int rounds)
{
    for (int i = 0; i < rounds; i++)
        if (event_base_loop(base, EVLOOP_NONBLOCK) < 0)
            abort();
}

static size_t _read_all(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    while (len < cap) {
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    return len;
}

/* Parse "<digits>" at s[*i..len) into *v; 0 when absent or above max. */
static int _digits(const uint8_t *s, size_t len, size_t *i, uint64_t max, uint64_t *v)
{
    size_t start = *i;
    *v = 0;
    while (*i < len && s[*i] >= '0' && s[*i] <= '9') {
        *v = *v * 10 + (uint64_t)(s[*i] - '0');
        if (*v > max)
            return 0;
        (*i)++;
    }
    return *i > start;
}

/* Did the reply hold "VALUE <key> <flags> <n>\r\n<data>\r\n", flags a 32-bit number? */
static int _sent_under_key(const get_t *g, const char *data, size_t len)
{
    for (size_t at = 0; at + 6 < reply_len; at++) {
        const uint8_t *s = reply + at;
        size_t left = reply_len - at, i = 6;
        uint64_t flags, n;
        if (memcmp(s, "VALUE ", 6) != 0 || left < i + g->key_len + 1 ||
            memcmp(s + i, g->key, g->key_len) != 0 || s[i + g->key_len] != ' ')
            continue;
        i += g->key_len + 1;
        if (!_digits(s, left, &i, UINT32_MAX, &flags) || i >= left || s[i++] != ' ' ||
            !_digits(s, left, &i, UINT32_MAX, &n) || i + 2 > left || s[i] != '\r' || s[i + 1] != '\n')
            continue;
        i += 2;
        if (n == len && i + n <= left && (len == 0 || memcmp(s + i, data, len) == 0))
            return 1;
    }
    return 0;
}

static void _add_get(int key);

static void _on_done(void *ctx, fp_mc_result_t r, const char *data, size_t len)
{
    get_t *g = ctx;
    if (g->cancelled)
        _die("a cancelled get was answered", g);
    if (g->answers++ > 0)
        _die("a get was answered twice", g);
    g->req = NULL;
    if ((r == FP_MC_HIT && len == 0) || (r == FP_MC_EMPTY && len != 0))
        _die("a hit without a value, or an empty hit with one", g);
    if (r == FP_MC_HIT && len > IN_MAX)
        _die("a value larger than the client buffers was handed out", g);
    if ((r == FP_MC_HIT || r == FP_MC_EMPTY) && !_sent_under_key(g, data, len)) {
        fprintf(stderr, "fuzz_memcached: value %.*s\n", (int)(len < 200 ? len : 200), data);
        _die("a value the reply did not send under this get's key", g);
    }
    if (r == FP_MC_QUEUED || r > FP_MC_OVERLOADED)
        _die("not an answer", g);
    if (!g->again)
        return;
    for (get_t *o = g + 1; o < gets + n_gets; o++) {
        if (o->req != NULL) {
            fp_mc_cancel(o->req);
            o->req = NULL;
            o->cancelled = 1;
            break;
        }
    }
    _add_get(g->key_index);
}

static void _add_get(int key)
{
    if (n_gets >= N_MAX)
        return;
    get_t *g = &gets[n_gets];
    memset(g, 0, sizeof(*g));
    g->index = n_gets;
    g->key_index = key;
    g->key = keys[key];
    g->key_len = strlen(keys[key]);
    fp_mc_result_t r = fp_mc_get(&pool, g->key, g->key_len, _on_done, g, &g->req);
    if (r != FP_MC_QUEUED) {
        if (r != FP_MC_UNAVAILABLE)
            _die("a get was refused other than as unavailable", g);
        return;                      /* asked while the server is down: answered at once */
    }
    n_gets++;
}

static void _cancel(get_t *g)
{
    if (g->req == NULL)
        return;                      /* answered already */
    fp_mc_cancel(g->req);
    g->req = NULL;
    g->cancelled = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    char sink[8192], expect[512];
    size_t expect_len = 3;
    uint32_t rnd;

    if (size < HEADER)
        return 0;
    reply = data + HEADER;
    reply_len = size - HEADER;
    rnd = data[3];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0 ||
        fp_mc_adopt(&pool, 0, sv[0]) < 0)
        abort();
    n_gets = 0;
    memcpy(expect, "get", 3);
    for (int i = 0; i < N_FIRST; i++) {
        _add_get(first_keys[i]);
        gets[i].again = (data[2] >> i) & 1;
        if ((data[0] >> i) & 1) {
            _cancel(&gets[i]);       /* not written yet: must never be */
        } else {
            expect[expect_len++] = ' ';
            memcpy(expect + expect_len, gets[i].key, gets[i].key_len);
            expect_len += gets[i].key_len;
        }
    }
    memcpy(expect + expect_len, "\r\n", 2);
    expect_len += 2;
    _spin(2);                        /* the deferred flush writes one "get" line */
    size_t got = _read_all(sv[1], sink, sizeof(sink));
    if (expect_len == 5 ? got != 0 : got != expect_len || memcmp(sink, expect, got) != 0) {
        fprintf(stderr, "fuzz_memcached: wrote %.*s, expected %.*s\n", (int)got, sink,
                (int)expect_len, expect);
        _die("the gets written are not the ones still wanted", NULL);
    }
    for (int i = 0; i < N_FIRST; i++)
        if ((data[1] >> i) & 1)
            _cancel(&gets[i]);       /* written: its reply must still be matched, then dropped */

    for (size_t sent = 0; sent < reply_len;) {
        size_t chunk = reply_len - sent;
        if (rnd != 0) {
            rnd = rnd * 1103515245u + 12345u;
            size_t cut = 1 + (rnd >> 16) % 97;
            chunk = chunk < cut ? chunk : cut;
        }
        ssize_t n = send(sv[1], reply + sent, chunk, MSG_NOSIGNAL);
        if (n > 0)
            sent += (size_t)n;
        _spin(1);
        (void)_read_all(sv[1], sink, sizeof(sink));      /* gets the callbacks made */
        if (n <= 0)
            break;                   /* the client closed its end (reset) */
    }
    close(sv[1]);                    /* memcached goes away: the rest get 503 */
    _spin(4);
    for (int i = 0; i < n_gets; i++)
        if (!gets[i].cancelled && gets[i].answers != 1)
            _die("a get that was not cancelled was never answered", &gets[i]);
    if (stats.inflight != 0)
        _die("gets left in flight", NULL);
    if (fp_mc_in_cap(&pool, 0) != IN_START)
        _die("the read buffer did not shrink back", NULL);
    return 0;
}
