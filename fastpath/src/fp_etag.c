/* ETag, If-None-Match and Prefer: wait (fp_etag.h). */
#include <string.h>

#include "fp_etag.h"
#include "fp_token.h"

_Static_assert(FP_ETAG_HEX / 2 <= SHA256_DIGEST_LENGTH, "the ETag is a prefix of the digest");

int fp_etag_of(const char *body, size_t len, char tag[FP_ETAG_LEN])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char md[SHA256_DIGEST_LENGTH];

    if (fp_sha256(body, len, md) != 0)
        return -1;
    tag[0] = '"';
    for (int i = 0; i < FP_ETAG_HEX / 2; i++) {
        tag[1 + 2 * i] = hex[md[i] >> 4];
        tag[2 + 2 * i] = hex[md[i] & 15];
    }
    tag[FP_ETAG_LEN - 1] = '"';
    return 0;
}

static int _is_ows(char ch)
{
    return ch == ' ' || ch == '\t';
}

static void _trim(const char **v, size_t *len)
{
    while (*len > 0 && _is_ows(**v)) {
        (*v)++;
        (*len)--;
    }
    while (*len > 0 && _is_ows((*v)[*len - 1]))
        (*len)--;
}

/* etagc = "!" / %x23-7E / obs-text (RFC 9110 8.8.3) */
static int _is_etagc(unsigned char ch)
{
    return ch == 0x21 || (ch >= 0x23 && ch != 0x7f);
}

fp_inm_t fp_inm_parse(const char *v, size_t len, char tag[FP_ETAG_LEN])
{
    _trim(&v, &len);
    if (len >= 2 && v[0] == 'W' && v[1] == '/') {
        v += 2;
        len -= 2;
    }
    if (len < 2 || v[0] != '"' || v[len - 1] != '"')
        return FP_INM_UNREADABLE;
    for (size_t i = 1; i + 1 < len; i++)
        if (!_is_etagc((unsigned char)v[i]))
            return FP_INM_UNREADABLE;
    if (len != FP_ETAG_LEN)
        return FP_INM_OTHER;
    memcpy(tag, v, FP_ETAG_LEN);
    return FP_INM_TAG;
}

/* The index of the first c in v[i, len) outside a quoted-string (RFC 9110 5.6.4, with its
 * backslash escapes), or len: `foo="a, wait=2"` holds no wait preference. */
static size_t _unquoted(const char *v, size_t i, size_t len, char c)
{
    int quoted = 0;
    for (; i < len; i++) {
        if (quoted) {
            if (v[i] == '\\' && i + 1 < len)
                i++;
            else if (v[i] == '"')
                quoted = 0;
        } else if (v[i] == '"') {
            quoted = 1;
        } else if (v[i] == c) {
            return i;
        }
    }
    return len;
}

/* preference = token [ BWS "=" BWS word ] *( OWS ";" [ OWS parameter ] ), comma-separated */
int32_t fp_prefer_wait(const char *v, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t end = _unquoted(v, i, len, ',');
        const char *p = v + i;
        size_t n = end - i;
        size_t semi_at = _unquoted(v, i, end, ';');
        const char *semi = semi_at < end ? v + semi_at : NULL;
        if (semi != NULL)
            n = (size_t)(semi - p);          /* parameters of a preference are ignored */
        const char *eq = memchr(p, '=', n);
        size_t name_len = eq != NULL ? (size_t)(eq - p) : n;
        _trim(&p, &name_len);
        if (name_len == 4 && (p[0] | 0x20) == 'w' && (p[1] | 0x20) == 'a' && (p[2] | 0x20) == 'i' &&
            (p[3] | 0x20) == 't') {
            if (eq == NULL)
                return -1;
            const char *q = eq + 1;
            size_t m = (size_t)(v + end - q);
            if (semi != NULL)
                m = (size_t)(semi - q);
            _trim(&q, &m);
            if (m >= 2 && q[0] == '"' && q[m - 1] == '"') {
                q++;
                m -= 2;
            }
            if (m == 0 || m > 5)
                return -1;
            int32_t w = 0;
            for (size_t k = 0; k < m; k++) {
                if (q[k] < '0' || q[k] > '9')
                    return -1;
                w = w * 10 + (q[k] - '0');
            }
            return w <= FP_WAIT_MAX_S ? w : -1;
        }
        i = end + 1;
    }
    return -1;
}

/* Accept = #( media-range [ ";" parameters ] ): 1 if one element's media-range is
 * text/event-stream (any case, OWS around it).  Elements are split at every ',' and parameters
 * (q= included) are not read: fastpoll's view (fastpoll/http.py wants_event_stream) reads it the
 * same way, so both sides agree on what a stream request is. */
int fp_accept_event_stream(const char *v, size_t len)
{
    static const char want[] = "text/event-stream";
    size_t i = 0;
    while (i <= len) {
        const char *comma = memchr(v + i, ',', len - i);
        size_t end = comma != NULL ? (size_t)(comma - v) : len;
        const char *p = v + i;
        const char *semi = memchr(p, ';', end - i);
        size_t n = semi != NULL ? (size_t)(semi - p) : end - i;
        _trim(&p, &n);
        if (n == sizeof(want) - 1) {
            size_t k = 0;
            while (k < n && (unsigned char)(p[k] | 0x20) == (unsigned char)want[k])
                k++;
            if (k == n)
                return 1;
        }
        i = end + 1;
    }
    return 0;
}

/* Last-Event-ID: the id of the client's last event, one of our tags if it is FP_ETAG_LEN bytes
 * (OWS trimmed): 1 and tag, else 0 (no match possible: the first event is sent). */
int fp_last_event_id(const char *v, size_t len, char tag[FP_ETAG_LEN])
{
    _trim(&v, &len);
    if (len != FP_ETAG_LEN)
        return 0;
    memcpy(tag, v, FP_ETAG_LEN);
    return 1;
}
