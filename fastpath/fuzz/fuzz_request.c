/* libFuzzer target for the request path: arbitrary client bytes go through the real connection
 * code (llhttp, fp_conn.c's decisions, token checks, answers) on a real event base, over a
 * socketpair.  memcached is a closed port, so requests with a valid token (the corpus has some)
 * reach fp_mc.c and get 503.  Built with AddressSanitizer and UBSan by `make fuzz`.
 *
 * The first input byte picks how the rest is cut into reads (0: all at once; otherwise pieces
 * of 1..255 bytes, with the loop run between them), so that every parser callback also meets
 * its data split at any point, as a slow or hostile client would send it.  An odd first byte
 * also opens the connection as a TCP listener that defers accept does: its first piece is
 * already there, and it is read at once, unarmed until it must wait for the client.
 *
 * A first byte with its top bit set opens the connection on the edge listener instead (docs/
 * contract.md section 10: CORS, preflights, refusals, misses sent to the site, caps of 1 held
 * per address and per user).
 *
 * A finding is a sanitizer report, a crash, a hang, or an answer that is not HTTP.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fp_internal.h"

#define FUZZ_SECRET "fuzz-secret-0123456789abcdef0123456789abcdef"
#define FUZZ_OUT_CAP (1u << 20)

static fp_server_t srv;
static fp_config_t cfg;
static fp_stats_t stats;
static char *out;

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
    cfg.timeout_ms = 50;
    cfg.idle_timeout_s = 10;
    cfg.drain_timeout_s = 1;
    cfg.max_body = 4096;
    cfg.max_headers = 2048;
    cfg.max_connections = 64;
    cfg.cookie_name = "plurk_token";     /* the corpus's cookie (the demo's; C's default is */
    cfg.cookie_name_len = 11;            /* the library's fastpoll_token) */
    cfg.n_resources = 2;
    cfg.resources[0] = "getMessages";
    cfg.resource_len[0] = 11;
    cfg.resources[1] = "getUnreadCount";
    cfg.resource_len[1] = 14;
    cfg.n_object_resources = 1;      /* object polls (the corpus has some with a valid capability) */
    cfg.object_resources[0] = "thread";
    cfg.object_resource_len[0] = 6;
    static const char *const origins[] = {"https://www.example.com", "http://localhost:8000"};
    cfg.n_edge_origins = 2;
    for (int i = 0; i < 2; i++) {
        cfg.edge_origins[i] = origins[i];
        cfg.edge_origin_len[i] = strlen(origins[i]);
    }
    cfg.edge_max_connections = 64;
    cfg.edge_max_per_address = 1;    /* a socketpair has no address: never counted, never refused */
    cfg.max_held_per_user = 1;
    cfg.edge_header_timeout_s = 5;
    cfg.stats = &stats;
    cfg.n_workers = 1;
    if (fp_server_init(&srv, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "fuzz_request: %s\n", err);
        abort();
    }
    out = malloc(FUZZ_OUT_CAP);
    if (out == NULL)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    size_t sent = 0, out_len = 0;
    int shut = 0;

    size_t piece = size;
    int read_now = 0;
    fp_conn_kind_t kind = FP_CONN_POLL;

    if (size > 0) {
        piece = data[0] ? data[0] : size;
        read_now = data[0] & 1;
        kind = data[0] & 0x80 ? FP_CONN_EDGE : FP_CONN_POLL;
        data++;
        size--;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    if (read_now && size > 0) {
        ssize_t n = send(sv[1], data, size < piece ? size : piece, MSG_NOSIGNAL);
        if (n > 0)
            sent = (size_t)n;
    }
    fp_listener_t ls = {.srv = &srv, .fd = -1, .kind = (uint8_t)kind, .nodelay = FP_NODELAY_NONE,
                        .read_on_accept = (uint8_t)read_now};
    fp_conn_open(&ls, sv[0]);
    for (int round = 0; round < 100000 && srv.n_conns > 0; round++) {
        if (sent < size) {
            size_t want = size - sent < piece ? size - sent : piece;
            ssize_t n = send(sv[1], data + sent, want, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
        }
        if (sent == size && !shut) {
            if (shutdown(sv[1], SHUT_WR) < 0)     /* the client is done: the server sees EOF */
                abort();
            shut = 1;
        }
        if (event_base_loop(srv.base, EVLOOP_NONBLOCK) < 0)
            abort();
        ssize_t n = recv(sv[1], out + out_len, FUZZ_OUT_CAP - out_len, 0);
        if (n > 0)
            out_len += (size_t)n;
        if (round > 100 && sent == size)
            usleep(100);                  /* a memcached deadline (50 ms) may be pending */
    }
    if (srv.n_conns > 0) {
        fprintf(stderr, "fuzz_request: connection still open after the input ended\n");
        abort();
    }
    if (out_len > 0 && (out_len < 9 || memcmp(out, "HTTP/1.1 ", 9) != 0)) {
        fprintf(stderr, "fuzz_request: answer is not HTTP: %.*s\n", (int)(out_len < 80 ? out_len : 80), out);
        abort();
    }
    close(sv[1]);
    return 0;
}
