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

/* uid = object = 1*64( ALPHA / DIGIT / "-" / "_" ): Django's str(pk), copied into keys verbatim. */
static int _is_uid_char(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           ch == '-' || ch == '_';
}

/* resource = 1*32( ALPHA / DIGIT / "_" ) */
static int _is_resource_char(unsigned char ch)
{
    return ch != '-' && _is_uid_char(ch);
}

/* 1..max bytes that is_char accepts at s[*pos ..), up to the next '.': 0, *pos advanced past. */
static int _parse_span(const char *s, size_t len, size_t *pos, int (*is_char)(unsigned char), size_t max,
                       const char **start, size_t *n_chars)
{
    size_t i = *pos;
    while (i < len && is_char((unsigned char)s[i]))
        if (++i - *pos > max)
            return -1;
    if (i == *pos)
        return -1;
    *start = s + *pos;
    *n_chars = i - *pos;
    *pos = i;
    return 0;
}

int fp_is_object_name(const char *s, size_t len)
{
    size_t pos = 0;
    const char *start;
    size_t n;
    return len > 0 && _parse_span(s, len, &pos, _is_uid_char, FP_UID_MAX_LEN, &start, &n) == 0 && pos == len;
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
 * FP_TOKEN_INTERNAL (503), never "bad signature".  fp_sha256 (the ETag's hash too) uses the
 * same API.  The deprecation warnings are silenced for these functions only (the fuzz build,
 * without setup.py's -Wno-deprecated-declarations, stays quiet too). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

int fp_sha256(const void *data, size_t len, unsigned char md[SHA256_DIGEST_LENGTH])
{
    SHA256_CTX ctx;
    return SHA256_Init(&ctx) == 1 && SHA256_Update(&ctx, data, len) == 1 && SHA256_Final(md, &ctx) == 1
               ? 0 : -1;
}

/* keys longer than the 64-byte block are hashed first */
int fp_hmac_prepare(fp_hmac_key_t *key, const unsigned char *secret, size_t secret_len)
{
    unsigned char block[SHA256_CBLOCK], pad[SHA256_CBLOCK];
    int ok = 1;

    memset(block, 0, sizeof(block));
    if (secret_len > sizeof(block))
        ok = fp_sha256(secret, secret_len, block) == 0;
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

/* sig (sig_len bytes) is the 64 lowercase hex digits of HMAC-SHA256(key, payload), compared in
 * constant time. */
static fp_token_result_t _check_sig(const fp_hmac_key_t *key, const char *payload, size_t payload_len,
                                    const char *sig, size_t sig_len)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char mac[32];
    char mac_hex[64];

    if (sig_len != 64)
        return FP_TOKEN_MALFORMED;
    for (size_t i = 0; i < 64; i++) {
        char c = sig[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return FP_TOKEN_MALFORMED;
    }
    if (_hmac(key, payload, payload_len, mac) != 0)
        return FP_TOKEN_INTERNAL;
    for (unsigned int i = 0; i < 32; i++) {
        mac_hex[2 * i] = hex[mac[i] >> 4];
        mac_hex[2 * i + 1] = hex[mac[i] & 15];
    }
    return CRYPTO_memcmp(mac_hex, sig, 64) == 0 ? FP_TOKEN_OK : FP_TOKEN_BAD_SIGNATURE;
}

/* The tail a token and a capability share, from s[pos]: expires "." sig, where sig signs
 * s[0..the dot), then the expiry against now.  The fields before it are the caller's. */
static fp_token_result_t _check_expiring_tail(const fp_hmac_key_t *key, const char *s, size_t len,
                                              size_t pos, int64_t now, uint64_t *expires)
{
    size_t payload_len, n_expires;
    const char *expires_str;

    if (_parse_decimal(s, len, &pos, 0, expires, &expires_str, &n_expires) < 0)
        return FP_TOKEN_MALFORMED;
    payload_len = pos;
    if (_expect_dot(s, len, &pos) < 0)
        return FP_TOKEN_MALFORMED;
    fp_token_result_t r = _check_sig(key, s, payload_len, s + pos, len - pos);
    if (r != FP_TOKEN_OK)
        return r;
    if (now < 0 || (uint64_t)now >= *expires)
        return FP_TOKEN_EXPIRED;
    return FP_TOKEN_OK;
}

fp_token_result_t fp_token_check(const fp_hmac_key_t *key, const char *tok, size_t len,
                                 int64_t now, fp_token_t *out)
{
    size_t pos = 3;

    if (len < 3 || len > FP_TOKEN_MAX_LEN || memcmp(tok, "v1.", 3) != 0)
        return FP_TOKEN_MALFORMED;
    if (_parse_span(tok, len, &pos, _is_uid_char, FP_UID_MAX_LEN, &out->uid_str, &out->uid_len) < 0 ||
        _expect_dot(tok, len, &pos) < 0 ||
        _parse_decimal(tok, len, &pos, 1, &out->epoch, &out->epoch_str, &out->epoch_len) < 0 ||
        _expect_dot(tok, len, &pos) < 0)
        return FP_TOKEN_MALFORMED;
    return _check_expiring_tail(key, tok, len, pos, now, &out->expires);
}

/* capability = "c1." resource "." object "." uid "." expires "." sig (docs/contract.md s. 8) */
fp_token_result_t fp_cap_check(const fp_hmac_key_t *key, const char *cap, size_t len, int64_t now,
                               fp_cap_t *out)
{
    size_t pos = 3;

    if (len < 3 || len > FP_CAP_MAX_LEN || memcmp(cap, "c1.", 3) != 0)
        return FP_TOKEN_MALFORMED;
    if (_parse_span(cap, len, &pos, _is_resource_char, FP_CAP_RESOURCE_MAX, &out->res, &out->res_len) < 0 ||
        _expect_dot(cap, len, &pos) < 0 ||
        _parse_span(cap, len, &pos, _is_uid_char, FP_UID_MAX_LEN, &out->obj, &out->obj_len) < 0 ||
        _expect_dot(cap, len, &pos) < 0 ||
        _parse_span(cap, len, &pos, _is_uid_char, FP_UID_MAX_LEN, &out->uid, &out->uid_len) < 0 ||
        _expect_dot(cap, len, &pos) < 0)
        return FP_TOKEN_MALFORMED;
    return _check_expiring_tail(key, cap, len, pos, now, &out->expires);
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

size_t fp_make_key(char *buf, size_t cap, const char *prefix, size_t prefix_len,
                   const char *res, size_t res_len, const fp_token_t *t)
{
    size_t need = prefix_len + 1 + res_len + 1 + t->uid_len + 1 + t->epoch_len, p = 0;
    if (need > cap)
        return 0;
    memcpy(buf + p, prefix, prefix_len); p += prefix_len;
    buf[p++] = ':';
    memcpy(buf + p, res, res_len); p += res_len;
    buf[p++] = ':';
    memcpy(buf + p, t->uid_str, t->uid_len); p += t->uid_len;
    buf[p++] = ':';
    memcpy(buf + p, t->epoch_str, t->epoch_len); p += t->epoch_len;
    return p;
}

/* ---- credentials ------------------------------------------------------------------------ *
 *
 * Django is the reference (docs/contract.md, section 2): gunicorn strips " \t" around a header
 * value and joins a repeated header with ","; plurkcore's token_from_request takes
 * "Bearer " + the rest (scheme case-insensitive), else Django's parse_cookie() value of
 * the token's cookie (fastpoll_token unless --cookie-name says otherwise: _cookie_name_t).
 * parse_cookie splits on ';' and the first '=', strips name and value with str.strip() after
 * decoding the bytes as UTF-8, keeps the last pair of a name and unquotes "..."; an empty
 * value is no cookie.  Where fastpath cannot be sure to read the same, it
 * answers FP_CRED_AMBIGUOUS and Django decides. */

typedef struct {
    const char *data;
    size_t len;
} _cookie_name_t;

/* The header whitespace gunicorn (and nginx, llhttp) strip around a value. */
static int _is_ows(unsigned char ch)
{
    return ch == ' ' || ch == '\t';
}

/* The ASCII bytes Python's str.strip() removes: \t \n \v \f \r, \x1c-\x1f and space.  Its
 * other whitespace (U+0085, U+00A0, U+2000...) is multi-byte in UTF-8; a lone \x85 or \xa0
 * byte is not even whitespace to Django (it decodes to U+FFFD).  Bytes >= 0x80 at an edge are
 * therefore left to Django rather than guessed. */
static int _is_py_space(unsigned char ch)
{
    return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f);
}

static int _is_py_space_or_8bit(unsigned char ch)
{
    return ch >= 0x80 || _is_py_space(ch);
}

static void _strip(const char **s, size_t *len, int (*is_space)(unsigned char))
{
    while (*len > 0 && is_space((unsigned char)**s)) {
        (*s)++;
        (*len)--;
    }
    while (*len > 0 && is_space((unsigned char)(*s)[*len - 1]))
        (*len)--;
}

/* s[0..n) equals the lowercase ASCII literal `lower`, folding A-Z only: strncasecmp() folds
 * with the C locale, and under tr_TR 'I' is not 'i'. */
static int _ascii_caseeq(const char *s, const char *lower, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 'A' && ch <= 'Z')
            ch = (unsigned char)(ch - 'A' + 'a');
        if (ch != (unsigned char)lower[i])
            return 0;
    }
    return 1;
}

fp_cred_header_t fp_cred_header(const char *name, size_t len)
{
    if (len == 13 && _ascii_caseeq(name, "authorization", 13))
        return FP_CRED_AUTHORIZATION;
    if (len == 6 && _ascii_caseeq(name, "cookie", 6))
        return FP_CRED_COOKIE;
    return FP_CRED_OTHER;
}

/* credentials = "Bearer" SP token: Django's value[:7].lower() == "bearer ", the rest verbatim
 * (so "Bearer  x" is the token " x", and "Bearer\tx" or "Bearer " alone is no Bearer). */
static fp_cred_result_t _bearer(const fp_header_span_t *h, const char **tok, size_t *tok_len)
{
    const char *v = h->data;
    size_t len = h->len;

    _strip(&v, &len, _is_ows);
    if (len < 7 || !_ascii_caseeq(v, "bearer ", 7))
        return FP_CRED_NONE;
    *tok = v + 7;
    *tok_len = len - 7;
    return FP_CRED_FOUND;
}

static int _is_cookie_name(const _cookie_name_t *want, const char *name, size_t len)
{
    return len == want->len && memcmp(name, want->data, len) == 0;
}

/* Could str.strip() of Django's decoded name make the cookie name of it, where the ASCII strip
 * did not?  Only by removing bytes >= 0x80 (maybe U+00A0, U+3000...) left at an edge. */
static int _may_be_cookie_name(const _cookie_name_t *want, const char *name, size_t len)
{
    _strip(&name, &len, _is_py_space_or_8bit);
    return _is_cookie_name(want, name, len);
}

/* One pair of the Cookie header: name "=" value.  *found counts the token cookie's pairs. */
static fp_cred_result_t _cookie_pair(const _cookie_name_t *want, const char *pair, size_t len, int *found,
                                     const char **tok, size_t *tok_len)
{
    const char *eq = memchr(pair, '=', len);
    if (eq == NULL)
        return FP_CRED_NONE;         /* Django: a pair without '=' has the empty name */
    const char *name = pair, *val = eq + 1;
    size_t name_len = (size_t)(eq - pair), val_len = len - name_len - 1;

    _strip(&name, &name_len, _is_py_space);
    if (!_is_cookie_name(want, name, name_len))
        return _may_be_cookie_name(want, name, name_len) ? FP_CRED_AMBIGUOUS : FP_CRED_NONE;
    if (++*found > 1)
        return FP_CRED_AMBIGUOUS;    /* Django keeps the last one */
    _strip(&val, &val_len, _is_py_space);
    if (val_len > 0 && ((unsigned char)val[0] >= 0x80 || (unsigned char)val[val_len - 1] >= 0x80))
        return FP_CRED_AMBIGUOUS;    /* maybe Unicode whitespace that Django strips */
    if (val_len >= 2 && val[0] == '"' && val[val_len - 1] == '"')
        return FP_CRED_AMBIGUOUS;    /* Django unquotes (and unescapes) "..." */
    *tok = val;
    *tok_len = val_len;
    return FP_CRED_FOUND;
}

static fp_cred_result_t _cookie(const _cookie_name_t *want, const fp_header_span_t *h,
                                const char **tok, size_t *tok_len)
{
    const char *p = h->data, *val = NULL;
    size_t left = h->len, val_len = 0;
    int found = 0;

    for (;;) {
        const char *semi = memchr(p, ';', left);
        size_t pair_len = semi != NULL ? (size_t)(semi - p) : left;
        if (_cookie_pair(want, p, pair_len, &found, &val, &val_len) == FP_CRED_AMBIGUOUS)
            return FP_CRED_AMBIGUOUS;
        if (semi == NULL)
            break;
        p = semi + 1;
        left -= pair_len + 1;
    }
    if (found == 0 || val_len == 0)
        return FP_CRED_NONE;         /* Django: an empty token cookie is no cookie */
    *tok = val;
    *tok_len = val_len;
    return FP_CRED_FOUND;
}

fp_cred_result_t fp_credentials(const fp_header_span_t *auth, int n_auth,
                                const fp_header_span_t *cookie, int n_cookie,
                                const char *cookie_name, size_t cookie_name_len,
                                const char **tok, size_t *tok_len)
{
    const _cookie_name_t want = {cookie_name, cookie_name_len};

    if (n_auth > 1)
        return FP_CRED_AMBIGUOUS;    /* gunicorn hands Django the values joined with "," */
    if (n_auth == 1 && _bearer(auth, tok, tok_len) == FP_CRED_FOUND)
        return FP_CRED_FOUND;        /* Bearer wins over the cookie, even with a bad token */
    if (n_cookie > 1)
        return FP_CRED_AMBIGUOUS;    /* joined with "," (not ";"): one pair swallows the next */
    if (n_cookie == 1)
        return _cookie(&want, cookie, tok, tok_len);
    return FP_CRED_NONE;
}

/* The parts of a key, joined by ':' into buf: the length, or 0 if they do not fit. */
static size_t _join(char *buf, size_t cap, const char *const *part, const size_t *len, int n)
{
    size_t p = 0;
    for (int i = 0; i < n; i++) {
        if (p + (i > 0) + len[i] > cap)
            return 0;
        if (i > 0)
            buf[p++] = ':';
        memcpy(buf + p, part[i], len[i]);
        p += len[i];
    }
    return p;
}

size_t fp_make_object_key(char *buf, size_t cap, const char *prefix, size_t prefix_len,
                          const char *res, size_t res_len, const char *obj, size_t obj_len)
{
    const char *part[] = {prefix, res, obj, "o"};
    const size_t len[] = {prefix_len, res_len, obj_len, 1};
    return _join(buf, cap, part, len, 4);
}

size_t fp_make_marker_key(char *buf, size_t cap, const char *prefix, size_t prefix_len, const fp_token_t *t)
{
    const char *part[] = {prefix, "@", t->uid_str, t->epoch_str};
    const size_t len[] = {prefix_len, 1, t->uid_len, t->epoch_len};
    return _join(buf, cap, part, len, 4);
}
