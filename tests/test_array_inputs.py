"""What counts as an array argument: dtypes, lists, other libraries' tensors.

Memory layouts (Fortran, strided, read-only) are covered for every op in test_validation.py.
"""
import sys

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


def test_cell_fast_path_is_taken_only_for_plain_arrays():
    """lstm_block_cell/gru_block_cell check plain calls in compiled code; anything
    else (float16, lists, Fortran order, bool attributes...) goes the general way,
    and both ways give the same bits."""
    from blockrnn import _kernels, gru, lstm

    args = [a[0] if a.ndim == 3 else a for a in _lstm_args()[1:]]
    fast = _kernels.lstm_cell_fast(*args, 1.0, 3.0, True, 1 << 20, lstm.LSTMBlockCellOutput)
    assert isinstance(fast, lstm.LSTMBlockCellOutput)
    general = blockrnn.lstm_block_cell(*[np.asfortranarray(a) for a in args],
                                       use_peephole=True)
    _assert_same(fast, general)
    not_plain = [
        ([a.astype(np.float16) for a in args], (1.0, 3.0, True)),
        ([args[0].tolist()] + args[1:], (1.0, 3.0, True)),
        ([np.asfortranarray(args[0])] + args[1:], (1.0, 3.0, True)),
        (args, (1.0, 3.0, 1)),           # use_peephole not a bool: the general path raises
        (args, (True, 3.0, False)),
        (args[:-1] + [args[-1][:-1]], (1.0, 3.0, False)),   # wrong b: general path raises
    ]
    for a, attrs in not_plain:
        assert _kernels.lstm_cell_fast(*a, *attrs, 1 << 20, lstm.LSTMBlockCellOutput) is None
    assert _kernels.lstm_cell_fast(*args, 1.0, 3.0, True, 1, lstm.LSTMBlockCellOutput) is None
    # The namedtuple is built in C: it and each array have exactly one owner.
    assert sys.getrefcount(fast) == 2 and all(sys.getrefcount(a) == 3 for a in fast)
    with pytest.raises(TypeError, match="tuple subclass"):
        _kernels.lstm_cell_fast(*args, 1.0, 3.0, True, 1 << 20, dict)

    rng = np.random.default_rng(1)
    g_args = [rng.uniform(-1, 1, s).astype(np.float64)
              for s in [(B, I), (B, H), (I + H, 2 * H), (I + H, H), (2 * H,), (H,)]]
    fast = _kernels.gru_cell_fast(*g_args, 1 << 20, gru.GRUBlockCellOutput)
    _assert_same(fast, blockrnn.gru_block_cell(*[np.asfortranarray(a) for a in g_args]))
    assert _kernels.gru_cell_fast(*g_args[:-1], g_args[-1][:-1], 1 << 20,
                                  gru.GRUBlockCellOutput) is None


def test_sequence_fast_path_is_taken_only_for_plain_calls():
    """block_lstm/block_lstm_v2 without sequence_length check plain calls in compiled
    code; the general path (here via Fortran-ordered inputs) gives the same bits."""
    from blockrnn import _kernels, lstm

    L, *arrays = _lstm_args()
    for layout, fwd, attrs in [(_kernels.GateLayout.ICFO, blockrnn.block_lstm,
                                dict(forget_bias=0.5, cell_clip=0.2)),
                               (_kernels.GateLayout.IFCO, blockrnn.block_lstm_v2,
                                dict(cell_clip=0.0))]:
        fast = _kernels.block_lstm_fast(L, *arrays, attrs.get("forget_bias", 0.0),
                                        attrs["cell_clip"], True, layout, 1 << 20,
                                        lstm.BlockLSTMOutput)
        assert isinstance(fast, lstm.BlockLSTMOutput)
        general = fwd(L, *[np.asfortranarray(a) for a in arrays], use_peephole=True, **attrs)
        _assert_same(fast, general)
        _assert_same(fast, fwd(L, *arrays, use_peephole=True, **attrs))
        for int_L in (np.int64(L), np.int32(L), np.uint8(L)):   # NumPy integer scalars too
            _assert_same(_kernels.block_lstm_fast(
                int_L, *arrays, attrs.get("forget_bias", 0.0), attrs["cell_clip"], True,
                layout, 1 << 20, lstm.BlockLSTMOutput), fast)
        # the general path converts or raises
        for other_L in (T + 1, -1, True, np.bool_(True), np.int64(T + 1), np.uint64(2**64 - 1),
                        np.array(L), float(L)):
            assert _kernels.block_lstm_fast(other_L, *arrays, 0.0, 0.0, True, layout, 1 << 20,
                                            lstm.BlockLSTMOutput) is None
        short = arrays[:4] + [arrays[4][:-1]] + arrays[5:]   # a peephole vector of H - 1
        assert _kernels.block_lstm_fast(L, *short, 0.0, 0.0, False, layout, 1 << 20,
                                        lstm.BlockLSTMOutput) is None


