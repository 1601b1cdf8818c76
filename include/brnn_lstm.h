/* The LSTM gate kernels for one batch row, forward (SPEC section 3) and
 * backward (section 4), each fused: the backward's one loop and the
 * forward's two passes (BRNN_LSTM_CELLS) read each input once and write each
 * output once, with the activations inlined (brnn_math.h), so the compiler
 * vectorises the whole step of a row. (Written in C for `restrict`: without
 * it, a loop that writes seven arrays and reads twelve is not vectorised.)
 *
 * Forward:
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

/* A row's cells in two passes over j, each one activation deep: the state
 * pass computes i, f, ci and the new cs of every cell (pre_i, pre_c, pre_f
 * from PRE_STATE, which declares pi, pc, pf), the output pass o, co and h
 * from that cs (pre_o from PRE_O, which declares po). The arithmetic of each
 * cell is the order above, so the bits are those of one pass; two passes let
 * the CPU overlap many cells' exps where one pass was bound by the latency of
 * the chain sigmoid -> cs -> tanh(cs) (one EPYC core, AVX-512, in L1: 1.6 ->
 * 1.1 ns a cell with brnn_math.h's exp shortcut). The state pass writes cs,
 * which the output pass reads back; STORE_STATE(vi, vc, vf) writes what else
 * the caller keeps of it, STORE_OUT(vo, tc) h = vo * tc and what else. */
#define BRNN_LSTM_CELLS(T, SIGMOID, TANH, CLIP, PEEP, PRE_STATE, STORE_STATE,       \
                        PRE_O, STORE_OUT)                                            \
    for (ptrdiff_t j = 0; j < H; j++) {                                              \
        PRE_STATE                                                                    \
        T cp = cs_prev[j];                                                           \
        pf = add_forget_bias ? pf + forget_bias : pf;                                \
        if (PEEP) {                                                                  \
            pi = pi + wci[j] * cp;                                                   \
            pf = pf + wcf[j] * cp;                                                   \
        }                                                                            \
        T vi = SIGMOID(pi), vf = SIGMOID(pf), vc = TANH(pc);                         \
        T c = vi * vc + vf * cp;                                                     \
        c = clip ? CLIP(c, cell_clip) : c;                                           \
        cs[j] = c;                                                                   \
        STORE_STATE(vi, vc, vf)                                                      \
    }                                                                                \
    for (ptrdiff_t j = 0; j < H; j++) {                                              \
        PRE_O                                                                        \
        T c = cs[j];                                                                 \
        if (PEEP) po = po + wco[j] * c;                                              \
        T vo = SIGMOID(po), tc = TANH(c);                                            \
        STORE_OUT(vo, tc)                                                            \
    }

/* The training forward keeps all seven outputs; with ACC, i_, ci, f, o hold
 * x @ W_x's gate columns on entry. */
#define BRNN_LSTM_PRE_STATE_ALL(T, ACC)                                              \
    T pi = ACC ? (i_[j] + gi[j]) + bi[j] : gi[j] + bi[j];                            \
    T pc = ACC ? (ci[j] + gc[j]) + bc[j] : gc[j] + bc[j];                            \
    T pf = ACC ? (f[j] + gf[j]) + bf[j] : gf[j] + bf[j];
#define BRNN_LSTM_STORE_STATE_ALL(vi, vc, vf)                                        \
    i_[j] = vi;                                                                      \
    ci[j] = vc;                                                                      \
    f[j] = vf;
#define BRNN_LSTM_PRE_O_ALL(T, ACC)                                                  \
    T po = ACC ? (o[j] + go[j]) + bo[j] : go[j] + bo[j];
#define BRNN_LSTM_STORE_OUT_ALL(vo, tc)                                              \
    o[j] = vo;                                                                       \
    co[j] = tc;                                                                      \
    h[j] = vo * tc;

/* The loop, for element type T; PEEP and ACC are compile-time constants in
 * each of the four copies the dispatcher below instantiates. */
#define BRNN_LSTM_FORWARD_LOOP(T, SIGMOID, TANH, CLIP, PEEP, ACC)                    \
    BRNN_LSTM_CELLS(T, SIGMOID, TANH, CLIP, PEEP, BRNN_LSTM_PRE_STATE_ALL(T, ACC),   \
                    BRNN_LSTM_STORE_STATE_ALL, BRNN_LSTM_PRE_O_ALL(T, ACC),          \
                    BRNN_LSTM_STORE_OUT_ALL)

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

/* The inference forward's step of a row (blockrnn/_inference.pxi): the same
 * cells (BRNN_LSTM_CELLS) as the forward above with acc (pre = (x_g + g_g) +
 * b_g), so the same bits, but it writes only what inference keeps: the new
 * cell state cs and h. x_i, x_c, x_f, x_o hold x[t] @ W_x's gate columns,
 * g_i .. g_o h[t-1] @ W_h's. */
#define BRNN_LSTM_PRE_STATE_INFER                                                    \
    float pi = (xi[j] + gi[j]) + bi[j];                                              \
    float pc = (xc[j] + gc[j]) + bc[j];                                              \
    float pf = (xf[j] + gf[j]) + bf[j];
