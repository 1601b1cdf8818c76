/* The GRU forward gate kernels (SPEC section 6) for one batch row, fused like
 * brnn_lstm.h's: one vectorised loop per kernel, activations inlined.
 *
 * Gates, per cell j (acc: r and u hold x @ w_ru[:I] on entry):
 *   r = sigmoid((r + pre_r) + b_r),  u = sigmoid((u + pre_u) + b_u)   if acc
 *   r = sigmoid(pre_r + b_r),        u = sigmoid(pre_u + b_u)         otherwise
 *   rh = r * h_prev
 * Output (c holds [x, r * h_prev] @ w_c on entry):
 *   c = tanh(c + b_c),  h = u * (h_prev - c) + c
 */
#ifndef BRNN_GRU_H
#define BRNN_GRU_H

#include "brnn_math.h"

#define BRNN_GRU_GATES_LOOP(T, SIGMOID, ACC)                                         \
    for (ptrdiff_t j = 0; j < H; j++) {                                              \
        T vr = SIGMOID(ACC ? (r[j] + pre_r[j]) + b_r[j] : pre_r[j] + b_r[j]);        \
        T vu = SIGMOID(ACC ? (u[j] + pre_u[j]) + b_u[j] : pre_u[j] + b_u[j]);        \
        r[j] = vr;                                                                   \
        u[j] = vu;                                                                   \
        rh[j] = vr * h_prev[j];                                                      \
    }

#define BRNN_GRU_ROWS(GATES, OUTPUT, T, SIGMOID, TANH)                               \
    BRNN_MULTIVERSION                                                                \
    static void GATES(ptrdiff_t H, const T *restrict pre_r, const T *restrict pre_u, \
                      const T *restrict b_r, const T *restrict b_u,                  \
                      const T *restrict h_prev, int acc, T *restrict r,              \
                      T *restrict u, T *restrict rh)                                 \
    {                                                                                \
        if (acc) {                                                                   \
            BRNN_GRU_GATES_LOOP(T, SIGMOID, 1)                                       \
        } else {                                                                     \
            BRNN_GRU_GATES_LOOP(T, SIGMOID, 0)                                       \
        }                                                                            \
    }                                                                                \
                                                                                     \
    BRNN_MULTIVERSION                                                                \
    static void OUTPUT(ptrdiff_t H, const T *restrict b_c, const T *restrict h_prev, \
                       const T *restrict u, T *restrict c, T *restrict h)            \
    {                                                                                \
        for (ptrdiff_t j = 0; j < H; j++) {                                          \
            T vc = TANH(c[j] + b_c[j]);                                              \
            c[j] = vc;                                                               \
            h[j] = u[j] * (h_prev[j] - vc) + vc;                                     \
        }                                                                            \
    }

BRNN_GRU_ROWS(brnn_gru_gates_row_f32, brnn_gru_output_row_f32, float, brnn_sigmoidf, brnn_tanhf)
BRNN_GRU_ROWS(brnn_gru_gates_row_f64, brnn_gru_output_row_f64, double, brnn_sigmoid, brnn_tanh)

#endif /* BRNN_GRU_H */
