"""The LSTM and reset-after GRU kernels read the reverse direction themselves.

``blockrnn.lstm._block_lstm_nn(..., reverse=True)``,
``blockrnn.gru_reset_after._block_gru_reset_after(..., reverse=True)`` and their
gradients (what ``blockrnn.torch``'s reverse direction runs when every row has length
T) take x, the gates and the gradients in x's own time order and run step t at time
T-1-t. Oracle: the
same op on ``x[::-1]`` (``reverse_sequence``'s copies, what the reverse direction did
before), outputs reversed back. Every step computes the same sums in the same order, so
the outputs, x_grad and the initial states' gradients are equal bit for bit; the weight,
bias and peephole gradients sum the steps' rows in the other order (time order): equal
to rounding.
"""
import numpy as np
import pytest
from _inputs import check_kernel_variant

from blockrnn import _kernels
from blockrnn.gru_reset_after import _block_gru_reset_after, _block_gru_reset_after_grad
from blockrnn.lstm import _block_lstm_nn, _block_lstm_nn_grad

# (T, B, I, H): batch 1 (the wide one-row kernel; 130 cells split a block on 2
# threads), odd sizes, 16 rows (split by rows on 2 threads), and backwards of several
# chunks: 65 steps of 32 x 4 x 256 floats are chunks of 32, 32 and 1 steps (the last
# one holds step 0 alone).
SHAPES = [(7, 1, 24, 130), (9, 3, 5, 37), (12, 16, 20, 48), (65, 32, 24, 256), (1, 2, 3, 4)]


