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
/* AVX-512F: brnn_tiles_avx512 (brnn_packed.h) on one row and 8 panels. */
BRNN_AVX512
static void brnn_row1_avx512(ptrdiff_t K, const float *a, const float *P, ptrdiff_t n0,
                             ptrdiff_t n1, int accumulate, float *c) {
    ptrdiff_t n = n0;
    for (; n + 8 * BRNN_NR <= n1; n += 8 * BRNN_NR)
        brnn_tiles_avx512(1, 8, K, a, K, P + n * K, 8 * BRNN_NR, accumulate, c + n, 0);
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

/* ---- the wide layout, for one row ----
 * One row streams all of W at every step (a GEMV: no reuse), so its speed is
 * the bandwidth of the cache that holds W. Read as 16-column panels (above),
 * a pass over 8 panels is 8 streams 64 bytes wide; read as blocks of 64
 * columns stored k-major, it is one stream 256 bytes wide. Measured on one
 * Zen 5 core, W in L2 (K x N = 128 x 512 / 256 x 512 floats): 135 / 128 GB/s
 * as panels, 194 / 241 GB/s as 64-column blocks. So the steps of batch 1 read
 * W_h in this layout:
 *   W [K, N], N16 = N rounded up to 16: block b holds columns [64b, 64b + wb),
 *   wb = min(64, N16 - 64b), k-major: P[64b * K + k * wb + j] = W(k, 64b + j),
 *   0 past column N. Its size is brnn_packed_size(K, N), as the panels'.
 * The kernels below compute every element as the panel kernels do (one FMA
 * chain over k in order, from 0, then added to c once if accumulating), so
 * the layout changes no bit. n0 must be a multiple of 16. */
#define BRNN_WIDE 64

/* The columns [c0, c1) of the wide copy (c0 a multiple of 16; c1 a multiple
 * of 16 or N): what a thread owning those cells reads, so that the threads of
 * a region can each pack their own. */
static void brnn_pack_wide_cols_f32(ptrdiff_t K, ptrdiff_t N, const float *w, ptrdiff_t sk,
                                    ptrdiff_t sn, ptrdiff_t c0, ptrdiff_t c1, float *P) {
    ptrdiff_t N16 = (N + BRNN_NR - 1) / BRNN_NR * BRNN_NR;
    if (c1 >= N) c1 = N16;   /* the zero columns past N belong to the last cells */
    for (ptrdiff_t n0 = c0 / BRNN_WIDE * BRNN_WIDE; n0 < c1; n0 += BRNN_WIDE) {
        ptrdiff_t wb = N16 - n0 < BRNN_WIDE ? N16 - n0 : BRNN_WIDE;
        ptrdiff_t j0 = c0 > n0 ? c0 - n0 : 0, j1 = c1 - n0 < wb ? c1 - n0 : wb;
        ptrdiff_t cols = N - n0 < j1 ? N - n0 : j1;   /* columns [cols, j1) are 0 */
        float *block = P + n0 * K;
        if (sn == 1) {   /* rows of W contiguous: a block row is one copy */
            for (ptrdiff_t k = 0; k < K; k++) {
                if (cols > j0)
                    memcpy(block + k * wb + j0, w + k * sk + n0 + j0, (cols - j0) * sizeof(float));
                for (ptrdiff_t j = cols > j0 ? cols : j0; j < j1; j++) block[k * wb + j] = 0.0f;
            }
            continue;
        }
        /* Strided columns (W stored transposed, sk == 1): 16 rows at a time,
         * so that each column's 16 values are one cache line read once. Row
         * by row, the block's 64 columns are 64 lines a row stride apart,
         * which a power-of-two stride maps to a few L1 sets (measured at
         * K x N = 512 x 128 stored transposed: the copy was ~40 us, 10% of
         * the batch-1 LSTM backward at 50,1,128,128). */
        for (ptrdiff_t k0 = 0; k0 < K; k0 += BRNN_NR) {
            ptrdiff_t kn = K - k0 < BRNN_NR ? K - k0 : BRNN_NR;
            for (ptrdiff_t j = j0; j < j1; j++) {
                const float *src = w + k0 * sk + (n0 + j) * sn;
                for (ptrdiff_t k = 0; k < kn; k++)
                    block[(k0 + k) * wb + j] = j < cols ? src[k * sk] : 0.0f;
            }
        }
    }
}

static void brnn_pack_wide_f32(ptrdiff_t K, ptrdiff_t N, const float *w, ptrdiff_t sk,
                               ptrdiff_t sn, float *P) {
    brnn_pack_wide_cols_f32(K, N, w, sk, sn, 0, N, P);
}

typedef void (*brnn_row1_wide_fn)(ptrdiff_t K, const float *a, const float *P, ptrdiff_t N,
                                  ptrdiff_t n0, ptrdiff_t n1, int accumulate, float *c);

/* The block loop both ISAs share: for each block that [n0, n1) meets, the
 * columns [n, end) of it, as `chunks` vectors of VW floats (the last one
 * partial when end - n is not a multiple of VW: its store goes through
 * brnn_store_row). ROW(M) computes M vectors; each is its own FMA chain. */
#define BRNN_ROW1_WIDE_LOOP(VW, MAXV, ROW)                                          \
    ptrdiff_t N16 = (N + BRNN_NR - 1) / BRNN_NR * BRNN_NR;                        \
    for (ptrdiff_t n = n0; n < n1;) {                                               \
        ptrdiff_t base = n / BRNN_WIDE * BRNN_WIDE;                                 \
        ptrdiff_t wb = N16 - base < BRNN_WIDE ? N16 - base : BRNN_WIDE;            \
        ptrdiff_t end = n1 < base + wb ? n1 : base + wb;                            \
        ptrdiff_t cols = end - n;                                                   \
        const float *p = P + base * K + (n - base);                                 \
        float *cn = c + n;                                                          \
        switch ((cols + VW - 1) / VW) {                                             \
        BRNN_ROW1_WIDE_CASES_##MAXV(ROW)                                            \
        default: break;                                                             \
        }                                                                           \
        n = end;                                                                    \
    }
#define BRNN_ROW1_WIDE_CASES_4(ROW) case 1: ROW(1) break; case 2: ROW(2) break;     \
    case 3: ROW(3) break; case 4: ROW(4) break;
#define BRNN_ROW1_WIDE_CASES_8(ROW) BRNN_ROW1_WIDE_CASES_4(ROW) case 5: ROW(5) break; \
    case 6: ROW(6) break; case 7: ROW(7) break; case 8: ROW(8) break;

/* Store vector q of a row: whole, or its first cols - q * VW floats. */
#define BRNN_ROW1_WIDE_STORE(VW, STOREU, LOADU, ADD, M)                             \
    for (int q = 0; q < M; q++) {                                                   \
        ptrdiff_t left = cols - q * VW;                                             \
        if (left >= VW) {                                                           \
            if (accumulate) acc[q] = ADD(LOADU(cn + q * VW), acc[q]);               \
            STOREU(cn + q * VW, acc[q]);                                            \
        } else {                                                                    \
            float tmp[VW];                                                          \
            STOREU(tmp, acc[q]);                                                    \
            brnn_store_row(tmp, left, accumulate, cn + q * VW);                     \
        }                                                                           \
    }

/* ROW(M) of the block loop for one ISA: M vectors of VW floats (type V), each
 * its own FMA chain over k; ZERO, SET1, FMADD, LOADU, STOREU, ADD are the
 * ISA's intrinsics. */
#define BRNN_ROW1_WIDE_ROW(V, VW, ZERO, SET1, FMADD, LOADU, STOREU, ADD, M)          \
    {                                                                               \
        V acc[M];                                                                   \
        for (int q = 0; q < M; q++) acc[q] = ZERO();                                \
        for (ptrdiff_t k = 0; k < K; k++) {                                         \
            V ak = SET1(a[k]);                                                      \
            _Pragma("GCC unroll 8")                                                 \
            for (int q = 0; q < M; q++)                                             \
                acc[q] = FMADD(ak, LOADU(p + k * wb + q * VW), acc[q]);             \
        }                                                                           \
        BRNN_ROW1_WIDE_STORE(VW, STOREU, LOADU, ADD, M)                             \
    }

#if BRNN_PACKED_X86
#define BRNN_ROW1_WIDE_512(M) BRNN_ROW1_WIDE_ROW(__m512, 16, _mm512_setzero_ps,        \
    _mm512_set1_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps, M)
