"""The GRU ops: GRUBlockCell and GRUBlockCellGrad (TensorFlow 2.21 semantics),
and block_gru / block_gru_grad, the same cell over a whole sequence (which
TensorFlow does not have).

The reset gate multiplies h_prev before the candidate's matmul (Cho et al.'s
"reset-before" GRU, not cuDNN/PyTorch's reset-after), and u weights the old
state: ``h = u * h_prev + (1 - u) * c``. Shapes: B batch, I input size, H
cell size. TensorFlow's GRU ops take float32 only; blockrnn's also take
float16 (computed in float32) and float64.
"""
from collections import namedtuple

import numpy as np

from blockrnn import _config, _kernels
from blockrnn._config import kernel_threads
from blockrnn._validation import (
    Arrays, check_blas_sizes, check_seq_len_max, check_sequence_length, steps_to_run,
    zero_padding)

__all__ = ["gru_block_cell", "gru_block_cell_grad", "gru_block_cell_grad_full",
           "block_gru", "block_gru_grad"]

GRUBlockCellOutput = namedtuple("GRUBlockCellOutput", "r u c h")
GRUBlockCellGradOutput = namedtuple(
    "GRUBlockCellGradOutput", "d_x d_h_prev d_c_bar d_r_bar_u_bar")
GRUBlockCellGradFullOutput = namedtuple(
    "GRUBlockCellGradFullOutput", "d_x d_h_prev d_w_ru d_w_c d_b_ru d_b_c")
BlockGRUOutput = namedtuple("BlockGRUOutput", "r u c h")
BlockGRUGradOutput = namedtuple(
    "BlockGRUGradOutput", "x_grad h_prev_grad w_ru_grad w_c_grad b_ru_grad b_c_grad")

_INPUTS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")


def _check_params(args, I, H):
    """w_ru [I+H, 2H], w_c [I+H, H], b_ru [2H], b_c [H]."""
    args.shape("w_ru", "[I+H, 2H]", (I + H, 2 * H))
    args.shape("w_c", "[I+H, H]", (I + H, H))
    args.shape("b_ru", "[2H]", (2 * H,))
    args.shape("b_c", "[H]", (H,))


def _check_cell(args):
    """x [B, I], h_prev [B, H], w_ru [I+H, 2H], w_c [I+H, H], b_ru [2H], b_c [H]."""
    B, I = args.rank("x", "[B, I]")
    H = args.rank("h_prev", "[B, H]")[1]
    args.shape("h_prev", "[B, H]", (B, H))
    _check_params(args, I, H)
    check_blas_sizes(args.op, B=B, **{"I+H": I + H, "2H": 2 * H})
    return B, I, H


def gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c):
    """One GRU step (TensorFlow's ``GRUBlockCell``).

    Parameters
    ----------
    x : array of shape (B, I)
    h_prev : array of shape (B, H)
    w_ru : array of shape (I+H, 2H)
        Rows [x; h_prev], columns [r, u].
    w_c : array of shape (I+H, H)
        Rows [x; r * h_prev].
    b_ru : array of shape (2H,)
        [b_r, b_u].
    b_c : array of shape (H,)

    Returns
    -------
    GRUBlockCellOutput(r, u, c, h), each of shape (B, H) (under 4 MB each,
    views of one (4, B, H) array)::

        [r, u] = sigmoid([x, h_prev] @ w_ru + b_ru)
        c = tanh([x, r * h_prev] @ w_c + b_c)
        h = u * (h_prev - c) + c
    """
    out = _kernels.gru_cell_fast(x, h_prev, w_ru, w_c, b_ru, b_c, _config.MIN_PARALLEL_WORK,
                                 GRUBlockCellOutput)
    if out is not None:  # the common call, checked and computed in compiled code
        return out
    args = Arrays("gru_block_cell", x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    B, I, H = _check_cell(args)
    outs = args.output_buffers(4, B, H)
    _kernels.gru_cell_forward(*args.kernel(*_INPUTS), kernel_threads(B, H), *outs)
    return GRUBlockCellOutput(*args.results(outs))


def _cell_grad(op, values, full):
    args = Arrays(op, **values)
    B, I, H = _check_cell(args)
    for name in ("r", "u", "c", "d_h"):
        args.shape(name, "[B, H]", (B, H))
    grads = [args.empty(B, I), args.empty(B, H), args.empty(B, H), args.empty(B, 2 * H)]
    param_grads = ([args.empty(I + H, 2 * H), args.empty(I + H, H), args.empty(2 * H),
                    args.empty(H)] if full else [None] * 4)
    _kernels.gru_cell_backward(
        *args.kernel("x", "h_prev", "w_ru", "w_c", "r", "u", "c", "d_h"),
        kernel_threads(B, H), *grads, full, *param_grads)
    return args, grads, param_grads


def gru_block_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h):
    """Backward of one GRU step (TensorFlow's ``GRUBlockCellGrad``).

    Parameters
    ----------
    x, h_prev, w_ru, w_c, b_ru, b_c : as for ``gru_block_cell``
        The values of x, b_ru and b_c are not used (only their shapes).
    r, u, c : arrays of shape (B, H)
        The outputs of ``gru_block_cell``.
    d_h : array of shape (B, H)
        Gradient of the loss w.r.t. h.

    Returns
    -------
    GRUBlockCellGradOutput(d_x, d_h_prev, d_c_bar, d_r_bar_u_bar)
        d_x (B, I), d_h_prev (B, H), d_c_bar (B, H) the gradient w.r.t. the
        pre-activation of c, d_r_bar_u_bar (B, 2H) those of [r, u].
    """
    values = dict(x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c,
                  r=r, u=u, c=c, d_h=d_h)
    args, grads, _ = _cell_grad("gru_block_cell_grad", values, full=False)
    return GRUBlockCellGradOutput(*map(args.result, grads))


