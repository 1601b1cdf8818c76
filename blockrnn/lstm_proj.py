"""The projected LSTM: PyTorch's ``nn.LSTM`` with ``proj_size = P > 0`` (SPEC §13),
one layer in one direction, over a whole sequence, forward and backward.

The weights are nn.LSTM's, as stored: ``w_ih`` (4H, I), ``w_hh`` (4H, P),
``b_ih``, ``b_hh`` (4H,), ``w_hr`` (P, H), gate row blocks i, f, g, o. Per step::

    i, f, g, o = σ, σ, tanh, σ of  x W_ih^T + b_ih + h_prev W_hh^T + b_hh
    c = f * c_prev + i * g
    m = o * tanh(c)               (B, H)
    h = m W_hr^T                  (B, P)

Shapes: T steps, B batch, I input size, H cell size, P projection size.
float16 (stored float16, computed in float32), float32 and float64.
"""
from collections import namedtuple

import numpy as np

from blockrnn import _config, _kernels
from blockrnn._validation import (
    Arrays, check_blas_sizes, check_seq_len_max, check_sequence_length, steps_to_run,
    zero_padding)

__all__ = ["block_lstm_proj", "block_lstm_proj_grad"]

BlockLSTMProjOutput = namedtuple("BlockLSTMProjOutput", "i f o ci cs co m h")
BlockLSTMProjGradOutput = namedtuple(
    "BlockLSTMProjGradOutput",
    "x_grad h_prev_grad c_prev_grad w_ih_grad w_hh_grad b_grad w_hr_grad")

_INPUTS = ("x", "h_prev", "c_prev", "w_ih", "w_hh", "b_ih", "b_hh", "w_hr")
_GATES = ("i", "f", "o", "ci", "cs", "co", "m")


def _check(args, seq_len_max, sequence_length):
    """x [T, B, I], h_prev [B, P], c_prev [B, H], w_ih [4H, I], w_hh [4H, P],
    b_ih, b_hh [4H], w_hr [P, H] (P, H >= 1), seq_len_max, sequence_length."""
    T, B, I = args.rank("x", "[T, B, I]")
    P = args.rank("h_prev", "[B, P]")[1]
    H = args.rank("c_prev", "[B, H]")[1]
    args.shape("h_prev", "[B, P]", (B, P))
    args.shape("c_prev", "[B, H]", (B, H))
    if P < 1 or H < 1:
        raise ValueError(f"{args.op}: the projection size P (h_prev's last axis) and the "
                         f"cell size H (c_prev's) must be >= 1, got P = {P}, H = {H}")
    args.shape("w_hr", "[P, H]", (P, H))
    args.shape("w_ih", "[4H, I]", (4 * H, I))
    args.shape("w_hh", "[4H, P]", (4 * H, P))
    args.shape("b_ih", "[4H]", (4 * H,))
    args.shape("b_hh", "[4H]", (4 * H,))
    L = check_seq_len_max(args.op, seq_len_max, T)
    lengths = check_sequence_length(args.op, sequence_length, B, T)
    if B:
        check_blas_sizes(args.op, **{"T*B": T * B, "I": I, "4H": 4 * H, "P": P})
    return L, lengths, T, B, I, H, P


def block_lstm_proj(seq_len_max, x, h_prev, c_prev, w_ih, w_hh, b_ih, b_hh, w_hr, *,
                    sequence_length=None):
    """nn.LSTM's projected cell (one layer, one direction) over a whole sequence.

    Parameters
    ----------
    seq_len_max : int
        Number of steps to run, L, with 0 <= L <= T.
    x : array (T, B, I)
    h_prev : array (B, P);  c_prev : array (B, H)
        Initial state.
    w_ih (4H, I), w_hh (4H, P), b_ih, b_hh (4H,), w_hr (P, H)
        nn.LSTM's ``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
        ``bias_hh_l{k}`` (zeros for ``bias=False``), ``weight_hr_l{k}``.
    sequence_length : array (B,) of integers in [0, T], optional
        Row b runs the steps t < min(L, sequence_length[b]); its outputs after
        them are zero. The padding of x must be finite (its values do not matter).

    Returns
    -------
    BlockLSTMProjOutput(i, f, o, ci, cs, co, m, h): the gates i, f, o and
    ci (= g), the cell state cs, co = tanh(cs), m = o * co, each (T, B, H), and
    h = m @ w_hr^T (T, B, P); zero for t >= L.
    """
    args = Arrays("block_lstm_proj", x=x, h_prev=h_prev, c_prev=c_prev, w_ih=w_ih, w_hh=w_hh,
                  b_ih=b_ih, b_hh=b_hh, w_hr=w_hr)
    L, lengths, T, B, I, H, P = _check(args, seq_len_max, sequence_length)
    if B == 0 or T == 0:
        return BlockLSTMProjOutput(*(args.zeros((T, B, H)) for _ in _GATES),
                                   args.zeros((T, B, P)))
    outs = _forward_kernel(steps_to_run(L, lengths), lengths, *args.kernel(*_INPUTS))
    return BlockLSTMProjOutput(*map(args.result, outs))