#define BRNN_ROW1_WIDE_256(M) BRNN_ROW1_WIDE_ROW(__m256, 8, _mm256_setzero_ps,         \
    _mm256_set1_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps, M)

BRNN_AVX512
static void brnn_row1_wide_avx512(ptrdiff_t K, const float *a, const float *P, ptrdiff_t N,
                                  ptrdiff_t n0, ptrdiff_t n1, int accumulate, float *c) {
    BRNN_ROW1_WIDE_LOOP(16, 4, BRNN_ROW1_WIDE_512)
}

BRNN_AVX2
static void brnn_row1_wide_avx2(ptrdiff_t K, const float *a, const float *P, ptrdiff_t N,
                                ptrdiff_t n0, ptrdiff_t n1, int accumulate, float *c) {
    BRNN_ROW1_WIDE_LOOP(8, 8, BRNN_ROW1_WIDE_256)
}
#endif

/* The wide one-row kernel matching packed variant `path`, or NULL (portable:
 * its callers keep the panels and brnn_packed_portable). */
static inline brnn_row1_wide_fn brnn_row1_wide_kernel(int path) {
#if BRNN_PACKED_X86
    if (path == BRNN_PACKED_AVX512) return brnn_row1_wide_avx512;
    if (path == BRNN_PACKED_AVX2) return brnn_row1_wide_avx2;
#endif
    (void)path;
    return NULL;
}

