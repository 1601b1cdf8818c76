/* The packed-weight product of the per-step recurrent products (float32):
 * C[rows, n0:n1] (+)= A[rows, K] . W[K, n0:n1], with W packed once per
 * sequence call and multiplied T times (ONNX Runtime's MLAS and oneDNN do the
 * same; the micro-kernel is the Goto/BLIS register-blocked tile).
 *
 * Packed layout: W [K, N] becomes ceil(N / 16) panels of 16 columns; panel p
 * holds columns [16p, 16p + 16), contiguous in k:
 *   P[p * 16 * K + k * 16 + j] = W(k, 16p + j), 0 past column N.
 * Every variant below reads that one layout.
 *
 * Determinism: each C element is ONE sum over k = 0..K-1, in order, started
 * from 0 (then added to C once if accumulating), whatever the tile or the
 * column range a call covers. Splitting rows or panels between threads
 * therefore never changes a bit; only the variant does (the AVX2 and AVX-512
 * variants use FMA, the portable one a multiply then an add).
 *
 * Variants, chosen once per process (brnn_packed_path_supported,
 * brnn_packed_kernel):
 *   BRNN_PACKED_AVX512: 12 x 16 tiles in zmm registers (AVX-512F);
 *   BRNN_PACKED_AVX2:   6 x 16 tiles in 12 ymm accumulators (AVX2 + FMA);
 *   BRNN_PACKED_PORTABLE: 4 x 16 tiles in C with 4-float vector extensions
 *                         (any CPU; aarch64 builds it).
 * The x86 variants are compiled with target attributes, so the extension
 * itself stays baseline x86-64; they only run where __builtin_cpu_supports
 * says the CPU has the ISA.
 *
 * Also here: the process-wide thread budget (brnn_budget_take/give), the one
 * piece of global mutable state of blockrnn.
 */
#ifndef BRNN_PACKED_H
#define BRNN_PACKED_H

#include <stddef.h>
#include <string.h>

#define BRNN_NR 16

enum { BRNN_PACKED_PORTABLE = 0, BRNN_PACKED_AVX2 = 1, BRNN_PACKED_AVX512 = 2 };

#if defined(__x86_64__) && defined(__GNUC__)
#define BRNN_PACKED_X86 1
#include <immintrin.h>
#else
#define BRNN_PACKED_X86 0
#endif

/* Floats of the packed copy of a [K, N] block. */
static inline ptrdiff_t brnn_packed_size(ptrdiff_t K, ptrdiff_t N) {
    return (N + BRNN_NR - 1) / BRNN_NR * BRNN_NR * K;
}

/* dst[j * ld_dst + i] = src[i * ld_src + j], i, j < 4: a 4 x 4 block
 * transposed (in SSE registers on x86-64, where SSE is baseline: a quarter of
 * the scalar copy's stores). */
static inline void brnn_transpose4(const float *src, ptrdiff_t ld_src, float *dst,
                                   ptrdiff_t ld_dst) {
#if BRNN_PACKED_X86
    __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + ld_src);
    __m128 r2 = _mm_loadu_ps(src + 2 * ld_src), r3 = _mm_loadu_ps(src + 3 * ld_src);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst, r0);
    _mm_storeu_ps(dst + ld_dst, r1);
    _mm_storeu_ps(dst + 2 * ld_dst, r2);
    _mm_storeu_ps(dst + 3 * ld_dst, r3);
#else
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) dst[j * ld_dst + i] = src[i * ld_src + j];
#endif
}

/* P = W packed (layout above); W(k, n) = w[k * sk + n * sn], so a row-major
 * block has (sk, sn) = (row stride, 1) and its transpose (1, row stride).
 * The full panels of contiguous rows (sn == 1) are copied 8 rows at a time,
 * each row's 64-byte pieces panel by panel: 8 streams in order, written as
 * 512 contiguous bytes per panel. (A panel at a time reads one piece of each
 * row, K lines a row stride apart, which the prefetchers do not follow; a row
 * at a time writes K x 64 bytes apart, a power of two that maps every store
 * to one L1 set. As dG [T*B, 4H], the GEMM driver's B, the pack was 4.4% of
 * the one-core LSTM fwd+bwd at 100,32,256,256.) Full panels of a transpose
 * (sk == 1) copy 4 x 4 blocks. */