def test_gru_sequence_fast_path_is_taken_only_for_plain_calls():
    """block_gru without sequence_length checks plain calls in compiled code, with
    the same bits as the general path (Fortran-ordered inputs, or sequence_length)."""
    from blockrnn import _kernels, gru

    rng = np.random.default_rng(2)
    T, B, I, H = 4, 3, 2, 5
    for dtype in (np.float32, np.float64):
        arrays = [rng.uniform(-1, 1, s).astype(dtype) for s in
                  [(T, B, I), (B, H), (I + H, 2 * H), (I + H, H), (2 * H,), (H,)]]
        for L in (T, 2, np.int64(3), 0):
            fast = _kernels.block_gru_fast(L, *arrays, 1 << 20, gru.BlockGRUOutput)
            assert isinstance(fast, gru.BlockGRUOutput) and fast.h.dtype == dtype
            _assert_same(fast, blockrnn.block_gru(L, *[np.asfortranarray(a) for a in arrays]))
            _assert_same(fast, blockrnn.block_gru(L, *arrays, sequence_length=[T] * B))
            _assert_same(fast, blockrnn.block_gru(L, *arrays))
        not_plain = [
            (T + 1, arrays), (True, arrays), (np.array(T), arrays), (float(T), arrays),
            (T, [a.astype(np.float16) for a in arrays]),
            (T, [arrays[0].tolist()] + arrays[1:]),
            (T, [np.asfortranarray(arrays[0])] + arrays[1:]),
            (T, arrays[:1] + [arrays[1][:-1]] + arrays[2:]),   # h_prev of B - 1 rows
            (T, arrays[:5] + [arrays[5][:-1]]),                # b_c of H - 1
            (T, arrays[:2] + [arrays[2][:, :-1]] + arrays[3:]),  # w_ru of 2H - 1 columns
        ]
        for L, a in not_plain:
            assert _kernels.block_gru_fast(L, *a, 1 << 20, gru.BlockGRUOutput) is None
        assert _kernels.block_gru_fast(T, *arrays, B * H, gru.BlockGRUOutput) is None


def _forward_calls(dtype):
    """(name, call) for every forward op, on plain inputs (the compiled fast path)
    and on inputs that take the general path (Fortran order, sequence_length)."""
    from _inputs import block_lstm_inputs, gru_cell_inputs, lstm_cell_inputs

    cell = lstm_cell_inputs(B, I, H, dtype)
    seq = block_lstm_inputs(T, B, I, H, dtype)
    gru_cell = gru_cell_inputs(B, I, H, dtype)
    gru_seq = dict(gru_cell, x=block_lstm_inputs(T, B, I, H, dtype)["x"])
    lengths = np.array([T, 1, 0][:B])
    fortran = lambda d: {k: np.asfortranarray(v) for k, v in d.items()}  # noqa: E731
    return [
        ("lstm_block_cell", lambda: blockrnn.lstm_block_cell(**cell)),
        ("lstm_block_cell F", lambda: blockrnn.lstm_block_cell(**fortran(cell))),
        ("block_lstm", lambda: blockrnn.block_lstm(T, **seq)),
        ("block_lstm lengths", lambda: blockrnn.block_lstm(T, **seq, sequence_length=lengths)),
        ("block_lstm_v2", lambda: blockrnn.block_lstm_v2(T - 1, **seq)),
        ("block_lstm_v2 F", lambda: blockrnn.block_lstm_v2(T - 1, **fortran(seq))),
        ("gru_block_cell", lambda: blockrnn.gru_block_cell(**gru_cell)),
        ("gru_block_cell F", lambda: blockrnn.gru_block_cell(**fortran(gru_cell))),
        ("block_gru", lambda: blockrnn.block_gru(T, **gru_seq)),
        ("block_gru lengths", lambda: blockrnn.block_gru(T, **gru_seq, sequence_length=lengths)),
    ]


