"""Pure-NumPy float64 reference implementation of the block-RNN ops (the test oracle).

This module is the *test oracle* for blockrnn: a deliberately plain, loop-over-time
re-implementation of TensorFlow 2.21's fused block-RNN raw ops, written directly from
``SPEC.md``:

* SPEC §2 -- gate layouts (ICFO for LSTMBlockCell/BlockLSTM*, IFCO for BlockLSTMV2/GradV2),
* SPEC §3 -- LSTM forward (one step, and the sequence loop with seq_len_max),
* SPEC §4 -- LSTM one-step backward (LSTMBlockCellGrad) and the full cell gradient,
* SPEC §5 -- sequence backward (BlockLSTMGrad / BlockLSTMGradV2),
* SPEC §6 -- GRU forward, SPEC §7 -- GRU backward and the full GRU gradient.

Every input is converted with ``np.asarray(..., dtype=np.float64)`` and all outputs are
blockrnn's own output namedtuples (TF's output names) holding float64 arrays.
No validation is done beyond what the computation itself needs.  Outputs at
``t >= seq_len_max`` are zero (all of them, including i, f, o, ci, co, which TF leaves
uninitialised).  Clipping is ignored by the gradients (straight-through, SPEC §4).
"""

import numpy as np

# The output types are blockrnn's own (one definition, in the public modules).
from blockrnn.gru import (
    BlockGRUGradOutput, BlockGRUOutput, GRUBlockCellGradFullOutput, GRUBlockCellGradOutput,
    GRUBlockCellOutput)
from blockrnn.gru_reset_after import BlockGRUResetAfterGradOutput, BlockGRUResetAfterOutput
from blockrnn.lstm import (
    BlockLSTMGradOutput, BlockLSTMOutput, LSTMBlockCellGradFullOutput,
    LSTMBlockCellGradOutput, LSTMBlockCellOutput)

__all__ = [
    "lstm_block_cell", "lstm_block_cell_grad", "lstm_block_cell_grad_full",
    "block_lstm", "block_lstm_v2", "block_lstm_grad", "block_lstm_grad_v2",
    "gru_block_cell", "gru_block_cell_grad", "gru_block_cell_grad_full",
    "block_gru_reset_after", "block_gru_reset_after_grad",
]


def _f64(a):
    return np.asarray(a, dtype=np.float64)


def _sigmoid(z):
    # Written to avoid overflow warnings for large |z|; same value as 1/(1+exp(-z)).
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gate_slices(layout, H):
    """Column slices (i, ci, f, o) of the 4H gate axis for layout "ICFO" or "IFCO" (SPEC §2)."""
    order = {"ICFO": ("i", "ci", "f", "o"), "IFCO": ("i", "f", "ci", "o")}[layout]
    pos = {name: k for k, name in enumerate(order)}
    return tuple(slice(pos[n] * H, (pos[n] + 1) * H) for n in ("i", "ci", "f", "o"))


def _pack_gates(layout, di, dci, df, do):
    """Assemble [B,4H] from the four gate blocks in the given layout (SPEC §2)."""
    H = di.shape[1]
    out = np.zeros((di.shape[0], 4 * H))
    si, sc, sf, so = _gate_slices(layout, H)
    out[:, si], out[:, sc], out[:, sf], out[:, so] = di, dci, df, do
    return out


# ----------------------------------------------------------------------------------------
# LSTM forward (SPEC §3)
# ----------------------------------------------------------------------------------------

