"""Property: every accepted variant of an array argument gives the bits of its
native, C-contiguous copy, at every public entry point and in every dtype.

Variants (each applied to one array argument at a time, the others native):
non-native byte order, unaligned data, Fortran order, negative strides,
non-unit strides, read-only, np.memmap, an ndarray subclass; each on shapes
with zero-size dimensions too (I = 0, B = 0, T = 0). When the native call
raises, every variant must raise the same error.

To cover a new entry point, add one line to ENTRY_POINTS: a name, the call
(taking keyword arguments, returning arrays or tuples of them) and the input
builder (dtype, T, B, I, H) -> keyword arguments.
"""
import itertools

import numpy as np
import pytest

import blockrnn
from blockrnn import raw_ops

from _inputs import (block_lstm_grad_inputs, block_lstm_inputs, gru_cell_grad_inputs,
                     gru_cell_inputs, lstm_cell_grad_inputs, lstm_cell_inputs)

DTYPES = [np.float16, np.float32, np.float64]
# (T, B, I, H): a plain shape, then the zero-size dimensions the ops accept (or reject
# the same way for every variant).
SHAPES = {"plain": (3, 2, 3, 2), "I=0": (3, 2, 0, 2), "B=0": (3, 0, 3, 2), "T=0": (0, 2, 3, 2)}


# --------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------

def _lengths(T, B):
    return np.arange(B, dtype=np.int64) % (T + 1)


def lstm_cell(dt, T, B, I, H):
    return dict(lstm_cell_inputs(B, I, H, dt), forget_bias=0.5, cell_clip=0.7,
                use_peephole=True)


def lstm_cell_grad(dt, T, B, I, H):
    if B == 0:   # no forward values to take the gradient of: build them empty
        d = lstm_cell_inputs(B, I, H, dt)
        d.update({k: np.zeros((0, H), dt) for k in ("i", "cs", "f", "o", "ci", "co",
                                                    "cs_grad", "h_grad")})
    else:
        d = lstm_cell_grad_inputs(B, I, H, dt, use_peephole=True)
    return dict(d, use_peephole=True)


def block_lstm(dt, T, B, I, H, lengths=False, v2=False):
    d = dict(block_lstm_inputs(T, B, I, H, dt), seq_len_max=T, cell_clip=0.7,
             use_peephole=True)
    if not v2:
        d["forget_bias"] = 0.5
    if lengths:
        d["sequence_length"] = _lengths(T, B)
    return d


def block_lstm_grad(dt, T, B, I, H, lengths=False, v2=False):
    d = dict(block_lstm_grad_inputs(T, B, I, H, max(T - 1, 0), dt, use_peephole=True, v2=v2),
             use_peephole=True)
    if lengths:
        d["sequence_length"] = _lengths(T, B)
    return d


def gru_cell(dt, T, B, I, H):
    return gru_cell_inputs(B, I, H, dt)


def gru_cell_grad(dt, T, B, I, H):
    return gru_cell_grad_inputs(B, I, H, dt)


def block_gru(dt, T, B, I, H, lengths=False):
    d = dict(gru_cell_inputs(B, I, H, dt), x=block_lstm_inputs(T, B, I, H, dt)["x"],
             seq_len_max=T)
    if lengths:
        d["sequence_length"] = _lengths(T, B)
    return d


def block_gru_grad(dt, T, B, I, H, lengths=False):
    d = block_gru(dt, T, B, I, H, lengths)
    fwd = blockrnn.block_gru(**d)
    rng = np.random.default_rng(5)
    return dict(d, **fwd._asdict(), h_grad=rng.uniform(-1, 1, (T, B, H)).astype(dt))


def layer_inputs(dt, T, B, I, H, lengths=False):
    rng = np.random.default_rng(6)
    d = {k: rng.uniform(-1, 1, s).astype(dt) for k, s in [
        ("x", (T, B, I)), ("h0", (4, B, H)), ("c0", (4, B, H)), ("dy", (T, B, 2 * H)),
        ("dh", (4, B, H)), ("dc", (4, B, H))]}      # 2 layers x 2 directions
    if lengths:
        d["sequence_length"] = _lengths(T, B)
    return d


