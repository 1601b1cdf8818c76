"""Float64 central finite-difference checks of every backward op against its forward op.

Independent of TensorFlow.  The loss is a fixed random linear functional of the forward
outputs that the grad ops consume:  LSTM  loss = Σ cs·Gcs + Σ h·Gh  (all timesteps for the
sequence ops), GRU  loss = Σ h·Gh.  Clipping is kept inactive (cell_clip = 0 or 100): the
spec's gradients are straight-through w.r.t. the clip, which is checked separately against
blockrnn._reference.  Spec: FD agrees to 1e-9..1e-10 in float64; we allow 1e-7 relative to
max(1, |g|).
"""
import numpy as np
import pytest

import blockrnn

EPS = 1e-6
TOL = 1e-7


# ----------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------

def fd_grad(loss, arrays, name, eps=EPS):
    """Central-difference gradient of loss(**arrays) w.r.t. arrays[name], one element at
    a time (arrays are copied; the caller's are not modified)."""
    arrs = {k: (np.array(v, dtype=np.float64, copy=True) if isinstance(v, np.ndarray) else v)
            for k, v in arrays.items()}
    a = arrs[name]
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        orig = a[idx]
        a[idx] = orig + eps
        lp = loss(**arrs)
        a[idx] = orig - eps
        lm = loss(**arrs)
        a[idx] = orig
        g[idx] = (lp - lm) / (2 * eps)
    return g


def assert_grad(actual, expected, what, tol=TOL):
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert actual.dtype == np.float64, (what, actual.dtype)
    if actual.size == 0:
        return
    err = np.abs(actual - expected) / np.maximum(1.0, np.abs(expected))
    assert np.all(np.isfinite(actual)), what
    assert err.max() <= tol, (f"{what}: max rel err {err.max():.3e}\n"
                              f"actual=\n{actual}\nfinite differences=\n{expected}")


def rnd(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape)


def lstm_params(rng, B, I, H, T=None):
    x = rnd(rng, B, I) if T is None else rnd(rng, T, B, I)
    return dict(x=x, cs_prev=rnd(rng, B, H), h_prev=rnd(rng, B, H),
                w=rnd(rng, I + H, 4 * H, lo=-0.8, hi=0.8), wci=rnd(rng, H), wcf=rnd(rng, H),
                wco=rnd(rng, H), b=rnd(rng, 4 * H, lo=-0.5, hi=0.5))


LSTM_ARGS = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
CELL_FWD = ("i", "cs", "f", "o", "ci", "co")
SEQ_FWD = ("i", "cs", "f", "o", "ci", "co", "h")


# ----------------------------------------------------------------------------------
# LSTMBlockCell / LSTMBlockCellGrad / lstm_block_cell_grad_full
# ----------------------------------------------------------------------------------

CELL_CASES = [
    # B, I, H, use_peephole, forget_bias, cell_clip
    pytest.param(1, 2, 2, True, 1.0, 0.0, id="B1-peep"),
    pytest.param(3, 4, 3, True, 0.7, 0.0, id="B3-peep"),
    pytest.param(3, 4, 3, False, 0.7, 0.0, id="B3-nopeep"),
    pytest.param(2, 1, 1, True, -1.5, 100.0, id="B2-H1-peep-clip100"),
    pytest.param(2, 3, 2, False, 1.0, 100.0, id="B2-nopeep-clip100"),
]


def _cell_setup(B, I, H, use_peephole, forget_bias, cell_clip, seed):
    rng = np.random.default_rng(seed)
    p = lstm_params(rng, B, I, H)
    Gcs, Gh = rnd(rng, B, H), rnd(rng, B, H)
    attrs = dict(forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole)

    def loss(**a):
        out = blockrnn.lstm_block_cell(*(a[k] for k in LSTM_ARGS), **attrs)
        gcs = a.get("Gcs", Gcs)
        gh = a.get("Gh", Gh)
        return float(np.sum(out.cs * gcs) + np.sum(out.h * gh))

    out = blockrnn.lstm_block_cell(*(p[k] for k in LSTM_ARGS), **attrs)
    if cell_clip > 0:
        assert np.abs(out.cs).max() < cell_clip  # clipping must be inactive here
    grad_args = [p[k] for k in LSTM_ARGS] + [getattr(out, k) for k in CELL_FWD] + [Gcs, Gh]
    return p, Gcs, Gh, attrs, loss, out, grad_args