def _lstm_step(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip,
               use_peephole, layout):
    """One LSTM step, SPEC §3.  Returns (i, cs, f, o, ci, co, h), each [B,H]."""
    H = cs_prev.shape[1]
    si, sc, sf, so = _gate_slices(layout, H)
    g = np.concatenate([x, h_prev], axis=1) @ w + b          # g = [x, h_prev] @ w + b
    pi = wci * cs_prev if use_peephole else 0.0               # peepholes not read when P = 0
    pf = wcf * cs_prev if use_peephole else 0.0
    i = _sigmoid(g[:, si] + pi)                               # i  = σ(g_i + P·wci⊙cs_prev)
    ci = np.tanh(g[:, sc])                                    # ci = tanh(g_c)
    f = _sigmoid(g[:, sf] + forget_bias + pf)                 # f  = σ(g_f + fb + P·wcf⊙cs_prev)
    cs = i * ci + f * cs_prev                                 # cs = i⊙ci + f⊙cs_prev
    if cell_clip > 0:                                         # clip only if cell_clip > 0
        cs = np.clip(cs, -cell_clip, cell_clip)               # (NaN propagates, ±inf clipped)
    co = np.tanh(cs)                                          # co = tanh(clipped cs)
    po = wco * cs if use_peephole else 0.0
    o = _sigmoid(g[:, so] + po)                               # o  = σ(g_o + P·wco⊙cs_new)
    h = o * co                                                # h  = o⊙co
    return i, cs, f, o, ci, co, h


def lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, *, forget_bias=1.0,
                    cell_clip=3.0, use_peephole=False):
    """LSTMBlockCell (ICFO), SPEC §3."""
    out = _lstm_step(_f64(x), _f64(cs_prev), _f64(h_prev), _f64(w), _f64(wci), _f64(wcf),
                     _f64(wco), _f64(b), float(forget_bias), float(cell_clip),
                     bool(use_peephole), "ICFO")
    return LSTMBlockCellOutput(*out)


def _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias,
                cell_clip, use_peephole, layout):
    """Sequence forward, SPEC §3: steps t < L, zeros for every output at t >= L."""
    x, cs_prev, h_prev, w = _f64(x), _f64(cs_prev), _f64(h_prev), _f64(w)
    wci, wcf, wco, b = _f64(wci), _f64(wcf), _f64(wco), _f64(b)
    T, B = x.shape[0], x.shape[1]
    H = cs_prev.shape[1]
    L = int(seq_len_max)
    outs = [np.zeros((T, B, H)) for _ in range(7)]           # i, cs, f, o, ci, co, h
    cs_t, h_t = cs_prev, h_prev
    for t in range(L):
        step = _lstm_step(x[t], cs_t, h_t, w, wci, wcf, wco, b, forget_bias, cell_clip,
                          use_peephole, layout)
        for k in range(7):
            outs[k][t] = step[k]
        cs_t, h_t = step[1], step[6]                          # next step uses stored cs, h
    return BlockLSTMOutput(*outs)


def _row_by_row(fn, seq_len_max, sequence_length, batch_args, shared_args, outputs):
    """Per-row lengths the plain way: run each batch row alone, as a batch of one
    with seq_len_max = min(L, sequence_length[b]), and put the rows together.

    batch_args are (array, batch axis) pairs; outputs gives, per output, its
    batch axis, or None for parameter gradients, which are summed over rows."""
    rows = []
    for row, length in enumerate(np.asarray(sequence_length)):
        sliced = [np.take(_f64(a), [row], axis=axis) for a, axis in batch_args]
        rows.append(fn(min(int(seq_len_max), int(length)), *sliced, *shared_args))
    results = []
    for k, axis in enumerate(outputs):
        if axis is None:
            results.append(sum(r[k] for r in rows))
        else:
            results.append(np.concatenate([r[k] for r in rows], axis=axis))
    return type(rows[0])(*results) if rows else None


def block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *, forget_bias=1.0,
               cell_clip=3.0, use_peephole=False, sequence_length=None):
    """BlockLSTM (ICFO), SPEC §3."""
    return _block_lstm_lengths(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                               float(forget_bias), float(cell_clip), bool(use_peephole),
                               "ICFO", sequence_length)


