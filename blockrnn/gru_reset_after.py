"""The reset-after GRU: PyTorch's ``nn.GRU``, Keras 3's default
``GRU(reset_after=True)``, ONNX's ``GRU`` with ``linear_before_reset=1``
(SPEC §13), over a whole sequence and for one step.

The reset gate multiplies the recurrent product, bias included, AFTER the
matmul (``n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn))``): a different
function from TensorFlow's GRUBlockCell (``blockrnn.block_gru``), which
resets before it. The weights are nn.GRU's, as stored: ``w_ih`` (3H, I),
``w_hh`` (3H, H), ``b_ih``, ``b_hh`` (3H,), gate blocks r, z, n. Shapes: T
steps, B batch, I input size, H cell size. float16 (stored float16, computed
in float32), float32 and float64.
"""
from collections import namedtuple

import numpy as np

from blockrnn import _config, _kernels
from blockrnn._config import kernel_threads
from blockrnn._validation import (
    Arrays, check_blas_sizes, check_reverse, check_seq_len_max, check_sequence_length,
    steps_to_run, zero_padding)

__all__ = ["block_gru_reset_after", "block_gru_reset_after_grad",
           "gru_cell_reset_after", "gru_cell_reset_after_grad"]

BlockGRUResetAfterOutput = namedtuple("BlockGRUResetAfterOutput", "r z n hn h")
BlockGRUResetAfterGradOutput = namedtuple(
    "BlockGRUResetAfterGradOutput", "x_grad h_prev_grad w_ih_grad w_hh_grad b_ih_grad b_hh_grad")

_INPUTS = ("x", "h_prev", "w_ih", "w_hh", "b_ih", "b_hh")
_PARAMS = ("w_ih", "w_hh", "b_ih", "b_hh")


def _check(args, seq_len_max, sequence_length):
    """x [T, B, I], h_prev [B, H], w_ih [3H, I], w_hh [3H, H], b_ih, b_hh [3H],
    seq_len_max and sequence_length."""
    T, B, I = args.rank("x", "[T, B, I]")
    H = args.rank("h_prev", "[B, H]")[1]
    args.shape("h_prev", "[B, H]", (B, H))
    args.shape("w_ih", "[3H, I]", (3 * H, I))
    args.shape("w_hh", "[3H, H]", (3 * H, H))
    args.shape("b_ih", "[3H]", (3 * H,))
    args.shape("b_hh", "[3H]", (3 * H,))
    L = check_seq_len_max(args.op, seq_len_max, T)
    lengths = check_sequence_length(args.op, sequence_length, B, T)
    if B and H:  # else nothing is computed (the ops return early)
        check_blas_sizes(args.op, **{"T*B": T * B, "I": I, "4H": 4 * H})
    return L, lengths, T, B, I, H


def block_gru_reset_after(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, *,
                          sequence_length=None):
    """nn.GRU's cell (one layer, one direction) over a whole sequence.

    Parameters
    ----------
    seq_len_max : int
        Number of steps to run, L, with 0 <= L <= T (any integer scalar).
    x : array of shape (T, B, I)
        Time-major input.
    h_prev : array of shape (B, H)
        Initial state.
    w_ih : array of shape (3H, I)
        nn.GRU's ``weight_ih_l{k}``: rows [W_ir; W_iz; W_in].
    w_hh : array of shape (3H, H)
        ``weight_hh_l{k}``: rows [W_hr; W_hz; W_hn].
    b_ih, b_hh : arrays of shape (3H,)
        ``bias_ih_l{k}``, ``bias_hh_l{k}`` (zeros for ``bias=False``).
    sequence_length : array of shape (B,) of integers in [0, T], optional
        Per-row lengths: row b runs the steps t < m = min(L, sequence_length[b])
        and its outputs after them are zero; its final state is h[m-1, b]
        (h_prev[b] if m = 0). The padding x[m:, b] must be finite; its values
        do not matter. None: every row runs L steps.

    Returns
    -------
    BlockGRUResetAfterOutput(r, z, n, hn, h), each of shape (T, B, H), zero
    for t >= L; each step starts from the previous step's h::

        r  = sigmoid(x W_ir^T + b_ir + h_prev W_hr^T + b_hr)
        z  = sigmoid(x W_iz^T + b_iz + h_prev W_hz^T + b_hz)
        hn = h_prev W_hn^T + b_hn
        n  = tanh(x W_in^T + b_in + r * hn)
        h  = (1 - z) * n + z * h_prev

    Under 4 MB each, the five arrays are views of one (5, T, B, H) array.
    """
    return _block_gru_reset_after(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh,
                                  sequence_length=sequence_length)