@pytest.mark.parametrize("B,I,H,use_peephole,forget_bias,cell_clip", CELL_CASES)
def test_lstm_block_cell_grad(B, I, H, use_peephole, forget_bias, cell_clip):
    p, Gcs, Gh, attrs, loss, out, grad_args = _cell_setup(
        B, I, H, use_peephole, forget_bias, cell_clip, seed=10 + B * 7 + H)
    g = blockrnn.lstm_block_cell_grad(*grad_args, use_peephole=use_peephole)
    assert g._fields == ("cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad")
    assert_grad(g.cs_prev_grad, fd_grad(loss, p, "cs_prev"), "cs_prev_grad")
    for k in ("wci", "wcf", "wco"):
        fd = fd_grad(loss, p, k)
        if not use_peephole:
            assert not np.any(fd)
        assert_grad(getattr(g, k + "_grad"), fd, k + "_grad")
    # dicfo = d loss / d g (pre-activation, ICFO, before forget_bias / peepholes).
    # Rows are independent, so row r of dicfo is the FD over b of the loss of row r alone.
    dicfo_fd = np.zeros((B, 4 * H))
    for r in range(B):
        pr = {k: (v[r:r + 1] if v.ndim == 2 and k not in ("w",) else v) for k, v in p.items()}
        pr["Gcs"], pr["Gh"] = Gcs[r:r + 1], Gh[r:r + 1]
        dicfo_fd[r] = fd_grad(loss, pr, "b")
    assert_grad(g.dicfo, dicfo_fd, "dicfo")
    # and the batch sum is the FD over b of the full loss
    assert_grad(g.dicfo.sum(axis=0), fd_grad(loss, p, "b"), "sum_b dicfo")


@pytest.mark.parametrize("B,I,H,use_peephole,forget_bias,cell_clip", CELL_CASES)
def test_lstm_block_cell_grad_full(B, I, H, use_peephole, forget_bias, cell_clip):
    p, Gcs, Gh, attrs, loss, out, grad_args = _cell_setup(
        B, I, H, use_peephole, forget_bias, cell_clip, seed=20 + B * 7 + H)
    g = blockrnn.lstm_block_cell_grad_full(*grad_args, use_peephole=use_peephole)
    assert g._fields == ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad",
                         "wcf_grad", "wco_grad", "b_grad")
    for k in LSTM_ARGS:
        assert_grad(getattr(g, k + "_grad"), fd_grad(loss, p, k), k + "_grad")


def test_lstm_block_cell_grad_full_none_upstream_is_zero():
    _, Gcs, Gh, _, _, _, grad_args = _cell_setup(2, 3, 2, True, 1.0, 0.0, seed=30)
    z = np.zeros_like(Gcs)
    for none_idx in (-2, -1):  # cs_grad=None, h_grad=None
        args_none = list(grad_args)
        args_none[none_idx] = None
        args_zero = list(grad_args)
        args_zero[none_idx] = z
        a = blockrnn.lstm_block_cell_grad_full(*args_none, use_peephole=True)
        b = blockrnn.lstm_block_cell_grad_full(*args_zero, use_peephole=True)
        for u, v in zip(a, b):
            np.testing.assert_allclose(u, v, rtol=1e-14, atol=1e-15)


# ----------------------------------------------------------------------------------
# BlockLSTM(V2) / BlockLSTMGrad(V2)
# ----------------------------------------------------------------------------------