def block_lstm_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *, cell_clip=0.0,
                  use_peephole=False, sequence_length=None):
    """BlockLSTMV2 (IFCO, forget_bias fixed 0), SPEC §3."""
    return _block_lstm_lengths(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                               0.0, float(cell_clip), bool(use_peephole), "IFCO",
                               sequence_length)


def _block_lstm_lengths(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *attrs):
    *attrs, sequence_length = attrs
    if sequence_length is None or len(sequence_length) == 0:
        return _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *attrs)
    return _row_by_row(_block_lstm, seq_len_max, sequence_length,
                       [(x, 1), (cs_prev, 0), (h_prev, 0)], (w, wci, wcf, wco, b, *attrs),
                       outputs=[1] * 7)


# ----------------------------------------------------------------------------------------
# LSTM backward (SPEC §4, §5)
# ----------------------------------------------------------------------------------------

def _lstm_step_grad(cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, cs_grad, h_grad,
                    use_peephole):
    """One-step backward, SPEC §4.  Returns (cs_prev_grad, di, dci, df, do)."""
    do = o * (1 - o) * co * h_grad                             # do  = o(1-o)·co·h_grad
    dcs = (1 - co * co) * o * h_grad + cs_grad                 # dcs = (1-co²)·o·h_grad + cs_grad
    if use_peephole:
        dcs = dcs + do * wco                                   #       + P·do⊙wco
    dci = (1 - ci * ci) * i * dcs                              # dci = (1-ci²)·i·dcs
    df = f * (1 - f) * cs_prev * dcs                           # df  = f(1-f)·cs_prev·dcs
    di = i * (1 - i) * ci * dcs                                # di  = i(1-i)·ci·dcs
    cs_prev_grad = f * dcs                                     # f⊙dcs
    if use_peephole:
        cs_prev_grad = cs_prev_grad + wci * di + wcf * df      #   + P·(wci⊙di + wcf⊙df)
    return cs_prev_grad, di, dci, df, do


def lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                         cs_grad, h_grad, *, use_peephole):
    """LSTMBlockCellGrad (ICFO dicfo), SPEC §4.  x, h_prev, w, b values are unused."""
    cs_prev, wci, wcf, wco = _f64(cs_prev), _f64(wci), _f64(wcf), _f64(wco)
    i, cs, f, o, ci, co = map(_f64, (i, cs, f, o, ci, co))
    cs_grad, h_grad = _f64(cs_grad), _f64(h_grad)
    cs_prev_grad, di, dci, df, do = _lstm_step_grad(
        cs_prev, i, cs, f, o, ci, co, wci, wcf, wco, cs_grad, h_grad, bool(use_peephole))
    dicfo = _pack_gates("ICFO", di, dci, df, do)
    if use_peephole:                                           # Σ_b over the batch axis
        wci_grad = (di * cs_prev).sum(axis=0)
        wcf_grad = (df * cs_prev).sum(axis=0)
        wco_grad = (do * cs).sum(axis=0)
    else:                                                      # zeros of the given shapes
        wci_grad, wcf_grad, wco_grad = (np.zeros(wci.shape), np.zeros(wcf.shape),
                                        np.zeros(wco.shape))
    return LSTMBlockCellGradOutput(cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad)


def lstm_block_cell_grad_full(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                              cs_grad, h_grad, *, use_peephole):
    """Full LSTM cell gradient (TF 1.x contrib completion), SPEC §4.  None grads = zeros."""
    x, h_prev, w, b, cs_prev = _f64(x), _f64(h_prev), _f64(w), _f64(b), _f64(cs_prev)
    shape = cs_prev.shape
    cs_grad = np.zeros(shape) if cs_grad is None else cs_grad
    h_grad = np.zeros(shape) if h_grad is None else h_grad
    k = lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                             cs_grad, h_grad, use_peephole=use_peephole)
    I = x.shape[1]
    xh_grad = k.dicfo @ w.T                                    # xh_grad = dicfo @ wᵀ
    w_grad = np.concatenate([x, h_prev], axis=1).T @ k.dicfo   # w_grad = [x,h_prev]ᵀ @ dicfo
    b_grad = k.dicfo.sum(axis=0)                               # b_grad = Σ_b dicfo
    return LSTMBlockCellGradFullOutput(xh_grad[:, :I], k.cs_prev_grad, xh_grad[:, I:], w_grad,
                                       k.wci_grad, k.wcf_grad, k.wco_grad, b_grad)


