"""A float64 NumPy stand-in of blockrnn.block_gru_reset_after(_grad), for the tests only.

The reset-after GRU kernels (nn.GRU's math, /work/notes/gru_reset_after_api.md) are
written on another branch; until they are merged, ``install(monkeypatch)`` puts this
implementation of the same API in their place so that blockrnn.torch.GRU's tests run.
When blockrnn has the real ops, ``install`` leaves them alone. Python loop over time:
slow, test-sized inputs only.
"""
from collections import namedtuple

import numpy as np

import blockrnn

BlockGRUResetAfterOutput = namedtuple("BlockGRUResetAfterOutput", "r z n hn h")
BlockGRUResetAfterGradOutput = namedtuple(
    "BlockGRUResetAfterGradOutput", "x_grad h_prev_grad w_ih_grad w_hh_grad b_ih_grad b_hh_grad")


def _sigmoid(a):
    return 1 / (1 + np.exp(-a))


def _rows(seq_len_max, T, B, sequence_length):
    n = np.full(B, seq_len_max) if sequence_length is None else \
        np.minimum(np.asarray(sequence_length), seq_len_max)
    return n


def block_gru_reset_after(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, *,
                          sequence_length=None):
    dt = x.dtype
    x, h, w_ih, w_hh, b_ih, b_hh = (np.asarray(a, np.float64) for a in
                                    (x, h_prev, w_ih, w_hh, b_ih, b_hh))
    T, B, _ = x.shape
    H = h.shape[1]
    n_rows = _rows(seq_len_max, T, B, sequence_length)
    out = np.zeros((5, T, B, H))
    for t in range(seq_len_max):
        live = (t < n_rows)[:, None]
        gi = x[t] @ w_ih.T + b_ih
        gh = h @ w_hh.T + b_hh
        r = _sigmoid(gi[:, :H] + gh[:, :H])
        z = _sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
        hn = gh[:, 2 * H:]
        n = np.tanh(gi[:, 2 * H:] + r * hn)
        h_new = (1 - z) * n + z * h
        for k, a in enumerate((r, z, n, hn, h_new)):
            out[k, t] = np.where(live, a, 0)
        h = np.where(live, h_new, h)
    return BlockGRUResetAfterOutput(*(a.astype(dt) for a in out))


def block_gru_reset_after_grad(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, r, z, n, hn,
                               h, h_grad, *, sequence_length=None):
    dt = x.dtype
    x, h0, w_ih, w_hh, r, z, n, hn, h, h_grad = (
        np.asarray(a, np.float64) for a in (x, h_prev, w_ih, w_hh, r, z, n, hn, h, h_grad))
    T, B, I = x.shape
    H = h0.shape[1]
    n_rows = _rows(seq_len_max, T, B, sequence_length)
    dx = np.zeros_like(x)
    dw_ih, dw_hh = np.zeros_like(w_ih), np.zeros_like(w_hh)
    db_ih, db_hh = np.zeros(3 * H), np.zeros(3 * H)
    carry = np.zeros((B, H))
    for t in reversed(range(seq_len_max)):
        live = (t < n_rows)[:, None]
        hp = h[t - 1] if t > 0 else h0
        dh = np.where(live, h_grad[t] + carry, 0)
        dn = dh * (1 - z[t])
        dz = dh * (hp - n[t])
        da_n = dn * (1 - n[t] ** 2)
        da_r = da_n * hn[t] * r[t] * (1 - r[t])
        da_z = dz * z[t] * (1 - z[t])
        dgi = np.concatenate([da_r, da_z, da_n], axis=1)
        dgh = np.concatenate([da_r, da_z, da_n * r[t]], axis=1)
        dx[t] = dgi @ w_ih
        dw_ih += dgi.T @ x[t]
        db_ih += dgi.sum(0)
        dw_hh += dgh.T @ hp
        db_hh += dgh.sum(0)
        carry = np.where(live, dh * z[t] + dgh @ w_hh, carry)
    return BlockGRUResetAfterGradOutput(*(a.astype(dt) for a in
                                          (dx, carry, dw_ih, dw_hh, db_ih, db_hh)))


def install(monkeypatch):
    """blockrnn.block_gru_reset_after(_grad) <- this module's, unless blockrnn has them."""
    if not hasattr(blockrnn, "block_gru_reset_after"):
        monkeypatch.setattr(blockrnn, "block_gru_reset_after", block_gru_reset_after,
                            raising=False)
        monkeypatch.setattr(blockrnn, "block_gru_reset_after_grad",
                            block_gru_reset_after_grad, raising=False)
