/* A small deterministic GEMM driver over the packed micro-kernels of
 * brnn_packed.h (float32), for the products a sequence call makes once over
 * all its steps (the backward's x_grad and weight gradients):
 *
 *   C[M, N] (+)= A[M, K] . B[K, N],
 *   A(m, k) = a[m * sam + k * sak],  B(k, n) = b[k * sbk + n * sbn]
 *
 * so either operand may be transposed or a block of a larger array. The loop
 * nest is Goto's (as in BLIS): for each block of NC columns and each block of
 * KC of K, the B block [kc, nc] is packed (brnn_pack_f32: panels of 16
 * columns, a panel stays in L1), then for each block of MC rows the micro-
 * kernel runs the panels over the row tiles of the A block [mc, kc] (kept in
 * L2, copied row-major and contiguous first: the kernel reads rows).
 *
 * Determinism: each C element is (((c) + s_0) + s_1) + ..., s_j the kernel's
 * in-order sum over K block j = [j KC, (j+1) KC); the first term c is the old
 * C if accumulating, else absent. KC is a constant, so the bits depend on K
 * and the kernel variant only: never on the thread count, on which thread
 * computes an element, or on MC / NC. Threads split rows or whole 16-column
 * panels of C (brnn_gemm_part), never K.
 *
 * Use: thread tid of nt calls brnn_gemm_f32 (or brnn_gemm_jobs_f32) with its
 * own workspace of brnn_gemm_ws(M, N, K) floats (brnn_gemm_jobs_ws for a job
 * list; at most BRNN_GEMM_WS); the nt calls together write all of C.
 * No barrier is needed between jobs that write different elements, nor
 * between jobs that write the same C of the same M and N (brnn_gemm_part then
 * gives every element to the same thread in both).
 */
#ifndef BRNN_GEMM_H
#define BRNN_GEMM_H

#include "brnn_packed.h"

#define BRNN_GEMM_KC 256 /* K block: a 16-column panel is 16 KB, in L1 */
#define BRNN_GEMM_MC 96  /* rows per A block: 96 KB at KC, in L2 (8, 16, 24 tiles) */
#define BRNN_GEMM_NC 512 /* columns per packed B block: 512 KB at KC */

/* At most the floats of one thread's workspace for any job (see brnn_gemm_ws). */
#define BRNN_GEMM_WS (BRNN_GEMM_KC * BRNN_GEMM_NC + BRNN_GEMM_MC * (BRNN_GEMM_KC + 16))

/* One product, as above. */
typedef struct {
    ptrdiff_t M, N, K;
    const float *a;
    ptrdiff_t sam, sak;
    const float *b;
    ptrdiff_t sbk, sbn;
    int accumulate;
    float *c;
    ptrdiff_t ldc;
} brnn_gemm_job;

/* Floats of one thread's workspace for a product of those sizes: a packed B
 * block [kc, nc], then an A block [mc, kc] of row stride kc + 16 (kc = min(K,
 * KC), nc = min(N rounded up to 16, NC), mc = min(M, MC)). */
static inline ptrdiff_t brnn_gemm_ws(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K) {
    ptrdiff_t kc = K < BRNN_GEMM_KC ? K : BRNN_GEMM_KC;
    ptrdiff_t n16 = (N + BRNN_NR - 1) / BRNN_NR * BRNN_NR;
    ptrdiff_t nc = n16 < BRNN_GEMM_NC ? n16 : BRNN_GEMM_NC;
    ptrdiff_t mc = M < BRNN_GEMM_MC ? M : BRNN_GEMM_MC;
    return kc * nc + mc * (kc + 16);
}

/* The part of C [M, N] thread tid of nt computes: rows [*m0, *m1) x columns
 * [*n0, *n1). A tall C (M >= N) is split in rows, a wide one in whole
 * 16-column panels (n0 a multiple of 16); a thread may get nothing. A
 * function of its arguments only. */
static inline void brnn_gemm_part(ptrdiff_t M, ptrdiff_t N, int tid, int nt, ptrdiff_t *m0,
                                  ptrdiff_t *m1, ptrdiff_t *n0, ptrdiff_t *n1) {
    *m0 = 0;
    *m1 = M;
    *n0 = 0;
    *n1 = N;
    if (nt <= 1) return;
    if (M >= N) {
        *m0 = tid * M / nt;
        *m1 = (tid + 1) * M / nt;
    } else {
        ptrdiff_t panels = (N + BRNN_NR - 1) / BRNN_NR;
        ptrdiff_t a = tid * panels / nt * BRNN_NR, b = (tid + 1) * panels / nt * BRNN_NR;
        *n0 = a < N ? a : N;
        *n1 = b < N ? b : N;
    }
}