def _block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci,
                     co, h, cs_grad, h_grad, use_peephole, layout):
    """Sequence backward, SPEC §5 (t = L-1 down to 0; t >= L ignored, x_grad[t>=L] = 0)."""
    x, cs_prev, h_prev, w, b = _f64(x), _f64(cs_prev), _f64(h_prev), _f64(w), _f64(b)
    wci, wcf, wco = _f64(wci), _f64(wcf), _f64(wco)
    i, cs, f, o, ci, co, h = map(_f64, (i, cs, f, o, ci, co, h))
    cs_grad, h_grad = _f64(cs_grad), _f64(h_grad)
    use_peephole = bool(use_peephole)
    T, B, I = x.shape
    H = cs_prev.shape[1]
    L = int(seq_len_max)
    x_grad = np.zeros((T, B, I))
    w_grad = np.zeros(w.shape)
    b_grad = np.zeros(b.shape)
    wci_grad, wcf_grad, wco_grad = np.zeros(wci.shape), np.zeros(wcf.shape), np.zeros(wco.shape)
    dcs_c = np.zeros((B, H))
    dh_c = np.zeros((B, H))
    for t in range(L - 1, -1, -1):
        cp = cs_prev if t == 0 else cs[t - 1]                  # from the INPUT cs, h tensors
        hp = h_prev if t == 0 else h[t - 1]
        cpg, di, dci, df, do = _lstm_step_grad(
            cp, i[t], cs[t], f[t], o[t], ci[t], co[t], wci, wcf, wco,
            cs_grad[t] + dcs_c, h_grad[t] + dh_c, use_peephole)
        dg = _pack_gates(layout, di, dci, df, do)
        xh_grad = dg @ w.T                                     # xh_grad = dg @ wᵀ
        x_grad[t] = xh_grad[:, :I]
        dh_c = xh_grad[:, I:]
        dcs_c = cpg
        w_grad += np.concatenate([x[t], hp], axis=1).T @ dg    # w_grad += [x[t], hp]ᵀ @ dg
        b_grad += dg.sum(axis=0)                               # b_grad += Σ_b dg
        if use_peephole:
            wci_grad += (di * cp).sum(axis=0)
            wcf_grad += (df * cp).sum(axis=0)
            wco_grad += (do * cs[t]).sum(axis=0)
    return BlockLSTMGradOutput(x_grad, dcs_c, dh_c, w_grad, wci_grad, wcf_grad, wco_grad,
                               b_grad)


def block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci,
                    co, h, cs_grad, h_grad, *, use_peephole, sequence_length=None):
    """BlockLSTMGrad (ICFO), SPEC §5."""
    return _block_lstm_grad_lengths(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i,
                                    cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole,
                                    "ICFO", sequence_length)


def block_lstm_grad_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o,
                       ci, co, h, cs_grad, h_grad, *, use_peephole, sequence_length=None):
    """BlockLSTMGradV2 (IFCO), SPEC §5."""
    return _block_lstm_grad_lengths(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i,
                                    cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole,
                                    "IFCO", sequence_length)