def lstm_layer(x, h0, c0, dy, dh, dc, sequence_length=None):
    """LSTM.forward then LSTM.backward (2 layers, bidirectional): y, the final state, dx,
    dstate0, the grads."""
    layer = blockrnn.LSTM(x.shape[2], h0.shape[2], 2, bidirectional=True, use_peephole=True,
                          cell_clip=0.7, dtype=np.asarray(x).dtype.newbyteorder("="), seed=0)
    y, state, ctx = layer.forward(x, (h0, c0), sequence_length=sequence_length)
    dx, dstate0 = layer.backward(ctx, dy, (dh, dc))
    return [y, *state, dx, *dstate0, *(layer.grads[k] for k in sorted(layer.grads))]


def gru_layer(x, h0, c0, dy, dh, dc, sequence_length=None):
    layer = blockrnn.GRU(x.shape[2], h0.shape[2], 2, bidirectional=True,
                         dtype=np.asarray(x).dtype.newbyteorder("="), seed=0)
    y, state, ctx = layer.forward(x, h0, sequence_length=sequence_length)
    dx, dh0 = layer.backward(ctx, dy, dh)
    return [y, state, dx, dh0, *(layer.grads[k] for k in sorted(layer.grads))]


def _with(build, **fixed):
    return lambda dt, T, B, I, H: build(dt, T, B, I, H, **fixed)


# name, call(**kwargs), inputs(dtype, T, B, I, H) -> kwargs
ENTRY_POINTS = [
    ("lstm_block_cell", blockrnn.lstm_block_cell, lstm_cell),
    ("lstm_block_cell_grad", blockrnn.lstm_block_cell_grad, lstm_cell_grad),
    ("lstm_block_cell_grad_full", blockrnn.lstm_block_cell_grad_full, lstm_cell_grad),
    ("block_lstm", blockrnn.block_lstm, block_lstm),
    ("block_lstm lengths", blockrnn.block_lstm, _with(block_lstm, lengths=True)),
    ("block_lstm_v2", blockrnn.block_lstm_v2, _with(block_lstm, v2=True)),
    ("block_lstm_v2 lengths", blockrnn.block_lstm_v2, _with(block_lstm, v2=True, lengths=True)),
    ("block_lstm_grad", blockrnn.block_lstm_grad, block_lstm_grad),
    ("block_lstm_grad lengths", blockrnn.block_lstm_grad, _with(block_lstm_grad, lengths=True)),
    ("block_lstm_grad_v2", blockrnn.block_lstm_grad_v2, _with(block_lstm_grad, v2=True)),
    ("block_lstm_grad_v2 lengths", blockrnn.block_lstm_grad_v2,
     _with(block_lstm_grad, v2=True, lengths=True)),
    ("gru_block_cell", blockrnn.gru_block_cell, gru_cell),
    ("gru_block_cell_grad", blockrnn.gru_block_cell_grad, gru_cell_grad),
    ("gru_block_cell_grad_full", blockrnn.gru_block_cell_grad_full, gru_cell_grad),
    ("block_gru", blockrnn.block_gru, block_gru),
    ("block_gru lengths", blockrnn.block_gru, _with(block_gru, lengths=True)),
    ("block_gru_grad", blockrnn.block_gru_grad, block_gru_grad),
    ("block_gru_grad lengths", blockrnn.block_gru_grad, _with(block_gru_grad, lengths=True)),
    ("raw_ops.LSTMBlockCell", raw_ops.LSTMBlockCell, lstm_cell),
    ("raw_ops.LSTMBlockCellGrad", raw_ops.LSTMBlockCellGrad, lstm_cell_grad),
    ("raw_ops.BlockLSTM", raw_ops.BlockLSTM, block_lstm),
    ("raw_ops.BlockLSTMV2", raw_ops.BlockLSTMV2, _with(block_lstm, v2=True)),
    ("raw_ops.BlockLSTMGrad", raw_ops.BlockLSTMGrad, block_lstm_grad),
    ("raw_ops.BlockLSTMGradV2", raw_ops.BlockLSTMGradV2, _with(block_lstm_grad, v2=True)),
    ("raw_ops.GRUBlockCell", raw_ops.GRUBlockCell, gru_cell),
    ("raw_ops.GRUBlockCellGrad", raw_ops.GRUBlockCellGrad, gru_cell_grad),
    ("raw_ops.BlockGRU", raw_ops.BlockGRU, _with(block_gru, lengths=True)),
    ("raw_ops.BlockGRUGrad", raw_ops.BlockGRUGrad, _with(block_gru_grad, lengths=True)),
    ("LSTM forward+backward", lstm_layer, layer_inputs),
    ("LSTM forward+backward lengths", lstm_layer, _with(layer_inputs, lengths=True)),
    ("GRU forward+backward", gru_layer, layer_inputs),
    ("GRU forward+backward lengths", gru_layer, _with(layer_inputs, lengths=True)),
]


