"""The sequence GRU (block_gru, block_gru_grad) and per-row sequence_length.

* block_gru / block_gru_grad against a step-by-step loop of TensorFlow's
  GRUBlockCell / GRUBlockCellGrad (parameter gradients completed with tf.matmul),
  against the float64 reference, and by float64 central finite differences.
* sequence_length (LSTM and GRU): against the reference, which runs every row
  alone as a batch of one; identical bits to no lengths when every length is L;
  padding past a row's length (even NaN) never reaches its results; finite
  differences through a loss on each row's final state.
"""
import numpy as np
import pytest

import blockrnn
from blockrnn import _reference as ref
from blockrnn import raw_ops

from _inputs import block_lstm_inputs, gru_cell_inputs, rel_err, upstream_grads
from test_gradcheck import assert_grad, fd_grad

GRU_OUT = ("r", "u", "c", "h")
GRU_GRADS = ("x_grad", "h_prev_grad", "w_ru_grad", "w_c_grad", "b_ru_grad", "b_c_grad")
TOL32 = 1e-4


def gru_sequence_inputs(T, B, I, H, dtype=np.float32, seed=0):
    """x (T, B, I), h_prev, w_ru, w_c, b_ru, b_c."""
    d = gru_cell_inputs(B, I, H, dtype, seed)
    d["x"] = np.random.default_rng(seed + 1).uniform(-1, 1, (T, B, I)).astype(dtype)
    return d


def tf_gru_loop(tf, L, x, h_prev, w_ru, w_c, b_ru, b_c, h_grad):
    """TF's GRUBlockCell over L steps, then GRUBlockCellGrad back over them."""
    T, B, I = x.shape
    H = h_prev.shape[1]
    outs = {k: np.zeros((T, B, H), np.float32) for k in GRU_OUT}
    h_t = h_prev
    for t in range(L):
        step = tf.raw_ops.GRUBlockCell(x=x[t], h_prev=h_t, w_ru=w_ru, w_c=w_c, b_ru=b_ru,
                                       b_c=b_c)
        for k, v in zip(GRU_OUT, step):
            outs[k][t] = v.numpy()
        h_t = outs["h"][t]
    grads = dict(x_grad=np.zeros_like(x), w_ru_grad=np.zeros_like(w_ru),
                 w_c_grad=np.zeros_like(w_c), b_ru_grad=np.zeros_like(b_ru),
                 b_c_grad=np.zeros_like(b_c))
    carry = np.zeros((B, H), np.float32)
    for t in range(L - 1, -1, -1):
        hp = h_prev if t == 0 else outs["h"][t - 1]
        d_x, d_h_prev, d_c_bar, d_rbub = [v.numpy() for v in tf.raw_ops.GRUBlockCellGrad(
            x=x[t], h_prev=hp, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c, r=outs["r"][t],
            u=outs["u"][t], c=outs["c"][t], d_h=h_grad[t] + carry)]
        grads["x_grad"][t] = d_x
        carry = d_h_prev
        grads["w_ru_grad"] += tf.matmul(np.concatenate([x[t], hp], 1), d_rbub,
                                        transpose_a=True).numpy()
        grads["w_c_grad"] += tf.matmul(np.concatenate([x[t], outs["r"][t] * hp], 1), d_c_bar,
                                       transpose_a=True).numpy()
        grads["b_ru_grad"] += d_rbub.sum(0)
        grads["b_c_grad"] += d_c_bar.sum(0)
    grads["h_prev_grad"] = carry
    return outs, grads


@pytest.mark.parametrize("T, B, I, H, L", [
    (5, 3, 4, 6, 5), (6, 2, 3, 5, 3), (4, 1, 8, 8, 4), (3, 4, 0, 3, 3), (3, 2, 2, 2, 0)])
