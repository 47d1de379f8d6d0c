/* Key -> memcached server, exactly as pymemcache 4's HashClient (docs/contract.md section 4). */
#ifndef FP_HASH_H
#define FP_HASH_H
#include <stddef.h>
#include <stdint.h>

/* MurmurHash3 x86_32 over len bytes. */
uint32_t fp_murmur3_32(const void *data, size_t len, uint32_t seed);

typedef struct {
    const char *name;   /* "host:port", as pymemcache names the node */
    size_t name_len;
} fp_node_t;

/* Index of the node that holds key (rendezvous: highest murmur3(node "-" key), ties to the
 * greater node name), or -1 when nodes is empty or a name is too long. */
int fp_rendezvous_pick(const fp_node_t *nodes, int n_nodes, const char *key, size_t key_len);

/* The tie-break: a's name sorts after b's (pymemcache keeps max(str(node), str(winner))). */
int fp_node_name_greater(const fp_node_t *a, const fp_node_t *b);

#endif
