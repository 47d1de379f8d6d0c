# The C API of fastpath/src, declared once (uvloop's includes/ style).
from libc.stdint cimport uint32_t, uint64_t, int64_t

cdef extern from "fp_hash.h" nogil:
    ctypedef struct fp_node_t:
        const char *name
        size_t name_len
    uint32_t fp_murmur3_32(const void *data, size_t len, uint32_t seed)
    int fp_rendezvous_pick(const fp_node_t *nodes, int n_nodes, const char *key, size_t key_len)
    int fp_node_name_greater(const fp_node_t *a, const fp_node_t *b)

cdef extern from "fp_etag.h" nogil:
    enum:
        FP_ETAG_LEN
    int fp_etag_of(const char *body, size_t len, char *tag)


cdef extern from "fp_token.h" nogil:
    ctypedef enum fp_token_result_t:
        FP_TOKEN_OK
        FP_TOKEN_MALFORMED
        FP_TOKEN_BAD_SIGNATURE
        FP_TOKEN_EXPIRED
        FP_TOKEN_INTERNAL
    ctypedef struct fp_token_t:
        uint64_t epoch, expires
        const char *uid_str
        size_t uid_len
        const char *epoch_str
        size_t epoch_len
    ctypedef struct fp_hmac_key_t:
        pass
    int fp_hmac_prepare(fp_hmac_key_t *key, const unsigned char *secret, size_t secret_len)
    fp_token_result_t fp_token_check(const fp_hmac_key_t *key, const char *tok, size_t tok_len,
                                     int64_t now, fp_token_t *out)
    const char *fp_token_strerror(fp_token_result_t r)
    size_t fp_make_key(char *buf, size_t cap, const char *prefix, size_t prefix_len,
                       const char *res, size_t res_len, const fp_token_t *t)
    ctypedef struct fp_cap_t:
        const char *res
        const char *obj
        const char *uid
        size_t res_len, obj_len, uid_len
        uint64_t expires
    fp_token_result_t fp_cap_check(const fp_hmac_key_t *key, const char *cap, size_t len, int64_t now,
                                   fp_cap_t *out)
    size_t fp_make_object_key(char *buf, size_t cap, const char *prefix, size_t prefix_len,
                              const char *res, size_t res_len, const char *obj, size_t obj_len)
    size_t fp_make_marker_key(char *buf, size_t cap, const char *prefix, size_t prefix_len, const fp_token_t *t)
    ctypedef struct fp_header_span_t:
        const char *data
        size_t len
    ctypedef enum fp_cred_result_t:
        FP_CRED_FOUND
        FP_CRED_NONE
        FP_CRED_AMBIGUOUS
    ctypedef enum fp_cred_header_t:
        FP_CRED_OTHER
        FP_CRED_AUTHORIZATION
        FP_CRED_COOKIE
    fp_cred_header_t fp_cred_header(const char *name, size_t len)
    fp_cred_result_t fp_credentials(const fp_header_span_t *auth, int n_auth,
                                    const fp_header_span_t *cookie, int n_cookie,
                                    const char *cookie_name, size_t cookie_name_len,
                                    const char **tok, size_t *tok_len)

cdef extern from "fp_server.h" nogil:
    enum:
        FP_MAX_SERVERS
        FP_MAX_RESOURCES
        FP_MAX_RESOURCE_LEN
        FP_MAX_ORIGINS
    ctypedef struct fp_stats_t:
        pass
    ctypedef struct fp_config_t:
        int listen_fd
        int admin_fd
        int edge_fd
        int n_nodes
        fp_node_t nodes[64]
        const char *node_addr[64]
        const unsigned char *secret
        size_t secret_len
        # the scalar settings (FP_CONFIG_SCALARS) are set by name: fp_config_set; the texts
        # (FP_CONFIG_TEXTS) by fp_config_set_text
        int n_resources
        const char *resources[16]
        size_t resource_len[16]
        int n_object_resources
        const char *object_resources[16]
        size_t object_resource_len[16]
        int n_edge_origins
        const char *edge_origins[16]
        size_t edge_origin_len[16]
        const char *notify_dir
        const char *notify_udp_host
        int notify_udp_port
        const char *backend_avoid[4]
        fp_stats_t *stats
        int n_workers
        int worker_index
    enum:
        FP_CONFIG_N_SCALARS
        FP_CONFIG_N_TEXTS
    const char *const fp_config_fields[]
    const char *const fp_config_text_fields[]
    void fp_config_defaults(fp_config_t *cfg)
    int fp_config_set(fp_config_t *cfg, const char *field, size_t field_len, long long value)
    int fp_config_get(const fp_config_t *cfg, const char *field, size_t field_len, long long *value)
    int fp_config_set_text(fp_config_t *cfg, const char *field, size_t field_len, const char *value,
                           size_t value_len)
    int fp_config_get_text(const fp_config_t *cfg, const char *field, size_t field_len, const char **value,
                           size_t *value_len)
    int fp_server_run(const fp_config_t *cfg, char *err, size_t err_len)
    size_t fp_stats_render(const fp_stats_t *slots, int n, char *buf, size_t cap)

cdef extern from "event2/event.h" nogil:
    struct event_base:
        pass
    enum:
        EVLOOP_NONBLOCK
    event_base *event_base_new()
    void event_base_free(event_base *base)
    int event_base_loop(event_base *base, int flags)

cdef extern from "fp_mc.h" nogil:
    ctypedef enum fp_mc_result_t:
        FP_MC_QUEUED
        FP_MC_HIT
        FP_MC_EMPTY
        FP_MC_MISS
        FP_MC_UNAVAILABLE
        FP_MC_OVERLOADED
    ctypedef struct fp_mc_req_t:
        pass
    ctypedef void (*fp_mc_done_fn)(void *ctx, fp_mc_result_t r, const char *data, size_t len)
    ctypedef struct fp_mc_pool_t:
        pass
    int fp_mc_pool_init(fp_mc_pool_t *pool, event_base *base, fp_stats_t *st,
                        const fp_config_t *cfg, char *err, size_t err_len)
    void fp_mc_pool_fini(fp_mc_pool_t *pool)
    fp_mc_result_t fp_mc_get(fp_mc_pool_t *pool, const char *key, size_t key_len,
                             fp_mc_done_fn done, void *ctx, fp_mc_req_t **req)
    void fp_mc_cancel(fp_mc_req_t *req)
    int fp_mc_adopt(fp_mc_pool_t *pool, int index, int fd)
    size_t fp_mc_in_cap(const fp_mc_pool_t *pool, int index)
