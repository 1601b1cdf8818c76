"""The LSTM ops: LSTMBlockCell, LSTMBlockCellGrad, BlockLSTM(V2), BlockLSTMGrad(V2).

Semantics are TensorFlow 2.21's (see SPEC.md). Shapes use B batch, I input
size, H cell size, T time steps. The gate axis of ``w``, ``b`` and of the gate
gradients is four blocks of H columns: ICFO (input, cell input, forget,
output) for every op except the V2 sequence ops, which use IFCO.

All array arguments accept anything ``numpy.asarray`` accepts and must share
one dtype: float16 (computed in float32, rounded once), float32 or float64.
"""
from collections import namedtuple

import numpy as np

from blockrnn import _config, _kernels
from blockrnn._config import kernel_threads
from blockrnn._validation import (
    Arrays, check_blas_sizes, check_bool, check_float, check_reverse, check_seq_len_max,
    check_sequence_length, steps_to_run, zero_padding)

__all__ = [
    "lstm_block_cell", "lstm_block_cell_grad", "lstm_block_cell_grad_full",
    "block_lstm", "block_lstm_v2", "block_lstm_grad", "block_lstm_grad_v2",
]

LSTMBlockCellOutput = namedtuple("LSTMBlockCellOutput", "i cs f o ci co h")
LSTMBlockCellGradOutput = namedtuple(
    "LSTMBlockCellGradOutput", "cs_prev_grad dicfo wci_grad wcf_grad wco_grad")
LSTMBlockCellGradFullOutput = namedtuple(
    "LSTMBlockCellGradFullOutput",
    "x_grad cs_prev_grad h_prev_grad w_grad wci_grad wcf_grad wco_grad b_grad")
BlockLSTMOutput = namedtuple("BlockLSTMOutput", "i cs f o ci co h")
BlockLSTMGradOutput = namedtuple(
    "BlockLSTMGradOutput",
    "x_grad cs_prev_grad h_prev_grad w_grad wci_grad wcf_grad wco_grad b_grad")
NNLSTMGradOutput = namedtuple(
    "NNLSTMGradOutput",
    "x_grad cs_prev_grad h_prev_grad w_ih_grad w_hh_grad wci_grad wcf_grad wco_grad b_grad")

_PARAMS = ("w", "wci", "wcf", "wco", "b")
_GATES = ("i", "cs", "f", "o", "ci", "co")


def _check_params(args, I, H, peepholes_required, nn_layout=False):
    """w [I+H, 4H] (nn_layout: nn.LSTM's w_ih [4H, I] and w_hh [4H, H] in its place),
    b [4H]; wci, wcf, wco rank 1, and [H] when required."""
    if nn_layout:
        args.shape("w_ih", "[4H, I]", (4 * H, I))
        args.shape("w_hh", "[4H, H]", (4 * H, H))
    else:
        args.shape("w", "[I+H, 4H]", (I + H, 4 * H))
    args.shape("b", "[4H]", (4 * H,))
    for name in ("wci", "wcf", "wco"):
        if peepholes_required:
            args.shape(name, "[H]", (H,))
        else:
            args.rank(name, "[H]")


def _check_cell(args, peepholes_required):
    """x [B, I], cs_prev and h_prev [B, H] and the parameters; returns B, I, H."""
    B, I = args.rank("x", "[B, I]")
    H = args.rank("cs_prev", "[B, H]")[1]
    args.shape("cs_prev", "[B, H]", (B, H))
    args.shape("h_prev", "[B, H]", (B, H))
    _check_params(args, I, H, peepholes_required)
    check_blas_sizes(args.op, B=B, **{"I+H": I + H, "4H": 4 * H})
    return B, I, H


def _check_sequence(args, seq_len_max, peepholes_required, nn_layout=False):
    """x [T, B, I], cs_prev and h_prev [B, H], the parameters (TensorFlow's w, or
    nn.LSTM's w_ih and w_hh with nn_layout) and seq_len_max."""
    T, B, I = args.rank("x", "[T, B, I]")
    H = args.rank("cs_prev", "[B, H]")[1]
    args.shape("cs_prev", "[B, H]", (B, H))
    args.shape("h_prev", "[B, H]", (B, H))
    _check_params(args, I, H, peepholes_required, nn_layout)
    L = check_seq_len_max(args.op, seq_len_max, T)
    if B and H:  # else nothing is computed (the ops return early)
        check_blas_sizes(args.op, **{"T*B": T * B, "I+H": I + H, "4H": 4 * H})
    return L, T, B, I, H


