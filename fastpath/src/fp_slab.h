/* Fixed-size objects for one worker (connections, wait keys, memcached requests), carved from
 * chunks the worker maps itself.
 *
 * Why not malloc: a worker is forked from the Python supervisor and inherits its heap, free
 * chunks and all.  malloc hands those chunks out first, and every object placed in one copies a
 * page the supervisor and the other workers still share: about 400 KB per worker, the first few
 * hundred connections of each (bench/longpoll.py).  Chunks mapped after the fork are the
 * worker's own from the start, and objects sit packed in them with no per-object header.  (What
 * still comes from malloc, libevent's records above all, avoids the inherited heap another way:
 * the worker serves on a thread of its own, which malloc gives a fresh arena; fp_server.c.)
 *
 * Memory freed here is kept for reuse, as memcached keeps its slabs: a worker stays at its peak,
 * which --max-connections bounds.  Sanitizer builds use calloc/free instead, so that ASan still
 * sees every use after free. */
#ifndef FP_SLAB_H
#define FP_SLAB_H
#include <stddef.h>

typedef struct fp_slab_chunk fp_slab_chunk_t;

typedef struct fp_slab {
    size_t size;                     /* of one object, rounded up to 16 */
    size_t chunk_bytes;              /* of one mapping */
    void *free;                      /* freed objects; the first word links them */
    char *next, *end;                /* the newest chunk's not yet used part */
    fp_slab_chunk_t *chunks;         /* every mapping, for fp_slab_fini */
} fp_slab_t;

/* chunk_bytes is rounded up to whole pages and holds at least one object. */
void fp_slab_init(fp_slab_t *s, size_t size, size_t chunk_bytes);
/* A zeroed object, or NULL when no memory can be mapped. */
void *fp_slab_alloc(fp_slab_t *s);
void fp_slab_free(fp_slab_t *s, void *p);       /* p may be NULL */
/* Unmaps everything: every object is gone. */
void fp_slab_fini(fp_slab_t *s);

#endif
