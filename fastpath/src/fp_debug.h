/* Debug-build checks (`make debug` defines FASTPATH_DEBUG=1): FP_ASSERT costs nothing otherwise. */
#ifndef FP_DEBUG_H
#define FP_DEBUG_H

#ifndef FASTPATH_DEBUG
#define FASTPATH_DEBUG 0
#endif

#if FASTPATH_DEBUG
#include <stdio.h>
#include <stdlib.h>
#define FP_ASSERT(cond, ...)                                                              \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "fastpath: %s:%d: assertion %s failed: ", __FILE__, __LINE__, \
                    #cond);                                                               \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
            abort();                                                                      \
        }                                                                                 \
    } while (0)
#else
#define FP_ASSERT(cond, ...) ((void)0)
#endif

#endif
