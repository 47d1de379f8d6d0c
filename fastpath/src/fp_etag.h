/* Long-polling's validators and preferences (docs/contract.md section 7): the ETag of an answer,
 * the one entity-tag of If-None-Match, and the wait of Prefer.  Pure functions over
 * (pointer, length): they know nothing of connections. */
#ifndef FP_ETAG_H
#define FP_ETAG_H
#include <stddef.h>
#include <stdint.h>

#define FP_ETAG_HEX 32               /* the first 32 lowercase hex digits of SHA-256(body) */
#define FP_ETAG_LEN (FP_ETAG_HEX + 2)   /* with its quotes */
#define FP_WAIT_MAX_S 86400

/* tag = '"' + hex(SHA-256(body))[:32] + '"' (FP_ETAG_LEN bytes, not NUL-terminated).
 * -1 if libcrypto fails. */
int fp_etag_of(const char *body, size_t len, char tag[FP_ETAG_LEN]);

typedef enum {
    FP_INM_NONE,                     /* no If-None-Match */
    FP_INM_TAG,                      /* one entity-tag that may be ours: opaque in tag */
    FP_INM_OTHER,                    /* one well-formed entity-tag that can never be ours */
    FP_INM_UNREADABLE                /* a list, "*", garbage, or the header repeated: Django's */
} fp_inm_t;

/* One entity-tag, strong or W/ weak (RFC 9110 8.8.3), surrounded by optional whitespace.  For
 * FP_INM_TAG, tag gets its opaque-tag with quotes (weak comparison ignores W/). */
fp_inm_t fp_inm_parse(const char *v, size_t len, char tag[FP_ETAG_LEN]);

/* Prefer (RFC 7240): the value of the first wait=N preference (0..86400), or -1 when there is
 * none or it cannot be read (then there is no wait).  Other preferences are ignored. */
int32_t fp_prefer_wait(const char *v, size_t len);

/* Accept: 1 if one of its media ranges is text/event-stream (parameters ignored), else 0. */
int fp_accept_event_stream(const char *v, size_t len);

/* Last-Event-ID: 1 and tag if the value (OWS trimmed) is FP_ETAG_LEN bytes, else 0. */
int fp_last_event_id(const char *v, size_t len, char tag[FP_ETAG_LEN]);

#endif