# --------------------------------------------------------------------------
# LSTMBlockCell / LSTMBlockCellGrad
# --------------------------------------------------------------------------

def lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, *,
                    forget_bias=1.0, cell_clip=3.0, use_peephole=False):
    """One LSTM step (TensorFlow's ``LSTMBlockCell``), ICFO gate layout.

    Parameters
    ----------
    x : array of shape (B, I)
    cs_prev, h_prev : arrays of shape (B, H)
        Previous cell state and output. B and H must be positive (TensorFlow
        rejects an empty cell state); I may be 0.
    w : array of shape (I+H, 4H)
        Rows 0:I multiply x, rows I:I+H multiply h_prev; columns ICFO.
    wci, wcf, wco : arrays of shape (H,)
        Peephole weights, read only when ``use_peephole`` (any length otherwise).
    b : array of shape (4H,)
    forget_bias : float, default 1.0
        Added to the forget gate's pre-activation.
    cell_clip : float, default 3.0
        Clip the cell state to [-cell_clip, cell_clip]; <= 0 disables clipping.
    use_peephole : bool, default False

    Returns
    -------
    LSTMBlockCellOutput(i, cs, f, o, ci, co, h), each of shape (B, H):
    the input, forget and output gates after their sigmoid, the cell state
    (after clipping), the cell input ``ci`` after tanh, ``co = tanh(cs)`` and
    ``h = o * co``. Under 4 MB each, the seven arrays are views of one
    (7, B, H) array.
    """
    out = _kernels.lstm_cell_fast(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias,
                                  cell_clip, use_peephole, _config.MIN_PARALLEL_WORK,
                                  LSTMBlockCellOutput)
    if out is not None:  # the common call, checked and computed in compiled code
        return out
    op = "lstm_block_cell"
    forget_bias = check_float(op, "forget_bias", forget_bias)
    cell_clip = check_float(op, "cell_clip", cell_clip)
    use_peephole = check_bool(op, "use_peephole", use_peephole)
    args = Arrays(op, x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf,
                  wco=wco, b=b)
    B, I, H = _check_cell(args, peepholes_required=use_peephole)
    if B == 0 or H == 0:
        raise ValueError(
            f"{op}: cs_prev is empty, has shape (B, H) = {(B, H)}; "
            f"LSTMBlockCell needs B > 0 and H > 0 (I may be 0)")
    outs = args.output_buffers(7, B, H)
    _kernels.lstm_cell_forward(
        *args.kernel("x", "cs_prev", "h_prev", *_PARAMS),
        forget_bias, cell_clip, use_peephole, _kernels.GateLayout.ICFO, kernel_threads(B, H), *outs)
    return LSTMBlockCellOutput(*args.results(outs))


def _cell_grad(op, values, use_peephole, full, optional=()):
    """Shared by the cell gradients; names in ``optional`` may be None (zeros)."""
    use_peephole = check_bool(op, "use_peephole", use_peephole)
    args = Arrays(op, **{k: v for k, v in values.items() if not (k in optional and v is None)})
    B, I, H = _check_cell(args, peepholes_required=use_peephole)
    for name in optional:
        if values[name] is None:
            args.add(name, args.zeros((B, H)))
    for name in _GATES + ("cs_grad", "h_grad"):
        args.shape(name, "[B, H]", (B, H))
    cs_prev_grad, dicfo = args.empty(B, H), args.empty(B, 4 * H)
    peephole_grads = [args.empty(H) for _ in range(3)]
    full_grads = ([args.empty(B, I), args.empty(B, H), args.empty(I + H, 4 * H),
                   args.empty(4 * H)] if full else [None] * 4)
    _kernels.lstm_cell_backward(
        *args.kernel("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco",
                     *_GATES, "cs_grad", "h_grad"),
        use_peephole, _kernels.GateLayout.ICFO, kernel_threads(B, H),
        cs_prev_grad, dicfo, *peephole_grads, full, *full_grads)
    if use_peephole:
        peephole_grads = list(map(args.result, peephole_grads))
    else:  # zeros of the shape of the given (unused) peephole weights
        peephole_grads = [args.zeros(args[name].shape) for name in ("wci", "wcf", "wco")]
    return args, cs_prev_grad, dicfo, peephole_grads, full_grads


def lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                         cs_grad, h_grad, *, use_peephole):
    """Backward of one LSTM step (TensorFlow's ``LSTMBlockCellGrad``), ICFO.

    Parameters
    ----------
    x : array of shape (B, I)
        Only its shape is used.
    cs_prev, h_prev : arrays of shape (B, H)
        ``h_prev`` is only shape-checked.
    w : array of shape (I+H, 4H); b : array of shape (4H,)
        Only their shapes are checked.
    wci, wcf, wco : arrays of shape (H,)
        Peephole weights; any length when ``use_peephole`` is False.
    i, cs, f, o, ci, co : arrays of shape (B, H)
        The outputs of ``lstm_block_cell`` for this step.
    cs_grad, h_grad : arrays of shape (B, H)
        Gradients of the loss w.r.t. this step's (clipped) ``cs`` and ``h``.
    use_peephole : bool (required)

    Returns
    -------
    LSTMBlockCellGradOutput(cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad)
        ``cs_prev_grad`` (B, H); ``dicfo`` (B, 4H), the gradient w.r.t. the
        gates' pre-activations (before forget_bias and peepholes), ICFO;
        peephole gradients of the shapes of wci, wcf, wco (zeros without
        peepholes). As in TensorFlow, cell clipping is ignored by the gradient.
    """
    values = dict(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b,
                  i=i, cs=cs, f=f, o=o, ci=ci, co=co, cs_grad=cs_grad, h_grad=h_grad)
    args, cs_prev_grad, dicfo, peephole_grads, _ = _cell_grad(
        "lstm_block_cell_grad", values, use_peephole, full=False)
    return LSTMBlockCellGradOutput(args.result(cs_prev_grad), args.result(dicfo),
                                   *peephole_grads)


def lstm_block_cell_grad_full(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                              cs_grad=None, h_grad=None, *, use_peephole):
    """All gradients of one LSTM step: ``lstm_block_cell_grad`` plus the matmuls
    TensorFlow 1.x's Python gradient added around it.

    Same arguments as ``lstm_block_cell_grad``; ``cs_grad`` or ``h_grad`` may
    be None (no gradient flows into that output: zeros).

    Returns
    -------
    LSTMBlockCellGradFullOutput(x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)
        Shapes of x (B, I), cs_prev (B, H), h_prev (B, H), w (I+H, 4H),
        wci, wcf, wco, b (4H,): ``[x_grad, h_prev_grad] = dicfo @ w.T``,
        ``w_grad = [x, h_prev].T @ dicfo``, ``b_grad = dicfo.sum(0)``.
    """
    op = "lstm_block_cell_grad_full"
    values = dict(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b,
                  i=i, cs=cs, f=f, o=o, ci=ci, co=co, cs_grad=cs_grad, h_grad=h_grad)
    args, cs_prev_grad, _, peephole_grads, (x_grad, h_prev_grad, w_grad, b_grad) = \
        _cell_grad(op, values, use_peephole, full=True, optional=("cs_grad", "h_grad"))
    return LSTMBlockCellGradFullOutput(
        args.result(x_grad), args.result(cs_prev_grad), args.result(h_prev_grad),
        args.result(w_grad), *peephole_grads, args.result(b_grad))


# --------------------------------------------------------------------------
# BlockLSTM / BlockLSTMV2 and their gradients
# --------------------------------------------------------------------------