def test_block_gru_matches_tf_cell_loop(tf, parity_record, T, B, I, H, L):
    d = gru_sequence_inputs(T, B, I, H, seed=T + B)
    h_grad = upstream_grads((T, B, H), names=("h_grad",), seed=T)["h_grad"]
    tf_outs, tf_grads = tf_gru_loop(tf, L, **d, h_grad=h_grad)

    ours = blockrnn.block_gru(L, *d.values())
    assert ours._fields == GRU_OUT
    for k in GRU_OUT:
        err = rel_err(getattr(ours, k), tf_outs[k])
        parity_record("block_gru [blockrnn vs TF GRUBlockCell loop]", err)
        assert err <= TOL32, k
    grads = blockrnn.block_gru_grad(L, *d.values(), *ours, h_grad)
    assert grads._fields == GRU_GRADS
    for k in GRU_GRADS:
        err = rel_err(getattr(grads, k), tf_grads[k])
        parity_record("block_gru_grad [blockrnn vs TF GRUBlockCellGrad loop]", err)
        assert err <= TOL32, k


def test_block_gru_raw_ops_and_reference():
    d = gru_sequence_inputs(6, 3, 4, 5, np.float64, seed=3)
    h_grad = upstream_grads((6, 3, 5), names=("h_grad",), dtype=np.float64)["h_grad"]
    ours = blockrnn.block_gru(4, *d.values())
    assert all(np.array_equal(a, b) for a, b in zip(ours, raw_ops.BlockGRU(seq_len_max=4, **d)))
    expected = ref.block_gru(4, *d.values())
    for k in GRU_OUT:
        assert rel_err(getattr(ours, k), getattr(expected, k)) <= 1e-13, k
    assert not np.any(ours.h[4:]) and not np.any(ours.r[4:])   # zeros past seq_len_max
    grads = blockrnn.block_gru_grad(4, *d.values(), *ours, h_grad)
    same = raw_ops.BlockGRUGrad(seq_len_max=4, **d, **ours._asdict(), h_grad=h_grad)
    assert all(np.array_equal(a, b) for a, b in zip(grads, same))
    expected = ref.block_gru_grad(4, *d.values(), *ours, h_grad)
    for k in GRU_GRADS:
        assert rel_err(getattr(grads, k), getattr(expected, k)) <= 1e-13, k
    assert not np.any(grads.x_grad[4:])


def gru_loss(G, lengths=None):
    """loss = sum h * G over all steps, through block_gru."""
    def loss(x, h_prev, w_ru, w_c, b_ru, b_c):
        out = blockrnn.block_gru(x.shape[0], x, h_prev, w_ru, w_c, b_ru, b_c,
                                 sequence_length=lengths)
        return float(np.sum(out.h * G))
    return loss


@pytest.mark.parametrize("lengths", [None, [4, 1, 0]], ids=["all-steps", "lengths"])
def test_block_gru_grad_finite_differences(lengths):
    T, B, I, H = 4, 3, 2, 3
    d = gru_sequence_inputs(T, B, I, H, np.float64, seed=11)
    G = np.random.default_rng(5).uniform(-1, 1, (T, B, H))
    out = blockrnn.block_gru(T, *d.values(), sequence_length=lengths)
    grads = blockrnn.block_gru_grad(T, *d.values(), *out, G, sequence_length=lengths)
    for arg, field in zip(d, GRU_GRADS):
        assert_grad(getattr(grads, field), fd_grad(gru_loss(G, lengths), d, arg), field)


# ----------------------------------------------------------------------------------
# sequence_length
# ----------------------------------------------------------------------------------

LSTM_FORWARD = [("block_lstm", dict(forget_bias=0.5, cell_clip=0.0)),
                ("block_lstm_v2", dict(cell_clip=0.0))]


def lstm_case(T=6, B=4, I=3, H=5, dtype=np.float64, seed=0):
    return block_lstm_inputs(T, B, I, H, dtype, seed)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fwd, attrs", LSTM_FORWARD)
