"""The sequence backwards in chunks of steps (blockrnn/_common.pxi,
backward_chunk_steps): the LSTM's (blockrnn/_lstm.pxi), the TF GRU's
(blockrnn/_gru.pxi) and the reset-after GRU's (blockrnn/_gru_reset_after.pxi)
reverse loops keep the gate gradients of one chunk at a time, and the products
over steps (x_grad, the weight gradients) and the bias / peephole sums take
each chunk's rows, added onto the later chunks'.

The shape here gives three chunks, the step range not a multiple of the chunk
(L % S != 0), so every boundary case runs: the chunk that holds step 0 (its
first rows read h_prev and cs_prev), chunks of other lengths, sequence lengths
that end inside a chunk and L < T. Checked against the float64 NumPy reference
(every row run alone for sequence_length), against TensorFlow's
BlockLSTMGradV2, and for thread-count independence.
"""
import os

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import blockrnn
from blockrnn import _kernels
from blockrnn import _reference as ref

from _inputs import check_kernel_variant, rel_err, upstream_grads

# B * 4H = 2**18 floats of gate gradients per step (every family's dG has 4H
# columns): 4 steps per chunk.
T, B, I, H = 11, 128, 6, 512
TOLERANCES = [(np.float64, 1e-12), (np.float32, 1e-4)]
STEPS = [(T, False), (T - 2, False), (T, True)]   # (L, with sequence lengths)


def _inputs(dtype, seed, shapes):
    """Uniform [-1, 1) arrays of `shapes` (name -> (shape, scale))."""
    rng = np.random.default_rng(seed)
    return {k: (rng.uniform(-1, 1, s) * scale).astype(dtype)
            for k, (s, scale) in shapes.items()}


W = 2.0 / np.sqrt(I + H)   # weights large enough that some gates saturate
# family -> (inputs, forward, gradient, its reference, gradient fields, op keywords)
FAMILIES = {
    "lstm": (dict(x=((T, B, I), 1), cs_prev=((B, H), 1), h_prev=((B, H), 1),
                  w=((I + H, 4 * H), W), wci=((H,), 1), wcf=((H,), 1), wco=((H,), 1),
                  b=((4 * H,), 0.5)),
             blockrnn.block_lstm_v2, blockrnn.block_lstm_grad_v2, ref.block_lstm_grad_v2,
             ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad",
              "wco_grad", "b_grad"), dict(use_peephole=True)),
    "lstm-no-peephole": None,   # the LSTM's, with use_peephole=False (filled in below)
    "gru": (dict(x=((T, B, I), 1), h_prev=((B, H), 1), w_ru=((I + H, 2 * H), W),
                 w_c=((I + H, H), W), b_ru=((2 * H,), 0.5), b_c=((H,), 0.5)),
            blockrnn.block_gru, blockrnn.block_gru_grad, ref.block_gru_grad,
            ("x_grad", "h_prev_grad", "w_ru_grad", "w_c_grad", "b_ru_grad", "b_c_grad"), {}),
    "gru-reset-after": (dict(x=((T, B, I), 1), h_prev=((B, H), 1), w_ih=((3 * H, I), W),
                             w_hh=((3 * H, H), W), b_ih=((3 * H,), 0.5),
                             b_hh=((3 * H,), 0.5)),
                        blockrnn.block_gru_reset_after, blockrnn.block_gru_reset_after_grad,
                        ref.block_gru_reset_after_grad,
                        ("x_grad", "h_prev_grad", "w_ih_grad", "w_hh_grad", "b_ih_grad",
                         "b_hh_grad"), {}),
}
FAMILIES["lstm-no-peephole"] = FAMILIES["lstm"][:5] + (dict(use_peephole=False),)


def _upstream(family, dtype, seed):
    names = ("cs_grad", "h_grad") if family.startswith("lstm") else ("h_grad",)
    return list(upstream_grads((T, B, H), names, dtype=dtype, seed=seed).values())


def _lengths(seed):
    lengths = np.random.default_rng(seed).integers(0, T + 1, B)
    lengths[:6] = [T, 0, 1, 4, 5, 8]   # ends at, before and after chunk boundaries
    return lengths