SEQ_CASES = [
    # T, L, B, I, H, use_peephole, forget_bias(v1 only), cell_clip
    pytest.param(3, 3, 2, 3, 2, True, 0.8, 0.0, id="L=T-peep"),
    pytest.param(4, 2, 2, 2, 2, True, 1.0, 0.0, id="L<T-peep"),
    pytest.param(3, 3, 3, 2, 3, False, -0.6, 0.0, id="L=T-nopeep"),
    pytest.param(4, 3, 1, 4, 2, False, 1.0, 100.0, id="L<T-nopeep-clip100"),
    pytest.param(2, 1, 2, 1, 1, True, 0.5, 100.0, id="L1-H1-peep-clip100"),
    pytest.param(1, 1, 1, 1, 3, True, 2.0, 0.0, id="T1"),
]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("T,L,B,I,H,use_peephole,forget_bias,cell_clip", SEQ_CASES)
def test_block_lstm_grad(version, T, L, B, I, H, use_peephole, forget_bias, cell_clip):
    rng = np.random.default_rng(100 + 13 * T + 7 * L + 3 * B + I + H)
    p = lstm_params(rng, B, I, H, T=T)
    Gcs, Gh = rnd(rng, T, B, H), rnd(rng, T, B, H)
    if version == "v1":
        fwd, grad = blockrnn.block_lstm, blockrnn.block_lstm_grad
        attrs = dict(forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole)
    else:
        fwd, grad = blockrnn.block_lstm_v2, blockrnn.block_lstm_grad_v2
        attrs = dict(cell_clip=cell_clip, use_peephole=use_peephole)

    def loss(**a):
        out = fwd(L, *(a[k] for k in LSTM_ARGS), **attrs)
        return float(np.sum(out.cs * Gcs) + np.sum(out.h * Gh))

    out = fwd(L, *(p[k] for k in LSTM_ARGS), **attrs)
    if cell_clip > 0:
        assert np.abs(out.cs).max() < cell_clip
    g = grad(L, *(p[k] for k in LSTM_ARGS), *(getattr(out, k) for k in SEQ_FWD), Gcs, Gh,
             use_peephole=use_peephole)
    assert g._fields == ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad",
                         "wcf_grad", "wco_grad", "b_grad")
    for k in LSTM_ARGS:
        fd = fd_grad(loss, p, k)
        if k in ("wci", "wcf", "wco") and not use_peephole:
            assert not np.any(fd)
        assert_grad(getattr(g, k + "_grad"), fd, k + "_grad")
    assert not np.any(g.x_grad[L:])