def gru_block_cell_grad_full(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h):
    """All gradients of one GRU step: ``gru_block_cell_grad`` plus the parameter
    gradients TensorFlow 1.x's Python gradient added around it.

    Same arguments as ``gru_block_cell_grad``.

    Returns
    -------
    GRUBlockCellGradFullOutput(d_x, d_h_prev, d_w_ru, d_w_c, d_b_ru, d_b_c)
        Shapes of x, h_prev, w_ru, w_c, b_ru, b_c::

            d_w_ru = [x, h_prev].T @ d_r_bar_u_bar,   d_b_ru = d_r_bar_u_bar.sum(0)
            d_w_c = [x, r * h_prev].T @ d_c_bar,      d_b_c = d_c_bar.sum(0)
    """
    values = dict(x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c,
                  r=r, u=u, c=c, d_h=d_h)
    args, (d_x, d_h_prev, _, _), param_grads = _cell_grad(
        "gru_block_cell_grad_full", values, full=True)
    return GRUBlockCellGradFullOutput(
        args.result(d_x), args.result(d_h_prev), *map(args.result, param_grads))


# --------------------------------------------------------------------------
# The GRU over a whole sequence
# --------------------------------------------------------------------------

def _check_sequence(args, seq_len_max, sequence_length):
    """x [T, B, I], h_prev [B, H], the parameters, seq_len_max and sequence_length."""
    T, B, I = args.rank("x", "[T, B, I]")
    H = args.rank("h_prev", "[B, H]")[1]
    args.shape("h_prev", "[B, H]", (B, H))
    _check_params(args, I, H)
    L = check_seq_len_max(args.op, seq_len_max, T)
    lengths = check_sequence_length(args.op, sequence_length, B, T)
    if B and H:  # else nothing is computed (the ops return early)
        check_blas_sizes(args.op, **{"T*B": T * B, "I+H": I + H, "2H": 2 * H})
    return L, lengths, T, B, I, H