def _assert_views_of_one_block(name, out, dtype):
    block = out[0].base
    assert isinstance(block, np.ndarray), name
    assert block.shape == (len(out), *out[0].shape) and block.dtype == dtype, name
    assert block.flags.c_contiguous and block.base is None, name
    for k, a in enumerate(out):
        assert a.base is block and a.dtype == dtype, (name, k)
        assert a.flags.c_contiguous and a.flags.writeable, (name, k)
        assert a.ctypes.data == block[k].ctypes.data, (name, k)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_forward_outputs_are_the_views_of_one_block(dtype):
    """A forward op's small outputs are block[0], block[1], ... of one C-contiguous
    array (one allocation, see new_outputs in _kernels.pyx), on every path and dtype:
    each its own writeable, non-overlapping (T, B, H) or (B, H) slab, in field order."""
    for name, call in _forward_calls(dtype):
        out = call()
        _assert_views_of_one_block(name, out, dtype)
        # One output written over leaves the others as they were.
        before = [np.copy(a) for a in out]
        out[-1][...] = 7
        for a, b in zip(out[:-1], before[:-1]):
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", ["C", "F"])   # the compiled fast path, the general path
def test_outputs_of_4_mb_or_more_are_separate_arrays(dtype, order):
    """From SHARED_BLOCK_BYTES (4 MB) per output on, each output is its own array
    on its own block (on Linux mapped by blockrnn, starting on a 2 MB huge-page
    frame: include/brnn_alloc.h), writeable, sharing no memory with the others;
    one element less and they share a block."""
    from _inputs import gru_cell_inputs, lstm_cell_inputs
    from blockrnn import _kernels

    H = 8
    rows = _kernels.SHARED_BLOCK_BYTES // (H * np.dtype(dtype).itemsize)
    for B in (rows, rows - 1):
        lstm = {k: np.asarray(v, order=order) for k, v in lstm_cell_inputs(B, 1, H, dtype).items()}
        gru = {k: np.asarray(v, order=order) for k, v in gru_cell_inputs(B, 1, H, dtype).items()}
        seq = dict(lstm, x=lstm["x"][None])
        gru_seq = dict(gru, x=gru["x"][None])
        for name, out in [("lstm_block_cell", blockrnn.lstm_block_cell(**lstm)),
                          ("block_lstm_v2", blockrnn.block_lstm_v2(1, **seq)),
                          ("gru_block_cell", blockrnn.gru_block_cell(**gru)),
                          ("block_gru", blockrnn.block_gru(1, **gru_seq))]:
            if B == rows:
                for k, a in enumerate(out):
                    assert not isinstance(a.base, np.ndarray), (name, k)
                    assert a.flags.c_contiguous and a.flags.writeable, (name, k)
                    if sys.platform.startswith("linux"):
                        assert a.ctypes.data % (1 << 21) == 0, (name, k)
                    assert not any(np.shares_memory(a, b) for b in out[k + 1:]), (name, k)
            else:
                _assert_views_of_one_block((name, B), out, dtype)


def test_float16_outputs_of_4_mb_or_more_in_float32():
    """float16 is computed in float32: from SHARED_BLOCK_BYTES per float32 output on,
    the compute buffers are separate arrays (their bases are blockrnn's mapped
    blocks, not an ndarray) and each is rounded to float16 by itself (this raised
    AttributeError once: the conversion took a base for a block of outputs); the
    answers are the float32 answers rounded once, one float16 array each."""
    from _inputs import gru_cell_inputs, lstm_cell_inputs
    from blockrnn import _kernels

    H = 8
    B = _kernels.SHARED_BLOCK_BYTES // (H * 4)
    lstm16, gru16 = lstm_cell_inputs(B, 1, H, np.float16), gru_cell_inputs(B, 1, H, np.float16)

    def outputs(dtype):   # the four ops on the float16 inputs, given as `dtype`
        lstm = {k: v.astype(dtype) for k, v in lstm16.items()}
        gru = {k: v.astype(dtype) for k, v in gru16.items()}
        return [("lstm_block_cell", blockrnn.lstm_block_cell(**lstm)),
                ("block_lstm_v2", blockrnn.block_lstm_v2(1, **dict(lstm, x=lstm["x"][None]))),
                ("gru_block_cell", blockrnn.gru_block_cell(**gru)),
                ("block_gru", blockrnn.block_gru(1, **dict(gru, x=gru["x"][None])))]

    for (name, half), (_, full) in zip(outputs(np.float16), outputs(np.float32)):
        for k, (a, want) in enumerate(zip(half, full)):
            assert a.dtype == np.float16 and a.shape == want.shape, (name, k)
            assert not any(np.shares_memory(a, b) for b in half[k + 1:]), (name, k)
            # float16 inputs are exact in float32: the same sums, one rounding
            np.testing.assert_array_equal(a, want.astype(np.float16), err_msg=name)


def _swapped(a):
    """The same values in the other byte order (big-endian on this machine)."""
    return a.astype(a.dtype.newbyteorder("S"))