#define BRNN_PACK_ROWS 8
static void brnn_pack_f32(ptrdiff_t K, ptrdiff_t N, const float *w, ptrdiff_t sk,
                          ptrdiff_t sn, float *P) {
    ptrdiff_t full = sn == 1 ? N / BRNN_NR * BRNN_NR : 0;   /* columns of full panels */
    for (ptrdiff_t k0 = 0; k0 < K; k0 += BRNN_PACK_ROWS) {
        ptrdiff_t k1 = K - k0 < BRNN_PACK_ROWS ? K : k0 + BRNN_PACK_ROWS;
        for (ptrdiff_t n0 = 0; n0 < full; n0 += BRNN_NR)
            for (ptrdiff_t k = k0; k < k1; k++)
                memcpy(P + n0 * K + k * BRNN_NR, w + k * sk + n0, BRNN_NR * sizeof(float));
    }
    for (ptrdiff_t n0 = full; n0 < N; n0 += BRNN_NR) {
        ptrdiff_t cols = N - n0 < BRNN_NR ? N - n0 : BRNN_NR;
        float *panel = P + n0 * K;
        ptrdiff_t k = 0;
        if (cols == BRNN_NR && sk == 1) {   /* panel[k * 16 + j] = w[(n0 + j) * sn + k] */
            for (; k + 4 <= K; k += 4)
                for (ptrdiff_t j = 0; j < BRNN_NR; j += 4)
                    brnn_transpose4(w + (n0 + j) * sn + k, sn, panel + k * BRNN_NR + j,
                                    BRNN_NR);
        }
        for (; k < K; k++) {
            const float *src = w + k * sk + n0 * sn;
            ptrdiff_t j = 0;
            for (; j < cols; j++) panel[k * BRNN_NR + j] = src[j * sn];
            for (; j < BRNN_NR; j++) panel[k * BRNN_NR + j] = 0.0f;
        }
    }
}

/* Store a tile's row (16 accumulated sums in acc) into c[0:cols]. */
static inline __attribute__((always_inline)) void brnn_store_row(
        const float *acc, ptrdiff_t cols, int accumulate, float *c) {
    if (accumulate) {
        for (ptrdiff_t j = 0; j < cols; j++) c[j] = c[j] + acc[j];
    } else {
        for (ptrdiff_t j = 0; j < cols; j++) c[j] = acc[j];
    }
}

/* The tile loop every variant shares: panels outer (a panel, K x 16 floats,
 * stays in L1 while the row tiles stream A), TILE(mr, ...) computes mr <= MR
 * rows by one panel; n0 must be a multiple of 16. A remainder of at most MR/2
 * rows shares the last full tile's rows in two near-equal tiles (32 rows in
 * 6 x 16 tiles: 6,6,6,6,4,4 rather than 6,6,6,6,6,2): a tile of 1-3 rows has
 * too few independent FMA chains to hide their latency (AVX2 kernel at
 * 32 x 256 x 1024 on one EPYC core: 90 -> 97 GFLOP/s). The rows' sums do not
 * depend on the tiling. */
#define BRNN_PACKED_LOOP(MR, TILE)                                                  \
    ptrdiff_t rem_ = rows % MR, body_ = rows - rem_, split_ = 0;                    \
    if (rem_ > 0 && rem_ <= MR / 2 && body_ > 0) {                                  \
        body_ -= MR;                                                                \
        split_ = (MR + rem_ + 1) / 2;                                               \
    }                                                                               \
    for (ptrdiff_t n = n0; n < n1; n += BRNN_NR) {                                  \
        const float *panel = P + n * K;                                             \
        ptrdiff_t cols = n1 - n < BRNN_NR ? n1 - n : BRNN_NR;                       \
        ptrdiff_t r = 0;                                                            \
        for (; r < body_; r += MR)                                                  \
            TILE(MR, K, A + r * lda, lda, panel, cols, accumulate, C + r * ldc + n, ldc); \
        switch (split_) { /* constant mr: the tile is unrolled for each */          \
        BRNN_PACKED_EDGE_##MR(TILE)                                                 \
        default: break;                                                             \
        }                                                                           \
        r += split_;                                                                \
        switch (rows - r) {                                                         \
        BRNN_PACKED_EDGE_##MR(TILE)                                                 \
        default: break;                                                             \
        }                                                                           \
    }
#define BRNN_PACKED_CASE(TILE, m)                                                   \
    case m: TILE(m, K, A + r * lda, lda, panel, cols, accumulate, C + r * ldc + n, ldc); break;
#define BRNN_PACKED_EDGE_4(TILE) \
    BRNN_PACKED_CASE(TILE, 1) BRNN_PACKED_CASE(TILE, 2) BRNN_PACKED_CASE(TILE, 3)
#define BRNN_PACKED_EDGE_6(TILE) BRNN_PACKED_EDGE_4(TILE) \
    BRNN_PACKED_CASE(TILE, 4) BRNN_PACKED_CASE(TILE, 5)
#define BRNN_PACKED_EDGE_12(TILE) BRNN_PACKED_EDGE_6(TILE) \
    BRNN_PACKED_CASE(TILE, 6) BRNN_PACKED_CASE(TILE, 7) BRNN_PACKED_CASE(TILE, 8) \
    BRNN_PACKED_CASE(TILE, 9) BRNN_PACKED_CASE(TILE, 10) BRNN_PACKED_CASE(TILE, 11)

/* The signature of every variant: C[rows, n0:n1] = A[rows, K] . W[:, n0:n1]
 * (accumulate: C + that), A row stride lda, C row stride ldc, C pointing at
 * column 0; P the packing of W [K, N] with n1 <= N; n0 a multiple of 16. */
