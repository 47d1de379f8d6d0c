/* The fastpath HTTP server: one event base per worker process (docs/fastpath.md).
 * Public to the Cython layer: configuration in, stats out. */
#ifndef FP_SERVER_H
#define FP_SERVER_H
#include <stddef.h>
#include <stdint.h>

#include "fp_hash.h"
#include "fp_stats.h"

#define FP_MAX_SERVERS 64
#define FP_MAX_RESOURCES 16
#define FP_MAX_RESOURCE_LEN 32

typedef struct {
    int listen_fd;                 /* bound, listening, non-blocking */
    int admin_fd;                  /* -1: no admin listener in this worker */
    int n_nodes;
    fp_node_t nodes[FP_MAX_SERVERS];
    const char *node_addr[FP_MAX_SERVERS];    /* "host:port" / "[v6]:port" for connect */
    const unsigned char *secret;
    size_t secret_len;
    int timeout_ms;                /* memcached answer deadline */
    int idle_timeout_s;            /* whole-request read, slow-reader and keep-alive idle timeout */
    int max_connections;           /* per worker; beyond it new connections are closed at once */
    int drain_timeout_s;
    size_t max_body;
    size_t max_headers;
    int n_resources;
    const char *resources[FP_MAX_RESOURCES];
    size_t resource_len[FP_MAX_RESOURCES];
    const char *backend_avoid[4];  /* libevent methods to avoid (NULL-terminated) */
    fp_stats_t *stats;             /* n_workers slots */
    int n_workers;
    int worker_index;
} fp_config_t;

/* Runs the event loop until SIGTERM/SIGINT (draining in-flight requests).  Returns 0, or -1 with
 * a message in err. */
int fp_server_run(const fp_config_t *cfg, char *err, size_t err_len);


#endif