#define BRNN_LSTM_STORE_STATE_INFER(vi, vc, vf)
#define BRNN_LSTM_PRE_O_INFER float po = (xo[j] + go[j]) + bo[j];
#define BRNN_LSTM_STORE_OUT_INFER(vo, tc) h[j] = vo * tc;
#define BRNN_LSTM_INFER_LOOP(PEEP)                                                   \
    BRNN_LSTM_CELLS(float, brnn_sigmoidf, brnn_tanhf, brnn_clipf, PEEP,              \
                    BRNN_LSTM_PRE_STATE_INFER, BRNN_LSTM_STORE_STATE_INFER,          \
                    BRNN_LSTM_PRE_O_INFER, BRNN_LSTM_STORE_OUT_INFER)

BRNN_MULTIVERSION
static void brnn_lstm_infer_row_f32(
    ptrdiff_t H, const float *restrict gi, const float *restrict gc, const float *restrict gf,
    const float *restrict go, const float *restrict xi, const float *restrict xc,
    const float *restrict xf, const float *restrict xo, const float *restrict bi,
    const float *restrict bc, const float *restrict bf, const float *restrict bo,
    const float *restrict wci, const float *restrict wcf, const float *restrict wco,
    float forget_bias, float cell_clip, int peep, const float *restrict cs_prev,
    float *restrict cs, float *restrict h)
{
    const int add_forget_bias = forget_bias != 0, clip = cell_clip > 0;
    if (peep) {
        BRNN_LSTM_INFER_LOOP(1)
    } else {
        BRNN_LSTM_INFER_LOOP(0)
    }
}

/* Backward, per cell j (cell clipping ignored, as in TensorFlow):
 *   hg  = h_grad + dh_carry                       (h_grad alone if !carry)
 *   dcs = (1 - co^2) * o * hg + (cs_grad + cs_prev_grad)   (+ cs_grad alone
 *         if !carry: cs_prev_grad holds the carry from step t+1 on entry)
 *   d_o = o * (1 - o) * co * hg;   dcs += d_o * wco       if peep
 *   d_ci = (1 - ci^2) * i * dcs
 *   d_f = f * (1 - f) * cs_prev * dcs
 *   d_i = i * (1 - i) * ci * dcs
 *   cs_prev_grad = f * dcs + wci * d_i + wcf * d_f      (f * dcs if !peep)
 * d_i, d_c, d_f, d_o are the row's four gate gradients (parts of dG). */
#define BRNN_LSTM_BACKWARD_LOOP(T, PEEP, CARRY)                                      \
    for (ptrdiff_t j = 0; j < H; j++) {                                              \
        T hg = CARRY ? h_grad[j] + dh_carry[j] : h_grad[j];                          \
        T dcs = CARRY ? (1 - co[j] * co[j]) * o[j] * hg + (cs_grad[j] + cs_prev_grad[j]) \
                      : (1 - co[j] * co[j]) * o[j] * hg + cs_grad[j];                \
        T vo = o[j] * (1 - o[j]) * co[j] * hg;                                       \
        if (PEEP) dcs = dcs + vo * wco[j];                                           \
        T vc = (1 - ci[j] * ci[j]) * i_[j] * dcs;                                    \
        T vf = f[j] * (1 - f[j]) * cs_prev[j] * dcs;                                 \
        T vi = i_[j] * (1 - i_[j]) * ci[j] * dcs;                                    \
        d_o[j] = vo;                                                                 \
        d_c[j] = vc;                                                                 \
        d_f[j] = vf;                                                                 \
        d_i[j] = vi;                                                                 \
        cs_prev_grad[j] = PEEP ? f[j] * dcs + wci[j] * vi + wcf[j] * vf : f[j] * dcs; \
    }

#define BRNN_LSTM_BACKWARD_ROW(NAME, T)                                              \
    BRNN_MULTIVERSION                                                                \
    static void NAME(                                                                \
        ptrdiff_t H, const T *restrict cs_prev, const T *restrict i_,               \
        const T *restrict f, const T *restrict o, const T *restrict ci,              \
        const T *restrict co, const T *restrict cs_grad, const T *restrict h_grad,   \
        const T *restrict dh_carry, const T *restrict wci, const T *restrict wcf,    \
        const T *restrict wco, int peep, int carry, T *restrict d_i,                 \
        T *restrict d_c, T *restrict d_f, T *restrict d_o, T *restrict cs_prev_grad) \
    {                                                                                \
        if (peep && carry) {                                                         \
            BRNN_LSTM_BACKWARD_LOOP(T, 1, 1)                                         \
        } else if (peep) {                                                           \
            BRNN_LSTM_BACKWARD_LOOP(T, 1, 0)                                         \
        } else if (carry) {                                                          \
            BRNN_LSTM_BACKWARD_LOOP(T, 0, 1)                                         \
        } else {                                                                     \
            BRNN_LSTM_BACKWARD_LOOP(T, 0, 0)                                         \
        }                                                                            \
    }

BRNN_LSTM_BACKWARD_ROW(brnn_lstm_backward_row_f32, float)
BRNN_LSTM_BACKWARD_ROW(brnn_lstm_backward_row_f64, double)

#endif /* BRNN_LSTM_H */