def _block_gru_reset_after(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, *,
                           sequence_length=None, reverse=False):
    """``block_gru_reset_after``; ``reverse=True`` (every row at full length: no
    sequence_length, seq_len_max = T): the reverse direction of a bidirectional layer
    read by the kernels themselves, step t at time T-1-t, the outputs in x's time
    order (``block_gru_reset_after`` on ``x[::-1]``, reversed), with no reversed
    copies (blockrnn.torch's reverse direction)."""
    op = "block_gru_reset_after"
    args = Arrays(op, x=x, h_prev=h_prev, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    L, lengths, T, B, I, H = _check(args, seq_len_max, sequence_length)
    reverse = check_reverse(op, reverse, L, T, lengths)
    if B == 0 or H == 0:  # nothing to compute: the (empty) outputs, whatever T is
        return BlockGRUResetAfterOutput(*args.results(args.output_buffers(5, T, B, H)))
    outs = _forward_kernel(steps_to_run(L, lengths), lengths, reverse,
                           *args.kernel(*_INPUTS))
    return BlockGRUResetAfterOutput(*args.results(outs))


def _forward_kernel(steps, lengths, reverse, x, h_prev, w_ih, w_hh, b_ih, b_hh):
    """The forward kernel's call on CHECKED arguments (no check here): C-contiguous
    arrays of one compute dtype (float32 or float64) of the shapes above, B and H
    non-zero, steps = steps_to_run(L, lengths), lengths None or checked int64 (B,),
    reverse as checked by check_reverse. Returns the new arrays [r, z, n, hn, h]
    (output_buffers). The checked callers: block_gru_reset_after, and
    blockrnn.torch's modules once they have checked their own arguments."""
    T, B = x.shape[0], x.shape[1]
    H = h_prev.shape[1]
    outs = _kernels.output_buffers(5, (T, B, H), x.dtype)
    _kernels.block_gru_reset_after_forward(steps, x, h_prev, w_ih, w_hh, b_ih, b_hh,
                                           kernel_threads(B, H), _config.thread_limit(),
                                           *outs, lengths, reverse)
    return outs


def block_gru_reset_after_grad(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh,
                               r, z, n, hn, h, h_grad, *, sequence_length=None):
    """Backward of ``block_gru_reset_after`` over the whole sequence.

    Parameters
    ----------
    seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh, sequence_length
        As given to ``block_gru_reset_after`` (b_ih and b_hh: only their shapes
        are used).
    r, z, n, hn, h : arrays of shape (T, B, H)
        ``block_gru_reset_after``'s outputs (entries at t >= L, and in row b
        at t >= sequence_length[b], are not read; NaN there is fine).
    h_grad : array of shape (T, B, H)
        Gradient of the loss w.r.t. h at every step (entries at t >= L, and
        in row b at t >= sequence_length[b], are not read). A loss on a row's
        final state adds its gradient at that row's last step.

    Returns
    -------
    BlockGRUResetAfterGradOutput(x_grad, h_prev_grad, w_ih_grad, w_hh_grad,
    b_ih_grad, b_hh_grad)
        Each of the shape of the matching input; x_grad is zero for t >= L
        (and in row b for t >= sequence_length[b]).
    """
    return _block_gru_reset_after_grad(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh,
                                       r, z, n, hn, h, h_grad,
                                       sequence_length=sequence_length)


def _block_gru_reset_after_grad(seq_len_max, x, h_prev, w_ih, w_hh, b_ih, b_hh,
                                r, z, n, hn, h, h_grad, *, sequence_length=None,
                                reverse=False):
    """``block_gru_reset_after_grad``; ``reverse`` as in ``_block_gru_reset_after``
    (every sequence argument in x's time order)."""
    op = "block_gru_reset_after_grad"
    args = Arrays(op, x=x, h_prev=h_prev, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh,
                  r=r, z=z, n=n, hn=hn, h=h, h_grad=h_grad)
    L, lengths, T, B, I, H = _check(args, seq_len_max, sequence_length)
    for name in ("r", "z", "n", "hn", "h", "h_grad"):
        args.shape(name, "[T, B, H]", (T, B, H))
    reverse = check_reverse(op, reverse, L, T, lengths)
    if B == 0 or H == 0:  # nothing to compute: zero gradients, whatever T is
        return BlockGRUResetAfterGradOutput(*(args.zeros(args[k].shape) for k in _INPUTS))
    grads = _backward_kernel(
        steps_to_run(L, lengths), lengths, reverse,
        *args.kernel("x", "h_prev", "w_ih", "w_hh", "r", "z", "n", "hn", "h", "h_grad"))
    return BlockGRUResetAfterGradOutput(*map(args.result, grads))


def _backward_kernel(steps, lengths, reverse, x, h_prev, w_ih, w_hh, r, z, n, hn, h,
                     h_grad):
    """The backward kernel's call on CHECKED arguments, as _forward_kernel's.
    Returns the new arrays [x_grad, h_prev_grad, w_ih_grad, w_hh_grad, b_ih_grad,
    b_hh_grad]."""
    T, B, I = x.shape
    H = h_prev.shape[1]
    dt = x.dtype
    grads = [np.empty((T, B, I), dt), np.empty((B, H), dt), np.empty((3 * H, I), dt),
             np.empty((3 * H, H), dt), np.empty(3 * H, dt), np.empty(3 * H, dt)]
    # w_hh_grad multiplies h at a row's padding by a zero gradient: zero it in
    # the copy it reads, so that any padding gives zeros.
    h = zero_padding(h, steps, lengths, dt)
    _kernels.block_gru_reset_after_backward(
        steps, x, h_prev, w_ih, w_hh, r, z, n, hn, h, h_grad, kernel_threads(B, H),
        _config.thread_limit(), *grads, lengths, reverse)
    return grads


def _cell_args(op, x, h_prev, **more):
    """The cell's arguments, checked (x [B, I], h_prev and every other
    non-parameter [B, H], the parameters as for the sequence), each
    non-parameter given a leading time axis of 1."""
    args = Arrays(op, x=x, h_prev=h_prev, **more)
    B, I = args.rank("x", "[B, I]")
    H = args.rank("h_prev", "[B, H]")[1]
    args.shape("w_ih", "[3H, I]", (3 * H, I))
    args.shape("w_hh", "[3H, H]", (3 * H, H))
    args.shape("b_ih", "[3H]", (3 * H,))
    args.shape("b_hh", "[3H]", (3 * H,))
    for name in ("h_prev",) + tuple(k for k in more if k not in _PARAMS):
        args.shape(name, "[B, H]", (B, H))
    for name in ("x",) + tuple(k for k in more if k not in _PARAMS):
        args.add(name, args[name][None])
    return args


def gru_cell_reset_after(x, h_prev, w_ih, w_hh, b_ih, b_hh):
    """One step of nn.GRU's cell (``nn.GRUCell``).

    x (B, I), h_prev (B, H), w_ih (3H, I), w_hh (3H, H), b_ih, b_hh (3H,), as
    for ``block_gru_reset_after``. Returns BlockGRUResetAfterOutput(r, z, n,
    hn, h), each of shape (B, H).
    """
    args = _cell_args("gru_cell_reset_after", x, h_prev, w_ih=w_ih, w_hh=w_hh,
                         b_ih=b_ih, b_hh=b_hh)
    out = block_gru_reset_after(1, *(args[k] for k in _INPUTS))
    return BlockGRUResetAfterOutput(*(a[0] for a in out))


def gru_cell_reset_after_grad(x, h_prev, w_ih, w_hh, b_ih, b_hh, r, z, n, hn, h_grad):
    """Backward of ``gru_cell_reset_after``.

    r, z, n, hn (B, H): its outputs; h_grad (B, H): the gradient of the loss
    w.r.t. h. Returns BlockGRUResetAfterGradOutput(x_grad (B, I), h_prev_grad
    (B, H), w_ih_grad, w_hh_grad, b_ih_grad, b_hh_grad).
    """
    args = _cell_args("gru_cell_reset_after_grad", x, h_prev, w_ih=w_ih, w_hh=w_hh,
                         b_ih=b_ih, b_hh=b_hh, r=r, z=z, n=n, hn=hn, h_grad=h_grad)
    # h (the step's output) is only read as the state of a later step: none.
    out = block_gru_reset_after_grad(1, *(args[k] for k in _INPUTS),
                                     *(args[k] for k in ("r", "z", "n", "hn")),
                                     args["r"], args["h_grad"])
    return out._replace(x_grad=out.x_grad[0])
