/* A small deterministic GEMM driver over the packed micro-kernels of
 * brnn_packed.h (float32), for the products a sequence call makes once over
 * all its steps (the backward's x_grad and weight gradients); its float64
 * twin (brnn_gemm_f64, double micro-kernels) is at the end of this file:
 *
 *   C[M, N] (+)= A[M, K] . B[K, N],
 *   A(m, k) = a[m * sam + k * sak],  B(k, n) = b[k * sbk + n * sbn]
 *
 * so either operand may be transposed or a block of a larger array. The loop
 * nest is Goto's (as in BLIS): for each block of NC columns and each block of
 * KC of K, the B block [kc, nc] is packed (brnn_pack_f32: panels of 16
 * columns, kept in L2), then for each block of MC rows the micro-kernel runs
 * the panels over the row tiles of the A block [mc, kc] (kept in L2 too,
 * copied row-major and contiguous first: the kernel reads rows).
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
 * list; at most BRNN_GEMM_WS); the nt calls together write all of C. A B that
 * many calls share (a weight, in every chunk of a backward) may be packed once
 * by brnn_gemm_prepack_b and given as the job's bp: the same blocks, so the
 * same bits, without each thread packing it again at every call.
 * No barrier is needed between jobs that write different elements, nor
 * between jobs that write the same C of the same M and N (brnn_gemm_part then
 * gives every element to the same thread in both).
 */
#ifndef BRNN_GEMM_H
#define BRNN_GEMM_H

#include "brnn_packed.h"

/* Block sizes. A K block of KC rows costs C one load and store of each
 * element it covers, so the fewer K blocks, the less C traffic: the weight
 * gradient of a backward chunk accumulates into C = dW [I+H, 4H], 8 MB at
 * I = H = 512 (in L3, not L2), every chunk. KC was 256 (a 16-column panel,
 * 16 KB, in L1): at 512 (32 KB a panel, the 12 x 32 tile's two panels then
 * stream from L2) with NC halved to keep the packed B block at 512 KB in
 * a 1 MB L2 beside the A block, one core of a 2-core Zen 5 VM, blockrnn
 * only, median of 7 fresh-process rounds, two runs alternated with the
 * build before: LSTM fwd+bwd 100,64,512,512 502 -> 465 and 450 -> 446 ms,
 * GRU 358 -> 345 and 351 -> 334; at 100,32,256,256 LSTM 60.4 -> 59.0 and
 * 57.4 -> 55.7, GRU 45.1 -> 42.8 and 46.2 -> 42.3 (the dW product of a
 * chunk alone, 1024 x 512 x 2048 accumulating: 163-172 -> 180-189 GFLOP/s);
 * on both cores within the runs' noise. */
#define BRNN_GEMM_KC 512 /* K block: a 16-column panel is 32 KB */
#define BRNN_GEMM_MC 96  /* rows per A block: 198 KB at KC, in L2 (8 tiles of 12) */
#define BRNN_GEMM_NC 256 /* columns per packed B block: 512 KB at KC, in L2 */

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
    const float *bp; /* B packed by brnn_gemm_prepack_b(K, N, ...), or NULL */
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

/* Floats of B [K, N] packed by brnn_gemm_prepack_b: K x N rounded up to 16. */
static inline ptrdiff_t brnn_gemm_prepacked_size(ptrdiff_t K, ptrdiff_t N) {
    return K * ((N + BRNN_NR - 1) / BRNN_NR * BRNN_NR);
}

/* Where the block of columns [jb, jb + NC) and rows [pc, pc + KC) starts in a
 * B packed by brnn_gemm_prepack_b: after the blocks of the columns before jb
 * (K x jb floats, jb a multiple of NC) and those of the rows before pc in this
 * column block (pc x its width rounded up to 16). */
static inline ptrdiff_t brnn_gemm_prepacked_at(ptrdiff_t K, ptrdiff_t N, ptrdiff_t jb,
                                               ptrdiff_t pc) {
    ptrdiff_t nb = N - jb < BRNN_GEMM_NC ? N - jb : BRNN_GEMM_NC;
    return jb * K + pc * ((nb + BRNN_NR - 1) / BRNN_NR * BRNN_NR);
}

