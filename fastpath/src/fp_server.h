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
#define FP_MAX_ORIGINS 16
#define FP_MAX_ORIGIN_LEN 255

/* The scalar settings of fp_config_t, one row each: X(type, field, default).  Every row is an
 * option of fastpath/options.py (OPTIONS, its c_field), which names the same fields with the same
 * defaults (tests/fastpath/test_options.py fails when the two drift).  The Cython layer sets them
 * by name through fp_config_set, so a new option needs no edit there.  A type is one token
 * (int, size_t) with an FP_CONFIG_MAX_<type> in fp_config.c. */
#define FP_CONFIG_SCALARS(X)                                                                      \
    X(int, timeout_ms, 50)            /* memcached answer deadline */                             \
    X(int, idle_timeout_s, 10)        /* whole-request read, slow-reader and keep-alive idle */    \
    X(int, max_connections, 16384)    /* per worker; beyond it new connections are closed */       \
    X(int, drain_timeout_s, 5)        /* SIGTERM waits this long for in-flight requests */         \
    X(size_t, max_body, 65536)        /* largest request body (413 beyond) */                      \
    X(size_t, max_headers, 32768)     /* largest request head (beyond: 404 MISS, Django's) */      \
    X(int, max_wait_s, 55)            /* longest hold of a poll (Prefer: wait); 0: never hold */  \
    X(int, reread_interval_s, 5)      /* a held key is read again at least this often */          \
    X(int, reread_rate, 8000)         /* ... at most this many keys a second, all workers together */ \
    X(int, stream_heartbeat_s, 25)    /* a stream's comment line this often */                     \
    X(int, max_stream_s, 300)         /* longest stream (jittered down by up to 10%) */          \
    X(int, edge_max_connections, 2048) /* the edge listener's open connections per worker */      \
    X(int, edge_max_per_address, 64)  /* held on the edge per client address, per worker; 0: no cap */ \
    X(int, edge_max_conns_per_address, 128) /* open on the edge per address, per worker; 0: no cap */ \
    X(int, max_held_per_user, 0)      /* held per user (token uid), per worker, both listeners; 0: no cap */ \
    X(int, edge_header_timeout_s, 10) /* an edge request must arrive within this of its first byte */

#define FP_CONFIG_FIELD_(type, field, dflt) type field;
#define FP_CONFIG_COUNT_(type, field, dflt) +1

enum { FP_CONFIG_N_SCALARS = 0 FP_CONFIG_SCALARS(FP_CONFIG_COUNT_) };

/* The names a Django project chooses (docs/contract.md), one row each: X(field, default, max
 * length).  Like the scalars, each is an option of fastpath/options.py (its c_field), which
 * checks their characters; C keeps `const char *field; size_t field_len;` pointing into the
 * Cython layer's bytes (or at the default literal) and checks the length only. */
#define FP_MAX_COOKIE_NAME_LEN 64
#define FP_MAX_PATH_PREFIX_LEN 64
#define FP_MAX_KEY_PREFIX_LEN 16
#define FP_CONFIG_TEXTS(X)                                                                        \
    X(cookie_name, "fastpoll_token", FP_MAX_COOKIE_NAME_LEN) /* the token's cookie */             \
    X(path_prefix, "/Poll/", FP_MAX_PATH_PREFIX_LEN)       /* polls are <path_prefix><resource> */ \
    X(key_prefix, "p1", FP_MAX_KEY_PREFIX_LEN)             /* keys are <key_prefix>:... */

#define FP_CONFIG_TEXT_FIELD_(field, dflt, max) const char *field; size_t field##_len;
#define FP_CONFIG_TEXT_COUNT_(field, dflt, max) +1

enum { FP_CONFIG_N_TEXTS = 0 FP_CONFIG_TEXTS(FP_CONFIG_TEXT_COUNT_) };

typedef struct {
    int listen_fd;                 /* bound, listening, non-blocking */
    int admin_fd;                  /* -1: no admin listener in this worker */
    int edge_fd;                   /* -1: no edge listener (clients straight, docs/contract.md 10) */
    int n_nodes;
    fp_node_t nodes[FP_MAX_SERVERS];
    const char *node_addr[FP_MAX_SERVERS];    /* numeric "host:port" / "[v6]:port" for connect */
    const unsigned char *secret;
    size_t secret_len;
    FP_CONFIG_SCALARS(FP_CONFIG_FIELD_)
    FP_CONFIG_TEXTS(FP_CONFIG_TEXT_FIELD_)
    int n_resources;
    const char *resources[FP_MAX_RESOURCES];
    size_t resource_len[FP_MAX_RESOURCES];
    int n_object_resources;        /* per-object resources: <prefix><resource>/<object>?cap= */
    const char *object_resources[FP_MAX_RESOURCES];
    size_t object_resource_len[FP_MAX_RESOURCES];
    int n_edge_origins;            /* the page origins the edge answers with CORS (exact) */
    const char *edge_origins[FP_MAX_ORIGINS];
    size_t edge_origin_len[FP_MAX_ORIGINS];
    const char *notify_dir;        /* NULL: no unix notices */
    const char *notify_udp_host;   /* numeric, no brackets; NULL: no UDP notices */
    int notify_udp_port;           /* worker i binds notify_udp_port + i */
    const char *backend_avoid[4];  /* libevent methods to avoid (NULL-terminated) */
    fp_stats_t *stats;             /* n_workers slots */
    int n_workers;
    int worker_index;
} fp_config_t;

/* The names of the scalar fields, in FP_CONFIG_SCALARS order (FP_CONFIG_N_SCALARS of them). */
extern const char *const fp_config_fields[FP_CONFIG_N_SCALARS];

/* The names of the text fields, in FP_CONFIG_TEXTS order (FP_CONFIG_N_TEXTS of them). */
extern const char *const fp_config_text_fields[FP_CONFIG_N_TEXTS];

/* Every scalar and text at its default, no listener (-1), one worker, everything else empty. */
void fp_config_defaults(fp_config_t *cfg);

/* Sets the scalar named by field (field_len bytes).  Returns 0, or -1 when no scalar has that
 * name or value does not fit it (scalars are counts and durations: 0..the type's maximum). */
int fp_config_set(fp_config_t *cfg, const char *field, size_t field_len, long long value);

/* Reads the scalar named by field (field_len bytes) into *value.  Returns 0, or -1 when no
 * scalar has that name. */
int fp_config_get(const fp_config_t *cfg, const char *field, size_t field_len, long long *value);

/* Points the text named by field at value (value_len bytes, kept by the caller for as long as
 * cfg is used).  Returns 0, or -1 when no text has that name or the length is not 1..its max. */
int fp_config_set_text(fp_config_t *cfg, const char *field, size_t field_len, const char *value,
                       size_t value_len);

/* The text named by field: 0 and *value, *value_len, or -1 when no text has that name. */
int fp_config_get_text(const fp_config_t *cfg, const char *field, size_t field_len, const char **value,
                       size_t *value_len);

/* Runs the event loop until SIGTERM/SIGINT (draining in-flight requests).  Returns 0, or -1 with
 * a message in err. */
int fp_server_run(const fp_config_t *cfg, char *err, size_t err_len);


#endif