def test_fast_paths_decline_non_native_byte_order():
    """The compiled fast paths read raw memory: a byte-swapped argument (even one)
    must send the call to the general path, never be read as native numbers."""
    from blockrnn import _kernels, gru, lstm

    L, *arrays = _lstm_args(np.float64)
    for k in range(len(arrays)):
        a = list(arrays)
        a[k] = _swapped(a[k])
        assert _kernels.block_lstm_fast(L, *a, 1.0, 0.0, False, _kernels.GateLayout.ICFO,
                                        1 << 20, lstm.BlockLSTMOutput) is None, k
        cell = [v[0] if v.ndim == 3 else v for v in a]
        assert _kernels.lstm_cell_fast(*cell, 1.0, 0.0, False, 1 << 20,
                                       lstm.LSTMBlockCellOutput) is None, k
    rng = np.random.default_rng(3)
    g = [rng.uniform(-1, 1, s) for s in [(T, B, I), (B, H), (I + H, 2 * H), (I + H, H),
                                         (2 * H,), (H,)]]
    for k in range(len(g)):
        a = list(g)
        a[k] = _swapped(a[k])
        assert _kernels.block_gru_fast(T, *a, 1 << 20, gru.BlockGRUOutput) is None, k
        assert _kernels.gru_cell_fast(a[0][0], *a[1:], 1 << 20,
                                      gru.GRUBlockCellOutput) is None, k


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_non_native_byte_order_is_computed_as_its_native_copy(dtype):
    """Big-endian arrays (as read from many file formats) give the bits of the
    native-order call, forward and gradient, in every dtype; so do big-endian
    integer sequence lengths."""
    from _inputs import block_lstm_grad_inputs, gru_cell_inputs, lstm_cell_inputs

    swap = lambda d: {k: _swapped(v) if isinstance(v, np.ndarray) else v  # noqa: E731
                      for k, v in d.items()}
    cell = lstm_cell_inputs(B, I, H, dtype)
    grad = block_lstm_grad_inputs(T, B, I, H, T - 1, dtype)
    seq = {k: grad[k] for k in ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")}
    gcell = gru_cell_inputs(B, I, H, dtype)
    gseq = dict(gcell, x=seq["x"])
    lengths = np.array([T, 1, 0][:B])
    calls = [
        lambda d: blockrnn.lstm_block_cell(**d, use_peephole=True),
        lambda d: blockrnn.block_lstm(T, **d, use_peephole=True),
        lambda d: blockrnn.block_lstm_v2(T, **d, cell_clip=0.5),
        lambda d: blockrnn.gru_block_cell(**d),
        lambda d: blockrnn.block_gru(T, **d),
        lambda d: blockrnn.block_lstm_grad(**d, use_peephole=True),
        lambda d: blockrnn.block_lstm_grad_v2(**d, use_peephole=False),
    ]
    for call, d in zip(calls, [cell, seq, seq, gcell, gseq, grad, grad]):
        native = call(d)
        _assert_same(call(swap(d)), native)
        one = dict(d, w=_swapped(d["w"])) if "w" in d else dict(d, w_c=_swapped(d["w_c"]))
        _assert_same(call(one), native)
    for op in (blockrnn.block_lstm, blockrnn.block_lstm_v2, blockrnn.block_gru):
        d = seq if op is not blockrnn.block_gru else gseq
        _assert_same(op(T, **swap(d), sequence_length=_swapped(lengths)),
                     op(T, **d, sequence_length=lengths))


def test_kernels_get_aligned_copies_of_unaligned_arrays():
    """An unaligned view (data one byte off) is C-contiguous, so ascontiguousarray
    would hand it to the kernels as is; they read whole floats from it (undefined
    behaviour in C, reported by UBSan). The admission copies it instead."""
    from blockrnn._validation import Arrays, check_sequence_length
    for dtype in (np.float32, np.float64):
        raw = np.zeros(3 * 4 * np.dtype(dtype).itemsize + 1, np.uint8)[1:]
        x = raw.view(dtype).reshape(3, 4)
        x[...] = np.arange(12).reshape(3, 4)
        assert not x.flags.aligned and x.flags.c_contiguous
        (got,) = Arrays("block_gru", x=x).kernel("x")
        assert got.flags.aligned and got.flags.c_contiguous
        np.testing.assert_array_equal(got, x)
    lengths = np.zeros(4 * 8 + 1, np.uint8)[1:].view(np.int64)
    assert not lengths.flags.aligned
    assert check_sequence_length("block_gru", lengths, 4, 3).flags.aligned
