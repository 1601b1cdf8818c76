"""The LSTM sequence kernels read nn.LSTM's weight layout in place (issue 27, point 1).

``blockrnn.lstm._block_lstm_nn`` / ``_block_lstm_nn_grad`` (what ``blockrnn.torch``'s
``lstm_op`` / ``lstm_backward_op`` run) take weight_ih (4H, I) and weight_hh (4H, H) as
stored; the compiled code reads them, and writes their gradients, through strides
(WeightStrides in _lstm.pxi), the same code that reads TensorFlow's w (I+H, 4H). Oracle:
``block_lstm_v2`` / ``block_lstm_grad_v2`` on w = [weight_ih.T; weight_hh.T]. The float32
packed route (every batch size; batch 1 packs W_h in the wide layout) packs the same
values and its GEMM driver sums each element in the same order: the bits are equal. The
BLAS route (float64) multiplies by the other orientation of the weights (a gemm transpose
flag): equal to rounding.
"""
import numpy as np
import pytest
from _inputs import check_kernel_variant

import blockrnn
from blockrnn import _kernels
from blockrnn.lstm import _block_lstm_nn, _block_lstm_nn_grad

# (T, B, I, H): float32 packed route (odd sizes, I = 1, H = 1, batch 1: one-row steps);
# float64: batch 1 (GEMV steps), B = 3 (gemm steps), B >= 4 with H <= T*B (the recurrent
# product by W_h^T, stored as weight_hh) and H > T*B (plain gemm).
SHAPES = [(7, 5, 13, 37), (4, 2, 1, 17), (5, 3, 6, 1), (9, 1, 11, 20), (6, 3, 8, 24),
          (6, 6, 10, 20), (1, 4, 9, 40)]