#if BRNN_PACKED_X86
/* ---- AVX-512F, for the driver: 12 rows x 32 columns (two panels) ----
 * brnn_packed_avx512's 12 x 16 tile issues one broadcast per FMA, so loads,
 * not FMAs, bound it (measured alone: 70-81 GFLOP/s on one core where
 * OpenBLAS's sgemm ran 97). Two panels per tile feed two FMAs per broadcast
 * (24 accumulators). Each element is still one in-order FMA chain over k,
 * the same as brnn_packed_avx512's: the same bits. */
static inline __attribute__((always_inline)) BRNN_AVX512 void brnn_tile2_avx512(
        int mr, ptrdiff_t K, const float *a, ptrdiff_t lda, const float *p,
        ptrdiff_t cols, int accumulate, float *c, ptrdiff_t ldc) {
    const float *q = p + BRNN_NR * K; /* the next panel */
    __m512 acc0[12], acc1[12];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (ptrdiff_t k = 0; k < K; k++) {
        __m512 b0 = _mm512_loadu_ps(p + k * BRNN_NR), b1 = _mm512_loadu_ps(q + k * BRNN_NR);
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            __m512 ar = _mm512_set1_ps(a[r * lda + k]);
            acc0[r] = _mm512_fmadd_ps(ar, b0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(ar, b1, acc1[r]);
        }
    }
    __mmask16 mask = (__mmask16)((1u << (cols - BRNN_NR)) - 1u);
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
        float *cr = c + r * ldc;
        if (accumulate) {
            acc0[r] = _mm512_add_ps(_mm512_loadu_ps(cr), acc0[r]);
            acc1[r] = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, cr + BRNN_NR), acc1[r]);
        }
        _mm512_storeu_ps(cr, acc0[r]);
        _mm512_mask_storeu_ps(cr + BRNN_NR, mask, acc1[r]);
    }
}

#define BRNN_GEMM_TILE2_CASE(m) \
    case m: brnn_tile2_avx512(m, K, A + r * lda, lda, panel, cols, accumulate, C + r * ldc + n, ldc); break;

/* brnn_packed_fn for the driver on AVX-512: column pairs of panels in 12 x 32
 * tiles, a last single panel by brnn_packed_avx512. */
BRNN_AVX512
static void brnn_gemm_avx512(ptrdiff_t rows, ptrdiff_t K, const float *A, ptrdiff_t lda,
                             const float *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                             float *C, ptrdiff_t ldc) {
    ptrdiff_t n = n0;
    for (; n1 - n > BRNN_NR; n += 2 * BRNN_NR) {
        const float *panel = P + n * K;
        ptrdiff_t cols = n1 - n < 2 * BRNN_NR ? n1 - n : 2 * BRNN_NR;
        ptrdiff_t r = 0;
        for (; r + 12 <= rows; r += 12)
            brnn_tile2_avx512(12, K, A + r * lda, lda, panel, cols, accumulate,
                              C + r * ldc + n, ldc);
        switch (rows - r) {
        BRNN_GEMM_TILE2_CASE(1) BRNN_GEMM_TILE2_CASE(2) BRNN_GEMM_TILE2_CASE(3)
        BRNN_GEMM_TILE2_CASE(4) BRNN_GEMM_TILE2_CASE(5) BRNN_GEMM_TILE2_CASE(6)
        BRNN_GEMM_TILE2_CASE(7) BRNN_GEMM_TILE2_CASE(8) BRNN_GEMM_TILE2_CASE(9)
        BRNN_GEMM_TILE2_CASE(10) BRNN_GEMM_TILE2_CASE(11)
        default: break;
        }
    }
    if (n < n1) brnn_packed_avx512(rows, K, A, lda, P, n, n1, accumulate, C, ldc);
}
#endif /* BRNN_PACKED_X86 */

/* The driver's kernel for a variant of brnn_packed.h: AVX-512's two-panel
 * tiles, else the variant's own function (the same bits either way). */
