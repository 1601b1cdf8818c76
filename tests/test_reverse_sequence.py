"""blockrnn.reverse_sequence: each row's valid prefix reversed, padding untouched."""
import numpy as np
import pytest

import blockrnn


def _reference(x, lengths):
    out = x.copy()
    for b, n in enumerate(lengths):
        out[:n, b] = x[:n, b][::-1]
    return out


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.bool_])
@pytest.mark.parametrize("shape", [(5, 3), (5, 3, 4), (7, 4, 2, 3), (1, 1, 1)])
def test_matches_a_python_loop(dtype, shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 10).astype(dtype)
    T, B = shape[:2]
    lengths = rng.integers(0, T + 1, B)
    lengths[0] = T
    out = blockrnn.reverse_sequence(x, lengths)
    assert out.dtype == x.dtype and out.shape == x.shape and out.flags.c_contiguous
    np.testing.assert_array_equal(out, _reference(x, lengths))
    # its own inverse
    np.testing.assert_array_equal(blockrnn.reverse_sequence(out, lengths), x)


def test_none_reverses_all_steps_and_input_variants_agree():
    x = np.arange(2 * 6 * 3 * 4, dtype=np.float32).reshape(6, 3, 2, 4)[:, :, 1]  # strided
    np.testing.assert_array_equal(blockrnn.reverse_sequence(x), x[::-1])
    lengths = np.array([6, 0, 3])
    want = blockrnn.reverse_sequence(np.ascontiguousarray(x), lengths)
    for variant in (x, np.asfortranarray(x), x.astype(">f4"), x[::-1][::-1]):
        np.testing.assert_array_equal(blockrnn.reverse_sequence(variant, lengths), want)


@pytest.mark.parametrize("shape", [(1, 3, 2), (0, 3, 2), (4, 0, 2)])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_result_never_shares_memory_with_x(shape, with_lengths):
    x = np.ones(shape, np.float32)
    lengths = np.full(shape[1], shape[0]) if with_lengths else None
    out = blockrnn.reverse_sequence(x, lengths)
    assert not np.shares_memory(out, x) and out.flags.writeable
    if out.size:
        out[...] = 0
        assert x.all()


def test_empty_arrays():
    for shape in [(0, 3, 2), (4, 0, 2), (4, 3, 0)]:
        x = np.zeros(shape, np.float32)
        lengths = np.zeros(shape[1], np.int64)
        assert blockrnn.reverse_sequence(x, lengths).shape == shape


def test_bad_input_raises_clear_errors():
    x = np.zeros((4, 3, 2), np.float32)
    with pytest.raises(ValueError, match="sequence_length must have shape"):
        blockrnn.reverse_sequence(x, [1, 2])
    with pytest.raises(ValueError, match=r"in \[0, T\]"):
        blockrnn.reverse_sequence(x, [1, 2, 5])
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        blockrnn.reverse_sequence(np.zeros(4), None)
    with pytest.raises(TypeError, match="numeric"):
        blockrnn.reverse_sequence(np.zeros((2, 2), object), [1, 1])


def test_matches_tensorflow():
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 5, 3)).astype(np.float32)
    lengths = np.array([9, 1, 0, 4, 7])
    want = tf.reverse_sequence(x, lengths, seq_axis=0, batch_axis=1).numpy()
    np.testing.assert_array_equal(blockrnn.reverse_sequence(x, lengths), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
@pytest.mark.parametrize("shape", [(6, 3), (7, 3, 5), (4, 2, 3, 70), (1, 2, 3), (0, 2, 3)])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_in_place_matches_reverse_sequence(dtype, shape, with_lengths):
    """reverse_sequence_in_place (the torch ops' and layers' reversal of their new
    outputs) writes reverse_sequence's result over its argument: odd and even
    lengths, zero lengths, rows of more than one swap buffer (70 x 3 x 8 bytes)."""
    from blockrnn.sequence import reverse_sequence_in_place
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    T, B = shape[:2]
    lengths = None
    if with_lengths:
        lengths = rng.integers(0, T + 1, B).astype(np.int64)
        lengths[0] = 0
    want = blockrnn.reverse_sequence(x, lengths)
    a = x.copy()
    out = reverse_sequence_in_place(a, lengths)
    assert out is a
    np.testing.assert_array_equal(a, want)


def test_in_place_rejects_arrays_it_cannot_write_in_place():
    from blockrnn.sequence import reverse_sequence_in_place
    x = np.zeros((4, 3, 2), np.float32)
    ro = x.copy()
    ro.flags.writeable = False
    for bad in (x[:, :, ::2], ro, x.astype(">f4"), x[:, 0, 0]):
        with pytest.raises(ValueError, match="writeable C-contiguous native"):
            reverse_sequence_in_place(bad, None)
