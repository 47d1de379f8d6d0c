/* Poll tokens: "v1." uid "." epoch "." expires "." 64-hex HMAC-SHA256, and where a request
 * carries one (docs/contract.md s. 2).  uid is text (Django's str(pk): "42", a UUID...). */
#ifndef FP_TOKEN_H
#define FP_TOKEN_H
#include <stddef.h>
#include <stdint.h>

#include <openssl/sha.h>

#define FP_UID_MAX_LEN 64
/* "v1." + uid + "." + 19-digit epoch + "." + 19-digit expires + "." + 64 hex */
#define FP_TOKEN_MAX_LEN (3 + FP_UID_MAX_LEN + 1 + 19 + 1 + 19 + 1 + 64)

typedef enum {
    FP_TOKEN_OK = 0,
    FP_TOKEN_MALFORMED = -1,
    FP_TOKEN_BAD_SIGNATURE = -2,
    FP_TOKEN_EXPIRED = -3,
    FP_TOKEN_INTERNAL = -4,          /* libcrypto failed: not the client's fault (503) */
} fp_token_result_t;

typedef struct {
    uint64_t epoch, expires;
    /* The uid and epoch spans inside the token, reused verbatim to build the cache key. */
    const char *uid_str;   size_t uid_len;
    const char *epoch_str; size_t epoch_len;
} fp_token_t;

/* HMAC-SHA256 with the key's inner and outer SHA-256 states computed once at start-up, so a
 * check costs two short SHA-256 runs and no allocation (OpenSSL 3's one-shot HMAC() fetches its
 * algorithm on every call).  fp_token.c says why this uses OpenSSL's deprecated SHA256_* API. */
typedef struct {
    SHA256_CTX inner, outer;
} fp_hmac_key_t;

/* SHA-256 of len bytes into md (32 bytes): 0, or -1 if libcrypto failed.  On the low-level API,
 * as the HMAC: OpenSSL 3's one-shot SHA256() and EVP_Digest fetch the algorithm through the
 * providers on every call (477 ns against 153 ns for 120 bytes here), and their first call sets
 * the providers up, about half a megabyte of heap in every fastpath worker. */
int fp_sha256(const void *data, size_t len, unsigned char md[SHA256_DIGEST_LENGTH]);

/* 0, or -1 if libcrypto failed (the key is then unusable). */
int fp_hmac_prepare(fp_hmac_key_t *key, const unsigned char *secret, size_t secret_len);

fp_token_result_t fp_token_check(const fp_hmac_key_t *key, const char *tok, size_t tok_len,
                                 int64_t now, fp_token_t *out);

const char *fp_token_strerror(fp_token_result_t r);

/* Build prefix ":" resource ":" uid ":" epoch into buf (prefix: --key-prefix, "p1" by default);
 * returns the length, or 0 if it does not fit. */
size_t fp_make_key(char *buf, size_t cap, const char *prefix, size_t prefix_len,
                   const char *res, size_t res_len, const fp_token_t *t);

/* ---- capabilities: per-object polls (docs/contract.md section 8) ---- */

#define FP_CAP_RESOURCE_MAX 32
/* "c1." + resource + "." + object + "." + uid + "." + 19-digit expires + "." + 64 hex */
#define FP_CAP_MAX_LEN (3 + FP_CAP_RESOURCE_MAX + 1 + FP_UID_MAX_LEN + 1 + FP_UID_MAX_LEN + 1 + 19 + 1 + 64)

typedef struct {
    const char *res, *obj, *uid;     /* spans inside the capability */
    size_t res_len, obj_len, uid_len;
    uint64_t expires;
} fp_cap_t;

/* "c1." resource "." object "." uid "." expires "." HMAC-SHA256 hex, checked as fp_token_check
 * checks a token (the same results); the caller compares resource, object and uid. */
fp_token_result_t fp_cap_check(const fp_hmac_key_t *key, const char *cap, size_t len, int64_t now,
                               fp_cap_t *out);

/* object = 1*64( ALPHA / DIGIT / "-" / "_" ) */
int fp_is_object_name(const char *s, size_t len);

/* prefix ":" resource ":" object ":o" (the object's key) and prefix ":@:" uid ":" epoch (the
 * user's epoch marker) into buf: the length, or 0 if it does not fit. */
size_t fp_make_object_key(char *buf, size_t cap, const char *prefix, size_t prefix_len,
                          const char *res, size_t res_len, const char *obj, size_t obj_len);
size_t fp_make_marker_key(char *buf, size_t cap, const char *prefix, size_t prefix_len, const fp_token_t *t);

/* ---- credentials: which bytes of a request are its token ---- */

/* One header value as received (no NUL terminator). */
typedef struct {
    const char *data;
    size_t len;
} fp_header_span_t;

typedef enum {
    FP_CRED_FOUND = 0,               /* *tok is the token (maybe invalid: the token check says) */
    FP_CRED_NONE = -1,               /* no credential: 401 "authentication required" */
    FP_CRED_AMBIGUOUS = -2,          /* Django could read it otherwise: 404 MISS, Django decides */
} fp_cred_result_t;

typedef enum {
    FP_CRED_OTHER = 0,
    FP_CRED_AUTHORIZATION,
    FP_CRED_COOKIE,
} fp_cred_header_t;

/* Which credential header a field name is; ASCII case folding only (never the C locale's). */
fp_cred_header_t fp_cred_header(const char *name, size_t len);

/* The token of a request, read as Django reads it.  auth and cookie are the first Authorization
 * and Cookie values, n_auth and n_cookie how many times each header came (a span is read only
 * when its count is 1); cookie_name is the token's cookie (--cookie-name).  Pure: *tok points
 * into auth or cookie. */
fp_cred_result_t fp_credentials(const fp_header_span_t *auth, int n_auth,
                                const fp_header_span_t *cookie, int n_cookie,
                                const char *cookie_name, size_t cookie_name_len,
                                const char **tok, size_t *tok_len);

#endif