/* The one-row kernel matching packed variant `path`, or NULL (portable). */
static inline brnn_row1_fn brnn_row1_kernel(int path) {
#if BRNN_PACKED_X86
    if (path == BRNN_PACKED_AVX512) return brnn_row1_avx512;
    if (path == BRNN_PACKED_AVX2) return brnn_row1_avx2;
#endif
    (void)path;
    return NULL;
}


/* ---- the gate-interleaved layout, for a fused batch-1 step ----
 * At batch 1 the LSTM and reset-after GRU inference forwards compute a
 * 16-cell panel's gate columns together and apply the gate math to them right
 * away, so that the gate math of one panel overlaps the reads of the next
 * one's weights (a step's product streams W_h from L2; in perf, the LSTM's
 * gate math was 12% of a call at 50,1,128,128, its product 59%, the step
 * barrier ~11%). W [K, nq*H] holds gate q in columns [q*H, q*H + H); panel
 * p (cells [16p, 16p + 16)) is one block of nq * 16 columns stored k-major:
 *   P[p*K*nq*16 + k*nq*16 + q*16 + j] = W(k, q*H + 16p + j), 0 past cell H,
 * H16 * nq * K floats in all (H16: H rounded up to 16). Each element is one
 * FMA chain over k in order from 0, as in the kernels above: the same bits as
 * brnn_row1_wide_* / brnn_packed_* of the same ISA. */
static void brnn_pack_gates_f32(ptrdiff_t K, ptrdiff_t H, int nq, const float *w,
                                ptrdiff_t sk, ptrdiff_t sn, float *P) {
    ptrdiff_t panels = (H + BRNN_NR - 1) / BRNN_NR, width = nq * BRNN_NR;
    for (ptrdiff_t p = 0; p < panels; p++) {
        float *block = P + p * K * width;
        for (ptrdiff_t k = 0; k < K; k++)
            for (int q = 0; q < nq; q++)
                for (ptrdiff_t j = 0; j < BRNN_NR; j++) {
                    ptrdiff_t n = p * BRNN_NR + j;
                    block[k * width + q * BRNN_NR + j] =
                        n < H ? w[k * sk + (q * H + n) * sn] : 0.0f;
                }
    }
}

/* out[q*16 + j] = a[0:K] . (gate q, cell 16p + j) for one panel block Pp. */
typedef void (*brnn_row1_gates_fn)(ptrdiff_t K, const float *a, const float *Pp, int nq,
                                   float *out);

#if BRNN_PACKED_X86
/* A panel block is a wide-layout block of nq * 16 columns (nq = 4 gates for
 * the LSTM, 3 for the GRU), all of them the panel's (wb = cols = nq * 16, no
 * accumulation): the wide kernels' row body (BRNN_ROW1_WIDE_ROW, through
 * ROW(M) of M vectors) computes it, so each element is the same FMA chain.
 * M4 / M3: the vectors of 4 / 3 panels. cols is a constant in each branch, so
 * every vector is whole and the partial-store path compiles away (with cols
 * a run-time nq * 16, GCC kept it and warned -Warray-bounds about its tmp). */
#define BRNN_ROW1_GATES(ROW, M4, M3)                                                \
    {                                                                               \
        const float *p = Pp;                                                        \
        float *cn = out;                                                            \
        const int accumulate = 0;                                                   \
        if (nq == 4) {                                                              \
            const ptrdiff_t wb = 4 * BRNN_NR, cols = wb;                            \
            ROW(M4)                                                                 \
        } else {                                                                    \
            const ptrdiff_t wb = 3 * BRNN_NR, cols = wb;                            \
            ROW(M3)                                                                 \
        }                                                                           \
    }

BRNN_AVX512
static void brnn_row1_gates_avx512(ptrdiff_t K, const float *a, const float *Pp, int nq,
                                   float *out) {
    BRNN_ROW1_GATES(BRNN_ROW1_WIDE_512, 4, 3)
}

BRNN_AVX2
static void brnn_row1_gates_avx2(ptrdiff_t K, const float *a, const float *Pp, int nq,
                                 float *out) {
    BRNN_ROW1_GATES(BRNN_ROW1_WIDE_256, 8, 6)
}
#endif

/* The fused-step kernel matching packed variant `path`, or NULL (portable). */
static inline brnn_row1_gates_fn brnn_row1_gates_kernel(int path) {
#if BRNN_PACKED_X86
    if (path == BRNN_PACKED_AVX512) return brnn_row1_gates_avx512;
    if (path == BRNN_PACKED_AVX2) return brnn_row1_gates_avx2;
#endif
    (void)path;
    return NULL;
}

#endif /* BRNN_INFERENCE_H */