typedef void (*brnn_packed_fn)(ptrdiff_t rows, ptrdiff_t K, const float *A, ptrdiff_t lda,
                               const float *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                               float *C, ptrdiff_t ldc);

/* ---- portable C ----
 * A tile row's 16 sums are four 4-float vectors (GCC/Clang vector extensions,
 * plain SIMD registers on every target: SSE2 on baseline x86-64, NEON on
 * aarch64, scalar code where there is none), so the compiler emits vector
 * multiplies and adds over the panel's columns. (Written as scalar loops over
 * j, GCC vectorised the loop over k instead and ran 4-6 GFLOP/s on an EPYC
 * core in baseline x86-64; this runs 28-31.) Each lane is still its
 * element's one sum over k in order; only the lanes run together. 4 x 16
 * sums fill 16 of aarch64's 32 vector registers. */
typedef float brnn_v4f __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) void brnn_tile_portable(
        int mr, ptrdiff_t K, const float *restrict a, ptrdiff_t lda, const float *restrict p,
        ptrdiff_t cols, int accumulate, float *restrict c, ptrdiff_t ldc) {
    brnn_v4f acc[4][BRNN_NR / 4];
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < BRNN_NR / 4; q++) acc[r][q] = (brnn_v4f){0, 0, 0, 0};
    for (ptrdiff_t k = 0; k < K; k++) {
        brnn_v4f pk[BRNN_NR / 4];
        memcpy(pk, p + k * BRNN_NR, sizeof pk);
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            const float ar = a[r * lda + k];
            const brnn_v4f av = {ar, ar, ar, ar};
#pragma GCC unroll 4
            for (int q = 0; q < BRNN_NR / 4; q++) acc[r][q] += av * pk[q];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) {
        float row[BRNN_NR];
        memcpy(row, acc[r], sizeof row);
        brnn_store_row(row, cols, accumulate, c + r * ldc);
    }
}

/* Baseline x86-64 has no FMA, so this is a multiply then an add there; a
 * compiler may contract them into FMA where the target has it (aarch64). */
static void brnn_packed_portable(ptrdiff_t rows, ptrdiff_t K, const float *A, ptrdiff_t lda,
                                 const float *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                                 float *C, ptrdiff_t ldc) {
    BRNN_PACKED_LOOP(4, brnn_tile_portable)
}

#if BRNN_PACKED_X86
/* ---- AVX2 + FMA: 6 rows x 16 columns in 12 ymm accumulators ---- */
#define BRNN_AVX2 __attribute__((target("avx2,fma")))
static inline __attribute__((always_inline)) BRNN_AVX2 void brnn_tile_avx2(
        int mr, ptrdiff_t K, const float *a, ptrdiff_t lda, const float *p,
        ptrdiff_t cols, int accumulate, float *c, ptrdiff_t ldc) {
    __m256 c0[6], c1[6];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) c0[r] = c1[r] = _mm256_setzero_ps();
    for (ptrdiff_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(p + k * BRNN_NR), b1 = _mm256_loadu_ps(p + k * BRNN_NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            __m256 ar = _mm256_broadcast_ss(a + r * lda + k);
            c0[r] = _mm256_fmadd_ps(ar, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(ar, b1, c1[r]);
        }
    }
#pragma GCC unroll 6   /* every loop over r unrolled: the accumulators stay in registers */
    for (int r = 0; r < mr; r++) {
        float *cr = c + r * ldc;
        if (cols == BRNN_NR) {
            if (accumulate) {
                c0[r] = _mm256_add_ps(_mm256_loadu_ps(cr), c0[r]);
                c1[r] = _mm256_add_ps(_mm256_loadu_ps(cr + 8), c1[r]);
            }
            _mm256_storeu_ps(cr, c0[r]);
            _mm256_storeu_ps(cr + 8, c1[r]);
        } else {
            float tmp[BRNN_NR];
            _mm256_storeu_ps(tmp, c0[r]);
            _mm256_storeu_ps(tmp + 8, c1[r]);
            brnn_store_row(tmp, cols, accumulate, cr);
        }
    }
}

BRNN_AVX2
static void brnn_packed_avx2(ptrdiff_t rows, ptrdiff_t K, const float *A, ptrdiff_t lda,
                             const float *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                             float *C, ptrdiff_t ldc) {
    BRNN_PACKED_LOOP(6, brnn_tile_avx2)
}

/* ---- AVX-512F: mr rows x np panels, one zmm accumulator per row and panel ----
 * The one AVX-512 tile: every AVX-512 kernel (this file's 12 x 16, the
 * driver's 12 x 32 and 6 x 64 in brnn_gemm.h, the inference's 1 x 128 in
 * brnn_inference.h) is this function at constant mr <= 12 and np <= 8 (the
 * bounds of acc) with mr x np <= 24 accumulators, so that they, the np panel
 * rows and the broadcast fit the 32 zmm registers. p points at the first of
 * np consecutive panels of the packing (BRNN_NR * K floats apart); the tile
 * covers cols columns, (np - 1) x 16 < cols <= np x 16, the last panel
 * masked. Each element is one FMA chain over k in order, started from 0,
 * added to c once if accumulating: the bits do not depend on mr or np. */