def _problem(T, B, I, H, dtype, peephole, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(dtype)  # noqa: E731
    w_ih, w_hh = r(4 * H, I, scale=0.3), r(4 * H, H, scale=0.3)
    peeps = [r(H, scale=0.5) if peephole else np.zeros(H, dtype) for _ in range(3)]
    return dict(x=r(T, B, I), cs_prev=r(B, H), h_prev=r(B, H), w_ih=w_ih, w_hh=w_hh,
                peeps=peeps, b=r(4 * H), w=np.concatenate([w_ih.T, w_hh.T]),
                cs_grad=r(T, B, H), h_grad=r(T, B, H))


def _assert_matches(got, want, exact, dtype, what):
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        tol = 1e-12 if dtype == np.float64 else 2e-6
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("with_lengths", [False, True])
def test_nn_layout_matches_tf_layout(shape, dtype, peephole, with_lengths):
    T, B, I, H = shape
    p = _problem(T, B, I, H, dtype, peephole)
    lengths = ((T - 2 * np.arange(B)) % (T + 1)).astype(np.int64) if with_lengths else None
    kw = dict(cell_clip=0.0, use_peephole=peephole, sequence_length=lengths)
    ref = blockrnn.block_lstm_v2(T, p["x"], p["cs_prev"], p["h_prev"], p["w"], *p["peeps"],
                                 p["b"], **kw)
    got = _block_lstm_nn(T, p["x"], p["cs_prev"], p["h_prev"], p["w_ih"], p["w_hh"],
                         *p["peeps"], p["b"], **kw)
    exact = dtype == np.float32   # the packed route: the same bits
    for name in ref._fields:
        _assert_matches(getattr(got, name), getattr(ref, name), exact, dtype, name)

    gates = [ref.i, ref.cs, ref.f, ref.o, ref.ci, ref.co, ref.h]
    kw = dict(use_peephole=peephole, sequence_length=lengths)
    gref = blockrnn.block_lstm_grad_v2(T, p["x"], p["cs_prev"], p["h_prev"], p["w"],
                                       *p["peeps"], p["b"], *gates, p["cs_grad"],
                                       p["h_grad"], **kw)
    g = _block_lstm_nn_grad(T, p["x"], p["cs_prev"], p["h_prev"], p["w_ih"], p["w_hh"],
                            *p["peeps"], p["b"], *gates, p["cs_grad"], p["h_grad"], **kw)
    assert g.w_ih_grad.shape == (4 * H, I) and g.w_hh_grad.shape == (4 * H, H)
    assert g.w_ih_grad.flags.c_contiguous and g.w_hh_grad.flags.c_contiguous
    want = dict(gref._asdict(), w_ih_grad=gref.w_grad[:I].T, w_hh_grad=gref.w_grad[I:].T)
    for name in g._fields:
        _assert_matches(getattr(g, name), want[name], exact, dtype, name)


def test_kernel_entry_refuses_weights_without_a_contiguous_axis():
    """The strided kernel entry checks its weight views (a caller's bug, not a crash)."""
    T, B, I, H = 3, 2, 4, 5
    p = _problem(T, B, I, H, np.float32, False)
    outs = [np.empty((T, B, H), np.float32) for _ in range(7)]
    w_x_bad = np.zeros((2 * I, 8 * H), np.float32)[::2, ::2]   # [I, 4H], no unit stride
    with pytest.raises(ValueError, match="contiguous rows or columns"):
        _kernels.block_lstm_forward(T, p["x"], p["cs_prev"], p["h_prev"], w_x_bad,
                                    p["w_hh"].T, *p["peeps"], p["b"], 0.0, 0.0, False,
                                    _kernels.GateLayout.IFCO, 1, 1, *outs)
    with pytest.raises(ValueError, match=r"\[H, 4H\]"):
        _kernels.block_lstm_forward(T, p["x"], p["cs_prev"], p["h_prev"], p["w_ih"].T,
                                    p["w_ih"].T, *p["peeps"], p["b"], 0.0, 0.0, False,
                                    _kernels.GateLayout.IFCO, 1, 1, *outs)


def test_nn_layout_bad_shapes_are_clear_errors():
    T, B, I, H = 3, 2, 4, 5
    p = _problem(T, B, I, H, np.float64, False)
    args = [T, p["x"], p["cs_prev"], p["h_prev"], p["w_ih"], p["w_hh"], *p["peeps"], p["b"]]
    bad = list(args)
    bad[4] = p["w_ih"].T          # (I, 4H): TensorFlow's orientation, not nn.LSTM's
    with pytest.raises(ValueError, match=r"w_ih must have shape \[4H, I\]"):
        _block_lstm_nn(*bad)
    bad = list(args)
    bad[5] = p["w_hh"][:, :-1]
    with pytest.raises(ValueError, match=r"w_hh must have shape \[4H, H\]"):
        _block_lstm_nn(*bad)


_VARIANT_CHECK = r'''
import sys, numpy as np, blockrnn
from blockrnn.lstm import _block_lstm_nn, _block_lstm_nn_grad
assert blockrnn._kernels.packed_kernel_name() == sys.argv[1]
rng = np.random.default_rng(0)
for T, B, I, H in [(5, 3, 40, 37), (6, 8, 16, 130), (7, 1, 24, 130)]:
    r = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)
    x, c0, h0, w_ih, w_hh, b, dcs, dh = (r(T, B, I), r(B, H), r(B, H), r(4 * H, I),
                                          r(4 * H, H), r(4 * H), r(T, B, H), r(T, B, H))
    p = [np.zeros(H, np.float32)] * 3
    w = np.concatenate([w_ih.T, w_hh.T])
    ref = blockrnn.block_lstm_v2(T, x, c0, h0, w, *p, b)
    got = _block_lstm_nn(T, x, c0, h0, w_ih, w_hh, *p, b)
    for a, e in zip(got, ref):
        np.testing.assert_array_equal(a, e)
    f64 = lambda a: a.astype(np.float64)
    want = blockrnn.block_lstm_v2(T, f64(x), f64(c0), f64(h0), f64(w), *map(f64, p), f64(b))
    np.testing.assert_allclose(got.h, want.h, rtol=1e-4, atol=1e-5)
    gates = [ref.i, ref.cs, ref.f, ref.o, ref.ci, ref.co, ref.h]
    gr = blockrnn.block_lstm_grad_v2(T, x, c0, h0, w, *p, b, *gates, dcs, dh,
                                     use_peephole=False)
    g = _block_lstm_nn_grad(T, x, c0, h0, w_ih, w_hh, *p, b, *gates, dcs, dh,
                            use_peephole=False)
    np.testing.assert_array_equal(g.w_ih_grad, gr.w_grad[:I].T)
    np.testing.assert_array_equal(g.w_hh_grad, gr.w_grad[I:].T)
    np.testing.assert_array_equal(g.x_grad, gr.x_grad)
    np.testing.assert_array_equal(g.h_prev_grad, gr.h_prev_grad)
print("ok")
'''


@pytest.mark.parametrize("variant", ["avx512", "avx2", "portable"])
def test_nn_layout_same_bits_under_every_kernel_variant(variant):
    """Packing either layout gives the same panels (and, at batch 1, the same wide
    blocks: 130 cells on 2 threads split a block), and the GEMM driver sums a gradient
    element in the same order whichever way round its C is stored (gspec_c), under each
    packed-kernel variant this CPU runs (float32, every batch size)."""
    check_kernel_variant(variant, _VARIANT_CHECK)
