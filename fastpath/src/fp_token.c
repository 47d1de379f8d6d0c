#include <string.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "fp_token.h"

#define FP_MAX_DIGITS 19
static const uint64_t FP_MAX_INT = 9223372036854775807ULL;

/* decimal = "0" / %x31-39 *18DIGIT   (allow_zero selects whether "0" is accepted)
 * Parses s[*pos ..) up to the next '.', returns 0 and advances *pos past the digits. */
static int _parse_decimal(const char *s, size_t len, size_t *pos, int allow_zero,
                          uint64_t *value, const char **start, size_t *n_digits)
{
    size_t i = *pos, n = 0;
    uint64_t v = 0;

    while (i < len && s[i] >= '0' && s[i] <= '9') {
        if (++n > FP_MAX_DIGITS)
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
        i++;
    }
    if (n == 0 || v > FP_MAX_INT)
        return -1;
    if (s[*pos] == '0' && (n > 1 || !allow_zero))
        return -1;
    *start = s + *pos;
    *n_digits = n;
    *value = v;
    *pos = i;
    return 0;
}

static int _expect_dot(const char *s, size_t len, size_t *pos)
{
    if (*pos >= len || s[*pos] != '.')
        return -1;
    (*pos)++;
    return 0;
}

/* RFC 2104 with SHA-256, on the low-level SHA256_Init/Update/Final API.
 *
 * That API is deprecated in OpenSSL 3 but still part of it, and it is the only one that keeps
 * the precomputed pads at no cost per check: a SHA256_CTX is a plain struct, so starting from
 * the prepared inner/outer state is a struct copy.  The supported alternatives copy provider
 * contexts instead; measured here (OpenSSL 3.0, a token-sized message), one HMAC costs 100 ns
 * this way, 129 ns with EVP_MD_CTX_copy_ex from prepared EVP_MD_CTXs, 157 ns re-initialising
 * an EVP_MAC_CTX with its key kept (EVP_MAC_init with a NULL key) and 369 ns with
 * EVP_MAC_CTX_dup.  Every call's result is checked (1 is success); a failure is
 * FP_TOKEN_INTERNAL (503), never "bad signature".  The deprecation warnings are silenced for
 * these two functions only (the fuzz build, without setup.py's -Wno-deprecated-declarations,
 * stays quiet too). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* keys longer than the 64-byte block are hashed first */
int fp_hmac_prepare(fp_hmac_key_t *key, const unsigned char *secret, size_t secret_len)
{
    unsigned char block[SHA256_CBLOCK], pad[SHA256_CBLOCK];
    int ok = 1;

    memset(block, 0, sizeof(block));
    if (secret_len > sizeof(block))
        ok = SHA256(secret, secret_len, block) != NULL;
    else
        memcpy(block, secret, secret_len);
    for (size_t i = 0; i < sizeof(block); i++)
        pad[i] = block[i] ^ 0x36;
    ok = ok && SHA256_Init(&key->inner) == 1 && SHA256_Update(&key->inner, pad, sizeof(pad)) == 1;
    for (size_t i = 0; i < sizeof(block); i++)
        pad[i] = block[i] ^ 0x5c;
    ok = ok && SHA256_Init(&key->outer) == 1 && SHA256_Update(&key->outer, pad, sizeof(pad)) == 1;
    OPENSSL_cleanse(block, sizeof(block));
    OPENSSL_cleanse(pad, sizeof(pad));
    return ok ? 0 : -1;
}

static int _hmac(const fp_hmac_key_t *key, const char *msg, size_t len, unsigned char out[32])
{
    SHA256_CTX ctx = key->inner;
    unsigned char inner[32];
    if (SHA256_Update(&ctx, msg, len) != 1 || SHA256_Final(inner, &ctx) != 1)
        return -1;
    ctx = key->outer;
    if (SHA256_Update(&ctx, inner, sizeof(inner)) != 1 || SHA256_Final(out, &ctx) != 1)
        return -1;
    return 0;
}
#pragma GCC diagnostic pop

fp_token_result_t fp_token_check(const fp_hmac_key_t *key, const char *tok, size_t len,
                                 int64_t now, fp_token_t *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t pos = 3, payload_len, n_expires;
    const char *expires_str;
    unsigned char mac[32];
    char mac_hex[64];

    if (len < 3 || len > FP_TOKEN_MAX_LEN || memcmp(tok, "v1.", 3) != 0)
        return FP_TOKEN_MALFORMED;
    if (_parse_decimal(tok, len, &pos, 0, &out->uid, &out->uid_str, &out->uid_len) < 0 ||
        _expect_dot(tok, len, &pos) < 0 ||
        _parse_decimal(tok, len, &pos, 1, &out->epoch, &out->epoch_str, &out->epoch_len) < 0 ||
        _expect_dot(tok, len, &pos) < 0 ||
        _parse_decimal(tok, len, &pos, 0, &out->expires, &expires_str, &n_expires) < 0)
        return FP_TOKEN_MALFORMED;
    payload_len = pos;
    if (_expect_dot(tok, len, &pos) < 0 || len - pos != 64)
        return FP_TOKEN_MALFORMED;
    for (size_t i = pos; i < len; i++) {
        char c = tok[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return FP_TOKEN_MALFORMED;
    }
    if (_hmac(key, tok, payload_len, mac) != 0)
        return FP_TOKEN_INTERNAL;
    for (unsigned int i = 0; i < 32; i++) {
        mac_hex[2 * i] = hex[mac[i] >> 4];
        mac_hex[2 * i + 1] = hex[mac[i] & 15];
    }
    if (CRYPTO_memcmp(mac_hex, tok + pos, 64) != 0)
        return FP_TOKEN_BAD_SIGNATURE;
    if (now < 0 || (uint64_t)now >= out->expires)
        return FP_TOKEN_EXPIRED;
    return FP_TOKEN_OK;
}

const char *fp_token_strerror(fp_token_result_t r)
{
    switch (r) {
    case FP_TOKEN_OK: return "ok";
    case FP_TOKEN_MALFORMED: return "malformed token";
    case FP_TOKEN_BAD_SIGNATURE: return "bad signature";
    case FP_TOKEN_EXPIRED: return "token expired";
    case FP_TOKEN_INTERNAL: return "token check failed";
    }
    return "invalid token";
}

size_t fp_make_key(char *buf, size_t cap, const char *res, size_t res_len, const fp_token_t *t)
{
    size_t need = 3 + res_len + 1 + t->uid_len + 1 + t->epoch_len, p = 0;
    if (need > cap)
        return 0;
    memcpy(buf + p, "p1:", 3); p += 3;
    memcpy(buf + p, res, res_len); p += res_len;
    buf[p++] = ':';
    memcpy(buf + p, t->uid_str, t->uid_len); p += t->uid_len;
    buf[p++] = ':';
    memcpy(buf + p, t->epoch_str, t->epoch_len); p += t->epoch_len;
    return p;
}
