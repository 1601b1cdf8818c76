"""What counts as an array argument: memory layouts, dtypes, lists, other libraries' tensors."""
import numpy as np
import pytest

import blockrnn
from blockrnn import _reference

T, B, I, H = 4, 3, 5, 2


def _lstm_args(dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    rand = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    return (T - 1, rand(T, B, I), rand(B, H), rand(B, H), rand(I + H, 4 * H),
            rand(H), rand(H), rand(H), rand(4 * H))


def _assert_same(a, b):
    assert a._fields == b._fields
    for name, x, y in zip(a._fields, a, b):
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def _fortran(a):
    return np.asfortranarray(a)


def _strided(a):
    """Same values, every axis strided by 2 inside a bigger buffer."""
    big = np.zeros(tuple(2 * d for d in a.shape), a.dtype)
    view = big[tuple(slice(None, None, 2) for _ in a.shape)]
    view[...] = a
    return view


def _reversed(a):
    """Same values, negatively strided along every axis."""
    rev = np.ascontiguousarray(a[tuple(slice(None, None, -1) for _ in a.shape)])
    return rev[tuple(slice(None, None, -1) for _ in a.shape)]


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("layout", [_fortran, _strided, _reversed, _read_only])
def test_memory_layouts_give_the_contiguous_result(layout):
    args = _lstm_args()
    expected = blockrnn.block_lstm(*args, use_peephole=True)
    arrays = [layout(a) for a in args[1:]]
    assert not all(a.flags.c_contiguous and a.flags.writeable for a in arrays if a.ndim > 1)
    _assert_same(blockrnn.block_lstm(args[0], *arrays, use_peephole=True), expected)

    grads_in = (np.ones((T, B, H), np.float32), np.full((T, B, H), 0.5, np.float32))
    expected_grad = blockrnn.block_lstm_grad(*args, *expected, *grads_in, use_peephole=True)
    got_grad = blockrnn.block_lstm_grad(args[0], *arrays, *map(layout, expected),
                                        *map(layout, grads_in), use_peephole=True)
    _assert_same(got_grad, expected_grad)


@pytest.mark.parametrize("layout", [_fortran, _strided, _reversed, _read_only])
def test_memory_layouts_gru(layout):
    rng = np.random.default_rng(1)
    args = [rng.uniform(-1, 1, s).astype(np.float32)
            for s in [(B, I), (B, H), (I + H, 2 * H), (I + H, H), (2 * H,), (H,)]]
    expected = blockrnn.gru_block_cell(*args)
    _assert_same(blockrnn.gru_block_cell(*map(layout, args)), expected)
    d_h = np.ones((B, H), np.float32)
    _assert_same(blockrnn.gru_block_cell_grad_full(*map(layout, args), *map(layout, expected[:3]),
                                                   layout(d_h)),
                 blockrnn.gru_block_cell_grad_full(*args, *expected[:3], d_h))


def test_inputs_are_not_modified():
    args = _lstm_args()
    copies = [np.copy(a) for a in args[1:]]
    fwd = blockrnn.block_lstm(*args, use_peephole=True)
    fwd_copies = [np.copy(a) for a in fwd]
    blockrnn.block_lstm_grad(*args, *fwd, *fwd[1::5], use_peephole=True)
    for a, c in zip(args[1:] + tuple(fwd), copies + fwd_copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_outputs_have_the_input_dtype(dtype):
    args = _lstm_args(dtype)
    out = blockrnn.block_lstm(*args)
    assert all(o.dtype == dtype for o in out)
    cell = blockrnn.lstm_block_cell(*(a[0] if a.ndim == 3 else a for a in args[1:]))
    assert all(o.dtype == dtype for o in cell)


def test_lists_and_scalars_take_the_dtype_of_x():
    seq_len_max, x, cs, h, w, wci, wcf, wco, b = _lstm_args(np.float64)
    expected = blockrnn.block_lstm(seq_len_max, x, cs, h, w, wci, wcf, wco, b)
    got = blockrnn.block_lstm(seq_len_max, x, cs.tolist(), h.tolist(), w.tolist(),
                              wci.tolist(), wcf.tolist(), wco.tolist(), b.tolist())
    _assert_same(got, expected)
    # float32 x: the lists become float32, as TensorFlow converts them.
    got32 = blockrnn.block_lstm(seq_len_max, x.astype(np.float32), cs.tolist(), h.tolist(),
                                w.tolist(), wci.tolist(), wcf.tolist(), wco.tolist(), b.tolist())
    assert all(o.dtype == np.float32 for o in got32)


def test_all_lists_default_to_float32():
    args = _lstm_args(np.float32)
    out = blockrnn.block_lstm(args[0], *(a.tolist() for a in args[1:]))
    _assert_same(out, blockrnn.block_lstm(*args))


def test_seq_len_max_accepts_any_integer_scalar():
    args = _lstm_args()
    expected = blockrnn.block_lstm(*args)
    for L in (np.int64(args[0]), np.int32(args[0]), np.array(args[0], dtype=np.uint8)):
        _assert_same(blockrnn.block_lstm(L, *args[1:]), expected)


def test_tensorflow_tensors_are_accepted(tf):
    args = _lstm_args()
    expected = blockrnn.block_lstm(*args, use_peephole=True)
    tensors = [tf.constant(a) for a in args[1:]]
    got = blockrnn.block_lstm(tf.constant(args[0], tf.int64), *tensors, use_peephole=True)
    _assert_same(got, expected)


def test_float64_is_exact_to_the_reference():
    args = _lstm_args(np.float64)
    ours = blockrnn.block_lstm(*args, use_peephole=True, cell_clip=0.5)
    ref = _reference.block_lstm(*args, use_peephole=True, cell_clip=0.5)
    for o, r in zip(ours, ref):
        np.testing.assert_allclose(o, r, rtol=1e-12, atol=1e-14)


def test_raw_ops_are_keyword_only_and_accept_name():
    args = _lstm_args()
    names = ("seq_len_max", "x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
    kwargs = dict(zip(names, args))
    _assert_same(blockrnn.raw_ops.BlockLSTM(**kwargs, name="layer"), blockrnn.block_lstm(*args))
    with pytest.raises(TypeError):
        blockrnn.raw_ops.BlockLSTM(*args)
    with pytest.raises(TypeError, match="forget_bias"):
        blockrnn.raw_ops.BlockLSTMV2(**kwargs, forget_bias=1.0)
    with pytest.raises(TypeError, match="use_peephole"):
        blockrnn.raw_ops.BlockLSTMGrad(**kwargs)  # use_peephole is required