def test_block_lstm_v1_v2_layouts_are_consistent():
    """block_lstm_v2 with IFCO weights == block_lstm with the same weights in ICFO and
    forget_bias 0; the grads are then the same up to the column permutation."""
    rng = np.random.default_rng(7)
    T, B, I, H, L = 3, 2, 3, 2, 3
    p = lstm_params(rng, B, I, H, T=T)
    perm = np.r_[0:H, 2 * H:3 * H, H:2 * H, 3 * H:4 * H]  # ICFO <-> IFCO (an involution)
    p2 = dict(p, w=p["w"][:, perm], b=p["b"][perm])
    o1 = blockrnn.block_lstm(L, *(p[k] for k in LSTM_ARGS), forget_bias=0.0, cell_clip=0.0,
                             use_peephole=True)
    o2 = blockrnn.block_lstm_v2(L, *(p2[k] for k in LSTM_ARGS), use_peephole=True)
    for a, b in zip(o1, o2):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    Gcs, Gh = rnd(rng, T, B, H), rnd(rng, T, B, H)
    g1 = blockrnn.block_lstm_grad(L, *(p[k] for k in LSTM_ARGS), *o1, Gcs, Gh,
                                  use_peephole=True)
    g2 = blockrnn.block_lstm_grad_v2(L, *(p2[k] for k in LSTM_ARGS), *o2, Gcs, Gh,
                                     use_peephole=True)
    np.testing.assert_allclose(g1.w_grad[:, perm], g2.w_grad, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(g1.b_grad[perm], g2.b_grad, rtol=1e-13, atol=1e-14)
    for f in ("x_grad", "cs_prev_grad", "h_prev_grad", "wci_grad", "wcf_grad", "wco_grad"):
        np.testing.assert_allclose(getattr(g1, f), getattr(g2, f), rtol=1e-13, atol=1e-14)


# ----------------------------------------------------------------------------------
# GRUBlockCell / GRUBlockCellGrad / gru_block_cell_grad_full
# ----------------------------------------------------------------------------------

GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
GRU_CASES = [pytest.param(1, 2, 2, id="B1"), pytest.param(3, 4, 3, id="B3"),
             pytest.param(2, 1, 1, id="H1"), pytest.param(2, 3, 2, id="B2")]


def _gru_setup(B, I, H, seed):
    rng = np.random.default_rng(seed)
    p = dict(x=rnd(rng, B, I), h_prev=rnd(rng, B, H), w_ru=rnd(rng, I + H, 2 * H),
             w_c=rnd(rng, I + H, H), b_ru=rnd(rng, 2 * H, lo=-0.5, hi=0.5),
             b_c=rnd(rng, H, lo=-0.5, hi=0.5))
    Gh = rnd(rng, B, H)

    def loss(**a):
        out = blockrnn.gru_block_cell(*(a[k] for k in GRU_ARGS))
        return float(np.sum(out.h * a.get("Gh", Gh)))

    out = blockrnn.gru_block_cell(*(p[k] for k in GRU_ARGS))
    grad_args = [p[k] for k in GRU_ARGS] + [out.r, out.u, out.c, Gh]
    return p, Gh, loss, grad_args


@pytest.mark.parametrize("B,I,H", GRU_CASES)
def test_gru_block_cell_grad(B, I, H):
    p, Gh, loss, grad_args = _gru_setup(B, I, H, seed=200 + 5 * B + I + H)
    g = blockrnn.gru_block_cell_grad(*grad_args)
    assert g._fields == ("d_x", "d_h_prev", "d_c_bar", "d_r_bar_u_bar")
    assert_grad(g.d_x, fd_grad(loss, p, "x"), "d_x")
    assert_grad(g.d_h_prev, fd_grad(loss, p, "h_prev"), "d_h_prev")
    # d_c_bar / d_r_bar_u_bar: gradients w.r.t. the pre-activations, row by row via b_c / b_ru
    dc_fd, dru_fd = np.zeros((B, H)), np.zeros((B, 2 * H))
    for r in range(B):
        pr = dict(p, x=p["x"][r:r + 1], h_prev=p["h_prev"][r:r + 1], Gh=Gh[r:r + 1])
        dc_fd[r] = fd_grad(loss, pr, "b_c")
        dru_fd[r] = fd_grad(loss, pr, "b_ru")
    assert_grad(g.d_c_bar, dc_fd, "d_c_bar")
    assert_grad(g.d_r_bar_u_bar, dru_fd, "d_r_bar_u_bar")
    assert_grad(g.d_c_bar.sum(0), fd_grad(loss, p, "b_c"), "sum_b d_c_bar")
    assert_grad(g.d_r_bar_u_bar.sum(0), fd_grad(loss, p, "b_ru"), "sum_b d_r_bar_u_bar")


@pytest.mark.parametrize("B,I,H", GRU_CASES)
def test_gru_block_cell_grad_full(B, I, H):
    p, Gh, loss, grad_args = _gru_setup(B, I, H, seed=300 + 5 * B + I + H)
    g = blockrnn.gru_block_cell_grad_full(*grad_args)
    assert g._fields == ("d_x", "d_h_prev", "d_w_ru", "d_w_c", "d_b_ru", "d_b_c")
    for k in GRU_ARGS:
        assert_grad(getattr(g, "d_" + k), fd_grad(loss, p, k), "d_" + k)


# ----------------------------------------------------------------------------------
# Active clipping: straight-through formula (compare with blockrnn._reference)
# ----------------------------------------------------------------------------------

def _reference():
    return pytest.importorskip("blockrnn._reference")


@pytest.mark.parametrize("use_peephole", [False, True])
def test_cell_grad_active_clipping_is_straight_through(use_peephole):
    ref = _reference()
    rng = np.random.default_rng(400)
    B, I, H, clip = 3, 3, 3, 0.4
    p = lstm_params(rng, B, I, H)
    p["cs_prev"] *= 2.0
    out = blockrnn.lstm_block_cell(*(p[k] for k in LSTM_ARGS), forget_bias=1.0,
                                   cell_clip=clip, use_peephole=use_peephole)
    assert np.any(np.abs(out.cs) == clip) and np.any(np.abs(out.cs) < clip)
    Gcs, Gh = rnd(rng, B, H), rnd(rng, B, H)
    args = [p[k] for k in LSTM_ARGS] + [getattr(out, k) for k in CELL_FWD] + [Gcs, Gh]
    for name in ("lstm_block_cell_grad", "lstm_block_cell_grad_full"):
        got = getattr(blockrnn, name)(*args, use_peephole=use_peephole)
        exp = getattr(ref, name)(*args, use_peephole=use_peephole)
        for f in got._fields:
            np.testing.assert_allclose(getattr(got, f), getattr(exp, f), rtol=1e-12,
                                       atol=1e-13, err_msg=f"{name}.{f}")

    # sanity: with active clipping the straight-through gradient is NOT the true one
    def loss(**a):
        o = blockrnn.lstm_block_cell(*(a[k] for k in LSTM_ARGS), forget_bias=1.0,
                                     cell_clip=clip, use_peephole=use_peephole)
        return float(np.sum(o.cs * Gcs) + np.sum(o.h * Gh))

    got = blockrnn.lstm_block_cell_grad(*args, use_peephole=use_peephole)
    assert np.abs(got.cs_prev_grad - fd_grad(loss, p, "cs_prev")).max() > 1e-3


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("use_peephole", [False, True])
def test_seq_grad_active_clipping_is_straight_through(version, use_peephole):
    ref = _reference()
    rng = np.random.default_rng(500)
    T, L, B, I, H, clip = 4, 3, 2, 3, 2, 0.3
    p = lstm_params(rng, B, I, H, T=T)
    p["b"] += 0.5
    if version == "v1":
        fwd, gname = blockrnn.block_lstm, "block_lstm_grad"
        attrs = dict(forget_bias=1.0, cell_clip=clip, use_peephole=use_peephole)
    else:
        fwd, gname = blockrnn.block_lstm_v2, "block_lstm_grad_v2"
        attrs = dict(cell_clip=clip, use_peephole=use_peephole)
    out = fwd(L, *(p[k] for k in LSTM_ARGS), **attrs)
    assert np.any(np.abs(out.cs[:L]) == clip) and np.any(np.abs(out.cs[:L]) < clip)
    Gcs, Gh = rnd(rng, T, B, H), rnd(rng, T, B, H)
    args = [L] + [p[k] for k in LSTM_ARGS] + list(out) + [Gcs, Gh]
    got = getattr(blockrnn, gname)(*args, use_peephole=use_peephole)
    exp = getattr(ref, gname)(*args, use_peephole=use_peephole)
    for f in got._fields:
        np.testing.assert_allclose(getattr(got, f), getattr(exp, f), rtol=1e-12, atol=1e-13,
                                   err_msg=f"{gname}.{f}")


@pytest.mark.parametrize("use_peephole", [False, True])
def test_grad_ops_use_given_forward_outputs(use_peephole):
    """The grad ops read the forward outputs they are given (never recompute them): the
    values of x, h_prev, w (except as a matmul operand in the full grad) and b are unused
    by the kernel outputs (SPEC §4)."""
    rng = np.random.default_rng(600)
    B, I, H = 2, 3, 2
    p = lstm_params(rng, B, I, H)
    out = blockrnn.lstm_block_cell(*(p[k] for k in LSTM_ARGS), use_peephole=use_peephole)
    Gcs, Gh = rnd(rng, B, H), rnd(rng, B, H)
    fwd = [getattr(out, k) for k in CELL_FWD]
    g1 = blockrnn.lstm_block_cell_grad(*(p[k] for k in LSTM_ARGS), *fwd, Gcs, Gh,
                                       use_peephole=use_peephole)
    q = dict(p, x=rnd(rng, B, I), h_prev=rnd(rng, B, H), w=rnd(rng, I + H, 4 * H),
             b=rnd(rng, 4 * H))
    g2 = blockrnn.lstm_block_cell_grad(*(q[k] for k in LSTM_ARGS), *fwd, Gcs, Gh,
                                       use_peephole=use_peephole)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------
# Output dtypes
# ----------------------------------------------------------------------------------

def _all_op_calls(conv, use_peephole=True):
    """(name, callable) for every op and helper; every float64 input is passed through
    `conv` (e.g. a cast to the dtype under test)."""
    rng = np.random.default_rng(700)
    B, I, H, T, L = 2, 3, 2, 3, 2
    c = [conv(v) for v in lstm_params(rng, B, I, H).values()]
    s = [conv(v) for v in lstm_params(rng, B, I, H, T=T).values()]
    gB = conv(rnd(rng, B, H))
    gT = conv(rnd(rng, T, B, H))
    gate = conv(rnd(rng, B, H, lo=0.1, hi=0.9))
    gates_T = conv(rnd(rng, T, B, H, lo=0.1, hi=0.9))
    gru = [conv(a) for a in (rnd(rng, B, I), rnd(rng, B, H), rnd(rng, I + H, 2 * H),
                             rnd(rng, I + H, H), rnd(rng, 2 * H), rnd(rng, H))]
    pp = dict(use_peephole=use_peephole)
    return [
        ("lstm_block_cell", lambda: blockrnn.lstm_block_cell(*c, **pp)),
        ("lstm_block_cell_grad",
         lambda: blockrnn.lstm_block_cell_grad(*c, *[gate] * 6, gB, gB, **pp)),
        ("lstm_block_cell_grad_full",
         lambda: blockrnn.lstm_block_cell_grad_full(*c, *[gate] * 6, gB, gB, **pp)),
        ("block_lstm", lambda: blockrnn.block_lstm(L, *s, **pp)),
        ("block_lstm_v2", lambda: blockrnn.block_lstm_v2(L, *s, **pp)),
        ("block_lstm_grad",
         lambda: blockrnn.block_lstm_grad(L, *s, *[gates_T] * 7, gT, gT, **pp)),
        ("block_lstm_grad_v2",
         lambda: blockrnn.block_lstm_grad_v2(L, *s, *[gates_T] * 7, gT, gT, **pp)),
        ("gru_block_cell", lambda: blockrnn.gru_block_cell(*gru)),
        ("gru_block_cell_grad", lambda: blockrnn.gru_block_cell_grad(*gru, gate, gate, gate, gB)),
        ("gru_block_cell_grad_full",
         lambda: blockrnn.gru_block_cell_grad_full(*gru, gate, gate, gate, gB)),
    ]


_OP_NAMES = [n for n, _ in _all_op_calls(lambda a: a)]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("op", _OP_NAMES)
def test_output_dtype(op, dtype):
    out = dict(_all_op_calls(lambda a: a.astype(dtype)))[op]()
    assert isinstance(out, tuple) and hasattr(out, "_fields")
    for f, a in out._asdict().items():
        assert isinstance(a, np.ndarray), f
        assert a.dtype == np.dtype(dtype), (f, a.dtype)
        assert np.all(np.isfinite(a)), f


@pytest.mark.parametrize("dtype,tol", [(np.float16, 2e-2), (np.float32, 1e-5)])
@pytest.mark.parametrize("op", _OP_NAMES)
def test_low_precision_close_to_float64(op, dtype, tol):
    """float16/float32 results agree with the float64 result on the same rounded inputs
    (loose sanity bound; the parity tests own the precise accuracy requirements)."""
    lo = dict(_all_op_calls(lambda a: a.astype(dtype)))[op]()
    hi = dict(_all_op_calls(lambda a: a.astype(dtype).astype(np.float64)))[op]()
    for f in lo._fields:
        a, r = getattr(lo, f).astype(np.float64), getattr(hi, f)
        err = np.abs(a - r) / np.maximum(1.0, np.abs(r))
        assert err.max() <= tol, (f, err.max())