def _block_lstm_grad_lengths(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f,
                             o, ci, co, h, cs_grad, h_grad, use_peephole, layout,
                             sequence_length):
    if sequence_length is None or len(sequence_length) == 0:
        return _block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs,
                                f, o, ci, co, h, cs_grad, h_grad, use_peephole, layout)

    def one_row(L, x, cs_prev, h_prev, i, cs, f, o, ci, co, h, cs_grad, h_grad):
        return _block_lstm_grad(L, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci,
                                co, h, cs_grad, h_grad, use_peephole, layout)

    sequences = [(a, 1) for a in (i, cs, f, o, ci, co, h, cs_grad, h_grad)]
    return _row_by_row(one_row, seq_len_max, sequence_length,
                       [(x, 1), (cs_prev, 0), (h_prev, 0)] + sequences, (),
                       outputs=[1, 0, 0, None, None, None, None, None])


# ----------------------------------------------------------------------------------------
# GRU (SPEC §6, §7)
# ----------------------------------------------------------------------------------------

def gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c):
    """GRUBlockCell, SPEC §6 (reset-before GRU)."""
    x, h_prev, w_ru, w_c, b_ru, b_c = map(_f64, (x, h_prev, w_ru, w_c, b_ru, b_c))
    H = h_prev.shape[1]
    ru = np.concatenate([x, h_prev], axis=1) @ w_ru + b_ru    # ru = [x, h_prev] @ w_ru + b_ru
    r = _sigmoid(ru[:, :H])
    u = _sigmoid(ru[:, H:])
    c = np.tanh(np.concatenate([x, r * h_prev], axis=1) @ w_c + b_c)  # c = tanh([x, r⊙h] @ w_c + b_c)
    h = u * (h_prev - c) + c                                  # h = u⊙(h_prev - c) + c
    return GRUBlockCellOutput(r, u, c, h)


def _gru_grad(h_prev, w_ru, w_c, r, u, c, d_h, I):
    """GRU backward kernel, SPEC §7.  Returns (d_x, d_h_prev, d_c_bar, d_r_bar_u_bar)."""
    d_c_bar = d_h * (1 - u) * (1 - c * c)                     # d_c_bar = d_h(1-u)(1-c²)
    d_u_bar = d_h * (h_prev - c) * u * (1 - u)                # d_u_bar = d_h(h_prev-c)u(1-u)
    dxhr = d_c_bar @ w_c.T                                    # [dx2 | d_hr] = d_c_bar @ w_cᵀ
    dx2, d_hr = dxhr[:, :I], dxhr[:, I:]
    d_r_bar = d_hr * h_prev * r * (1 - r)                     # d_r_bar = d_hr·h_prev·r(1-r)
    d_r_bar_u_bar = np.concatenate([d_r_bar, d_u_bar], axis=1)
    dxh = d_r_bar_u_bar @ w_ru.T                              # [dx1 | dh1] = d_rbub @ w_ruᵀ
    d_x = dxh[:, :I] + dx2
    d_h_prev = dxh[:, I:] + d_hr * r + d_h * u
    return d_x, d_h_prev, d_c_bar, d_r_bar_u_bar


def gru_block_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h):
    """GRUBlockCellGrad, SPEC §7.  x, b_ru, b_c values are unused (x gives I)."""
    x = _f64(x)
    out = _gru_grad(_f64(h_prev), _f64(w_ru), _f64(w_c), _f64(r), _f64(u), _f64(c),
                    _f64(d_h), x.shape[1])
    return GRUBlockCellGradOutput(*out)


def gru_block_cell_grad_full(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h):
    """Full GRU gradient (TF 1.x contrib completion), SPEC §7."""
    x, h_prev, r = _f64(x), _f64(h_prev), _f64(r)
    d_x, d_h_prev, d_c_bar, d_rbub = _gru_grad(h_prev, _f64(w_ru), _f64(w_c), r, _f64(u),
                                               _f64(c), _f64(d_h), x.shape[1])
    d_w_ru = np.concatenate([x, h_prev], axis=1).T @ d_rbub   # [x, h_prev]ᵀ @ d_r_bar_u_bar
    d_w_c = np.concatenate([x, r * h_prev], axis=1).T @ d_c_bar  # [x, r⊙h_prev]ᵀ @ d_c_bar
    return GRUBlockCellGradFullOutput(d_x, d_h_prev, d_w_ru, d_w_c, d_rbub.sum(axis=0),
                                      d_c_bar.sum(axis=0))