def _forward_kernel(steps, lengths, x, h_prev, c_prev, w_ih, w_hh, b_ih, b_hh, w_hr):
    """The forward kernel's call on CHECKED arguments (no check here): C-contiguous
    arrays of one compute dtype (float32 or float64) of the shapes above, T, B, P and
    H non-zero, steps = steps_to_run(L, lengths), lengths None or checked int64 (B,).
    Returns the new arrays [i, f, o, ci, cs, co, m, h]. The checked callers:
    block_lstm_proj, and blockrnn.torch's modules once they have checked their own
    arguments."""
    T, B = x.shape[0], x.shape[1]
    P, H = h_prev.shape[1], c_prev.shape[1]
    outs = [np.empty((T, B, H), x.dtype) for _ in _GATES] + [np.empty((T, B, P), x.dtype)]
    _kernels.block_lstm_proj_forward(steps, x, h_prev, c_prev, w_ih, w_hh, b_ih, b_hh, w_hr,
                                     _config.thread_limit(), *outs, lengths)
    return outs


def block_lstm_proj_grad(seq_len_max, x, h_prev, c_prev, w_ih, w_hh, b_ih, b_hh, w_hr,
                         i, f, o, ci, cs, co, m, h, cs_grad, h_grad, *, sequence_length=None):
    """Backward of ``block_lstm_proj`` over the whole sequence.

    Parameters
    ----------
    seq_len_max, x, h_prev, c_prev, w_ih, w_hh, b_ih, b_hh, w_hr, sequence_length
        As given to ``block_lstm_proj`` (b_ih, b_hh: only their shapes are used).
    i, f, o, ci, cs, co, m (T, B, H), h (T, B, P)
        ``block_lstm_proj``'s outputs (entries past a row's length are not read).
    cs_grad (T, B, H), h_grad (T, B, P)
        Gradients of the loss w.r.t. cs and h at every step (entries past a
        row's length are not read). A loss on a row's final state adds its
        gradient at that row's last step.

    Returns
    -------
    BlockLSTMProjGradOutput(x_grad, h_prev_grad, c_prev_grad, w_ih_grad,
    w_hh_grad, b_grad, w_hr_grad), each of the shape of the matching input;
    b_grad (4H,) is the gradient of b_ih and of b_hh alike.
    """
    args = Arrays("block_lstm_proj_grad", x=x, h_prev=h_prev, c_prev=c_prev, w_ih=w_ih,
                  w_hh=w_hh, b_ih=b_ih, b_hh=b_hh, w_hr=w_hr, i=i, f=f, o=o, ci=ci, cs=cs,
                  co=co, m=m, h=h, cs_grad=cs_grad, h_grad=h_grad)
    L, lengths, T, B, I, H, P = _check(args, seq_len_max, sequence_length)
    for name in _GATES + ("cs_grad",):
        args.shape(name, "[T, B, H]", (T, B, H))
    for name in ("h", "h_grad"):
        args.shape(name, "[T, B, P]", (T, B, P))
    if B == 0 or T == 0:  # nothing to compute: zero gradients
        return BlockLSTMProjGradOutput(*(args.zeros(s) for s in _grad_shapes(T, B, I, H, P)))
    grads = _backward_kernel(
        steps_to_run(L, lengths), lengths,
        *args.kernel("x", "h_prev", "c_prev", "w_ih", "w_hh", "w_hr", *_GATES, "h", "cs_grad",
                     "h_grad"))
    return BlockLSTMProjGradOutput(*map(args.result, grads))


def _grad_shapes(T, B, I, H, P):
    """The shapes of BlockLSTMProjGradOutput's arrays."""
    return [(T, B, I), (B, P), (B, H), (4 * H, I), (4 * H, P), (4 * H,), (P, H)]


def _backward_kernel(steps, lengths, x, h_prev, c_prev, w_ih, w_hh, w_hr, i, f, o, ci, cs,
                     co, m, h, cs_grad, h_grad):
    """The backward kernel's call on CHECKED arguments, as _forward_kernel's.
    Returns the new arrays [x_grad, h_prev_grad, c_prev_grad, w_ih_grad, w_hh_grad,
    b_grad, w_hr_grad]."""
    T, B, I = x.shape
    P, H = h_prev.shape[1], c_prev.shape[1]
    grads = [np.empty(s, x.dtype) for s in _grad_shapes(T, B, I, H, P)]
    # The weight gradients multiply h and m at a row's padding by a zero gradient:
    # zero them in the copies read, so that any padding gives zeros.
    h, m = (zero_padding(a, steps, lengths, x.dtype) for a in (h, m))
    _kernels.block_lstm_proj_backward(steps, x, h_prev, c_prev, w_ih, w_hh, w_hr, i, f, o,
                                      ci, cs, co, m, h, cs_grad, h_grad,
                                      _config.thread_limit(), *grads, lengths)
    return grads
