/* OpenMP queries with serial fallbacks, so the kernels build without OpenMP
 * (the Cython prange loops then run serially by themselves). */
#ifndef BRNN_OPENMP_H
#define BRNN_OPENMP_H

#ifdef _OPENMP
#include <omp.h>
#define BRNN_OPENMP_ENABLED 1
static inline int brnn_omp_get_max_threads(void) { return omp_get_max_threads(); }
static inline int brnn_omp_get_thread_num(void) { return omp_get_thread_num(); }
static inline int brnn_omp_get_num_threads(void) { return omp_get_num_threads(); }
static inline int brnn_omp_get_num_procs(void) { return omp_get_num_procs(); }
/* An orphaned barrier: it binds to the parallel region of the caller (a
 * Cython `with parallel()` block); outside a region it does nothing. */
static inline void brnn_omp_barrier(void) {
#pragma omp barrier
}
#else
#define BRNN_OPENMP_ENABLED 0
static inline int brnn_omp_get_max_threads(void) { return 1; }
static inline int brnn_omp_get_thread_num(void) { return 0; }
static inline int brnn_omp_get_num_threads(void) { return 1; }
static inline int brnn_omp_get_num_procs(void) { return 1; }
static inline void brnn_omp_barrier(void) {}
#endif

#endif /* BRNN_OPENMP_H */
