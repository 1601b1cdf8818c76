/* Activations for blockrnn's gate kernels.
 *
 * float: element functions written so that GCC/Clang vectorise the loops that
 * inline them at -O3 -fno-trapping-math (no branches, no libm calls; rounding
 * and the 2^n scale by integer arithmetic). On x86-64 Linux (GCC >= 12) each
 * kernel of brnn_lstm.h and brnn_gru.h is compiled for AVX-512, AVX2+FMA and
 * the baseline (BRNN_MULTIVERSION), and the loader picks one per machine (GNU
 * ifunc via target_clones). Every element is computed on its own, so the
 * AVX-512 and AVX2 clones give the same bits; a call gives the same bits on
 * any thread of one machine. Speed on one EPYC core: 0.5 ns per sigmoid,
 * 0.8 ns per tanh (libm: about 9 ns each).
 * Accuracy: a few float32 ulp (exp: Cody-Waite reduction + degree-6
 * polynomial, the classic Cephes expf scheme; tanh: odd polynomial below
 * 0.625, 1 - 2 / (e^{2|z|} + 1) above).
 *
 * double: libm, element by element (used by the float64 gradient checks).
 *
 * NaN propagates; sigmoid(-inf) is about 3e-39 rather than 0 (the argument
 * of exp is clamped to +-88.7 so it never overflows); tanh(+-inf) = +-1.
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

/* e^z for float, valid for finite |z| <= 88.7 (callers clamp). */
static inline __attribute__((always_inline)) float brnn_expf_kernel(float z) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adds round to nearest */
    float n = (z * log2e + round_magic) - round_magic;
    float r = (z - n * ln2_hi) - n * ln2_lo; /* |r| <= ln2 / 2 */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    /* 2^n built in the exponent field; n in [-128, 128]: split it in two
     * halves so that neither scale over- nor underflows. */
    int32_t k = (int32_t)n;
    int32_t k1 = k >> 1, k2 = k - k1;
    uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    return p * s1 * s2;
}

/* Clamp to [lo, hi]; NaN becomes lo (the callers put NaN back afterwards:
 * a branch-free select keeps the loops vectorisable, and exp's integer
 * conversion never sees a NaN). */
static inline __attribute__((always_inline)) float brnn_clampf(float z, float lo, float hi) {
    z = z > lo ? z : lo;
    return z < hi ? z : hi;
}

/* 1 / (1 + e^-z) */
static inline __attribute__((always_inline)) float brnn_sigmoidf(float z) {
    float e = brnn_expf_kernel(brnn_clampf(-z, -88.7f, 88.7f));
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
    float e = brnn_expf_kernel(brnn_clampf(2.0f * a, 0.0f, 88.7f));
    float large = copysignf(1.0f - 2.0f / (e + 1.0f), z);
    float t = a < 0.625f ? small : large;
    return z != z ? z : t;
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

#endif /* BRNN_MATH_H */