def _block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c):
    """GRUBlockCell at steps t < L, each from the previous h; zeros at t >= L."""
    x, h_prev = _f64(x), _f64(h_prev)
    T, B = x.shape[:2]
    H = h_prev.shape[1]
    outs = [np.zeros((T, B, H)) for _ in range(4)]            # r, u, c, h
    h_t = h_prev
    for t in range(int(seq_len_max)):
        step = gru_block_cell(x[t], h_t, w_ru, w_c, b_ru, b_c)
        for k in range(4):
            outs[k][t] = step[k]
        h_t = step.h
    return BlockGRUOutput(*outs)


def block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, *, sequence_length=None):
    """blockrnn's sequence GRU: GRUBlockCell (SPEC §6) at every step."""
    if sequence_length is None or len(sequence_length) == 0:
        return _block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c)
    return _row_by_row(_block_gru, seq_len_max, sequence_length, [(x, 1), (h_prev, 0)],
                       (w_ru, w_c, b_ru, b_c), outputs=[1] * 4)


def _block_gru_grad(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad):
    """Backward of _block_gru: gru_block_cell_grad_full at t = L-1 .. 0, with the
    gradient of h[t-1] carried back and the parameter gradients summed."""
    x, h_prev, w_ru, w_c, b_ru, b_c = map(_f64, (x, h_prev, w_ru, w_c, b_ru, b_c))
    r, u, c, h, h_grad = map(_f64, (r, u, c, h, h_grad))
    x_grad = np.zeros(x.shape)
    grads = [np.zeros(a.shape) for a in (w_ru, w_c, b_ru, b_c)]
    dh_c = np.zeros(h_prev.shape)
    for t in range(int(seq_len_max) - 1, -1, -1):
        hp = h_prev if t == 0 else h[t - 1]
        step = gru_block_cell_grad_full(x[t], hp, w_ru, w_c, b_ru, b_c, r[t], u[t], c[t],
                                        h_grad[t] + dh_c)
        x_grad[t] = step.d_x
        dh_c = step.d_h_prev
        for k in range(4):
            grads[k] += step[2 + k]
    return BlockGRUGradOutput(x_grad, dh_c, *grads)


def block_gru_grad(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad, *,
                   sequence_length=None):
    """Backward of block_gru."""
    if sequence_length is None or len(sequence_length) == 0:
        return _block_gru_grad(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h,
                               h_grad)

    def one_row(L, x, h_prev, r, u, c, h, h_grad):
        return _block_gru_grad(L, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad)

    return _row_by_row(one_row, seq_len_max, sequence_length,
                       [(x, 1), (h_prev, 0)] + [(a, 1) for a in (r, u, c, h, h_grad)], (),
                       outputs=[1, 0, None, None, None, None])


# ----------------------------------------------------------------------------------------
# The reset-after GRU (nn.GRU, SPEC §13)
# ----------------------------------------------------------------------------------------

def _gru_ra_step(x, h_prev, w_ih, w_hh, b_ih, b_hh):
    """One step of nn.GRU's cell; returns r, z, n, hn, h."""
    H = h_prev.shape[1]
    gi = x @ w_ih.T + b_ih                                    # [B, 3H], blocks r, z, n
    gh = h_prev @ w_hh.T + b_hh
    r = _sigmoid(gi[:, :H] + gh[:, :H])
    z = _sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
    hn = gh[:, 2 * H:]                                        # h W_hn^T + b_hn
    n = np.tanh(gi[:, 2 * H:] + r * hn)                       # n = tanh(x W_in^T + b_in + r⊙hn)
    return r, z, n, hn, (1 - z) * n + z * h_prev              # h' = (1-z)⊙n + z⊙h


