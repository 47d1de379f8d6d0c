/* Fixed-size objects from chunks mapped by the worker (fp_slab.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fp_slab.h"

#if defined(__SANITIZE_ADDRESS__)
#define FP_SLAB_USE_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FP_SLAB_USE_MALLOC 1
#endif
#endif

/* A mapping: this header, then objects. */
struct fp_slab_chunk {
    fp_slab_chunk_t *next;
    size_t bytes;
};

#define CHUNK_HEAD ((sizeof(fp_slab_chunk_t) + 15) & ~(size_t)15)

void fp_slab_init(fp_slab_t *s, size_t size, size_t chunk_bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    memset(s, 0, sizeof(*s));
    s->size = (size < sizeof(void *) ? sizeof(void *) : size + 15) & ~(size_t)15;
    if (chunk_bytes < CHUNK_HEAD + s->size)
        chunk_bytes = CHUNK_HEAD + s->size;
    s->chunk_bytes = (chunk_bytes + page - 1) / page * page;
}

#ifndef FP_SLAB_USE_MALLOC      /* the sanitizer builds allocate each object (above) */
static int _grow(fp_slab_t *s)
{
    void *m = mmap(NULL, s->chunk_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return -1;
    fp_slab_chunk_t *ch = m;
    ch->next = s->chunks;
    ch->bytes = s->chunk_bytes;
    s->chunks = ch;
    s->next = (char *)m + CHUNK_HEAD;
    s->end = (char *)m + s->chunk_bytes;
    return 0;
}
#endif

void *fp_slab_alloc(fp_slab_t *s)
{
    void *p;
#ifdef FP_SLAB_USE_MALLOC
    if ((p = calloc(1, s->size)) == NULL)
        return NULL;
#else
    if (s->free != NULL) {
        p = s->free;
        memcpy(&s->free, p, sizeof(void *));
        memset(p, 0, s->size);
    } else {
        /* a fresh chunk's pages are zero and untouched until an object lands on them */
        if ((size_t)(s->end - s->next) < s->size && _grow(s) < 0)
            return NULL;
        p = s->next;
        s->next += s->size;
    }
#endif
    return p;
}

void fp_slab_free(fp_slab_t *s, void *p)
{
    if (p == NULL)
        return;
#ifdef FP_SLAB_USE_MALLOC
    (void)s;
    free(p);
#else
    memcpy(p, &s->free, sizeof(void *));
    s->free = p;
#endif
}

void fp_slab_fini(fp_slab_t *s)
{
    while (s->chunks != NULL) {
        fp_slab_chunk_t *ch = s->chunks;
        s->chunks = ch->next;
        munmap(ch, ch->bytes);
    }
    memset(s, 0, sizeof(*s));
}
