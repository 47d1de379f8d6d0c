/* Debug checks.  FP_ASSERT (the connection state machine's transitions, fp_conn.c) is compiled in
 * when FASTPATH_CHECKS is 1: in debug builds (`make debug` defines FASTPATH_DEBUG=1) and in the
 * ASan and fuzz builds (`make test-asan`, `make fuzz` define FASTPATH_CHECKS=1), so CI runs it.
 * It costs nothing otherwise.  FASTPATH_DEBUG alone also logs every transition (too loud for a
 * fuzzer). */
#ifndef FP_DEBUG_H
#define FP_DEBUG_H

#ifndef FASTPATH_DEBUG
#define FASTPATH_DEBUG 0
#endif
#ifndef FASTPATH_CHECKS
#define FASTPATH_CHECKS FASTPATH_DEBUG
#endif

#if FASTPATH_CHECKS
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