#define BRNN_AVX512 __attribute__((target("avx512f")))
static inline __attribute__((always_inline)) BRNN_AVX512 void brnn_tiles_avx512(
        int mr, int np, ptrdiff_t K, const float *a, ptrdiff_t lda, const float *p,
        ptrdiff_t cols, int accumulate, float *c, ptrdiff_t ldc) {
    __m512 acc[12][8];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int q = 0; q < np; q++) acc[r][q] = _mm512_setzero_ps();
    for (ptrdiff_t k = 0; k < K; k++) {
        __m512 b[8];
#pragma GCC unroll 8
        for (int q = 0; q < np; q++) b[q] = _mm512_loadu_ps(p + q * BRNN_NR * K + k * BRNN_NR);
#pragma GCC unroll 12
        for (int r = 0; r < mr; r++) {
            __m512 ar = _mm512_set1_ps(a[r * lda + k]);
#pragma GCC unroll 8
            for (int q = 0; q < np; q++) acc[r][q] = _mm512_fmadd_ps(ar, b[q], acc[r][q]);
        }
    }
    __mmask16 last = (__mmask16)((1u << (cols - (np - 1) * BRNN_NR)) - 1u);
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
#pragma GCC unroll 8
        for (int q = 0; q < np; q++) {
            float *cq = c + r * ldc + q * BRNN_NR;
            if (q < np - 1) {
                if (accumulate) acc[r][q] = _mm512_add_ps(_mm512_loadu_ps(cq), acc[r][q]);
                _mm512_storeu_ps(cq, acc[r][q]);
            } else {
                if (accumulate)
                    acc[r][q] = _mm512_add_ps(_mm512_maskz_loadu_ps(last, cq), acc[r][q]);
                _mm512_mask_storeu_ps(cq, last, acc[r][q]);
            }
        }
    }
}

/* One panel: up to 12 rows x 16 columns (12 accumulators). */
static inline __attribute__((always_inline)) BRNN_AVX512 void brnn_tile_avx512(
        int mr, ptrdiff_t K, const float *a, ptrdiff_t lda, const float *p,
        ptrdiff_t cols, int accumulate, float *c, ptrdiff_t ldc) {
    brnn_tiles_avx512(mr, 1, K, a, lda, p, cols, accumulate, c, ldc);
}

BRNN_AVX512
static void brnn_packed_avx512(ptrdiff_t rows, ptrdiff_t K, const float *A, ptrdiff_t lda,
                               const float *P, ptrdiff_t n0, ptrdiff_t n1, int accumulate,
                               float *C, ptrdiff_t ldc) {
    BRNN_PACKED_LOOP(12, brnn_tile_avx512)
}
#endif /* BRNN_PACKED_X86 */