/* P [brnn_gemm_prepacked_size(K, N)] = B [K, N] (B(k, n) = b[k * sbk + n * sbn])
 * in the driver's blocks: for each block of NC columns from column 0, each
 * block of KC rows packed as brnn_gemm_f32 packs it (brnn_pack_f32). */
static void brnn_gemm_prepack_b(ptrdiff_t K, ptrdiff_t N, const float *b, ptrdiff_t sbk,
                                ptrdiff_t sbn, float *P) {
    for (ptrdiff_t jb = 0; jb < N; jb += BRNN_GEMM_NC) {
        ptrdiff_t nb = N - jb < BRNN_GEMM_NC ? N - jb : BRNN_GEMM_NC;
        for (ptrdiff_t pc = 0; pc < K; pc += BRNN_GEMM_KC) {
            ptrdiff_t kc = K - pc < BRNN_GEMM_KC ? K - pc : BRNN_GEMM_KC;
            brnn_pack_f32(kc, nb, b + pc * sbk + jb * sbn, sbk, sbn,
                          P + brnn_gemm_prepacked_at(K, N, jb, pc));
        }
    }
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
/* ---- AVX-512F, for the driver: two and four panels a tile ----
 * brnn_packed_avx512's 12 x 16 tile issues one broadcast per FMA, so loads,
 * not FMAs, bound it (measured alone: 70-81 GFLOP/s on one core where
 * OpenBLAS's sgemm ran 97). The driver runs brnn_tiles_avx512 (brnn_packed.h)
 * on two panels, 12 x 32 (two FMAs per broadcast, 24 accumulators).
 * A product of 1-6 rows (a thread's rows of a small batch's step, a batch of
 * 2-6) gives the 12 x 32 tile only 2 x rows accumulators: 8 at 4 rows, the
 * bare minimum of independent FMA chains that hides the FMA latency on two
 * FMA ports, so a load that misses L1 can stall it. Such a product first
 * runs its whole groups of four panels in 6 x 64 tiles (4 x rows chains).
 * Measured on one core of a 2-core Intel Xeon (Emerald Rapids) VM, 64 step
 * products of W [H, 4H] packed, the two tiles alternated 30 times in one
 * process, mean GFLOP/s in 2-3 runs: 4 rows H=128-256 +14 to +22%, 5-6 rows
 * H=256 +12 to +22%, 2 rows H=128 +24 to +31%; H=512 (W out of L2) equal.
 * Every tile is one FMA chain per element over k in order: the same bits. */
#define BRNN_GEMM_TILE4_CASE(m) \
    case m: brnn_tiles_avx512(m, 4, K, A, lda, P + n * K, 4 * BRNN_NR, accumulate, C + n, ldc); break;

#define BRNN_GEMM_TILE2_CASE(m) \
    case m: brnn_tiles_avx512(m, 2, K, A + r * lda, lda, panel, cols, accumulate, C + r * ldc + n, ldc); break;

/* brnn_packed_fn for the driver on AVX-512: column pairs of panels in 12 x 32
 * tiles, a last single panel by brnn_packed_avx512; a product of at most 6
 * rows first runs its whole groups of four panels in 6 x 64 tiles. */
BRNN_AVX512
static void brnn_gemm_avx512(ptrdiff_t rows, ptrdiff_t K, const float *A, ptrdiff_t lda,
                             const float *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                             float *C, ptrdiff_t ldc) {
    ptrdiff_t n = n0;
    if (rows <= 6)
        for (; n1 - n >= 4 * BRNN_NR; n += 4 * BRNN_NR) {
            switch (rows) {
            BRNN_GEMM_TILE4_CASE(1) BRNN_GEMM_TILE4_CASE(2) BRNN_GEMM_TILE4_CASE(3)
            BRNN_GEMM_TILE4_CASE(4) BRNN_GEMM_TILE4_CASE(5) BRNN_GEMM_TILE4_CASE(6)
            default: break;
            }
        }
    for (; n1 - n > BRNN_NR; n += 2 * BRNN_NR) {
        const float *panel = P + n * K;
        ptrdiff_t cols = n1 - n < 2 * BRNN_NR ? n1 - n : 2 * BRNN_NR;
        ptrdiff_t r = 0;
        for (; r + 12 <= rows; r += 12)
            brnn_tiles_avx512(12, 2, K, A + r * lda, lda, panel, cols, accumulate,
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
        return;
    }
    ptrdiff_t k = 0;
    if (sam == 1) { /* A stored transposed, a[k * sak + r] (x^T, h^T): 4 x 4 blocks */
        ptrdiff_t r4 = mc / 4 * 4;
        for (; k + 4 <= kc; k += 4) {
            for (ptrdiff_t r = 0; r < r4; r += 4)
                brnn_transpose4(a + k * sak + r, sak, ap + r * lda + k, lda);
            for (ptrdiff_t r = r4; r < mc; r++)
                for (ptrdiff_t i = k; i < k + 4; i++) ap[r * lda + i] = a[r + i * sak];
        }
    }
    for (; k < kc; k++)
        for (ptrdiff_t r = 0; r < mc; r++) ap[r * lda + k] = a[r * sam + k * sak];
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
    float *bws = ws, *ap = ws + kc_max * (n16 < BRNN_GEMM_NC ? n16 : BRNN_GEMM_NC);
    /* Column blocks of NC: this thread's own from n0, or, with B packed
     * beforehand, the packed blocks from a multiple of NC (jb) that hold its
     * columns [jc, je), panel (jc - jb) / 16 on. */
    ptrdiff_t jb = j->bp ? n0 / BRNN_GEMM_NC * BRNN_GEMM_NC : n0;
    for (; jb < n1; jb += BRNN_GEMM_NC) {
        ptrdiff_t jc = jb > n0 ? jb : n0, je = n1 - jb < BRNN_GEMM_NC ? n1 : jb + BRNN_GEMM_NC;
        ptrdiff_t skip = jc - jb; /* columns of the block before this thread's */
        for (ptrdiff_t pc = 0; pc < j->K; pc += BRNN_GEMM_KC) {
            ptrdiff_t kc = j->K - pc < BRNN_GEMM_KC ? j->K - pc : BRNN_GEMM_KC;
            const float *bp = bws;
            if (j->bp)
                bp = j->bp + brnn_gemm_prepacked_at(j->K, j->N, jb, pc);
            else
                brnn_pack_f32(kc, je - jc, j->b + pc * j->sbk + jc * j->sbn, j->sbk, j->sbn,
                              bws);
            int acc = j->accumulate || pc > 0;
            for (ptrdiff_t ic = m0; ic < m1; ic += BRNN_GEMM_MC) {
                ptrdiff_t mc = m1 - ic < BRNN_GEMM_MC ? m1 - ic : BRNN_GEMM_MC;
                brnn_gemm_pack_a(mc, kc, j->a + ic * j->sam + pc * j->sak, j->sam, j->sak, ap,
                                 lda);
                fn(mc, kc, ap, lda, bp, skip, skip + je - jc, acc, j->c + ic * j->ldc + jb,
                   j->ldc);
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

/* ==== float64: the same driver over double micro-kernels ====
 *
 * B is packed in panels of 8 doubles (BRNN_DNR; 8 x KC doubles = 16 KB, in
 * L1), P[p * 8 * K + k * 8 + j] = B(k, 8p + j), 0 past column N. Variants, the
 * same ones as float32's and chosen by the same path (BLOCKRNN_KERNEL):
 *   AVX-512F: 12 rows x 16 doubles (two panels, two zmm per row: 24
 *             accumulators, two FMAs per broadcast), a last odd panel 12 x 8;
 *   AVX2+FMA: 6 rows x 8 doubles (two ymm per row, 12 accumulators);
 *   portable: 4 rows x 8 doubles in 2-double vectors (16 accumulators; a
 *             multiply then an add, no FMA on baseline x86-64).
 * Determinism as for float32: each element is its own in-order sum over each
 * K block of KC, the blocks added in order onto C; threads split rows or
 * 16-column groups (brnn_gemm_part), never K. So the bits depend on K and the
 * variant only. KC is 256 (float32's before it went to 512; tried 128 and
 * 192, no faster on one Xeon core); MC is half of float32's, and the packed
 * B block is 512 KB as float32's. */
#define BRNN_DNR 8
#define BRNN_DGEMM_KC 256 /* K block: an 8-double panel is 16 KB, in L1 */
#define BRNN_DGEMM_MC 48  /* rows per A block: 96 KB at KC, in L2 */
#define BRNN_DGEMM_NC 256 /* columns per packed B block: 512 KB at KC */

/* At most the doubles of one thread's workspace for any job. */
#define BRNN_DGEMM_WS (BRNN_DGEMM_KC * BRNN_DGEMM_NC + BRNN_DGEMM_MC * (BRNN_DGEMM_KC + 8))

typedef struct {
    ptrdiff_t M, N, K;
    const double *a;
    ptrdiff_t sam, sak;
    const double *b;
    ptrdiff_t sbk, sbn;
    int accumulate;
    double *c;
    ptrdiff_t ldc;
} brnn_dgemm_job;

/* C[rows, n0:n1] (+)= A[rows, K] . B[:, n0:n1], B packed in 8-double panels;
 * n0 a multiple of 8 (the float64 twin of brnn_packed_fn). */
typedef void (*brnn_dgemm_fn)(ptrdiff_t rows, ptrdiff_t K, const double *A, ptrdiff_t lda,
                              const double *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                              double *C, ptrdiff_t ldc);

/* Doubles of one thread's workspace (as brnn_gemm_ws). */
static inline ptrdiff_t brnn_dgemm_ws(ptrdiff_t M, ptrdiff_t N, ptrdiff_t K) {
    ptrdiff_t kc = K < BRNN_DGEMM_KC ? K : BRNN_DGEMM_KC;
    ptrdiff_t n8 = (N + BRNN_DNR - 1) / BRNN_DNR * BRNN_DNR;
    ptrdiff_t nc = n8 < BRNN_DGEMM_NC ? n8 : BRNN_DGEMM_NC;
    ptrdiff_t mc = M < BRNN_DGEMM_MC ? M : BRNN_DGEMM_MC;
    return kc * nc + mc * (kc + 8);
}

/* P = B [K, N] packed in 8-double panels. Rows of B contiguous (sn == 1): a
 * panel row is one 64-byte copy; columns contiguous (sk == 1): each column read
 * in order. (A small M reuses each packed block little: at M = 256 the element
 * loop below cost ~15% of the product.) */
static void brnn_pack_f64(ptrdiff_t K, ptrdiff_t N, const double *w, ptrdiff_t sk,
                          ptrdiff_t sn, double *P) {
    for (ptrdiff_t n0 = 0; n0 < N; n0 += BRNN_DNR) {
        ptrdiff_t cols = N - n0 < BRNN_DNR ? N - n0 : BRNN_DNR;
        double *panel = P + n0 * K;
        if (cols == BRNN_DNR && sn == 1) {
            for (ptrdiff_t k = 0; k < K; k++)
                memcpy(panel + k * BRNN_DNR, w + k * sk + n0, BRNN_DNR * sizeof(double));
            continue;
        }
        if (cols == BRNN_DNR && sk == 1) {
            for (ptrdiff_t j = 0; j < BRNN_DNR; j++) {
                const double *src = w + (n0 + j) * sn;
                for (ptrdiff_t k = 0; k < K; k++) panel[k * BRNN_DNR + j] = src[k];
            }
            continue;
        }
        for (ptrdiff_t k = 0; k < K; k++) {
            const double *src = w + k * sk + n0 * sn;
            ptrdiff_t j = 0;
            for (; j < cols; j++) panel[k * BRNN_DNR + j] = src[j * sn];
            for (; j < BRNN_DNR; j++) panel[k * BRNN_DNR + j] = 0.0;
        }
    }
}

static inline __attribute__((always_inline)) void brnn_dstore_row(
        const double *acc, ptrdiff_t cols, int accumulate, double *c) {
    if (accumulate) {
        for (ptrdiff_t j = 0; j < cols; j++) c[j] = c[j] + acc[j];
    } else {
        for (ptrdiff_t j = 0; j < cols; j++) c[j] = acc[j];
    }
}

/* Panels of width NRT (8, or 16 for AVX-512's pairs) outer, tiles of MR rows
 * then one edge tile of a constant row count (the tile is unrolled for it). */
#define BRNN_DGEMM_LOOP(MR, NRT, TILE)                                              \
    for (ptrdiff_t n = n0; n < n1; n += NRT) {                                      \
        const double *panel = P + n * K;                                            \
        ptrdiff_t cols = n1 - n < NRT ? n1 - n : NRT;                               \
        ptrdiff_t r = 0;                                                            \
        for (; r + MR <= rows; r += MR)                                             \
            TILE(MR, K, A + r * lda, lda, panel, cols, accumulate, C + r * ldc + n, ldc); \
        switch (rows - r) {                                                         \
        BRNN_PACKED_EDGE_##MR(TILE)                                                 \
        default: break;                                                             \
        }                                                                           \
    }

/* ---- portable C: 4 x 8 doubles in 2-double vectors ---- */
typedef double brnn_v2d __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) void brnn_dtile_portable(
        int mr, ptrdiff_t K, const double *restrict a, ptrdiff_t lda, const double *restrict p,
        ptrdiff_t cols, int accumulate, double *restrict c, ptrdiff_t ldc) {
    brnn_v2d acc[4][BRNN_DNR / 2];
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < BRNN_DNR / 2; q++) acc[r][q] = (brnn_v2d){0, 0};
    for (ptrdiff_t k = 0; k < K; k++) {
        brnn_v2d pk[BRNN_DNR / 2];
        memcpy(pk, p + k * BRNN_DNR, sizeof pk);
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            const double ar = a[r * lda + k];
            const brnn_v2d av = {ar, ar};
#pragma GCC unroll 4
            for (int q = 0; q < BRNN_DNR / 2; q++) acc[r][q] += av * pk[q];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) {
        double row[BRNN_DNR];
        memcpy(row, acc[r], sizeof row);
        brnn_dstore_row(row, cols, accumulate, c + r * ldc);
    }
}

static void brnn_dgemm_portable(ptrdiff_t rows, ptrdiff_t K, const double *A, ptrdiff_t lda,
                                const double *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                                double *C, ptrdiff_t ldc) {
    BRNN_DGEMM_LOOP(4, BRNN_DNR, brnn_dtile_portable)
}

#if BRNN_PACKED_X86
/* ---- AVX2 + FMA: 6 rows x 8 doubles in 12 ymm accumulators ---- */
static inline __attribute__((always_inline)) BRNN_AVX2 void brnn_dtile_avx2(
        int mr, ptrdiff_t K, const double *a, ptrdiff_t lda, const double *p,
        ptrdiff_t cols, int accumulate, double *c, ptrdiff_t ldc) {
    __m256d c0[6], c1[6];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm256_setzero_pd();
    for (ptrdiff_t k = 0; k < K; k++) {
        __m256d b0 = _mm256_loadu_pd(p + k * BRNN_DNR), b1 = _mm256_loadu_pd(p + k * BRNN_DNR + 4);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m256d ar = _mm256_broadcast_sd(a + r * lda + k);
            c0[r] = _mm256_fmadd_pd(ar, b0, c0[r]);
            c1[r] = _mm256_fmadd_pd(ar, b1, c1[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
        double *cr = c + r * ldc;
        if (cols == BRNN_DNR) {
            if (accumulate) {
                c0[r] = _mm256_add_pd(_mm256_loadu_pd(cr), c0[r]);
                c1[r] = _mm256_add_pd(_mm256_loadu_pd(cr + 4), c1[r]);
            }
            _mm256_storeu_pd(cr, c0[r]);
            _mm256_storeu_pd(cr + 4, c1[r]);
        } else {
            double tmp[BRNN_DNR];
            _mm256_storeu_pd(tmp, c0[r]);
            _mm256_storeu_pd(tmp + 4, c1[r]);
            brnn_dstore_row(tmp, cols, accumulate, cr);
        }
    }
}

BRNN_AVX2
static void brnn_dgemm_avx2(ptrdiff_t rows, ptrdiff_t K, const double *A, ptrdiff_t lda,
                            const double *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                            double *C, ptrdiff_t ldc) {
    BRNN_DGEMM_LOOP(6, BRNN_DNR, brnn_dtile_avx2)
}

/* ---- AVX-512F: 12 rows x 16 doubles (two panels), or x 8 (one) ---- */
static inline __attribute__((always_inline)) BRNN_AVX512 void brnn_dtile2_avx512(
        int mr, ptrdiff_t K, const double *a, ptrdiff_t lda, const double *p,
        ptrdiff_t cols, int accumulate, double *c, ptrdiff_t ldc) {
    __m512d acc0[12], acc1[12];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) acc0[r] = acc1[r] = _mm512_setzero_pd();
    if (cols > BRNN_DNR) {   /* two panels: the second one at p + 8K */
        const double *q = p + BRNN_DNR * K;
        for (ptrdiff_t k = 0; k < K; k++) {
            __m512d b0 = _mm512_loadu_pd(p + k * BRNN_DNR), b1 = _mm512_loadu_pd(q + k * BRNN_DNR);
#pragma GCC unroll 12
            for (int r = 0; r < mr; r++) {
                __m512d ar = _mm512_set1_pd(a[r * lda + k]);
                acc0[r] = _mm512_fmadd_pd(ar, b0, acc0[r]);
                acc1[r] = _mm512_fmadd_pd(ar, b1, acc1[r]);
            }
        }
    } else {                 /* the last, odd panel */
        for (ptrdiff_t k = 0; k < K; k++) {
            __m512d b0 = _mm512_loadu_pd(p + k * BRNN_DNR);
#pragma GCC unroll 12
            for (int r = 0; r < mr; r++)
                acc0[r] = _mm512_fmadd_pd(_mm512_set1_pd(a[r * lda + k]), b0, acc0[r]);
        }
    }
    ptrdiff_t c0 = cols < BRNN_DNR ? cols : BRNN_DNR, c1 = cols - c0;
    __mmask8 m0 = (__mmask8)((1u << c0) - 1u), m1 = (__mmask8)((1u << c1) - 1u);
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
        double *cr = c + r * ldc;
        if (accumulate) {
            acc0[r] = _mm512_add_pd(_mm512_maskz_loadu_pd(m0, cr), acc0[r]);
            acc1[r] = _mm512_add_pd(_mm512_maskz_loadu_pd(m1, cr + BRNN_DNR), acc1[r]);
        }
        _mm512_mask_storeu_pd(cr, m0, acc0[r]);
        _mm512_mask_storeu_pd(cr + BRNN_DNR, m1, acc1[r]);
    }
}

BRNN_AVX512
static void brnn_dgemm_avx512(ptrdiff_t rows, ptrdiff_t K, const double *A, ptrdiff_t lda,
                              const double *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                              double *C, ptrdiff_t ldc) {
    BRNN_DGEMM_LOOP(12, 2 * BRNN_DNR, brnn_dtile2_avx512)
}
#endif /* BRNN_PACKED_X86 */

/* The float64 driver's kernel for a variant of brnn_packed.h. */
static inline brnn_dgemm_fn brnn_dgemm_kernel(int path) {
#if BRNN_PACKED_X86
    if (path == BRNN_PACKED_AVX512) return brnn_dgemm_avx512;
    if (path == BRNN_PACKED_AVX2) return brnn_dgemm_avx2;
#endif
    return brnn_dgemm_portable;
}

/* ap[r * lda + k] = A(r, k) (as brnn_gemm_pack_a). A transposed (sam == 1,
 * e.g. x^T): 8 k at a time for every row, so each row's write is one line
 * and the 8 source rows' lines are reused over 8 rows (~2.5 of w_grad's
 * 30 ms at 256 x 1024 x 3200 with the plain loop below). */
static inline void brnn_dgemm_pack_a(ptrdiff_t mc, ptrdiff_t kc, const double *a, ptrdiff_t sam,
                                     ptrdiff_t sak, double *ap, ptrdiff_t lda) {
    if (sak == 1) {
        for (ptrdiff_t r = 0; r < mc; r++)
            memcpy(ap + r * lda, a + r * sam, (size_t)kc * sizeof(double));
    } else if (sam == 1) {
        for (ptrdiff_t k0 = 0; k0 < kc; k0 += 8) {
            ptrdiff_t k1 = kc - k0 < 8 ? kc : k0 + 8;
            for (ptrdiff_t r = 0; r < mc; r++)
                for (ptrdiff_t k = k0; k < k1; k++) ap[r * lda + k] = a[r + k * sak];
        }
    } else {
        for (ptrdiff_t k = 0; k < kc; k++)
            for (ptrdiff_t r = 0; r < mc; r++) ap[r * lda + k] = a[r * sam + k * sak];
    }
}

/* Thread tid of nt's part of job j (as brnn_gemm_f32); ws: this thread's
 * brnn_dgemm_ws(M, N, K) doubles. */
static void brnn_gemm_f64(brnn_dgemm_fn fn, const brnn_dgemm_job *j, int tid, int nt,
                          double *ws) {
    ptrdiff_t m0, m1, n0, n1;
    brnn_gemm_part(j->M, j->N, tid, nt, &m0, &m1, &n0, &n1);
    if (m1 <= m0 || n1 <= n0) return;
    if (j->K == 0) {
        if (!j->accumulate)
            for (ptrdiff_t m = m0; m < m1; m++)
                memset(j->c + m * j->ldc + n0, 0, (size_t)(n1 - n0) * sizeof(double));
        return;
    }
    ptrdiff_t kc_max = j->K < BRNN_DGEMM_KC ? j->K : BRNN_DGEMM_KC, lda = kc_max + 8;
    ptrdiff_t n8 = (j->N + BRNN_DNR - 1) / BRNN_DNR * BRNN_DNR;
    double *bp = ws, *ap = ws + kc_max * (n8 < BRNN_DGEMM_NC ? n8 : BRNN_DGEMM_NC);
    for (ptrdiff_t jc = n0; jc < n1; jc += BRNN_DGEMM_NC) {
        ptrdiff_t nc = n1 - jc < BRNN_DGEMM_NC ? n1 - jc : BRNN_DGEMM_NC;
        for (ptrdiff_t pc = 0; pc < j->K; pc += BRNN_DGEMM_KC) {
            ptrdiff_t kc = j->K - pc < BRNN_DGEMM_KC ? j->K - pc : BRNN_DGEMM_KC;
            brnn_pack_f64(kc, nc, j->b + pc * j->sbk + jc * j->sbn, j->sbk, j->sbn, bp);
            int acc = j->accumulate || pc > 0;
            for (ptrdiff_t ic = m0; ic < m1; ic += BRNN_DGEMM_MC) {
                ptrdiff_t mc = m1 - ic < BRNN_DGEMM_MC ? m1 - ic : BRNN_DGEMM_MC;
                brnn_dgemm_pack_a(mc, kc, j->a + ic * j->sam + pc * j->sak, j->sam, j->sak, ap,
                                  lda);
                fn(mc, kc, ap, lda, bp, 0, nc, acc, j->c + ic * j->ldc + jc, j->ldc);
            }
        }
    }
}

static inline ptrdiff_t brnn_dgemm_jobs_ws(int njobs, const brnn_dgemm_job *jobs) {
    ptrdiff_t most = 0;
    for (int i = 0; i < njobs; i++) {
        ptrdiff_t n = brnn_dgemm_ws(jobs[i].M, jobs[i].N, jobs[i].K);
        if (n > most) most = n;
    }
    return most;
}

static void brnn_gemm_jobs_f64(brnn_dgemm_fn fn, int njobs, const brnn_dgemm_job *jobs,
                               int tid, int nt, double *ws) {
    for (int i = 0; i < njobs; i++) brnn_gemm_f64(fn, jobs + i, tid, nt, ws);
}

#endif /* BRNN_GEMM_H */
