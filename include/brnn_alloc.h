/* Large output arrays on huge pages, faulted in before the kernel writes them.
 *
 * A forward's outputs are fresh memory at every call (glibc returns blocks of
 * this size to the OS when they are freed), and the OS zeroes each page on
 * its first touch. NumPy's own allocation asks for huge pages, but a block of
 * glibc's starts anywhere: of a 13 MB output a few MB fall outside the 2 MB
 * frames and fault in 4 KB at a time, and the threads of a parallel region,
 * writing the same rows, fault the same pages at once. Measured
 * (100,64,512,512 forward, 7 x 13 MB, Zen 5): 4200-5700 faults per call, 12 ms
 * of system time on one thread and 20-49 ms on two, in a 57-78 ms call.
 *
 * brnn_big_alloc maps the block itself, starting on a 2 MB frame, asks for
 * huge pages and faults it all in at once (MADV_POPULATE_WRITE, Linux 5.14):
 * 7 x 13 MB in ~4.4 ms on one thread. Where any of that is missing (not
 * Linux, an older kernel, transparent huge pages off), the block is still
 * valid memory: what is missing only leaves the faults to the first touch.
 */
#ifndef BRNN_ALLOC_H
#define BRNN_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#if defined(__linux__)
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define BRNN_HUGE_PAGE ((size_t)1 << 21)

/* Bytes mapped for a block of nbytes (nbytes > 0): whole 4 KB pages. */
static inline size_t brnn_big_len(size_t nbytes) { return (nbytes + 4095) & ~(size_t)4095; }

/* A block of nbytes (> 0) zeroed by the OS, starting on a 2 MB boundary, or
 * NULL if it cannot be mapped. Free it with brnn_big_free(p, nbytes). */
static void *brnn_big_alloc(size_t nbytes) {
    size_t len = brnn_big_len(nbytes);
    if (len > SIZE_MAX - BRNN_HUGE_PAGE) return NULL;
    char *raw = (char *)mmap(NULL, len + BRNN_HUGE_PAGE, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == (char *)MAP_FAILED) return NULL;
    /* keep [p, p + len), p the first 2 MB boundary; unmap the rest */
    char *p = (char *)(((uintptr_t)raw + BRNN_HUGE_PAGE - 1) & ~(uintptr_t)(BRNN_HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    char *end = raw + len + BRNN_HUGE_PAGE;
    if (end > p + len) munmap(p + len, (size_t)(end - (p + len)));
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    madvise(p, len, MADV_POPULATE_WRITE); /* EINVAL before Linux 5.14: faults later */
    return p;
}

static void brnn_big_free(void *p, size_t nbytes) { munmap(p, brnn_big_len(nbytes)); }

#else /* not Linux: the callers use NumPy's allocation */
static void *brnn_big_alloc(size_t nbytes) { (void)nbytes; return NULL; }
static void brnn_big_free(void *p, size_t nbytes) { (void)p; (void)nbytes; }
#endif

#endif /* BRNN_ALLOC_H */