def _run(family, dtype, L, lengths, seed, grad_op=None):
    """(forward outputs, gradients) of `family`; the gradient by grad_op if given."""
    shapes, forward, grad, _, _, kw = FAMILIES[family]
    d = _inputs(dtype, seed, shapes)
    fwd = forward(L, *d.values(), sequence_length=lengths, **kw)
    upstream = _upstream(family, dtype, seed)
    grads = (grad_op or grad)(L, *d.values(), *fwd, *upstream, sequence_length=lengths, **kw)
    return d, fwd, upstream, grads


def test_the_shape_runs_several_chunks():
    S = _kernels.backward_chunk_steps_for(T, B * 4 * H)
    assert S == 4
    assert all(L % S != 0 for L, _ in STEPS)     # a short chunk holds step 0
    assert _kernels.backward_chunk_steps_for(0, B * 4 * H) == 0
    assert _kernels.backward_chunk_steps_for(T, 16) == T   # small: one chunk


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype, tol", TOLERANCES)
@pytest.mark.parametrize("L, with_lengths", STEPS)
def test_chunked_backward_matches_the_reference(family, dtype, tol, L, with_lengths):
    lengths = _lengths(5) if with_lengths else None
    _, _, _, ours = _run(family, dtype, L, lengths, seed=5)
    _, _, _, want = _run(family, dtype, L, lengths, seed=5, grad_op=FAMILIES[family][3])
    for k in FAMILIES[family][4]:
        assert rel_err(getattr(ours, k), getattr(want, k)) <= tol, k
    assert np.all(ours.x_grad[L:] == 0)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_chunked_backward_bits_do_not_depend_on_threads(family, dtype):
    lengths = _lengths(6)
    with threadpool_limits(1, user_api="openmp"):
        one = _run(family, dtype, T, lengths, seed=6)[3]
    with threadpool_limits(2, user_api="openmp"):
        two = _run(family, dtype, T, lengths, seed=6)[3]
    for k in FAMILIES[family][4]:
        assert np.array_equal(getattr(one, k), getattr(two, k)), k


def test_chunked_lstm_backward_matches_tensorflow(tf):
    L = T - 2
    d, fwd, (cs_grad, h_grad), ours = _run("lstm", np.float32, L, None, seed=2)
    theirs = tf.raw_ops.BlockLSTMGradV2(seq_len_max=np.int64(L), **d, **fwd._asdict(),
                                        cs_grad=cs_grad, h_grad=h_grad, use_peephole=True)
    for k in FAMILIES["lstm"][4]:
        assert rel_err(getattr(ours, k), getattr(theirs, k).numpy()) <= 1e-4, k


# Every kernel variant this CPU runs (BLOCKRNN_KERNEL, chosen at import, so each in a
# fresh process): the chunked float32 backwards against the float64 reference, and
# 1 vs 2 threads bit for bit, reusing this module's table.
_VARIANT_CHECK = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import os

import numpy as np
from threadpoolctl import threadpool_limits
from blockrnn import _kernels
import test_backward_chunks as t
assert _kernels.packed_kernel_name() == sys.argv[1], _kernels.packed_kernel_name()
for family, (_, _, _, ref_grad, fields, _) in t.FAMILIES.items():
    lengths = t._lengths(9)
    with threadpool_limits(1, user_api="openmp"):
        one = t._run(family, np.float32, t.T - 2, lengths, seed=9)[3]
    with threadpool_limits(2, user_api="openmp"):
        two = t._run(family, np.float32, t.T - 2, lengths, seed=9)[3]
    want = t._run(family, np.float64, t.T - 2, lengths, seed=9, grad_op=ref_grad)[3]
    for k in fields:
        assert np.array_equal(getattr(one, k), getattr(two, k)), (family, k)
        assert t.rel_err(getattr(one, k), getattr(want, k)) <= 1e-4, (family, k)
print("ok")
"""


@pytest.mark.parametrize("variant", ["avx512", "avx2", "portable"])
def test_chunked_backwards_under_every_kernel_variant(variant):
    check_kernel_variant(variant, _VARIANT_CHECK)