/* Whether this CPU (and this build) can run a variant. */
static inline int brnn_packed_path_supported(int path) {
    if (path == BRNN_PACKED_PORTABLE) return 1;
#if BRNN_PACKED_X86
    __builtin_cpu_init();
    if (path == BRNN_PACKED_AVX2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (path == BRNN_PACKED_AVX512) return __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

/* The fastest variant this CPU supports. */
static inline int brnn_packed_best_path(void) {
    if (brnn_packed_path_supported(BRNN_PACKED_AVX512)) return BRNN_PACKED_AVX512;
    if (brnn_packed_path_supported(BRNN_PACKED_AVX2)) return BRNN_PACKED_AVX2;
    return BRNN_PACKED_PORTABLE;
}

/* The variant's function; the caller checked brnn_packed_path_supported. */
static inline brnn_packed_fn brnn_packed_kernel(int path) {
#if BRNN_PACKED_X86
    if (path == BRNN_PACKED_AVX512) return brnn_packed_avx512;
    if (path == BRNN_PACKED_AVX2) return brnn_packed_avx2;
#endif
    return brnn_packed_portable;
}

/* ---- the per-step barrier of a sequence call's parallel region ----
 * Not OpenMP's barrier: libgomp's spins for a fixed count, and when the
 * machine has more runnable threads than cores (a second process, OpenBLAS's
 * workers, which spin ~0.1 s after each GEMM) the waiting thread burns the
 * time slice its partner needs (measured: a 2-thread forward 3.4x slower
 * than 1 thread on a loaded 2-core machine). This one spins briefly, then
 * yields the core at every check. n threads share one zeroed struct.
 *
 * The spin is ~1 us: when another process holds the other core, the
 * scheduler runs both of a call's threads on one core, and every step's
 * spin is then pure loss before the yield hands the core over. Measured at
 * T=64, batch 1, 2 threads, a foreign process busy on the other core
 * (2-core Sapphire Rapids, pause ~10 ns): 2000 spins (20 us) 1.78 ms at
 * H=128 and 2.1 ms at H=256, 12x and 4x one thread's 0.15 and 0.54 ms; 50
 * spins 0.31 and 0.63 ms; none 0.27 and 0.59 ms. A yield with nothing else
 * to run costs ~0.16 us, so a partner on a free core is still seen at once. */
#include <sched.h>
#include <time.h>
/* count, gen: the barrier; shed, slow: brnn_barrier_wait_shed's answer and
 * whether a stalled partner decided it; stalled: a thread saw its partner
 * stall at this barrier; cpus: the CPUs (bit cpu % 64) the threads arriving
 * at this barrier run on; start_ns: monotonic time of the region's first
 * barrier, waited_ns: the ns its threads spent yielding at its barriers (both
 * kept by a patient region only: see brnn_barrier_wait_shed). Zero the whole
 * struct before the region. */
typedef struct {
    int count; int gen; int shed; int slow; int stalled;
    unsigned long long cpus;
    long long start_ns, waited_ns;
} brnn_barrier;

#ifdef __linux__
int sched_getcpu(void);   /* glibc / musl (<sched.h> declares it with _GNU_SOURCE) */
#define brnn_current_cpu() sched_getcpu()
#else
#define brnn_current_cpu() (-1)
#endif

#ifndef BRNN_BARRIER_SPINS
#define BRNN_BARRIER_SPINS 100
#endif

static inline long long brnn_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Wait until the barrier's generation moves on from gen: spin, then yield at
 * every check. With slow_ns > 0, a wait past slow_ns sets b->stalled and the
 * time spent yielding is added to b->waited_ns (see brnn_barrier_wait_shed);
 * the clock is read only once yielding began. */
static inline void brnn_barrier_await_into(brnn_barrier *b, int gen, long long slow_ns,
                                           brnn_barrier *acct) {
    long long start = 0;
    for (int spin = 0; __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == gen; spin++) {
        if (spin < BRNN_BARRIER_SPINS) {
#if BRNN_PACKED_X86
            __builtin_ia32_pause();
#endif
            continue;
        }
        if (slow_ns > 0) {
            if (start == 0)
                start = brnn_now_ns();
            else if (brnn_now_ns() - start > slow_ns)
                __atomic_store_n(&acct->stalled, 1, __ATOMIC_RELAXED);
        }
        sched_yield();
    }
    if (start != 0)
        __atomic_fetch_add(&acct->waited_ns, brnn_now_ns() - start, __ATOMIC_RELAXED);
}

static inline void brnn_barrier_await(brnn_barrier *b, int gen, long long slow_ns) {
    brnn_barrier_await_into(b, gen, slow_ns, b);
}

static inline void brnn_barrier_wait(brnn_barrier *b, int n) {
    int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELEASE);
        return;
    }
    brnn_barrier_await(b, gen, 0);
}

/* ---- the thread budget ----
 * blockrnn's threads in use in this process, summed over concurrent calls. A
 * call asks for up to `want` threads out of `total` and gets at least one
 * (its own: the calling thread always runs); it returns them with give. */
static int brnn_threads_in_use = 0;