static inline brnn_packed_fn brnn_gemm_kernel(int path) {
#if BRNN_PACKED_X86
    if (path == BRNN_PACKED_AVX512) return brnn_gemm_avx512;
#endif
    return brnn_packed_kernel(path);
}

/* ap[r * lda + k] = A(r, k), r < mc, k < kc: the A block row-major and
 * contiguous whatever A's strides (a row stride of a power of two, such as
 * dG's 4H, maps a tile's rows onto a few L1 sets; lda = kc + 16 is not one). */
static inline void brnn_gemm_pack_a(ptrdiff_t mc, ptrdiff_t kc, const float *a, ptrdiff_t sam,
                                    ptrdiff_t sak, float *ap, ptrdiff_t lda) {
    if (sak == 1) {
        for (ptrdiff_t r = 0; r < mc; r++)
            memcpy(ap + r * lda, a + r * sam, (size_t)kc * sizeof(float));
    } else {
        for (ptrdiff_t k = 0; k < kc; k++)
            for (ptrdiff_t r = 0; r < mc; r++) ap[r * lda + k] = a[r * sam + k * sak];
    }
}

/* Thread tid of nt's part of job j (see the top of this file); ws: this
 * thread's brnn_gemm_ws(M, N, K) floats. */
static void brnn_gemm_f32(brnn_packed_fn fn, const brnn_gemm_job *j, int tid, int nt,
                          float *ws) {
    ptrdiff_t m0, m1, n0, n1;
    brnn_gemm_part(j->M, j->N, tid, nt, &m0, &m1, &n0, &n1);
    if (m1 <= m0 || n1 <= n0) return;
    if (j->K == 0) { /* an empty sum */
        if (!j->accumulate)
            for (ptrdiff_t m = m0; m < m1; m++)
                memset(j->c + m * j->ldc + n0, 0, (size_t)(n1 - n0) * sizeof(float));
        return;
    }
    /* the layout of brnn_gemm_ws(M, N, K) */
    ptrdiff_t kc_max = j->K < BRNN_GEMM_KC ? j->K : BRNN_GEMM_KC, lda = kc_max + 16;
    ptrdiff_t n16 = (j->N + BRNN_NR - 1) / BRNN_NR * BRNN_NR;
    float *bp = ws, *ap = ws + kc_max * (n16 < BRNN_GEMM_NC ? n16 : BRNN_GEMM_NC);
    for (ptrdiff_t jc = n0; jc < n1; jc += BRNN_GEMM_NC) {
        ptrdiff_t nc = n1 - jc < BRNN_GEMM_NC ? n1 - jc : BRNN_GEMM_NC;
        for (ptrdiff_t pc = 0; pc < j->K; pc += BRNN_GEMM_KC) {
            ptrdiff_t kc = j->K - pc < BRNN_GEMM_KC ? j->K - pc : BRNN_GEMM_KC;
            brnn_pack_f32(kc, nc, j->b + pc * j->sbk + jc * j->sbn, j->sbk, j->sbn, bp);
            int acc = j->accumulate || pc > 0;
            for (ptrdiff_t ic = m0; ic < m1; ic += BRNN_GEMM_MC) {
                ptrdiff_t mc = m1 - ic < BRNN_GEMM_MC ? m1 - ic : BRNN_GEMM_MC;
                brnn_gemm_pack_a(mc, kc, j->a + ic * j->sam + pc * j->sak, j->sam, j->sak, ap,
                                 lda);
                fn(mc, kc, ap, lda, bp, 0, nc, acc, j->c + ic * j->ldc + jc, j->ldc);
            }
        }
    }
}

/* Floats of one thread's workspace for all of the jobs. */
static inline ptrdiff_t brnn_gemm_jobs_ws(int njobs, const brnn_gemm_job *jobs) {
    ptrdiff_t most = 0;
    for (int i = 0; i < njobs; i++) {
        ptrdiff_t n = brnn_gemm_ws(jobs[i].M, jobs[i].N, jobs[i].K);
        if (n > most) most = n;
    }
    return most;
}

/* Thread tid of nt's part of the jobs, in order (see the top of this file
 * for when jobs may share C without a barrier). */
static void brnn_gemm_jobs_f32(brnn_packed_fn fn, int njobs, const brnn_gemm_job *jobs,
                               int tid, int nt, float *ws) {
    for (int i = 0; i < njobs; i++) brnn_gemm_f32(fn, jobs + i, tid, nt, ws);
}

#endif /* BRNN_GEMM_H */
