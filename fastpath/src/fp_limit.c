/* Counts per key with a cap (fp_limit.h): chained hash tables of murmur3, doubled when they hold
 * more entries than buckets, an entry freed when its count falls to 0. */
#include <stdlib.h>
#include <string.h>

#include "fp_hash.h"
#include "fp_limit.h"

#define FIRST_BUCKETS 64

static const char *const _names[FP_LIMIT_N] = {
    [FP_LIMIT_ADDRESS] = "address",
    [FP_LIMIT_USER] = "user",
    [FP_LIMIT_OPEN] = "open",
};

const char *fp_limit_name(fp_limit_id_t which)
{
    return _names[which];
}

static fp_limit_entry_t **_bucket(fp_limit_table_t *t, uint32_t hash)
{
    return &t->buckets[hash & (t->n_buckets - 1)];
}

/* Twice the buckets (the first FIRST_BUCKETS when there are none).  -1: no memory, and the
 * table stays as it was (still correct, only longer chains). */
static int _grow(fp_limit_table_t *t)
{
    uint32_t n = t->n_buckets ? t->n_buckets * 2 : FIRST_BUCKETS;
    fp_limit_entry_t **b = calloc(n, sizeof(*b));
    if (b == NULL)
        return -1;
    for (uint32_t i = 0; i < t->n_buckets; i++) {
        fp_limit_entry_t *e = t->buckets[i], *next;
        for (; e != NULL; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    free(t->buckets);
    t->buckets = b;
    t->n_buckets = n;
    return 0;
}

fp_limit_entry_t *fp_limit_take(fp_limits_t *l, fp_limit_id_t which, const char *key, size_t len, uint32_t cap)
{
    fp_limit_table_t *t = &l->tables[which];
    uint32_t hash = fp_murmur3_32(key, len, 0);
    fp_limit_entry_t *e;

    if (len == 0 || len > FP_LIMIT_KEY_MAX)
        return NULL;
    if (t->n_entries >= t->n_buckets && _grow(t) < 0 && t->buckets == NULL)
        return NULL;
    for (e = *_bucket(t, hash); e != NULL; e = e->next)
        if (e->hash == hash && e->len == len && memcmp(e->key, key, len) == 0)
            break;
    if (e != NULL && cap > 0 && e->count >= cap) {
        l->refused[which]++;
        return NULL;
    }
    if (e == NULL) {
        if ((e = malloc(sizeof(*e) + len)) == NULL)
            return NULL;
        e->hash = hash;
        e->count = 0;
        e->len = (uint8_t)len;
        memcpy(e->key, key, len);
        e->next = *_bucket(t, hash);
        *_bucket(t, hash) = e;
        t->n_entries++;
    }
    e->count++;
    return e;
}

void fp_limit_put(fp_limits_t *l, fp_limit_id_t which, fp_limit_entry_t *e)
{
    fp_limit_table_t *t = &l->tables[which];
    fp_limit_entry_t **p;

    if (e == NULL || --e->count > 0)
        return;
    for (p = _bucket(t, e->hash); *p != e; p = &(*p)->next)
        ;
    *p = e->next;
    t->n_entries--;
    free(e);
}

uint32_t fp_limit_keys(const fp_limits_t *l, fp_limit_id_t which)
{
    return l->tables[which].n_entries;
}

void fp_limit_fini(fp_limits_t *l)
{
    for (int i = 0; i < FP_LIMIT_N; i++) {
        fp_limit_table_t *t = &l->tables[i];
        for (uint32_t b = 0; b < t->n_buckets; b++) {
            fp_limit_entry_t *e = t->buckets[b], *next;
            for (; e != NULL; e = next) {
                next = e->next;
                free(e);
            }
        }
        free(t->buckets);
        memset(t, 0, sizeof(*t));
    }
}