def block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, *, sequence_length=None):
    """A GRU over a whole sequence: ``gru_block_cell`` at every step, in one call.

    TensorFlow has no sequence op for the GRU; this one follows BlockLSTM's
    conventions (time-major, ``seq_len_max``, zeros after it).

    Parameters
    ----------
    seq_len_max : int
        Number of steps to run, L, with 0 <= L <= T (any integer scalar).
    x : array of shape (T, B, I)
        Time-major input.
    h_prev : array of shape (B, H)
        Initial state.
    w_ru : array of shape (I+H, 2H)
    w_c : array of shape (I+H, H)
    b_ru : array of shape (2H,)
    b_c : array of shape (H,)
        As for ``gru_block_cell``.
    sequence_length : array of shape (B,) of integers in [0, T], optional
        Per-row lengths: row b runs the steps t < n = min(L, sequence_length[b])
        and its outputs after them are zero; its final state is h[n-1, b]
        (h_prev[b] if n = 0). The padding x[n:, b] must be finite; its values
        do not matter. None: every row runs L steps.

    Returns
    -------
    BlockGRUOutput(r, u, c, h), each of shape (T, B, H)
        The outputs of ``gru_block_cell`` at every step, each step starting
        from the previous step's h; all zero for t >= L. Under 4 MB each, the
        four arrays are views of one (4, T, B, H) array (one allocation):
        keeping one alive keeps all four's memory; ``h.copy()`` keeps h alone.
    """
    if sequence_length is None:
        out = _kernels.block_gru_fast(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c,
                                      _config.MIN_PARALLEL_WORK, BlockGRUOutput,
                                      _config.thread_limit())
        if out is not None:  # the common call, checked and computed in compiled code
            return out
    args = Arrays("block_gru", x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
    L, lengths, T, B, I, H = _check_sequence(args, seq_len_max, sequence_length)
    if B == 0 or H == 0:  # nothing to compute: the (empty) outputs, whatever T is
        return BlockGRUOutput(*args.results(args.output_buffers(4, T, B, H)))
    outs = _forward_kernel(steps_to_run(L, lengths), lengths, *args.kernel(*_INPUTS))
    return BlockGRUOutput(*args.results(outs))


def _forward_kernel(steps, lengths, x, h_prev, w_ru, w_c, b_ru, b_c):
    """The forward kernel's call on CHECKED arguments (no check here): C-contiguous
    arrays of one compute dtype (float32 or float64) of the shapes above, B and H
    non-zero, steps = steps_to_run(L, lengths), lengths None or checked int64 (B,).
    Returns the new arrays [r, u, c, h] (output_buffers). The checked callers:
    block_gru, and blockrnn.torch's modules once they have checked their own
    arguments."""
    T, B = x.shape[0], x.shape[1]
    H = h_prev.shape[1]
    outs = _kernels.output_buffers(4, (T, B, H), x.dtype)
    _kernels.block_gru_forward(steps, x, h_prev, w_ru, w_c, b_ru, b_c, kernel_threads(B, H),
                               _config.thread_limit(), *outs, lengths)
    return outs


def block_gru_grad(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad, *,
                   sequence_length=None):
    """Backward of ``block_gru`` over the whole sequence.

    Parameters
    ----------
    seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, sequence_length
        As given to ``block_gru`` (b_ru and b_c: only their shapes are used).
    r, u, c, h : arrays of shape (T, B, H)
        ``block_gru``'s outputs (entries at t >= L are not read; their values
        past a row's length do not matter, NaN included).
    h_grad : array of shape (T, B, H)
        Gradient of the loss w.r.t. h at every step (entries at t >= L, and
        in row b at t >= sequence_length[b], are not read). A loss on a row's
        final state adds its gradient at that row's last step.

    Returns
    -------
    BlockGRUGradOutput(x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad, b_c_grad)
        Each of the shape of the matching input; x_grad is zero for t >= L.
    """
    args = Arrays("block_gru_grad", x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru,
                  b_c=b_c, r=r, u=u, c=c, h=h, h_grad=h_grad)
    L, lengths, T, B, I, H = _check_sequence(args, seq_len_max, sequence_length)
    for name in ("r", "u", "c", "h", "h_grad"):
        args.shape(name, "[T, B, H]", (T, B, H))
    if B == 0 or H == 0:  # nothing to compute: zero gradients, whatever T is
        return BlockGRUGradOutput(*(args.zeros(args[name].shape) for name in _INPUTS))
    grads = _backward_kernel(
        steps_to_run(L, lengths), lengths,
        *args.kernel("x", "h_prev", "w_ru", "w_c", "r", "u", "c", "h", "h_grad"))
    return BlockGRUGradOutput(*map(args.result, grads))


def _backward_kernel(steps, lengths, x, h_prev, w_ru, w_c, r, u, c, h, h_grad):
    """The backward kernel's call on CHECKED arguments, as _forward_kernel's.
    Returns the new arrays [x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad,
    b_c_grad]."""
    T, B, I = x.shape
    H = h_prev.shape[1]
    dt = x.dtype
    grads = [np.empty((T, B, I), dt), np.empty((B, H), dt), np.empty((I + H, 2 * H), dt),
             np.empty((I + H, H), dt), np.empty(2 * H, dt), np.empty(H, dt)]
    # The weight gradients multiply r and h at a row's padding by zero: zero it
    # in the copies they read, so that any padding gives zeros.
    r, h = (zero_padding(a, steps, lengths, dt) for a in (r, h))
    _kernels.block_gru_backward(steps, x, h_prev, w_ru, w_c, r, u, c, h, h_grad,
                                kernel_threads(B, H), _config.thread_limit(), *grads,
                                lengths)
    return grads