def _block_lstm(op, layout, seq_len_max, values, forget_bias, cell_clip, use_peephole,
                sequence_length):
    if sequence_length is None:
        out = _kernels.block_lstm_fast(
            seq_len_max, *values.values(), forget_bias, cell_clip, use_peephole, layout,
            _config.MIN_PARALLEL_WORK, BlockLSTMOutput, _config.thread_limit())
        if out is not None:  # the common call, checked and computed in compiled code
            return out
    forget_bias = check_float(op, "forget_bias", forget_bias)
    cell_clip = check_float(op, "cell_clip", cell_clip)
    use_peephole = check_bool(op, "use_peephole", use_peephole)
    args = Arrays(op, **values)
    # TensorFlow checks the peephole lengths here even without peepholes.
    L, T, B, I, H = _check_sequence(args, seq_len_max, peepholes_required=True)
    lengths = check_sequence_length(op, sequence_length, B, T)
    outs = args.output_buffers(7, T, B, H)
    if B == 0 or H == 0:  # nothing to compute: the (empty) outputs, whatever T is
        return BlockLSTMOutput(*args.results(outs))
    x, cs_prev, h_prev, w, wci, wcf, wco, b = args.kernel("x", "cs_prev", "h_prev", *_PARAMS)
    _kernels.block_lstm_forward(
        steps_to_run(L, lengths), x, cs_prev, h_prev, w[:I], w[I:], wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, layout, kernel_threads(B, H),
        _config.thread_limit(), *outs, lengths)
    return BlockLSTMOutput(*args.results(outs))


_SEQUENCE_LENGTH_DOC = """sequence_length : array of shape (B,) of integers in [0, T], optional
        Per-row lengths (like ONNX's ``sequence_lens``): row b runs the steps
        t < min(L, sequence_length[b]) and all its outputs after them are
        zero. Its final state is then cs[n-1, b], h[n-1, b] with
        n = min(L, sequence_length[b]) (cs_prev[b], h_prev[b] if n = 0).
        The padding x[n:, b] must be finite; its values do not matter (the
        backward's weight-gradient GEMMs multiply it by zero). None (the
        default) is TensorFlow's behaviour: every row runs L steps."""


def block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *,
               forget_bias=1.0, cell_clip=3.0, use_peephole=False, sequence_length=None):
    """An LSTM over a whole sequence (TensorFlow's ``BlockLSTM``), ICFO layout.

    Parameters
    ----------
    seq_len_max : int
        Number of steps to run, L, with 0 <= L <= T (any integer scalar).
    x : array of shape (T, B, I)
        Time-major input.
    cs_prev, h_prev : arrays of shape (B, H)
        Initial cell state and output.
    w : array of shape (I+H, 4H)
        Rows 0:I multiply x[t], rows I:I+H multiply h[t-1]; columns ICFO.
    wci, wcf, wco : arrays of shape (H,)
        Peephole weights (checked even when unused, as in TensorFlow).
    b : array of shape (4H,)
    forget_bias : float, default 1.0
    cell_clip : float, default 3.0
        <= 0 disables clipping.
    use_peephole : bool, default False
    {sequence_length}

    Returns
    -------
    BlockLSTMOutput(i, cs, f, o, ci, co, h), each of shape (T, B, H)
        Per step, the outputs of ``lstm_block_cell``; each step starts from
        the previous step's cs and h. Every output is zero for t >= L
        (TensorFlow zeroes only cs and h there and leaves the rest undefined).
        Under 4 MB each, the seven arrays are views of one (7, T, B, H) array
        (one allocation): keeping one alive keeps all seven's memory;
        ``h.copy()`` keeps h alone.
    """
    values = dict(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b)
    return _block_lstm("block_lstm", _kernels.GateLayout.ICFO, seq_len_max, values,
                       forget_bias, cell_clip, use_peephole, sequence_length)


def block_lstm_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *,
                  cell_clip=0.0, use_peephole=False, sequence_length=None):
    """An LSTM over a whole sequence (TensorFlow's ``BlockLSTMV2``), IFCO layout.

    As ``block_lstm`` except: the gate blocks of ``w``, ``b`` are ordered IFCO
    (input, forget, cell input, output), there is no forget bias (it is 0),
    and ``cell_clip`` defaults to 0.0 (no clipping). Shapes: x (T, B, I),
    cs_prev and h_prev (B, H), w (I+H, 4H), wci/wcf/wco (H,), b (4H,);
    outputs BlockLSTMOutput(i, cs, f, o, ci, co, h), each (T, B, H) (under 4 MB
    each, views of one (7, T, B, H) array); ``sequence_length`` (B,) as for
    ``block_lstm``.
    """
    values = dict(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b)
    return _block_lstm("block_lstm_v2", _kernels.GateLayout.IFCO, seq_len_max, values,
                       0.0, cell_clip, use_peephole, sequence_length)