def _problem(T, B, I, H, dtype, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(dtype)  # noqa: E731
    return dict(x=r(T, B, I), c0=r(B, H, scale=0.5), h0=r(B, H, scale=0.5),
                w_ih=r(4 * H, I, scale=0.2), w_hh=r(4 * H, H, scale=0.1),
                peeps=[r(H, scale=0.5) for _ in range(3)], b=r(4 * H, scale=0.2),
                dcs=r(T, B, H), dh=r(T, B, H))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("peephole", [False, True])
def test_reverse_equals_the_op_on_reversed_copies(shape, dtype, peephole):
    T, B, I, H = shape
    p = _problem(T, B, I, H, dtype)
    if not peephole:
        p["peeps"] = [np.zeros(H, dtype)] * 3
    args = (p["c0"], p["h0"], p["w_ih"], p["w_hh"], *p["peeps"], p["b"])
    flip = lambda a: np.ascontiguousarray(a[::-1])  # noqa: E731
    ref = _block_lstm_nn(T, flip(p["x"]), *args, use_peephole=peephole)
    got = _block_lstm_nn(T, p["x"], *args, use_peephole=peephole, reverse=True)
    for name in ref._fields:
        np.testing.assert_array_equal(getattr(got, name), flip(getattr(ref, name)),
                                      err_msg=name)

    gref = _block_lstm_nn_grad(T, flip(p["x"]), *args, *ref, flip(p["dcs"]), flip(p["dh"]),
                               use_peephole=peephole)
    g = _block_lstm_nn_grad(T, p["x"], *args, *got, p["dcs"], p["dh"],
                            use_peephole=peephole, reverse=True)
    np.testing.assert_array_equal(g.x_grad, flip(gref.x_grad))
    np.testing.assert_array_equal(g.h_prev_grad, gref.h_prev_grad)
    np.testing.assert_array_equal(g.cs_prev_grad, gref.cs_prev_grad)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for name in ("w_ih_grad", "w_hh_grad", "b_grad", "wci_grad", "wcf_grad", "wco_grad"):
        want = getattr(gref, name)
        np.testing.assert_allclose(getattr(g, name), want, rtol=tol,
                                   atol=tol * max(1.0, float(np.abs(want).max())),
                                   err_msg=name)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gru_reverse_equals_the_op_on_reversed_copies(shape, dtype):
    """The reset-after GRU (nn.GRU's): batch 1 runs the packed forward loop on
    the wide one-row layout and the per-step gemm backward, from 2 rows the packed
    loops; 65 x 32 x 4 x 256 floats of dG are again chunks of 32, 32 and 1 steps."""
    T, B, I, H = shape
    p = _problem(T, B, I, H, dtype)
    rng = np.random.default_rng(1)
    r = lambda *s: (rng.standard_normal(s) * 0.2).astype(dtype)  # noqa: E731
    args = (p["h0"], r(3 * H, I), r(3 * H, H), r(3 * H), r(3 * H))
    flip = lambda a: np.ascontiguousarray(a[::-1])  # noqa: E731
    ref = _block_gru_reset_after(T, flip(p["x"]), *args)
    got = _block_gru_reset_after(T, p["x"], *args, reverse=True)
    for name in ref._fields:
        np.testing.assert_array_equal(getattr(got, name), flip(getattr(ref, name)),
                                      err_msg=name)
    gref = _block_gru_reset_after_grad(T, flip(p["x"]), *args, *ref[:4], ref.h, flip(p["dh"]))
    g = _block_gru_reset_after_grad(T, p["x"], *args, *got[:4], got.h, p["dh"], reverse=True)
    np.testing.assert_array_equal(g.x_grad, flip(gref.x_grad))
    np.testing.assert_array_equal(g.h_prev_grad, gref.h_prev_grad)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for name in ("w_ih_grad", "w_hh_grad", "b_ih_grad", "b_hh_grad"):
        want = getattr(gref, name)
        np.testing.assert_allclose(getattr(g, name), want, rtol=tol,
                                   atol=tol * max(1.0, float(np.abs(want).max())),
                                   err_msg=name)


def test_reverse_needs_rows_of_full_length():
    T, B, I, H = 4, 2, 3, 5
    p = _problem(T, B, I, H, np.float32)
    args = (p["c0"], p["h0"], p["w_ih"], p["w_hh"], *p["peeps"], p["b"])
    with pytest.raises(ValueError, match="reverse=True needs every row at full length"):
        _block_lstm_nn(T, p["x"], *args, reverse=True, sequence_length=np.array([4, 2]))
    with pytest.raises(ValueError, match="got seq_len_max 3"):
        _block_lstm_nn(3, p["x"], *args, reverse=True)
    fwd = _block_lstm_nn(T, p["x"], *args)
    with pytest.raises(ValueError, match="reverse=True needs every row at full length"):
        _block_lstm_nn_grad(T, p["x"], *args, *fwd, p["dcs"], p["dh"], use_peephole=False,
                            sequence_length=np.array([4, 4]), reverse=True)
    with pytest.raises(TypeError, match="reverse"):
        _block_lstm_nn(T, p["x"], *args, reverse="yes")
    gru = (p["h0"], np.zeros((3 * H, I), np.float32), np.zeros((3 * H, H), np.float32),
           np.zeros(3 * H, np.float32), np.zeros(3 * H, np.float32))
    with pytest.raises(ValueError, match="reverse=True needs every row at full length"):
        _block_gru_reset_after(T, p["x"], *gru, reverse=True, sequence_length=np.array([4, 1]))
    g = _block_gru_reset_after(T, p["x"], *gru)
    with pytest.raises(ValueError, match="got seq_len_max 2"):
        _block_gru_reset_after_grad(2, p["x"], *gru, *g, p["dh"], reverse=True)
    outs = [np.empty((T, B, H), np.float32) for _ in range(7)]   # the kernel entry too
    with pytest.raises(ValueError, match="reverse=True needs every row at full length"):
        _kernels.block_lstm_forward(3, p["x"], p["c0"], p["h0"], p["w_ih"].T, p["w_hh"].T,
                                    *p["peeps"], p["b"], 0.0, 0.0, False,
                                    _kernels.GateLayout.IFCO, 1, 1, *outs, None, True)


_VARIANT_CHECK = r'''
import sys, numpy as np, blockrnn
from blockrnn.gru_reset_after import _block_gru_reset_after, _block_gru_reset_after_grad
from blockrnn.lstm import _block_lstm_nn, _block_lstm_nn_grad
assert blockrnn._kernels.packed_kernel_name() == sys.argv[1]
rng = np.random.default_rng(0)
flip = lambda a: np.ascontiguousarray(a[::-1])
for T, B, I, H in [(5, 3, 40, 37), (6, 16, 16, 130), (7, 1, 24, 130)]:
    r = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)
    x, c0, h0, w_ih, w_hh, b, dcs, dh = (r(T, B, I), r(B, H), r(B, H), r(4 * H, I),
                                          r(4 * H, H), r(4 * H), r(T, B, H), r(T, B, H))
    args = (c0, h0, w_ih, w_hh, *[r(H) for _ in range(3)], b)
    ref = _block_lstm_nn(T, flip(x), *args, use_peephole=True)
    got = _block_lstm_nn(T, x, *args, use_peephole=True, reverse=True)
    for a, e in zip(got, ref):
        np.testing.assert_array_equal(a, flip(e))
    gr = _block_lstm_nn_grad(T, flip(x), *args, *ref, flip(dcs), flip(dh), use_peephole=True)
    g = _block_lstm_nn_grad(T, x, *args, *got, dcs, dh, use_peephole=True, reverse=True)
    np.testing.assert_array_equal(g.x_grad, flip(gr.x_grad))
    np.testing.assert_array_equal(g.h_prev_grad, gr.h_prev_grad)
    np.testing.assert_allclose(g.w_hh_grad, gr.w_hh_grad, rtol=1e-5, atol=1e-5)
    gru = (h0, r(3 * H, I), r(3 * H, H), r(3 * H), r(3 * H))
    ref = _block_gru_reset_after(T, flip(x), *gru)
    got = _block_gru_reset_after(T, x, *gru, reverse=True)
    for a, e in zip(got, ref):
        np.testing.assert_array_equal(a, flip(e))
    gr = _block_gru_reset_after_grad(T, flip(x), *gru, *ref, flip(dh))
    g = _block_gru_reset_after_grad(T, x, *gru, *got, dh, reverse=True)
    np.testing.assert_array_equal(g.x_grad, flip(gr.x_grad))
    np.testing.assert_array_equal(g.h_prev_grad, gr.h_prev_grad)
print("ok")
'''


@pytest.mark.parametrize("variant", ["avx512", "avx2", "portable"])
def test_reverse_under_every_kernel_variant(variant):
    """The reverse direction's bits (LSTM and reset-after GRU) under each packed-kernel
    variant this CPU runs (float32; batch 1 reads W_h in the wide layout, 16 rows split
    by rows)."""
    check_kernel_variant(variant, _VARIANT_CHECK)
