#include <string.h>

#include "fp_hash.h"

#define FP_HASH_MAX_INPUT 512   /* node name + "-" + key; keys are <= 75 bytes, names <= 300 */

static inline uint32_t _rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

uint32_t fp_murmur3_32(const void *data, size_t len, uint32_t seed)
{
    const uint8_t *p = data;
    const uint32_t c1 = 0xcc9e2d51, c2 = 0x1b873593;
    uint32_t h = seed, k;
    size_t blocks = len / 4, i;

    for (i = 0; i < blocks; i++) {
        k = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
            (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
        k *= c1; k = _rotl32(k, 15); k *= c2;
        h ^= k; h = _rotl32(h, 13); h = h * 5 + 0xe6546b64;
    }
    k = 0;
    const uint8_t *tail = p + blocks * 4;
    switch (len & 3) {
    case 3: k ^= (uint32_t)tail[2] << 16; /* fall through */
    case 2: k ^= (uint32_t)tail[1] << 8;  /* fall through */
    case 1: k ^= tail[0];
            k *= c1; k = _rotl32(k, 15); k *= c2; h ^= k;
    }
    h ^= (uint32_t)len;
    h ^= h >> 16; h *= 0x85ebca6b; h ^= h >> 13; h *= 0xc2b2ae35; h ^= h >> 16;
    return h;
}

/* memcmp-based "a > b" for byte strings of explicit lengths (Python's str comparison on ASCII). */
int fp_node_name_greater(const fp_node_t *a, const fp_node_t *b)
{
    size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(a->name, b->name, n);
    if (c != 0)
        return c > 0;
    return a->name_len > b->name_len;
}

int fp_rendezvous_pick(const fp_node_t *nodes, int n_nodes, const char *key, size_t key_len)
{
    char buf[FP_HASH_MAX_INPUT];
    int64_t best_score = -1;
    int best = -1;

    for (int i = 0; i < n_nodes; i++) {
        size_t need = nodes[i].name_len + 1 + key_len;
        if (need > sizeof(buf))
            return -1;
        memcpy(buf, nodes[i].name, nodes[i].name_len);
        buf[nodes[i].name_len] = '-';
        memcpy(buf + nodes[i].name_len + 1, key, key_len);
        int64_t score = fp_murmur3_32(buf, need, 0);
        if (score > best_score || (score == best_score && fp_node_name_greater(&nodes[i], &nodes[best]))) {
            best_score = score;
            best = i;
        }
    }
    return best;
}