def _block_gru_ra(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh):
    x, h_prev, w_ih, w_hh, b_ih, b_hh = map(_f64, (x, h_prev, w_ih, w_hh, b_ih, b_hh))
    T, B = x.shape[:2]
    outs = [np.zeros((T, B, h_prev.shape[1])) for _ in range(5)]
    h_t = h_prev
    for t in range(int(seq_len_max)):
        step = _gru_ra_step(x[t], h_t, w_ih, w_hh, b_ih, b_hh)
        for k in range(5):
            outs[k][t] = step[k]
        h_t = step[4]
    return BlockGRUResetAfterOutput(*outs)


def block_gru_reset_after(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, *,
                          sequence_length=None):
    """nn.GRU's cell over a sequence (blockrnn.block_gru_reset_after)."""
    if sequence_length is None or len(sequence_length) == 0:
        return _block_gru_ra(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh)
    return _row_by_row(_block_gru_ra, seq_len_max, sequence_length, [(x, 1), (h_prev, 0)],
                       (w_ih, w_hh, b_ih, b_hh), outputs=[1] * 5)


def _block_gru_ra_grad(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, r, z, n, hn, h,
                       h_grad):
    """Backward of _block_gru_ra, step by step from t = L-1 down to 0."""
    x, h_prev, w_ih, w_hh = map(_f64, (x, h_prev, w_ih, w_hh))
    r, z, n, hn, h, h_grad = map(_f64, (r, z, n, hn, h, h_grad))
    H = h_prev.shape[1]
    x_grad = np.zeros(x.shape)
    w_ih_grad, w_hh_grad = np.zeros(w_ih.shape), np.zeros(w_hh.shape)
    b_ih_grad, b_hh_grad = np.zeros(3 * H), np.zeros(3 * H)
    dh_c = np.zeros(h_prev.shape)
    for t in range(int(seq_len_max) - 1, -1, -1):
        hp = h_prev if t == 0 else h[t - 1]
        dh = h_grad[t] + dh_c
        dnx = dh * (1 - z[t]) * (1 - n[t] ** 2)                # d(x W_in^T + b_in)
        dr = dnx * hn[t] * r[t] * (1 - r[t])                  # d(pre-activation of r)
        dz = dh * (hp - n[t]) * z[t] * (1 - z[t])             # d(pre-activation of z)
        d_gi = np.concatenate([dr, dz, dnx], axis=1)          # d(x W_ih^T + b_ih)
        d_gh = np.concatenate([dr, dz, dnx * r[t]], axis=1)   # d(h W_hh^T + b_hh)
        x_grad[t] = d_gi @ w_ih
        dh_c = d_gh @ w_hh + dh * z[t]
        w_ih_grad += d_gi.T @ x[t]
        w_hh_grad += d_gh.T @ hp
        b_ih_grad += d_gi.sum(axis=0)
        b_hh_grad += d_gh.sum(axis=0)
    return BlockGRUResetAfterGradOutput(x_grad, dh_c, w_ih_grad, w_hh_grad, b_ih_grad,
                                        b_hh_grad)


def block_gru_reset_after_grad(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, r, z, n, hn,
                               h, h_grad, *, sequence_length=None):
    """Backward of block_gru_reset_after."""
    if sequence_length is None or len(sequence_length) == 0:
        return _block_gru_ra_grad(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, r, z, n,
                                  hn, h, h_grad)

    def one_row(L, x, h_prev, r, z, n, hn, h, h_grad):
        return _block_gru_ra_grad(L, x, h_prev, w_ih, w_hh, b_ih, b_hh, r, z, n, hn, h,
                                  h_grad)

    return _row_by_row(one_row, seq_len_max, sequence_length,
                       [(x, 1), (h_prev, 0)] + [(a, 1) for a in (r, z, n, hn, h, h_grad)],
                       (), outputs=[1, 0, None, None, None, None])