@pytest.mark.parametrize("L, lengths", [(6, [6, 0, 2, 5]), (4, [6, 3, 1, 4]), (0, [2, 3, 0, 1])])
def test_lstm_sequence_length_matches_rows_run_alone(dtype, fwd, attrs, L, lengths):
    d = lstm_case(dtype=dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    ours = getattr(blockrnn, fwd)(L, *d.values(), use_peephole=True, **attrs,
                                  sequence_length=lengths)
    expected = getattr(ref, fwd)(L, *d.values(), use_peephole=True, **attrs,
                                 sequence_length=lengths)
    for k, a in ours._asdict().items():
        assert rel_err(a, getattr(expected, k)) <= tol, k
    grad = fwd.replace("block_lstm", "block_lstm_grad")
    g = upstream_grads((6, 4, 5), dtype=dtype)
    ours_g = getattr(blockrnn, grad)(L, *d.values(), *ours, *g.values(), use_peephole=True,
                                     sequence_length=lengths)
    expected_g = getattr(ref, grad)(L, *d.values(), *ours, *g.values(), use_peephole=True,
                                    sequence_length=lengths)
    for k, a in ours_g._asdict().items():
        assert rel_err(a, getattr(expected_g, k)) <= tol, k


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gru_sequence_length_matches_rows_run_alone(dtype):
    d = gru_sequence_inputs(6, 4, 3, 5, dtype, seed=2)
    lengths = np.array([6, 0, 2, 5], dtype=np.int32)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    ours = blockrnn.block_gru(5, *d.values(), sequence_length=lengths)
    expected = ref.block_gru(5, *d.values(), sequence_length=lengths)
    for k in GRU_OUT:
        assert rel_err(getattr(ours, k), getattr(expected, k)) <= tol, k
    h_grad = upstream_grads((6, 4, 5), names=("h_grad",), dtype=dtype)["h_grad"]
    ours_g = blockrnn.block_gru_grad(5, *d.values(), *ours, h_grad, sequence_length=lengths)
    expected_g = ref.block_gru_grad(5, *d.values(), *ours, h_grad, sequence_length=lengths)
    for k in GRU_GRADS:
        assert rel_err(getattr(ours_g, k), getattr(expected_g, k)) <= tol, k


def test_full_lengths_give_tensorflows_bits():
    """sequence_length == seq_len_max for every row: the same bits as without it."""
    d = lstm_case(dtype=np.float32)
    full = np.full(4, 5)
    for fwd, attrs in LSTM_FORWARD:
        plain = getattr(blockrnn, fwd)(5, *d.values(), use_peephole=True, **attrs)
        with_lengths = getattr(blockrnn, fwd)(5, *d.values(), use_peephole=True, **attrs,
                                              sequence_length=full)
        assert all(np.array_equal(a, b) for a, b in zip(plain, with_lengths))
    g = gru_sequence_inputs(6, 4, 3, 5, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(
        blockrnn.block_gru(5, *g.values()),
        blockrnn.block_gru(5, *g.values(), sequence_length=full)))


def test_padding_never_reaches_the_results():
    """Padding past each row's length changes nothing: any finite values in x (the
    weight-gradient GEMMs multiply them by zero; NaN * 0 would be NaN, so x's
    padding must be finite, as documented) and anything, NaN included, in the
    upstream gradients (never read)."""
    lengths = np.array([6, 0, 2, 5])
    d = lstm_case(dtype=np.float32)
    g = upstream_grads((6, 4, 5), dtype=np.float32)
    poisoned = {k: v.copy() for k, v in d.items()}
    pg = {k: v.copy() for k, v in g.items()}
    for row, n in enumerate(lengths):
        poisoned["x"][n:, row] = 1e30
        pg["cs_grad"][n:, row] = np.nan
        pg["h_grad"][n:, row] = np.nan
    clean = blockrnn.block_lstm_v2(6, *d.values(), sequence_length=lengths)
    dirty = blockrnn.block_lstm_v2(6, *poisoned.values(), sequence_length=lengths)
    assert all(np.array_equal(a, b) for a, b in zip(clean, dirty))
    for row, n in enumerate(lengths):
        assert not np.any(clean.h[n:, row]) and not np.any(clean.cs[n:, row])
    clean_g = blockrnn.block_lstm_grad_v2(6, *d.values(), *clean, *g.values(),
                                          use_peephole=False, sequence_length=lengths)
    dirty_g = blockrnn.block_lstm_grad_v2(6, *poisoned.values(), *dirty, *pg.values(),
                                          use_peephole=False, sequence_length=lengths)
    assert all(np.array_equal(a, b) for a, b in zip(clean_g, dirty_g))

    gd = gru_sequence_inputs(6, 4, 3, 5, seed=8)
    gp = {k: v.copy() for k, v in gd.items()}
    h_grad = pg["h_grad"].copy()
    for row, n in enumerate(lengths):
        gp["x"][n:, row] = -1e30
    clean = blockrnn.block_gru(6, *gd.values(), sequence_length=lengths)
    dirty = blockrnn.block_gru(6, *gp.values(), sequence_length=lengths)
    assert all(np.array_equal(a, b) for a, b in zip(clean, dirty))
    clean_g = blockrnn.block_gru_grad(6, *gd.values(), *clean, np.nan_to_num(h_grad),
                                      sequence_length=lengths)
    dirty_g = blockrnn.block_gru_grad(6, *gp.values(), *dirty, h_grad, sequence_length=lengths)
    assert all(np.array_equal(a, b) for a, b in zip(clean_g, dirty_g))


def final_state(seq, start, lengths):
    """Each row's state after its last step (start if it has none)."""
    out = np.array(start, copy=True)
    for row, n in enumerate(lengths):
        if n:
            out[row] = seq[n - 1, row]
    return out


def test_lstm_final_state_gradient_finite_differences():
    """loss = sum(final h * Gh) + sum(final cs * Gc) + sum(outputs * Gy): the final-state
    gradient enters at each row's last step (cs_prev/h_prev directly if it has none)."""
    T, B, I, H = 4, 3, 2, 3
    lengths = [4, 2, 0]
    rng = np.random.default_rng(9)
    d = {k: v.astype(np.float64) for k, v in lstm_case(T, B, I, H, seed=3).items()}
    Gy, Gh, Gc = rng.uniform(-1, 1, (T, B, H)), rng.uniform(-1, 1, (B, H)), rng.uniform(-1, 1, (B, H))

    def loss(x, cs_prev, h_prev, w, wci, wcf, wco, b):
        out = blockrnn.block_lstm_v2(T, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                                     use_peephole=True, sequence_length=lengths)
        return float(np.sum(out.h * Gy) + np.sum(final_state(out.h, h_prev, lengths) * Gh)
                     + np.sum(final_state(out.cs, cs_prev, lengths) * Gc))

    out = blockrnn.block_lstm_v2(T, *d.values(), use_peephole=True, sequence_length=lengths)
    h_grad, cs_grad = Gy.copy(), np.zeros((T, B, H))
    for row, n in enumerate(lengths):
        if n:
            h_grad[n - 1, row] += Gh[row]
            cs_grad[n - 1, row] += Gc[row]
    grads = blockrnn.block_lstm_grad_v2(T, *d.values(), *out, cs_grad, h_grad,
                                        use_peephole=True, sequence_length=lengths)
    grads = grads._asdict()
    grads["cs_prev_grad"][2] += Gc[2]   # row 2 has no steps: its final state is the start
    grads["h_prev_grad"][2] += Gh[2]
    for arg in d:
        assert_grad(grads[f"{arg}_grad"], fd_grad(loss, d, arg), arg)


@pytest.mark.parametrize("value, error, match", [
    ([1, 2], ValueError, r"must have shape \(B,\) = \(3,\), got \(2,\)"),
    ([[1, 2, 3]], ValueError, r"shape \(B,\)"),
    ([1, 2, 7], ValueError, r"in \[0, T\] = \[0, 6\]"),
    ([1, -1, 2], ValueError, r"in \[0, T\]"),
    ([1.0, 2.0, 3.0], TypeError, "integer dtype, got float64"),
    ([True, False, True], TypeError, "integer dtype, got bool"),
    ("abc", TypeError, "integer dtype"),
])
def test_sequence_length_validation(value, error, match):
    d = lstm_case(T=6, B=3)
    with pytest.raises(error, match=match):
        blockrnn.block_lstm(6, *d.values(), sequence_length=value)
    g = gru_sequence_inputs(6, 3, 3, 5)
    with pytest.raises(error, match="block_gru: sequence_length .*" + match):
        blockrnn.block_gru(6, *g.values(), sequence_length=value)


@pytest.mark.parametrize("name, shape, match", [
    ("x", (6, 3), r"x must have rank 3"),
    ("h_prev", (2, 5), r"h_prev must have shape \[B, H\] = \(3, 5\), got \(2, 5\)"),
    ("w_ru", (8, 9), r"w_ru must have shape \[I\+H, 2H\] = \(8, 10\)"),
    ("w_c", (8, 4), r"w_c must have shape \[I\+H, H\] = \(8, 5\)"),
    ("b_ru", (5,), r"b_ru must have shape \[2H\] = \(10,\)"),
    ("b_c", (4,), r"b_c must have shape \[H\] = \(5,\)"),
])
def test_block_gru_validation(name, shape, match):
    d = gru_sequence_inputs(6, 3, 3, 5)
    d[name] = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match="block_gru: " + match):
        blockrnn.block_gru(6, *d.values())
    d = gru_sequence_inputs(6, 3, 3, 5)
    out = blockrnn.block_gru(6, *d.values())._asdict()
    out["h"] = np.zeros((6, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"block_gru_grad: h must have shape \[T, B, H\]"):
        blockrnn.block_gru_grad(6, *d.values(), **out, h_grad=np.zeros((6, 3, 5), np.float32))
    with pytest.raises(ValueError, match=r"seq_len_max must be in \[0, T\]"):
        blockrnn.block_gru(7, *d.values())
    mixed = list(d.values())
    mixed[-1] = mixed[-1].astype(np.float64)
    with pytest.raises(TypeError, match="b_c has dtype float64 but x has dtype float32"):
        blockrnn.block_gru(6, *mixed)


def test_block_gru_float16_and_zero_sizes():
    d = gru_sequence_inputs(5, 2, 3, 4, np.float16, seed=6)
    out = blockrnn.block_gru(5, *d.values())
    assert all(a.dtype == np.float16 for a in out)
    expected = ref.block_gru(5, *d.values())
    assert max(rel_err(a, b) for a, b in zip(out, expected)) <= 2e-3
    for T, B, I, H in [(0, 2, 3, 4), (3, 0, 3, 4), (3, 2, 0, 4), (3, 2, 3, 0)]:
        d = gru_sequence_inputs(T, B, I, H, np.float64)
        out = blockrnn.block_gru(T, *d.values())
        grads = blockrnn.block_gru_grad(T, *d.values(), *out, np.ones((T, B, H)))
        assert [g.shape for g in grads] == [(T, B, I), (B, H), (I + H, 2 * H), (I + H, H),
                                            (2 * H,), (H,)]
        expected = ref.block_gru_grad(T, *d.values(), *out, np.ones((T, B, H)))
        assert all(rel_err(a, b) <= 1e-13 for a, b in zip(grads, expected))


HUGE_T = 2**31 + 1   # more steps than any loop over T could finish in a second


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("B, I, H", [(0, 3, 2), (2, 0, 0)])   # empty batch; empty cell
@pytest.mark.parametrize("with_lengths", [False, True])
def test_empty_calls_return_in_constant_time(dtype, B, I, H, with_lengths):
    """Nothing to compute (B = 0, or H = 0 with I = 0 so that x is empty too):
    every sequence op and gradient returns its zeros at once, whatever T is (a
    zero-size x of 2**31 + 1 steps costs no memory, and must cost no time)."""
    import time

    T = HUGE_T
    x = np.empty((T, B, I), dtype)
    lengths = {"sequence_length": np.zeros(B, np.int64)} if with_lengths else {}
    rng = np.random.default_rng(0)
    rand = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    lstm = (rand(B, H), rand(B, H), rand(I + H, 4 * H), rand(H), rand(H), rand(H), rand(4 * H))
    gru = (rand(B, H), rand(I + H, 2 * H), rand(I + H, H), rand(2 * H), rand(H))
    seq = lambda k: [np.empty((T, B, H), dtype) for _ in range(k)]  # noqa: E731
    start = time.perf_counter()
    for fwd, attrs in [(blockrnn.block_lstm, dict(forget_bias=1.0)),
                       (blockrnn.block_lstm_v2, {}), (raw_ops.BlockLSTMV2, None)]:
        if attrs is None:
            out = fwd(seq_len_max=T, x=x, cs_prev=lstm[0], h_prev=lstm[1], w=lstm[2],
                      wci=lstm[3], wcf=lstm[4], wco=lstm[5], b=lstm[6])
        else:
            out = fwd(T, x, *lstm, use_peephole=True, **attrs, **lengths)
        assert [(o.shape, o.dtype) for o in out] == [((T, B, H), dtype)] * 7
    for grad in (blockrnn.block_lstm_grad, blockrnn.block_lstm_grad_v2):
        g = grad(T, x, *lstm, *seq(9), use_peephole=True, **lengths)
        for got, arg in zip(g, (x,) + lstm):
            assert got.shape == arg.shape and got.dtype == dtype and not got.any()
    out = blockrnn.block_gru(T, x, *gru, **lengths)
    assert [(o.shape, o.dtype) for o in out] == [((T, B, H), dtype)] * 4
    g = blockrnn.block_gru_grad(T, x, *gru, *seq(5), **lengths)
    for got, arg in zip(g, (x,) + gru):
        assert got.shape == arg.shape and got.dtype == dtype and not got.any()
    if dtype != np.float16 and H:   # the NumPy layers on an empty batch
        for layer in (blockrnn.LSTM(I, H, dtype=dtype, use_peephole=True),
                      blockrnn.GRU(I, H, dtype=dtype)):
            y, _, ctx = layer.forward(x, **lengths)
            dx, _ = layer.backward(ctx, None)
            assert y.shape == (T, B, H) and dx.shape == x.shape
            assert all(not v.any() for v in layer.grads.values())
    assert time.perf_counter() - start < 1.0   # a hang guard; the asserts above are the test


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_output_padding_never_reaches_a_gradient(dtype, bad):
    """Forward outputs past a row's length that are not finite (masked, or made
    elsewhere) give the gradients of clean (zero) padding, bit for bit: every
    output of every sequence op, alone and all at once."""
    lengths = np.array([6, 0, 2, 5])
    d = {k: v.astype(dtype) for k, v in lstm_case(dtype=np.float64).items()}
    g = upstream_grads((6, 4, 5), dtype=dtype)

    def poison(fwd, names):
        out = fwd._asdict()
        for name in names:
            out[name] = out[name].copy()
            for row, n in enumerate(lengths):
                out[name][n:, row] = bad
        return out

    for fwd_op, grad_op in [(blockrnn.block_lstm, blockrnn.block_lstm_grad),
                            (blockrnn.block_lstm_v2, blockrnn.block_lstm_grad_v2)]:
        fwd = fwd_op(6, *d.values(), use_peephole=True, sequence_length=lengths)
        clean = grad_op(6, *d.values(), *fwd, *g.values(), use_peephole=True,
                        sequence_length=lengths)
        assert all(np.isfinite(a).all() for a in clean)
        for names in [(n,) for n in fwd._fields] + [fwd._fields]:
            dirty = grad_op(6, *d.values(), **poison(fwd, names), **g, use_peephole=True,
                            sequence_length=lengths)
            for k, a, b in zip(clean._fields, dirty, clean):
                np.testing.assert_array_equal(a, b, err_msg=f"{fwd_op.__name__} {names} {k}")

    gd = {k: v.astype(dtype) for k, v in gru_sequence_inputs(6, 4, 3, 5, seed=8).items()}
    fwd = blockrnn.block_gru(6, *gd.values(), sequence_length=lengths)
    clean = blockrnn.block_gru_grad(6, *gd.values(), *fwd, g["h_grad"], sequence_length=lengths)
    assert all(np.isfinite(a).all() for a in clean)
    for names in [(n,) for n in fwd._fields] + [fwd._fields]:
        dirty = blockrnn.block_gru_grad(6, *gd.values(), **poison(fwd, names),
                                        h_grad=g["h_grad"], sequence_length=lengths)
        for k, a, b in zip(clean._fields, dirty, clean):
            np.testing.assert_array_equal(a, b, err_msg=f"block_gru {names} {k}")
