/* OpenMP queries with serial fallbacks, so the kernels build without OpenMP
 * (the Cython prange loops then run serially by themselves). */
#ifndef BRNN_OPENMP_H
#define BRNN_OPENMP_H

#ifdef _OPENMP
#include <omp.h>
#define BRNN_OPENMP_ENABLED 1
static inline int brnn_omp_get_max_threads(void) { return omp_get_max_threads(); }
#else
#define BRNN_OPENMP_ENABLED 0
static inline int brnn_omp_get_max_threads(void) { return 1; }
#endif

#endif /* BRNN_OPENMP_H */
