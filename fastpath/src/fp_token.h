/* Poll tokens: "v1." uid "." epoch "." expires "." 64-hex HMAC-SHA256 (docs/contract.md s. 2). */
#ifndef FP_TOKEN_H
#define FP_TOKEN_H
#include <stddef.h>
#include <stdint.h>

#include <openssl/sha.h>

#define FP_TOKEN_MAX_LEN 128

typedef enum {
    FP_TOKEN_OK = 0,
    FP_TOKEN_MALFORMED = -1,
    FP_TOKEN_BAD_SIGNATURE = -2,
    FP_TOKEN_EXPIRED = -3,
    FP_TOKEN_INTERNAL = -4,          /* libcrypto failed: not the client's fault (503) */
} fp_token_result_t;

typedef struct {
    uint64_t uid, epoch, expires;
    /* The decimal spans inside the token, reused verbatim to build the cache key. */
    const char *uid_str;   size_t uid_len;
    const char *epoch_str; size_t epoch_len;
} fp_token_t;

/* HMAC-SHA256 with the key's inner and outer SHA-256 states computed once at start-up, so a
 * check costs two short SHA-256 runs and no allocation (OpenSSL 3's one-shot HMAC() fetches its
 * algorithm on every call).  fp_token.c says why this uses OpenSSL's deprecated SHA256_* API. */
typedef struct {
    SHA256_CTX inner, outer;
} fp_hmac_key_t;

/* 0, or -1 if libcrypto failed (the key is then unusable). */
int fp_hmac_prepare(fp_hmac_key_t *key, const unsigned char *secret, size_t secret_len);

fp_token_result_t fp_token_check(const fp_hmac_key_t *key, const char *tok, size_t tok_len,
                                 int64_t now, fp_token_t *out);

const char *fp_token_strerror(fp_token_result_t r);

/* Build "p1:" resource ":" uid ":" epoch into buf; returns the length, or 0 if it does not fit. */
size_t fp_make_key(char *buf, size_t cap, const char *res, size_t res_len, const fp_token_t *t);

#endif