def _block_lstm_grad(op, layout, seq_len_max, values, use_peephole, sequence_length):
    use_peephole = check_bool(op, "use_peephole", use_peephole)
    args = Arrays(op, **values)
    L, T, B, I, H = _check_sequence(args, seq_len_max, peepholes_required=use_peephole)
    for name in _GATES + ("h", "cs_grad", "h_grad"):
        args.shape(name, "[T, B, H]", (T, B, H))
    lengths = check_sequence_length(op, sequence_length, B, T)
    if B == 0 or H == 0:  # nothing to compute: zero gradients, whatever T is
        return BlockLSTMGradOutput(*(args.zeros(args[name].shape) for name in (
            "x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")))
    grads = [args.empty(T, B, I), args.empty(B, H), args.empty(B, H),
             args.empty(I + H, 4 * H), args.empty(H), args.empty(H), args.empty(H),
             args.empty(4 * H)]
    steps = steps_to_run(L, lengths)
    # The weight and peephole gradients multiply h and cs at a row's padding by
    # zero: zero it in the copies they read, so that any padding gives zeros.
    x, cs_prev, h_prev, w, *rest = args.kernel(
        "x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", *_GATES, "h", "cs_grad", "h_grad",
        padded=("cs", "h"), steps=steps, lengths=lengths)
    w_grad = grads[3]
    _kernels.block_lstm_backward(
        steps, x, cs_prev, h_prev, w[:I], w[I:], *rest, use_peephole, layout,
        kernel_threads(B, H), _config.thread_limit(), *grads[:3], w_grad[:I], w_grad[I:],
        *grads[4:], lengths)
    if not use_peephole:  # zeros of the shape of the given (unused) peephole weights
        grads[4:7] = [args.zeros(args[name].shape) for name in ("wci", "wcf", "wco")]
    grads = list(map(args.result, grads))
    return BlockLSTMGradOutput(*grads)


_GRAD_DOC = """Backward of ``{fwd}`` over a whole sequence (TensorFlow's ``{tf}``), {layout} layout.

    Parameters
    ----------
    seq_len_max : int
        L, with 0 <= L <= T, as given to the forward op.
    x : array of shape (T, B, I)
    cs_prev, h_prev : arrays of shape (B, H)
    w : array of shape (I+H, 4H)
    wci, wcf, wco : arrays of shape (H,)
        Any length when ``use_peephole`` is False.
    b : array of shape (4H,)
        Only its shape is used.
    i, cs, f, o, ci, co, h : arrays of shape (T, B, H)
        The forward op's outputs (entries at t >= L are not read; with
        sequence_length, their values past a row's length do not matter, NaN
        included).
    cs_grad, h_grad : arrays of shape (T, B, H)
        Gradients of the loss w.r.t. the forward outputs cs and h at every
        step (entries at t >= L are not read).
    use_peephole : bool (required)
    sequence_length : array of shape (B,), optional
        As given to the forward op. Row b's gradients come from its steps
        t < min(L, sequence_length[b]) only; a loss on its final state adds
        its gradient into cs_grad/h_grad at that row's last step.

    Returns
    -------
    BlockLSTMGradOutput(x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)
        Each of the shape of the matching input; x_grad is zero for t >= L,
        everything is zero when L = 0, peephole gradients are zeros without
        peepholes. As in TensorFlow, cell clipping is ignored by the gradient.
    """


def block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                    i, cs, f, o, ci, co, h, cs_grad, h_grad, *, use_peephole,
                    sequence_length=None):
    values = dict(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b,
                  i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h, cs_grad=cs_grad, h_grad=h_grad)
    return _block_lstm_grad("block_lstm_grad", _kernels.GateLayout.ICFO, seq_len_max, values,
                            use_peephole, sequence_length)