static inline int brnn_budget_take(int want, int total) {
    int used = __atomic_load_n(&brnn_threads_in_use, __ATOMIC_RELAXED);
    int grant;
    do {
        int free_ = total - used;
        grant = want < free_ ? want : free_;
        if (grant < 1) grant = 1;
    } while (!__atomic_compare_exchange_n(&brnn_threads_in_use, &used, used + grant, 0,
                                          __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    return grant;
}

static inline void brnn_budget_give(int n) {
    __atomic_fetch_sub(&brnn_threads_in_use, n, __ATOMIC_ACQ_REL);
}

static inline int brnn_budget_in_use(void) {
    return __atomic_load_n(&brnn_threads_in_use, __ATOMIC_RELAXED);
}

/* Whether the budget is over-committed (more threads in use than the `cores`
 * the process may use): another caller was granted a thread beyond it, and a
 * call that holds several should give back what it can. */
static inline int brnn_budget_overcommitted(int cores) {
    return brnn_budget_in_use() > cores;
}

/* ---- shedding threads at a step boundary ----
 * A call that took several threads gives all but its first back at the end of
 * a step, and runs its remaining steps on that one thread, when a thread of
 * the call is no longer worth its share:
 *   - the budget is over-committed (in use > the CPUs the process may use):
 *     another caller was granted its own thread beyond the budget, so the
 *     cores now hold more of blockrnn's threads than they run at once;
 *   - a thread of the call waited more than BRNN_SHED_WAIT_NS at this
 *     barrier (in a call of long steps: a third of the call's time at its
 *     barriers, see brnn_barrier_wait_shed): its partner was not running
 *     (another process holds that core), and every further step would wait
 *     for the scheduler again. A quiet machine's steps wait far less (2-core
 *     Zen 5 VM, batch 1-8: ~0.16 ms at most within a call; a thread's
 *     start-up, the first barrier, up to ~3 ms in rare calls; at
 *     100,64,512,512 a wait over 1 ms in ~1 call of 10; on a 2-core Zen 4
 *     VM, 1-6 ms waits at ~5 barriers a second, some three within 4 ms);
 *     one that shares its cores with a busy process, 2-4 ms (the
 *     scheduler's time slice).
 * The last thread to arrive decides and stores the answer before releasing the
 * others, so every thread returns the same one; on shedding it gives n - 1
 * threads back to the budget (the caller gives back the last one). The step
 * loop then hands every cell to thread 0 and the others leave the loop: the
 * split of cells never changes a bit (brnn_packed.h: one sum per element), so
 * neither does shedding. */
#ifndef BRNN_SHED_WAIT_NS
#define BRNN_SHED_WAIT_NS 1000000
#endif

/* After a call shed because a partner thread was not running, the object it
 * ran for (an inference object's packed weights) runs its calls on one thread
 * for a spell: on a machine whose cores other processes keep busy, every call
 * would otherwise pay the wait again. The spell starts at BRNN_SOLO_MIN_NS
 * and doubles, up to BRNN_SOLO_NS, each time a call sheds again within
 * BRNN_SOLO_RECUR_NS of the last spell's end (the cause is still there: a
 * busy process stalls the partner again within a time slice); a shed long
 * after one starts at the minimum again. A quiet VM's stalls are isolated
 * (the host held a virtual CPU for over 1 ms): on the 2-core Zen 5 VM, 3-4 a
 * second in a loop of LSTM batch-1 H=256 calls, and a fixed 50 ms spell
 * each ran 4-7% of the calls on one thread (2.4x slower), ~10% of the wall
 * time. Fields are read and written atomically by concurrent callers (a
 * lost update only changes one spell's length); zero it for none. */
#ifndef BRNN_SOLO_NS
#define BRNN_SOLO_NS 50000000
#endif
#ifndef BRNN_SOLO_MIN_NS
#define BRNN_SOLO_MIN_NS 4000000
#endif
#ifndef BRNN_SOLO_RECUR_NS
#define BRNN_SOLO_RECUR_NS 20000000
#endif
typedef struct {
    long long until;  /* monotonic ns: the end of the spell (0: none) */
    long long spell;  /* its length */
} brnn_solo;

static inline int brnn_solo_now(const brnn_solo *s) {
    long long u = __atomic_load_n(&s->until, __ATOMIC_RELAXED);
    return u != 0 && brnn_now_ns() < u;
}

/* A spell from monotonic time now on (brnn_solo_start: now is the clock's). */
static inline void brnn_solo_start_at(brnn_solo *s, long long now) {
    long long u = __atomic_load_n(&s->until, __ATOMIC_RELAXED);
    long long spell = __atomic_load_n(&s->spell, __ATOMIC_RELAXED);
    if (u != 0 && now - u < BRNN_SOLO_RECUR_NS && spell > 0)   /* again, right after */
        spell = 2 * spell < BRNN_SOLO_NS ? 2 * spell : BRNN_SOLO_NS;
    else
        spell = BRNN_SOLO_MIN_NS;
    __atomic_store_n(&s->spell, spell, __ATOMIC_RELAXED);
    __atomic_store_n(&s->until, now + spell, __ATOMIC_RELAXED);
}

static inline void brnn_solo_start(brnn_solo *s) { brnn_solo_start_at(s, brnn_now_ns()); }

/* ---- idle objects ----
 * A call's partner threads sleep between calls (libgomp's passive wait). On a
 * virtual machine a CPU left idle for long is halted by the host (KVM polls a
 * halted CPU for 200 us by default, then the host's scheduler must run it
 * again): waking a partner there took ~300 us per call on a 2-core Zen 5 VM,
 * where a batch-1 request is ~100 us on one thread. `last` is an object's time
 * of the end of its last call (0: none); brnn_idle_for says whether that was
 * more than idle_ns ago, or never. */
static inline int brnn_idle_for(const long long *last, long long idle_ns) {
    long long u = __atomic_load_n(last, __ATOMIC_RELAXED);
    return u == 0 || brnn_now_ns() - u > idle_ns;
}

static inline void brnn_mark_now(long long *last) {
    __atomic_store_n(last, brnn_now_ns(), __ATOMIC_RELAXED);
}

/* ---- one thread or several, by what an object's calls measured ----
 * A second thread does not always pay for a small call: where another process
 * keeps the partner's core busy (each per-step barrier then waits for the
 * scheduler), or a virtual CPU runs slower for a while. Measured on a 2-core
 * Zen 5 VM with a busy process on the other core: the reset-after GRU, T=50,
 * batch 1, H=128, 275 us a call on 2 threads (thousands of involuntary context
 * switches), against ~80 on one. brnn_pace keeps, per object, the mean time
 * per multiply-add (femtoseconds; 0: none yet) of its small calls that ran on
 * one thread (slot 0) and on several (slot 1): each new time moves its mean a
 * quarter of the way, and by at most a quarter of the mean upwards, so that
 * it follows a machine that changes (several threads slowed 3.5x are seen
 * as slower within 3 timed calls) while one slow call moves it little.
 * Several threads count as slower once their mean exceeds one thread's by
 * an eighth. (Measured on a quiet 2-core Zen 5 VM, the reset-after GRU and
 * the LSTM at T=50, batch 1, H=128: with each new time weighing half of the
 * mean, single calls of 1.4-2x the usual time flipped the choice, and 30% of
 * the calls ran on one thread, 1.4x slower.)
 *
 * Several threads are what a call asks for unless they measured slower; every
 * BRNN_PACE_PROBE-th call then asks for one, to keep that mean current, or
 * every BRNN_PACE_PROBE_FAR-th while one thread measured over twice as slow
 * (a probe then costs more than a whole several-thread call, and a stale
 * one-thread mean only delays noticing that one thread became faster: LSTM batch 1
 * H=256 on the quiet 2-core Zen 5 VM, one thread 2.4x slower, the probes
 * every 64th call took ~2% of the wall time). While
 * one thread is faster, a call asks for several again for BRNN_PACE_TRY_NS
 * every BRNN_PACE_RETRY_NS. A core that sat idle is slow for its first
 * milliseconds of work on a VM (the same GRU: ~275 us a call for ~15 calls in
 * a row, then ~65), so a several-thread call is timed only once its run of
 * several-thread calls (`streak`: from the first one after a one-thread call
 * or an idle spell; a probe of one thread does not end it) has lasted
 * BRNN_PACE_WARM_NS, and not right after a one-thread call (its partner,
 * idle for that call, went to sleep: measured 1.4-2x the usual time).
 * Concurrent callers update it without a lock (atomic
 * loads and stores: a lost update only delays a mean). Which choice a call
 * makes never changes a bit (one sum per element, above). */
#ifndef BRNN_PACE_PROBE
#define BRNN_PACE_PROBE 64
#endif
#ifndef BRNN_PACE_PROBE_FAR
#define BRNN_PACE_PROBE_FAR 256
#endif
#ifndef BRNN_PACE_WARM_NS
#define BRNN_PACE_WARM_NS 8000000
#endif
#ifndef BRNN_PACE_TRY_NS
#define BRNN_PACE_TRY_NS 12000000
#endif
#ifndef BRNN_PACE_RETRY_NS
#define BRNN_PACE_RETRY_NS 200000000
#endif
typedef struct {
    long long fs_per_mac[2];
    long long streak;    /* monotonic ns: start of the run of several-thread calls (0: none) */
    long long retry_at;  /* monotonic ns: when several threads are tried again */
    int calls;
    int after_one;       /* the last call planned asked for one thread */
} brnn_pace;

enum { BRNN_PACE_MANY = 1, BRNN_PACE_TIMED = 2 };

/* The plan of the next small call at monotonic time now: BRNN_PACE_MANY if
 * it asks for several threads, BRNN_PACE_TIMED if its time goes into the
 * means (brnn_pace_record). */
static inline int brnn_pace_plan(brnn_pace *p, long long now) {
    long long one = __atomic_load_n(&p->fs_per_mac[0], __ATOMIC_RELAXED);
    long long many = __atomic_load_n(&p->fs_per_mac[1], __ATOMIC_RELAXED);
    long long streak = __atomic_load_n(&p->streak, __ATOMIC_RELAXED);
    int k = __atomic_add_fetch(&p->calls, 1, __ATOMIC_RELAXED);
    if (!(one > 0 && many > one + one / 8)) {  /* several threads: not slower */
        int every = one > 2 * many ? BRNN_PACE_PROBE_FAR : BRNN_PACE_PROBE;
        if (k % every == 0) {
            __atomic_store_n(&p->after_one, 1, __ATOMIC_RELAXED);
            return BRNN_PACE_TIMED;                              /* probe one */
        }
    } else if (!(streak != 0 && now - streak < BRNN_PACE_TRY_NS)) {   /* no try running */
        if (now < __atomic_load_n(&p->retry_at, __ATOMIC_RELAXED)) {
            __atomic_store_n(&p->streak, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&p->after_one, 1, __ATOMIC_RELAXED);
            return BRNN_PACE_TIMED;                              /* one thread */
        }
        __atomic_store_n(&p->retry_at, now + BRNN_PACE_RETRY_NS, __ATOMIC_RELAXED);
        streak = 0;                                              /* a new try */
    }
    if (streak == 0) {
        __atomic_store_n(&p->streak, now, __ATOMIC_RELAXED);
        streak = now;
    }
    int woke = __atomic_exchange_n(&p->after_one, 0, __ATOMIC_RELAXED);
    return BRNN_PACE_MANY |
           (now - streak >= BRNN_PACE_WARM_NS && !woke ? BRNN_PACE_TIMED : 0);
}

/* A call that ran alone for another reason than the pace (an idle spell, a
 * solo spell): the partner cores cool down, a run of several-thread calls
 * starts again. */
static inline void brnn_pace_idle(brnn_pace *p) {
    __atomic_store_n(&p->streak, 0, __ATOMIC_RELAXED);
}

/* A timed small call on several threads (many) or one took ns for macs
 * multiply-adds. */
static inline void brnn_pace_record(brnn_pace *p, int many, long long ns, long long macs) {
    if (macs <= 0 || ns < 0) return;
    long long v = (long long)((double)ns * 1e6 / (double)macs);
    if (v < 1) v = 1;
    long long *slot = &p->fs_per_mac[many != 0];
    long long old = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (old > 0 && v > 2 * old) v = 2 * old;   /* upwards: at most old / 4 */
    __atomic_store_n(slot, old == 0 ? v : old + (v - old) / 4, __ATOMIC_RELAXED);
}

static inline int brnn_atomic_load(const int *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
static inline void brnn_atomic_add(int *p, int v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

/* A patient region (brnn_barrier_wait_shed) sheds for its partners once they
 * were not running for a third of the time since its first barrier: waits of
 * waited_ns in elapsed_ns, at least BRNN_PATIENT_SPAN_NS of it. A partner
 * time-sliced with a busy process waits about half the time (its core's time
 * slices); a VM's moments are short and rare. */
#ifndef BRNN_PATIENT_SPAN_NS
#define BRNN_PATIENT_SPAN_NS 20000000
#endif
static inline int brnn_patient_sheds(long long waited_ns, long long elapsed_ns) {
    return elapsed_ns >= BRNN_PATIENT_SPAN_NS && 3 * waited_ns >= elapsed_ns;
}

/* A barrier inside a step whose end is a shedding barrier `step`
 * (brnn_barrier_wait_shed): a partner's stall seen here counts there, as if
 * the step's barrier had waited for it. */
static inline void brnn_barrier_wait_within(brnn_barrier *b, int n, brnn_barrier *step) {
    int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELEASE);
        return;
    }

/* brnn_barrier_wait, then 1 if the call goes on with one thread (every
 * thread of the call gets the same answer), else 0. `cores`: the CPUs this
 * process may run on.
 * Also a partner that is not running: two threads of the call on one CPU
 * (a stall, as a long wait is). Linux sometimes wakes a sleeping worker
 * onto its waker's CPU with the other CPU idle, and leaves it there: on the
 * 2-core Zen 5 VM, after such a wake the reset-after GRU at T=50, batch 1,
 * H=128 took ~350 us a call on 2 threads for the next ~60 ms (each step's
 * barrier a hand-over of the one CPU by sched_yield; CPU / wall 1.0), against
 * ~55 apart and ~80 on one thread.
 * A stalled partner sheds at once where a step is short (a wait of 1 ms is
 * hundreds of steps); a `patient` region, whose steps are long enough that a
 * VM's or the kernel's moment costs less than finishing on one thread, sheds
 * only when its waits add up (brnn_patient_sheds; see INFER_SHORT_STEP_WORK in
 * blockrnn/_inference.pxi). Over-commit sheds at once either way. */
   brnn_barrier_await_into(b, gen, BRNN_SHED_WAIT_NS, step);
}

static inline int brnn_barrier_wait_shed(brnn_barrier *b, int n, int cores, int patient) {
    int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    int cpu = brnn_current_cpu();
    if (cpu >= 0) {
        unsigned long long bit = 1ULL << (cpu % 64);
        if (__atomic_fetch_or(&b->cpus, bit, __ATOMIC_RELAXED) & bit)
            __atomic_store_n(&b->stalled, 1, __ATOMIC_RELAXED);
    }
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {
        int stalled = __atomic_exchange_n(&b->stalled, 0, __ATOMIC_RELAXED);
        if (!patient) {
            if (stalled) __atomic_store_n(&b->slow, 1, __ATOMIC_RELAXED);
        } else if (b->start_ns == 0) {
            b->start_ns = brnn_now_ns();
        } else {   /* the clock is read only once a thread yielded */
            long long waited = __atomic_load_n(&b->waited_ns, __ATOMIC_RELAXED);
            if (waited > 0 && brnn_patient_sheds(waited, brnn_now_ns() - b->start_ns))
                __atomic_store_n(&b->slow, 1, __ATOMIC_RELAXED);
        }
        int shed = __atomic_load_n(&b->slow, __ATOMIC_RELAXED)
                   || brnn_budget_overcommitted(cores);
        if (shed) brnn_budget_give(n - 1);
        __atomic_store_n(&b->shed, shed, __ATOMIC_RELAXED);
        __atomic_store_n(&b->cpus, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELEASE);
        return shed;
    }
    brnn_barrier_await(b, gen, BRNN_SHED_WAIT_NS);
    return __atomic_load_n(&b->shed, __ATOMIC_RELAXED);
}

#endif /* BRNN_PACKED_H */