# --------------------------------------------------------------------------
# variants: the same values in another memory layout or array type
# --------------------------------------------------------------------------

class Sub(np.ndarray):
    """A trivial ndarray subclass."""


def _unaligned(a):
    raw = np.zeros(a.nbytes + 1, np.uint8)
    out = raw[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _strided(a):
    """Every other element along the last axis of a twice-as-long buffer."""
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def _reversed(a):
    """Negative strides on every axis."""
    back = tuple(slice(None, None, -1) for _ in range(a.ndim))
    return np.ascontiguousarray(a[back])[back]


def _readonly(a):
    out = a.copy()
    out.flags.writeable = False
    return out


def _memmap(a, path):
    m = np.memmap(path, dtype=a.dtype, mode="w+", shape=a.shape)
    m[...] = a
    m.flush()
    return np.memmap(path, dtype=a.dtype, mode="r", shape=a.shape)


VARIANTS = {
    "byteswapped": lambda a, path: a.astype(a.dtype.newbyteorder("S")),
    "unaligned": lambda a, path: _unaligned(a),
    "fortran": lambda a, path: np.asfortranarray(a),
    "negative strides": lambda a, path: _reversed(a),
    "strided": lambda a, path: _strided(a),
    "read-only": lambda a, path: _readonly(a),
    "memmap": lambda a, path: _memmap(a, path) if a.size else None,   # mmap needs a byte
    "subclass": lambda a, path: a.copy().view(Sub),
}


def _outputs(result):
    """The arrays of a result (a namedtuple, a list, nested tuples)."""
    if isinstance(result, np.ndarray):
        return [result]
    return [a for r in result for a in _outputs(r)]


def _run(call, kwargs):
    try:
        return _outputs(call(**kwargs)), None
    except (TypeError, ValueError) as exc:
        return None, exc


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name, call, inputs", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_every_variant_gives_the_native_bits(name, call, inputs, dtype, shape, tmp_path):
    T, B, I, H = SHAPES[shape]
    try:
        kwargs = inputs(dtype, T, B, I, H)
    except (TypeError, ValueError) as exc:   # e.g. the float64 reference on B = 0 cells
        pytest.fail(f"input builder failed: {exc!r}")
    for value in kwargs.values():   # the inputs themselves are the native C-contiguous copies
        assert not isinstance(value, np.ndarray) or (
            value.dtype.isnative and value.flags.c_contiguous and type(value) is np.ndarray)
    expected, error = _run(call, kwargs)
    if error is None:
        assert expected and all(a.dtype.isnative for a in expected), name
    files = itertools.count()
    checked = 0
    for arg, value in kwargs.items():
        if not isinstance(value, np.ndarray):
            continue
        for variant, make in VARIANTS.items():
            other = make(value, tmp_path / f"{next(files)}.dat")
            if other is None:
                continue
            np.testing.assert_array_equal(other, value)
            got, got_error = _run(call, dict(kwargs, **{arg: other}))
            where = f"{name} {np.dtype(dtype).name} {shape}: {arg} {variant}"
            if error is not None:
                assert got_error is not None, f"{where}: native raised {error!r}, variant not"
                assert (type(got_error), str(got_error)) == (type(error), str(error)), where
                continue
            assert got_error is None, f"{where}: raised {got_error!r}"
            assert len(got) == len(expected), where
            for k, (a, e) in enumerate(zip(got, expected)):
                assert a.dtype == e.dtype and a.shape == e.shape, (where, k)
                assert a.tobytes() == e.tobytes(), f"{where}: output {k} differs"
            checked += 1
    assert checked or error is not None