def block_lstm_grad_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                       i, cs, f, o, ci, co, h, cs_grad, h_grad, *, use_peephole,
                       sequence_length=None):
    values = dict(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b,
                  i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h, cs_grad=cs_grad, h_grad=h_grad)
    return _block_lstm_grad("block_lstm_grad_v2", _kernels.GateLayout.IFCO, seq_len_max, values,
                            use_peephole, sequence_length)


block_lstm.__doc__ = block_lstm.__doc__.format(sequence_length=_SEQUENCE_LENGTH_DOC)
block_lstm_grad.__doc__ = _GRAD_DOC.format(fwd="block_lstm", tf="BlockLSTMGrad", layout="ICFO")
block_lstm_grad_v2.__doc__ = _GRAD_DOC.format(
    fwd="block_lstm_v2", tf="BlockLSTMGradV2", layout="IFCO")


# --------------------------------------------------------------------------
# BlockLSTMV2 on nn.LSTM's weight layout (for blockrnn.torch)
# --------------------------------------------------------------------------

def _block_lstm_nn(seq_len_max, x, cs_prev, h_prev, w_ih, w_hh, wci, wcf, wco, b, *,
                   cell_clip=0.0, use_peephole=False, sequence_length=None, reverse=False):
    """``block_lstm_v2`` with nn.LSTM's weights as stored: w_ih (4H, I) =
    ``weight_ih_l{k}``, w_hh (4H, H) = ``weight_hh_l{k}`` (gate rows i, f, g, o,
    BlockLSTMV2's IFCO), in place of w = [w_ih.T; w_hh.T]. The kernels read them
    in place (no transposed copy); the outputs are ``block_lstm_v2``'s, bit for
    bit on the float32 packed route. b (4H,): b_ih + b_hh (any forget bias added
    by the caller). ``reverse=True`` (every row at full length: no sequence_length,
    seq_len_max = T): the reverse direction of a bidirectional layer read by the
    kernels themselves, step t at time T-1-t, the outputs in x's time order (what
    ``block_lstm_v2`` on ``x[::-1]`` returns, reversed), with no reversed copies."""
    op = "block_lstm_nn"
    cell_clip = check_float(op, "cell_clip", cell_clip)
    use_peephole = check_bool(op, "use_peephole", use_peephole)
    args = Arrays(op, x=x, cs_prev=cs_prev, h_prev=h_prev, w_ih=w_ih, w_hh=w_hh, wci=wci,
                  wcf=wcf, wco=wco, b=b)
    L, T, B, I, H = _check_sequence(args, seq_len_max, True, nn_layout=True)
    lengths = check_sequence_length(op, sequence_length, B, T)
    reverse = check_reverse(op, reverse, L, T, lengths)
    if B == 0 or H == 0:
        return BlockLSTMOutput(*args.results(args.output_buffers(7, T, B, H)))
    outs = _nn_forward_kernel(
        steps_to_run(L, lengths), lengths, reverse,
        *args.kernel("x", "cs_prev", "h_prev", "w_ih", "w_hh", "wci", "wcf", "wco", "b"),
        cell_clip, use_peephole)
    return BlockLSTMOutput(*args.results(outs))


def _nn_forward_kernel(steps, lengths, reverse, x, cs_prev, h_prev, w_ih, w_hh, wci, wcf,
                       wco, b, cell_clip, use_peephole):
    """_block_lstm_nn's kernel call on CHECKED arguments (no check here): C-contiguous
    arrays of one compute dtype (float32 or float64) of its shapes (the peepholes
    read only with use_peephole), B and H non-zero, steps = steps_to_run(L, lengths),
    lengths None or checked int64 (B,), reverse as checked by check_reverse,
    cell_clip a float, use_peephole a bool. Returns the new arrays [i, cs, f, o, ci,
    co, h] (output_buffers). The checked callers: _block_lstm_nn, and
    blockrnn.torch's modules once they have checked their own arguments."""
    T, B = x.shape[0], x.shape[1]
    H = h_prev.shape[1]
    outs = _kernels.output_buffers(7, (T, B, H), x.dtype)
    _kernels.block_lstm_forward(
        steps, x, cs_prev, h_prev, w_ih.T, w_hh.T, wci, wcf, wco, b, 0.0, cell_clip,
        use_peephole, _kernels.GateLayout.IFCO, kernel_threads(B, H),
        _config.thread_limit(), *outs, lengths, reverse)
    return outs


