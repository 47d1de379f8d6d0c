/* Counts per key with a cap: held connections per client address and per user, and open edge
 * connections per client address (docs/contract.md section 10).  One small chained hash table per limit, an entry per key that holds at least
 * one, freed when its count falls to 0, so that the table's size follows the keys holding now.
 * One worker's: nothing is locked, and a cap is per worker. */
#ifndef FP_LIMIT_H
#define FP_LIMIT_H
#include <stddef.h>
#include <stdint.h>

#define FP_LIMIT_KEY_MAX 64          /* a uid (FP_UID_MAX_LEN), or a family byte and an address */

/* The limits, one table each (fp_limit.c's _limits names them). */
typedef enum {
    FP_LIMIT_ADDRESS,                /**< held on a client-facing listener, per client address */
    FP_LIMIT_USER,                   /**< held on any listener, per token uid */
    FP_LIMIT_HELD_N,                 /* the limits of a hold are the ones before this */
    FP_LIMIT_OPEN = FP_LIMIT_HELD_N, /**< open on a client-facing listener, per client address */
    FP_LIMIT_N
} fp_limit_id_t;

typedef struct fp_limit_entry {
    struct fp_limit_entry *next;     /* in its bucket */
    uint32_t hash;
    uint32_t count;
    uint8_t len;
    char key[];
} fp_limit_entry_t;

typedef struct {
    fp_limit_entry_t **buckets;      /* n_buckets, a power of two; NULL until the first take */
    uint32_t n_buckets, n_entries;
} fp_limit_table_t;

typedef struct {
    fp_limit_table_t tables[FP_LIMIT_N];
    uint64_t refused[FP_LIMIT_N];    /* takes refused at the cap */
} fp_limits_t;

/* The limit's name, for messages ("address", "user", "open"). */
const char *fp_limit_name(fp_limit_id_t which);

/* One more for key (len bytes, 1..FP_LIMIT_KEY_MAX): its entry, to give back with fp_limit_put;
 * NULL when key already holds cap (cap 0: no cap) or there is no memory for its entry. */
fp_limit_entry_t *fp_limit_take(fp_limits_t *l, fp_limit_id_t which, const char *key, size_t len, uint32_t cap);

/* One fewer for e's key (e NULL: nothing); e is freed at 0. */
void fp_limit_put(fp_limits_t *l, fp_limit_id_t which, fp_limit_entry_t *e);

/* Keys holding now (tests, stats). */
uint32_t fp_limit_keys(const fp_limits_t *l, fp_limit_id_t which);

void fp_limit_fini(fp_limits_t *l);

#endif
