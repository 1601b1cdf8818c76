/* The reset-after GRU's gate kernels (nn.GRU, Keras reset_after=True, ONNX
 * linear_before_reset=1; SPEC section 13) for one batch row, forward and
 * backward, fused like brnn_lstm.h's: vectorised loops, activations inlined
 * (brnn_math.h); the forward in two passes over the row (r and z, then n
 * and h: each one activation deep, as BRNN_LSTM_CELLS). Gate order r, z, n.
 *
 * Forward, per cell j. On entry r, z, n hold the input projections
 * x @ W_ir^T, x @ W_iz^T, x @ W_in^T of the row (no bias); gr, gz, gn the
 * recurrent ones h_prev @ W_hr^T, h_prev @ W_hz^T, h_prev @ W_hn^T:
 *   r  = sigmoid((r + b_ir) + (gr + b_hr))
 *   z  = sigmoid((z + b_iz) + (gz + b_hz))
 *   hn = gn + b_hn
 *   n  = tanh((n + b_in) + r * hn)
 *   h  = (1 - z) * n + z * h_prev            (nn.GRU's expression)
 *
 * Backward, per cell j (carry holds d h from step t+1 on entry):
 *   dh   = h_grad + carry
 *   dnx  = dh * (1 - z) * (1 - n^2)           d(x W_in^T + b_in)
 *   dr   = dnx * hn * r * (1 - r)             d(pre-activation of r)
 *   dz   = dh * (h_prev - n) * z * (1 - z)    d(pre-activation of z)
 *   dhn  = dnx * r                            d(h W_hn^T + b_hn)
 *   carry = dh * z                            (d h_prev before + dG_h @ W_hh)
 */
#ifndef BRNN_GRU_RESET_AFTER_H
#define BRNN_GRU_RESET_AFTER_H

#include "brnn_math.h"

#define BRNN_GRU_RA_FORWARD_ROW(NAME, T, SIGMOID, TANH)                              \
    BRNN_MULTIVERSION                                                                \
    static void NAME(ptrdiff_t H, const T *restrict gr, const T *restrict gz,        \
                     const T *restrict gn, const T *restrict b_ir,                   \
                     const T *restrict b_iz, const T *restrict b_in,                 \
                     const T *restrict b_hr, const T *restrict b_hz,                 \
                     const T *restrict b_hn, const T *restrict h_prev,               \
                     T *restrict r, T *restrict z, T *restrict n, T *restrict hn,    \
                     T *restrict h)                                                  \
    {                                                                                \
        for (ptrdiff_t j = 0; j < H; j++) { /* two passes: see BRNN_LSTM_CELLS */    \
            r[j] = SIGMOID((r[j] + b_ir[j]) + (gr[j] + b_hr[j]));                    \
            z[j] = SIGMOID((z[j] + b_iz[j]) + (gz[j] + b_hz[j]));                    \
        }                                                                            \
        for (ptrdiff_t j = 0; j < H; j++) {                                          \
            T vhn = gn[j] + b_hn[j];                                                 \
            T vn = TANH((n[j] + b_in[j]) + r[j] * vhn);                              \
            hn[j] = vhn;                                                             \
            n[j] = vn;                                                               \
            h[j] = (1 - z[j]) * vn + z[j] * h_prev[j];                               \
        }                                                                            \
    }

BRNN_GRU_RA_FORWARD_ROW(brnn_gru_ra_forward_row_f32, float, brnn_sigmoidf, brnn_tanhf)
BRNN_GRU_RA_FORWARD_ROW(brnn_gru_ra_forward_row_f64, double, brnn_sigmoid, brnn_tanh)

#define BRNN_GRU_RA_BACKWARD_ROW(NAME, T)                                            \
    BRNN_MULTIVERSION                                                                \
    static void NAME(ptrdiff_t H, const T *restrict h_prev, const T *restrict r,     \
                     const T *restrict z, const T *restrict n, const T *restrict hn, \
                     const T *restrict h_grad, T *restrict carry, T *restrict dr,    \
                     T *restrict dz, T *restrict dhn, T *restrict dnx)               \
    {                                                                                \
        for (ptrdiff_t j = 0; j < H; j++) {                                          \
            T dh = h_grad[j] + carry[j];                                             \
            T vn = n[j], vr = r[j], vz = z[j];                                       \
            T vnx = dh * (1 - vz) * (1 - vn * vn);                                   \
            dr[j] = vnx * hn[j] * vr * (1 - vr);                                     \
            dz[j] = dh * (h_prev[j] - vn) * vz * (1 - vz);                           \
            dhn[j] = vnx * vr;                                                       \
            dnx[j] = vnx;                                                            \
            carry[j] = dh * vz;                                                      \
        }                                                                            \
    }

BRNN_GRU_RA_BACKWARD_ROW(brnn_gru_ra_backward_row_f32, float)
BRNN_GRU_RA_BACKWARD_ROW(brnn_gru_ra_backward_row_f64, double)

#endif /* BRNN_GRU_RESET_AFTER_H */