def _block_lstm_nn_grad(seq_len_max, x, cs_prev, h_prev, w_ih, w_hh, wci, wcf, wco, b,
                        i, cs, f, o, ci, co, h, cs_grad, h_grad, *, use_peephole,
                        sequence_length=None, reverse=False):
    """``block_lstm_grad_v2`` with nn.LSTM's weights as in ``_block_lstm_nn`` (b:
    only its shape is used; ``reverse`` as there: every sequence argument in x's
    time order, the gradient of ``_block_lstm_nn(..., reverse=True)``).
    Returns NNLSTMGradOutput(x_grad, cs_prev_grad, h_prev_grad, w_ih_grad (4H, I),
    w_hh_grad (4H, H), wci_grad, wcf_grad, wco_grad, b_grad (4H,)): the weight
    gradients computed in nn.LSTM's layout directly, b_grad that of b_ih and of
    b_hh alike."""
    op = "block_lstm_nn_grad"
    use_peephole = check_bool(op, "use_peephole", use_peephole)
    args = Arrays(op, x=x, cs_prev=cs_prev, h_prev=h_prev, w_ih=w_ih, w_hh=w_hh, wci=wci,
                  wcf=wcf, wco=wco, b=b, i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h,
                  cs_grad=cs_grad, h_grad=h_grad)
    L, T, B, I, H = _check_sequence(args, seq_len_max, use_peephole, nn_layout=True)
    for name in _GATES + ("h", "cs_grad", "h_grad"):
        args.shape(name, "[T, B, H]", (T, B, H))
    lengths = check_sequence_length(op, sequence_length, B, T)
    reverse = check_reverse(op, reverse, L, T, lengths)
    if B == 0 or H == 0:
        return NNLSTMGradOutput(*(args.zeros(args[name].shape) for name in (
            "x", "cs_prev", "h_prev", "w_ih", "w_hh", "wci", "wcf", "wco", "b")))
    grads = _nn_backward_kernel(
        steps_to_run(L, lengths), lengths, reverse,
        *args.kernel("x", "cs_prev", "h_prev", "w_ih", "w_hh", "wci", "wcf", "wco", *_GATES,
                     "h", "cs_grad", "h_grad"), use_peephole)
    if not use_peephole:
        grads[5:8] = [args.zeros(args[name].shape) for name in ("wci", "wcf", "wco")]
    return NNLSTMGradOutput(*map(args.result, grads))


def _nn_backward_kernel(steps, lengths, reverse, x, cs_prev, h_prev, w_ih, w_hh, wci, wcf,
                        wco, i, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole):
    """_block_lstm_nn_grad's kernel call on CHECKED arguments, as _nn_forward_kernel's.
    Returns the new arrays [x_grad, cs_prev_grad, h_prev_grad, w_ih_grad, w_hh_grad,
    wci_grad, wcf_grad, wco_grad, b_grad] (the peephole gradients meaningless without
    peepholes)."""
    T, B, I = x.shape
    H = h_prev.shape[1]
    dt = x.dtype
    grads = [np.empty((T, B, I), dt), np.empty((B, H), dt), np.empty((B, H), dt),
             np.empty((4 * H, I), dt), np.empty((4 * H, H), dt), np.empty(H, dt),
             np.empty(H, dt), np.empty(H, dt), np.empty(4 * H, dt)]
    # The weight and peephole gradients multiply h and cs at a row's padding by
    # zero: zero it in the copies they read, so that any padding gives zeros.
    cs = zero_padding(cs, steps, lengths, dt)
    h = zero_padding(h, steps, lengths, dt)
    _kernels.block_lstm_backward(
        steps, x, cs_prev, h_prev, w_ih.T, w_hh.T, wci, wcf, wco, i, cs, f, o, ci, co, h,
        cs_grad, h_grad, use_peephole, _kernels.GateLayout.IFCO, kernel_threads(B, H),
        _config.thread_limit(), *grads[:3], grads[3].T, grads[4].T, *grads[5:], lengths,
        reverse)
    return grads
