/* libFuzzer target for the memcached client: three real client connections (two users, two
 * resources) ask for their keys, fastpath sends its multi-key get to a socketpair that stands in
 * for memcached, and the fuzz input is what "memcached" answers.  Built with AddressSanitizer and
 * UBSan by `make fuzz`.
 *
 * Findings: a sanitizer report, a crash, a connection left open once its client is gone, an
 * answer that is not HTTP, or a 200 whose body is not a value "memcached" sent under that
 * client's own key (never another user's entry).
 */
#define _GNU_SOURCE                  /* memmem */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fp_internal.h"

#define FUZZ_SECRET "fuzz-secret-0123456789abcdef0123456789abcdef"
#define N_CLIENTS 3
#define OUT_CAP (1u << 16)

/* signed with FUZZ_SECRET, expiring in 2100 (python: plurkcore.tokens.sign) */
static const char *const tokens[2] = {
    "v1.1.0.4102444800.6579af7704b4c9cff5025edd830cdda242f77c525871d314bb59c61e8c275b16",
    "v1.2.0.4102444800.9341d22eb35be16d2ff7cda2ce4b257616207de4450fdf0dcde196714fba8bb5",
};
static const char *const resources[N_CLIENTS] = {"getMessages", "getMessages", "getUnreadCount"};
static const int users[N_CLIENTS] = {1, 2, 1};

static fp_server_t srv;
static fp_config_t cfg;
static fp_stats_t stats;
static char out[N_CLIENTS][OUT_CAP];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const char node[] = "127.0.0.1:9";
    char err[256];

    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        abort();
    fp_config_defaults(&cfg);            /* no listener: the target adopts its sockets */
    cfg.n_nodes = 1;
    cfg.nodes[0].name = node;
    cfg.nodes[0].name_len = sizeof(node) - 1;
    cfg.node_addr[0] = node;
    cfg.secret = (const unsigned char *)FUZZ_SECRET;
    cfg.secret_len = sizeof(FUZZ_SECRET) - 1;
    cfg.timeout_ms = 1000;
    cfg.idle_timeout_s = 10;
    cfg.drain_timeout_s = 1;
    cfg.max_body = 4096;
    cfg.max_headers = 2048;
    cfg.max_connections = 64;
    cfg.n_resources = 2;
    cfg.resources[0] = "getMessages";
    cfg.resource_len[0] = 11;
    cfg.resources[1] = "getUnreadCount";
    cfg.resource_len[1] = 14;
    cfg.stats = &stats;
    cfg.n_workers = 1;
    if (fp_server_init(&srv, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "fuzz_memcached: %s\n", err);
        abort();
    }
    return 0;
}

static void _spin(int rounds)
{
    for (int i = 0; i < rounds; i++)
        if (event_base_loop(srv.base, EVLOOP_NONBLOCK) < 0)
            abort();
}

static size_t _drain(int fd, char *buf, size_t len, size_t cap)
{
    for (;;) {
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n <= 0 || (size_t)(len + n) >= cap)
            return n > 0 ? len + (size_t)n : len;
        len += (size_t)n;
    }
}

/* Does the input hold "VALUE <the client's key> <flags> <n>\r\n<body>\r\n"?  (Only 200s are
 * checked: other answers carry no value.) */
static int _body_was_sent_under_own_key(const uint8_t *in, size_t in_len, int client,
                                        const char *resp, size_t resp_len)
{
    char key[64], head[160];
    const char *body;
    size_t body_len;

    if (resp_len < 12 || memcmp(resp, "HTTP/1.1 200", 12) != 0)
        return 1;
    body = memmem(resp, resp_len, "\r\n\r\n", 4);
    if (body == NULL)
        return 1;                    /* head not complete in what we read: nothing to judge */
    body += 4;
    body_len = resp_len - (size_t)(body - resp);
    snprintf(key, sizeof(key), "p1:%s:%d:0", resources[client], users[client]);
    for (size_t i = 0; i + 6 < in_len; i++) {
        if (memcmp(in + i, "VALUE ", 6) != 0)
            continue;
        const uint8_t *nl = memchr(in + i, '\n', in_len - i);
        if (nl == NULL)
            break;
        size_t line_len = (size_t)(nl - (in + i)) + 1;
        if (line_len >= sizeof(head))
            continue;
        memcpy(head, in + i, line_len);
        head[line_len] = '\0';
        char got_key[64];
        unsigned flags;
        unsigned long n;
        if (sscanf(head, "VALUE %63s %u %lu", got_key, &flags, &n) != 3 || strcmp(got_key, key) != 0)
            continue;
        size_t data_at = i + line_len;
        if (n == body_len && data_at + n <= in_len && memcmp(in + data_at, body, n) == 0)
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int mc[2], cl[N_CLIENTS][2];
    size_t out_len[N_CLIENTS] = {0};
    char sink[8192];

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, mc) < 0 ||
        fp_mc_adopt(&srv, 0, mc[0]) < 0)
        abort();
    for (int i = 0; i < N_CLIENTS; i++) {
        char req[512];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, cl[i]) < 0)
            abort();
        fp_conn_open(&srv, cl[i][0], 0);
        int n = snprintf(req, sizeof(req), "GET /Poll/%s HTTP/1.1\r\nAuthorization: Bearer %s\r\n\r\n",
                         resources[i], tokens[users[i] - 1]);
        if (send(cl[i][1], req, (size_t)n, MSG_NOSIGNAL) != n)
            abort();
    }
    _spin(4);                                   /* requests parsed, one multi-key get sent */
    (void)_drain(mc[1], sink, 0, sizeof(sink));
    for (size_t sent = 0; sent < size;) {
        ssize_t n = send(mc[1], data + sent, size - sent, MSG_NOSIGNAL);
        if (n > 0)
            sent += (size_t)n;
        _spin(2);
        if (n <= 0)
            break;
    }
    close(mc[1]);                               /* memcached goes away: the rest get 503 */
    _spin(4);
    for (int i = 0; i < N_CLIENTS; i++) {
        out_len[i] = _drain(cl[i][1], out[i], 0, OUT_CAP);
        if (out_len[i] > 0 && (out_len[i] < 9 || memcmp(out[i], "HTTP/1.1 ", 9) != 0)) {
            fprintf(stderr, "fuzz_memcached: client %d got non-HTTP: %.*s\n", i,
                    (int)(out_len[i] < 80 ? out_len[i] : 80), out[i]);
            abort();
        }
        if (!_body_was_sent_under_own_key(data, size, i, out[i], out_len[i])) {
            fprintf(stderr, "fuzz_memcached: client %d (user %d) got a value not stored under its key:\n%.*s\n",
                    i, users[i], (int)(out_len[i] < 400 ? out_len[i] : 400), out[i]);
            abort();
        }
        close(cl[i][1]);
    }
    for (int round = 0; round < 1000 && srv.n_conns > 0; round++)
        _spin(1);
    if (srv.n_conns > 0) {
        fprintf(stderr, "fuzz_memcached: a connection outlived its client\n");
        abort();
    }
    return 0;
}
