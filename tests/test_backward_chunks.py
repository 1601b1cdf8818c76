"""The sequence backwards in chunks of steps (blockrnn/_common.pxi,
backward_chunk_steps): the LSTM's (blockrnn/_lstm.pxi), the TF GRU's
(blockrnn/_gru.pxi) and the reset-after GRU's (blockrnn/_gru_reset_after.pxi)
reverse loops keep the gate gradients of
one chunk at a time, and the products over steps (x_grad, the weight
gradients) and the bias / peephole sums take each chunk's rows, added onto the
later chunks'.

The shapes here give three or more chunks, the step range not a multiple of
the chunk (L % S != 0), so every boundary case runs: the chunk that holds
step 0 (its first rows read h_prev and cs_prev), chunks of other lengths,
sequence lengths that end inside a chunk and L < T. Checked against the
float64 NumPy reference (every row run alone for sequence_length), against
TensorFlow's BlockLSTMGradV2, and for thread-count independence.
"""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import blockrnn
from blockrnn import _kernels
from blockrnn import _reference as ref

from _inputs import block_lstm_inputs, rel_err, upstream_grads

# B * 4H = 2**18 floats per step: 4 steps per chunk.
T, B, I, H = 11, 128, 6, 512
GRAD_FIELDS = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad",
               "wco_grad", "b_grad")


def _case(dtype, seed=0):
    d = block_lstm_inputs(T, B, I, H, dtype, seed)
    d["w"] = d["w"] * 4   # saturate some gates less rarely than 1/sqrt(I+H) weights
    return d


def test_the_shape_runs_several_chunks():
    S = _kernels.backward_chunk_steps_for(T, B * 4 * H)
    assert S == 4
    assert T % S != 0 and (T - 2) % S != 0       # L = T and L = T - 2: a short chunk
    assert _kernels.backward_chunk_steps_for(0, B * 4 * H) == 0
    assert _kernels.backward_chunk_steps_for(T, 16) == T   # small: one chunk


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-4)])
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("L", [T, T - 2])
def test_chunked_backward_matches_the_reference(dtype, tol, use_peephole, L):
    d = _case(dtype)
    fwd = blockrnn.block_lstm_v2(L, *d.values(), use_peephole=use_peephole)
    g = upstream_grads((T, B, H), dtype=dtype)
    ours = blockrnn.block_lstm_grad_v2(L, *d.values(), *fwd, *g.values(),
                                       use_peephole=use_peephole)
    want = ref.block_lstm_grad_v2(L, *d.values(), *fwd, *g.values(), use_peephole=use_peephole)
    for k in GRAD_FIELDS:
        assert rel_err(getattr(ours, k), getattr(want, k)) <= tol, k
    assert np.all(ours.x_grad[L:] == 0)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_chunked_backward_with_sequence_length(dtype, tol):
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, T + 1, B)
    lengths[:6] = [T, 0, 1, 4, 5, 8]   # ends at, before and after chunk boundaries
    d = _case(dtype, seed=1)
    fwd = blockrnn.block_lstm_v2(T, *d.values(), use_peephole=True, sequence_length=lengths)
    g = upstream_grads((T, B, H), dtype=dtype, seed=1)
    ours = blockrnn.block_lstm_grad_v2(T, *d.values(), *fwd, *g.values(), use_peephole=True,
                                       sequence_length=lengths)
    want = ref.block_lstm_grad_v2(T, *d.values(), *fwd, *g.values(), use_peephole=True,
                                  sequence_length=lengths)
    for k in GRAD_FIELDS:
        assert rel_err(getattr(ours, k), getattr(want, k)) <= tol, k


def test_chunked_backward_matches_tensorflow(tf):
    d = _case(np.float32, seed=2)
    L = T - 2
    fwd = blockrnn.block_lstm_v2(L, *d.values(), use_peephole=True)
    g = upstream_grads((T, B, H), dtype=np.float32, seed=2)
    ours = blockrnn.block_lstm_grad_v2(L, *d.values(), *fwd, *g.values(), use_peephole=True)
    args = dict(seq_len_max=np.int64(L), **d, **fwd._asdict(), **g)
    theirs = tf.raw_ops.BlockLSTMGradV2(**args, use_peephole=True)
    for k in GRAD_FIELDS:
        assert rel_err(getattr(ours, k), getattr(theirs, k).numpy()) <= 1e-4, k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_backward_bits_do_not_depend_on_threads(dtype):
    d = _case(dtype, seed=4)
    lengths = np.random.default_rng(4).integers(0, T + 1, B)
    fwd = blockrnn.block_lstm_v2(T, *d.values(), use_peephole=True, sequence_length=lengths)
    g = upstream_grads((T, B, H), dtype=dtype, seed=4)
    run = lambda: blockrnn.block_lstm_grad_v2(  # noqa: E731
        T, *d.values(), *fwd, *g.values(), use_peephole=True, sequence_length=lengths)
    with threadpool_limits(1, user_api="openmp"):
        one = run()
    with threadpool_limits(2, user_api="openmp"):
        two = run()
    for k in GRAD_FIELDS:
        assert np.array_equal(getattr(one, k), getattr(two, k)), k


# ---- the reset-after GRU (nn.GRU's), chunked the same way ----
GRU_GRAD_FIELDS = ("x_grad", "h_prev_grad", "w_ih_grad", "w_hh_grad", "b_ih_grad",
                   "b_hh_grad")


