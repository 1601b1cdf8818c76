/* The one-row packed product of the inference forward at batch 1:
 * c[n0:n1] (+)= a[0:K] . W[:, n0:n1], W packed as in brnn_packed.h.
 *
 * brnn_packed.h's tiles hold one accumulator per row and panel, so one row is
 * a single FMA chain per panel: latency-bound (one FMA per 4 cycles of a
 * core that can issue two per cycle). Here one row runs 8 panels at once
 * (8 independent chains). Each element is still ONE sum over k in order,
 * started from 0, with the same instruction (FMA) as the variant of the same
 * ISA in brnn_packed.h, then added to c once if accumulating: the bits are
 * those of brnn_packed_avx512 / brnn_packed_avx2 for that row. (The portable
 * variant has no counterpart here: callers use it as is.)
 */
#ifndef BRNN_INFERENCE_H
#define BRNN_INFERENCE_H

#include "brnn_packed.h"

typedef void (*brnn_row1_fn)(ptrdiff_t K, const float *a, const float *P, ptrdiff_t n0,
                             ptrdiff_t n1, int accumulate, float *c);

#if BRNN_PACKED_X86
/* AVX-512F: up to 8 panels of 16 columns, one zmm accumulator each. */
BRNN_AVX512
static void brnn_row1_avx512(ptrdiff_t K, const float *a, const float *P, ptrdiff_t n0,
                             ptrdiff_t n1, int accumulate, float *c) {
    ptrdiff_t n = n0;
    for (; n + 8 * BRNN_NR <= n1; n += 8 * BRNN_NR) {
        const float *p = P + n * K;
        __m512 acc[8];
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) acc[q] = _mm512_setzero_ps();
        for (ptrdiff_t k = 0; k < K; k++) {
            __m512 ak = _mm512_set1_ps(a[k]);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++)
                acc[q] = _mm512_fmadd_ps(ak, _mm512_loadu_ps(p + q * BRNN_NR * K + k * BRNN_NR),
                                         acc[q]);
        }
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            float *cq = c + n + q * BRNN_NR;
            if (accumulate) acc[q] = _mm512_add_ps(_mm512_loadu_ps(cq), acc[q]);
            _mm512_storeu_ps(cq, acc[q]);
        }
    }
    if (n < n1) brnn_packed_avx512(1, K, a, K, P, n, n1, accumulate, c, 0);
}

/* AVX2 + FMA: up to 4 panels, two ymm accumulators each (8 chains). */
BRNN_AVX2
static void brnn_row1_avx2(ptrdiff_t K, const float *a, const float *P, ptrdiff_t n0,
                           ptrdiff_t n1, int accumulate, float *c) {
    ptrdiff_t n = n0;
    for (; n + 4 * BRNN_NR <= n1; n += 4 * BRNN_NR) {
        const float *p = P + n * K;
        __m256 acc[8];
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) acc[q] = _mm256_setzero_ps();
        for (ptrdiff_t k = 0; k < K; k++) {
            __m256 ak = _mm256_broadcast_ss(a + k);
#pragma GCC unroll 8
            for (int q = 0; q < 8; q++)
                acc[q] = _mm256_fmadd_ps(
                    ak, _mm256_loadu_ps(p + (q / 2) * BRNN_NR * K + k * BRNN_NR + (q % 2) * 8),
                    acc[q]);
        }
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) {
            float *cq = c + n + (q / 2) * BRNN_NR + (q % 2) * 8;
            if (accumulate) acc[q] = _mm256_add_ps(_mm256_loadu_ps(cq), acc[q]);
            _mm256_storeu_ps(cq, acc[q]);
        }
    }
    if (n < n1) brnn_packed_avx2(1, K, a, K, P, n, n1, accumulate, c, 0);
}
#endif

/* The one-row kernel matching packed variant `path`, or NULL (portable). */
static inline brnn_row1_fn brnn_row1_kernel(int path) {
#if BRNN_PACKED_X86
    if (path == BRNN_PACKED_AVX512) return brnn_row1_avx512;
    if (path == BRNN_PACKED_AVX2) return brnn_row1_avx2;
#endif
    (void)path;
    return NULL;
}

#endif /* BRNN_INFERENCE_H */
