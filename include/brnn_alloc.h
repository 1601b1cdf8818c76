/* Large output arrays on huge pages, faulted in before the kernel writes them.
 *
 * A forward's outputs are fresh memory at every call (glibc returns blocks of
 * this size to the OS when they are freed), and the OS zeroes each page on
 * its first touch. NumPy's own allocation asks for huge pages, but a block of
 * glibc's starts anywhere: of a 13 MB output a few MB fall outside the 2 MB
 * frames and fault in 4 KB at a time, and the threads of a parallel region,
 * writing the same rows, fault the same pages at once. Measured (100,64,512,512 forward, 7 x 13 MB, Zen 5):
 * 4200-5700 faults per call, 12 ms of system time on one thread and 20-49 ms
 * on two, in a 57-78 ms call.
 *
 * brnn_big_alloc takes the block from malloc starting on a 2 MB frame
 * (posix_memalign), asks for huge pages and faults it all in at once
 * (MADV_POPULATE_WRITE, Linux 5.14): 7 x 13 MB in ~4.4 ms on one thread. A
 * block glibc kept from an earlier call (see docs/performance.md, "Large
 * forwards in a loop") is already in: the populate then only walks it. Where
 * any of that is missing (not Linux, an older kernel, transparent huge pages
 * off), the block is still valid memory: what is missing only leaves the
 * faults to the first touch.
 */
#ifndef BRNN_ALLOC_H
#define BRNN_ALLOC_H

#include <stddef.h>
#include <stdlib.h>

#if defined(__linux__)
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#endif

#define BRNN_HUGE_PAGE ((size_t)1 << 21)

/* nbytes (> 0, rounded up to whole 4 KB pages) from malloc, starting on a
 * 2 MB boundary, or NULL if there is no such memory; free() it. */
static void *brnn_big_alloc(size_t nbytes) {
    void *p = NULL;
    size_t len = (nbytes + 4095) & ~(size_t)4095; /* whole pages: madvise's unit */
    if (len < nbytes) return NULL;
#if defined(_WIN32) /* no posix_memalign: the caller takes NumPy's allocation */
    return NULL;
#else
    if (posix_memalign(&p, BRNN_HUGE_PAGE, len) != 0) return NULL;
#endif
#if defined(__linux__)
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    madvise(p, len, MADV_POPULATE_WRITE); /* EINVAL before Linux 5.14: faults later */
#endif
    return p;
}

#endif /* BRNN_ALLOC_H */