def _gru_case(dtype, seed=0):
    rng = np.random.default_rng(seed)
    u = lambda *s, scale=1.0: (rng.uniform(-1, 1, s) * scale).astype(dtype)  # noqa: E731
    ws = 2.0 / np.sqrt(I + H)
    return dict(x=u(T, B, I), h_prev=u(B, H), w_ih=u(3 * H, I, scale=ws),
                w_hh=u(3 * H, H, scale=ws), b_ih=u(3 * H, scale=0.5), b_hh=u(3 * H, scale=0.5))


def _gru_grads(impl, L, d, h_grad, lengths):
    fwd = blockrnn.block_gru_reset_after(L, *d.values(), sequence_length=lengths)
    return fwd, impl.block_gru_reset_after_grad(L, *d.values(), *fwd, h_grad,
                                                sequence_length=lengths)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-4)])
@pytest.mark.parametrize("L, with_lengths", [(T, False), (T - 2, False), (T, True)])
def test_chunked_gru_reset_after_backward_matches_the_reference(dtype, tol, L, with_lengths):
    assert _kernels.backward_chunk_steps_for(T, B * 4 * H) == 4   # dG: [rows, 4H]
    d = _gru_case(dtype, seed=5)
    lengths = None
    if with_lengths:
        lengths = np.random.default_rng(5).integers(0, T + 1, B)
        lengths[:6] = [T, 0, 1, 4, 5, 8]
    h_grad = upstream_grads((T, B, H), ("h_grad",), dtype=dtype, seed=5)["h_grad"]
    _, ours = _gru_grads(blockrnn, L, d, h_grad, lengths)
    fwd = blockrnn.block_gru_reset_after(L, *d.values(), sequence_length=lengths)
    want = ref.block_gru_reset_after_grad(L, *d.values(), *fwd, h_grad,
                                          sequence_length=lengths)
    for k in GRU_GRAD_FIELDS:
        assert rel_err(getattr(ours, k), getattr(want, k)) <= tol, k
    assert np.all(ours.x_grad[L:] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_gru_reset_after_bits_do_not_depend_on_threads(dtype):
    d = _gru_case(dtype, seed=6)
    lengths = np.random.default_rng(6).integers(0, T + 1, B)
    h_grad = upstream_grads((T, B, H), ("h_grad",), dtype=dtype, seed=6)["h_grad"]
    with threadpool_limits(1, user_api="openmp"):
        _, one = _gru_grads(blockrnn, T, d, h_grad, lengths)
    with threadpool_limits(2, user_api="openmp"):
        _, two = _gru_grads(blockrnn, T, d, h_grad, lengths)
    for k in GRU_GRAD_FIELDS:
        assert np.array_equal(getattr(one, k), getattr(two, k)), k


# ---- the TF GRU (GRUBlockCell over a sequence), chunked the same way ----
TF_GRU_GRAD_FIELDS = ("x_grad", "h_prev_grad", "w_ru_grad", "w_c_grad", "b_ru_grad",
                      "b_c_grad")


def _tf_gru_case(dtype, seed=0):
    rng = np.random.default_rng(seed)
    u = lambda *s, scale=1.0: (rng.uniform(-1, 1, s) * scale).astype(dtype)  # noqa: E731
    ws = 2.0 / np.sqrt(I + H)
    return dict(x=u(T, B, I), h_prev=u(B, H), w_ru=u(I + H, 2 * H, scale=ws),
                w_c=u(I + H, H, scale=ws), b_ru=u(2 * H, scale=0.5), b_c=u(H, scale=0.5))


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-4)])
@pytest.mark.parametrize("L, with_lengths", [(T, False), (T - 2, False), (T, True)])
def test_chunked_tf_gru_backward_matches_the_reference(dtype, tol, L, with_lengths):
    d = _tf_gru_case(dtype, seed=7)
    lengths = None
    if with_lengths:
        lengths = np.random.default_rng(7).integers(0, T + 1, B)
        lengths[:6] = [T, 0, 1, 4, 5, 8]
    h_grad = upstream_grads((T, B, H), ("h_grad",), dtype=dtype, seed=7)["h_grad"]
    fwd = blockrnn.block_gru(L, *d.values(), sequence_length=lengths)
    ours = blockrnn.block_gru_grad(L, *d.values(), *fwd, h_grad, sequence_length=lengths)
    want = ref.block_gru_grad(L, *d.values(), *fwd, h_grad, sequence_length=lengths)
    for k in TF_GRU_GRAD_FIELDS:
        assert rel_err(getattr(ours, k), getattr(want, k)) <= tol, k
    assert np.all(ours.x_grad[L:] == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_tf_gru_bits_do_not_depend_on_threads(dtype):
    d = _tf_gru_case(dtype, seed=8)
    lengths = np.random.default_rng(8).integers(0, T + 1, B)
    h_grad = upstream_grads((T, B, H), ("h_grad",), dtype=dtype, seed=8)["h_grad"]
    fwd = blockrnn.block_gru(T, *d.values(), sequence_length=lengths)
    run = lambda: blockrnn.block_gru_grad(  # noqa: E731
        T, *d.values(), *fwd, h_grad, sequence_length=lengths)
    with threadpool_limits(1, user_api="openmp"):
        one = run()
    with threadpool_limits(2, user_api="openmp"):
        two = run()
    for k in TF_GRU_GRAD_FIELDS:
        assert np.array_equal(getattr(one, k), getattr(two, k)), k
