/* Activations for blockrnn's gate kernels.
 *
 * float: element functions written so that GCC/Clang vectorise the loops that
 * inline them at -O3 -fno-trapping-math (no branches, no libm calls; rounding
 * and the 2^n scale by integer arithmetic). On x86-64 Linux (GCC >= 12) each
 * kernel of brnn_lstm.h and brnn_gru.h is compiled for AVX-512, AVX2+FMA and
 * the baseline (BRNN_MULTIVERSION), and the loader picks one per machine (GNU
 * ifunc via target_clones). Every element is computed on its own, so the
 * AVX-512 and AVX2 clones give the same bits; a call gives the same bits on
 * any thread of one machine. Throughput on one Zen 5 core, a loop over an
 * array in L1: 0.18 ns per sigmoid, 0.27 ns per tanh with AVX-512 (AVX2:
 * 0.35, 0.53; libm: about 9 ns each).
 * Accuracy: a few float32 ulp (exp: Cody-Waite reduction + degree-6
 * polynomial, the classic Cephes expf scheme; tanh: odd polynomial below
 * 0.625, 1 - 2 / (e^{2|z|} + 1) above).
 *
 * double: libm, element by element (used by the float64 gradient checks).
 *
 * NaN propagates; sigmoid(z) for z <= -88.3 is about 4.6e-39 rather than
 * e^z (the argument of exp is clamped to [-86.9, 88.3] so that 2^n stays a
 * normal float; TensorFlow flushes such values to 0); tanh(+-inf) = +-1.
 * Compiled without -ffast-math (the code relies on IEEE rounding).
 */
#ifndef BRNN_MATH_H
#define BRNN_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA; the ifunc resolver checks the
 * CPU's features. GCC 12 is the first to know the ISA levels in
 * target_clones. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && \
    !defined(__clang__) && __GNUC__ >= 12
#define BRNN_MULTIVERSION \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#ifndef BRNN_MULTIVERSION
#define BRNN_MULTIVERSION
#endif

/* e^z for float, valid for finite z in [BRNN_EXP_MIN, BRNN_EXP_MAX] (callers
 * clamp). n = rint(z / ln 2) comes from the round-to-nearest add: t = z log2e
 * + 1.5 * 2^23 holds n in its low mantissa bits, so t's bits shifted by 23
 * are n in the exponent field, and adding them to p's bits scales p by 2^n
 * exactly (p in [0.70, 1.42], n in [-125, 127]: the result is a normal float).
 * That is the same value as p * 2^n by multiplication, so the same bits as
 * before this shortcut, in ~7 fewer operations on the activations' critical
 * path. */
#define BRNN_EXP_MIN (-86.9f)  /* rint(z log2e) >= -125 */
#define BRNN_EXP_MAX 88.3f     /* rint(z log2e) <= 127 */
static inline __attribute__((always_inline)) float brnn_expf_kernel(float z) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adds round to nearest */
    float t = z * log2e + round_magic;
    float n = t - round_magic;
    float r = (z - n * ln2_hi) - n * ln2_lo; /* |r| <= ln2 / 2 */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    uint32_t tb, pb;
    memcpy(&tb, &t, sizeof tb);
    memcpy(&pb, &p, sizeof pb);
    pb += tb << 23;
    memcpy(&p, &pb, sizeof p);
    return p;
}

/* Clamp to [lo, hi]; NaN becomes lo (the callers put NaN back afterwards:
 * a branch-free select keeps the loops vectorisable, and exp's exponent
 * arithmetic never sees a NaN). */
static inline __attribute__((always_inline)) float brnn_clampf(float z, float lo, float hi) {
    z = z > lo ? z : lo;
    return z < hi ? z : hi;
}

/* 1 / (1 + e^-z) */
static inline __attribute__((always_inline)) float brnn_sigmoidf(float z) {
    float e = brnn_expf_kernel(brnn_clampf(-z, BRNN_EXP_MIN, BRNN_EXP_MAX));
    float s = 1.0f / (1.0f + e);
    return z != z ? z : s;
}

/* tanh(z) */
static inline __attribute__((always_inline)) float brnn_tanhf(float z) {
    float a = fabsf(z);
    /* |z| < 0.625: z + z^3 P(z^2) */
    float s = z * z;
    float p = -5.70498872745e-3f;
    p = p * s + 2.06390887954e-2f;
    p = p * s - 5.37397155531e-2f;
    p = p * s + 1.33314422036e-1f;
    p = p * s - 3.33332819422e-1f;
    float small = p * s * z + z;
    /* |z| >= 0.625: 1 - 2 / (e^{2|z|} + 1), with z's sign */
    float e = brnn_expf_kernel(brnn_clampf(2.0f * a, 0.0f, BRNN_EXP_MAX));
    float large = copysignf(1.0f - 2.0f / (e + 1.0f), z);
    return a >= 0.625f ? large : small; /* NaN: the comparison is false, small is NaN */
}

static inline double brnn_sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }
static inline double brnn_tanh(double z) { return tanh(z); }

/* clip(v, -limit, +limit) that lets NaN through (SPEC section 3); +-inf
 * becomes +-limit. Callers only clip when limit > 0. */
static inline float brnn_clipf(float v, float limit) {
    return v > limit ? limit : (v < -limit ? -limit : v);
}
static inline double brnn_clip(double v, double limit) {
    return v > limit ? limit : (v < -limit ? -limit : v);
}

/* Column sums in double of `rows` rows, for the backwards' bias and peephole
 * gradients: acc[j] += a[r, j] (row stride lda), and acc[j] += a[r, j] *
 * b[r, j] (strides lda, ldb), rows in order, so each acc[j] is one sum in a
 * fixed order (the callers split the rows in fixed blocks, see
 * blockrnn/_common.pxi). In C for `restrict` and the vector clones. */
#define BRNN_COLUMN_SUMS(NAME, T)                                                    \
    BRNN_MULTIVERSION                                                                \
    static void NAME(ptrdiff_t rows, ptrdiff_t n, const T *restrict a, ptrdiff_t lda,  \
                     double *restrict acc) {                                         \
        for (ptrdiff_t r = 0; r < rows; r++)                                         \
            for (ptrdiff_t j = 0; j < n; j++)                                        \
                acc[j] += a[r * lda + j];                                            \
    }
#define BRNN_PRODUCT_SUMS(NAME, T)                                                   \
    BRNN_MULTIVERSION                                                                \
    static void NAME(ptrdiff_t rows, ptrdiff_t n, const T *restrict a, ptrdiff_t lda,  \
                     const T *restrict b, ptrdiff_t ldb, double *restrict acc) {     \
        for (ptrdiff_t r = 0; r < rows; r++)                                         \
            for (ptrdiff_t j = 0; j < n; j++)                                        \
                acc[j] += a[r * lda + j] * b[r * ldb + j];                           \
    }
BRNN_COLUMN_SUMS(brnn_column_sums_f32, float)
BRNN_COLUMN_SUMS(brnn_column_sums_f64, double)
BRNN_PRODUCT_SUMS(brnn_product_sums_f32, float)
BRNN_PRODUCT_SUMS(brnn_product_sums_f64, double)

#endif /* BRNN_MATH_H */
