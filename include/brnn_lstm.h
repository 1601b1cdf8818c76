/* The LSTM forward gate kernel (SPEC section 3) for one batch row, fused:
 * one loop reads each input once and writes the seven outputs, with every
 * activation inlined (brnn_math.h), so the compiler vectorises the whole step
 * of a row. (Written in C for `restrict`: without it, a loop that writes seven
 * arrays and reads twelve is not vectorised.)
 *
 * Per cell j, in this order (the order of TensorFlow's Eigen expressions):
 *   pre_g = (dst_g[j] + g_g[j]) + b_g[j]    if acc (dst_g holds x @ W_x),
 *           g_g[j] + b_g[j]                 otherwise, for g in i, c, f, o
 *   pre_f = pre_f + forget_bias             only if forget_bias != 0 (keeps -0)
 *   pre_i += wci * cs_prev;  pre_f += wcf * cs_prev          if peep
 *   i = sigmoid(pre_i), f = sigmoid(pre_f), ci = tanh(pre_c)
 *   cs = i * ci + f * cs_prev, clipped to +-cell_clip if cell_clip > 0
 *   pre_o += wco * cs (the new, clipped cs)                  if peep
 *   o = sigmoid(pre_o), co = tanh(cs), h = o * co
 * wci/wcf/wco are only read if peep. dst_i/c/f/o are the outputs i/ci/f/o.
 */
#ifndef BRNN_LSTM_H
#define BRNN_LSTM_H

#include "brnn_math.h"

/* The loop, for element type T; PEEP and ACC are compile-time constants in
 * each of the four copies the dispatcher below instantiates. */
#define BRNN_LSTM_FORWARD_LOOP(T, SIGMOID, TANH, CLIP, PEEP, ACC)                    \
    for (ptrdiff_t j = 0; j < H; j++) {                                              \
        T pi = ACC ? (i_[j] + gi[j]) + bi[j] : gi[j] + bi[j];                        \
        T pc = ACC ? (ci[j] + gc[j]) + bc[j] : gc[j] + bc[j];                        \
        T pf = ACC ? (f[j] + gf[j]) + bf[j] : gf[j] + bf[j];                         \
        T po = ACC ? (o[j] + go[j]) + bo[j] : go[j] + bo[j];                         \
        T cp = cs_prev[j];                                                           \
        pf = add_forget_bias ? pf + forget_bias : pf;                                \
        if (PEEP) {                                                                  \
            pi = pi + wci[j] * cp;                                                   \
            pf = pf + wcf[j] * cp;                                                   \
        }                                                                            \
        T vi = SIGMOID(pi), vf = SIGMOID(pf), vc = TANH(pc);                         \
        T c = vi * vc + vf * cp;                                                     \
        c = clip ? CLIP(c, cell_clip) : c;                                           \
        if (PEEP) po = po + wco[j] * c;                                              \
        T vo = SIGMOID(po), tc = TANH(c);                                            \
        i_[j] = vi;                                                                  \
        ci[j] = vc;                                                                  \
        f[j] = vf;                                                                   \
        o[j] = vo;                                                                   \
        cs[j] = c;                                                                   \
        co[j] = tc;                                                                  \
        h[j] = vo * tc;                                                              \
    }

#define BRNN_LSTM_FORWARD_ROW(NAME, T, SIGMOID, TANH, CLIP)                          \
    BRNN_MULTIVERSION                                                                \
    static void NAME(                                                                \
        ptrdiff_t H, const T *restrict gi, const T *restrict gc,                     \
        const T *restrict gf, const T *restrict go, const T *restrict bi,            \
        const T *restrict bc, const T *restrict bf, const T *restrict bo,            \
        const T *restrict wci, const T *restrict wcf, const T *restrict wco,         \
        T forget_bias, T cell_clip, int peep, int acc, const T *restrict cs_prev,    \
        T *restrict i_, T *restrict cs, T *restrict f, T *restrict o,                \
        T *restrict ci, T *restrict co, T *restrict h)                               \
    {                                                                                \
        const int add_forget_bias = forget_bias != 0, clip = cell_clip > 0;          \
        if (peep && acc) {                                                           \
            BRNN_LSTM_FORWARD_LOOP(T, SIGMOID, TANH, CLIP, 1, 1)                     \
        } else if (peep) {                                                           \
            BRNN_LSTM_FORWARD_LOOP(T, SIGMOID, TANH, CLIP, 1, 0)                     \
        } else if (acc) {                                                            \
            BRNN_LSTM_FORWARD_LOOP(T, SIGMOID, TANH, CLIP, 0, 1)                     \
        } else {                                                                     \
            BRNN_LSTM_FORWARD_LOOP(T, SIGMOID, TANH, CLIP, 0, 0)                     \
        }                                                                            \
    }

BRNN_LSTM_FORWARD_ROW(brnn_lstm_forward_row_f32, float, brnn_sigmoidf, brnn_tanhf, brnn_clipf)
BRNN_LSTM_FORWARD_ROW(brnn_lstm_forward_row_f64, double, brnn_sigmoid, brnn_tanh, brnn_clip)

#endif /* BRNN_LSTM_H */
