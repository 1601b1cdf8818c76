/* Scalar activations for blockrnn's gate kernels, in float and double.
 *
 * They follow the math of TensorFlow's kernels (sigma(z) = 1 / (1 + e^-z),
 * tanh from libm) without -ffast-math, so NaN and +-Inf propagate as in TF.
 */
#ifndef BRNN_MATH_H
#define BRNN_MATH_H

#include <math.h>

static inline float brnn_sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }
static inline double brnn_sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

static inline float brnn_tanhf(float z) { return tanhf(z); }
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
