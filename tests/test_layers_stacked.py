"""blockrnn.layers with num_layers > 1 and bidirectional=True (nn.LSTM's interface).

* backward equals float64 central finite differences for a 2-layer bidirectional
  LSTM (with and without peepholes) and GRU with sequence_length (rows of length
  0, 1, partial and full), w.r.t. x, the initial states and every parameter;
* a 1-layer unidirectional layer is bit for bit the plain op;
* a bidirectional layer's reverse half is the op run on reverse_sequence'd input,
  reversed back; layer 1 reads layer 0's [forward | reverse] output;
* names, order and shapes of params and states; argument errors.
"""
import numpy as np
import pytest

import blockrnn
from blockrnn.layers import GRU, LSTM

T, B, I, H = 4, 4, 3, 3
LENGTHS = np.array([4, 0, 1, 2])        # full, empty, length 1, partial


def _rand(seed, *shape):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def _make(kind, seed, **kw):
    if kind.startswith("gru"):
        return GRU(I, H, 2, bidirectional=True, reset_after=kind == "gru_reset_after",
                   dtype=np.float64, seed=seed, **kw)
    return LSTM(I, H, 2, bidirectional=True, use_peephole=kind == "lstm_peephole",
                dtype=np.float64, seed=seed, **kw)


def _fd(loss, arr, eps=1e-6):
    g = np.zeros_like(arr)
    for idx in np.ndindex(arr.shape):
        old = arr[idx]
        arr[idx] = old + eps
        lp = loss()
        arr[idx] = old - eps
        lm = loss()
        arr[idx] = old
        g[idx] = (lp - lm) / (2 * eps)
    return g


@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
@pytest.mark.parametrize("kind", ["lstm", "lstm_peephole", "gru", "gru_reset_after"])
def test_stacked_bidirectional_backward_finite_differences(kind, lengths):
    layer = _make(kind, seed=1)
    is_gru = kind.startswith("gru")
    n_states = 1 if is_gru else 2
    x = _rand(2, T, B, I)
    s0 = [_rand(3 + i, 4, B, H) for i in range(n_states)]          # (L*D, B, H)
    wy = _rand(5, T, B, 2 * H)
    ws = [_rand(6 + i, 4, B, H) for i in range(n_states)]

    def pack(parts):
        return parts[0] if is_gru else tuple(parts)

    def loss():
        y, sn, _ = layer.forward(x, pack(s0), sequence_length=lengths)
        sn = [sn] if is_gru else list(sn)
        # the final states enter quadratically, so that their gradient depends on them
        return np.sum(wy * y) + sum(np.sum(w * s ** 2) for w, s in zip(ws, sn))

    y, sn, ctx = layer.forward(x, pack(s0), sequence_length=lengths)
    sn = [sn] if is_gru else list(sn)
    assert y.shape == (T, B, 2 * H) and all(s.shape == (4, B, H) for s in sn)
    if lengths is not None:
        assert not np.any(y[:, 1]) and not np.any(y[1:, 2]) and not np.any(y[2:, 3])
        for s, init in zip(sn, s0):                   # a length-0 row keeps its state
            np.testing.assert_array_equal(s[:, 1], init[:, 1])
    dx, ds0 = layer.backward(ctx, wy, pack([2 * w * s for w, s in zip(ws, sn)]))
    ds0 = [ds0] if is_gru else list(ds0)
    tol = 1e-8
    np.testing.assert_allclose(dx, _fd(loss, x), rtol=0, atol=tol, err_msg="x")
    for k, (a, s) in enumerate(zip(ds0, s0)):
        np.testing.assert_allclose(a, _fd(loss, s), rtol=0, atol=tol, err_msg=f"state[{k}]")
    grads = {k: v.copy() for k, v in layer.grads.items()}
    assert list(grads) == list(layer.params)
    for name, p in layer.params.items():
        np.testing.assert_allclose(grads[name], _fd(loss, p), rtol=0, atol=tol, err_msg=name)
        assert np.any(grads[name] != 0), name           # every parameter is reached


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lengths", [None, LENGTHS], ids=["full", "lengths"])
def test_one_layer_unidirectional_is_the_plain_op(dtype, lengths):
    x = _rand(10, T, B, I).astype(dtype)
    h0, c0 = _rand(11, 1, B, H).astype(dtype), _rand(12, 1, B, H).astype(dtype)
    steps = T if lengths is None else int(lengths.max())
    lstm = LSTM(I, H, use_peephole=True, cell_clip=0.7, dtype=dtype, seed=0)
    y, (h, c), _ = lstm.forward(x, (h0, c0), sequence_length=lengths)
    p = lstm.params
    ref = blockrnn.block_lstm_v2(steps, x, c0[0], h0[0], p["w_l0"], p["wci_l0"], p["wcf_l0"],
                                 p["wco_l0"], p["b_l0"], cell_clip=0.7, use_peephole=True,
                                 sequence_length=lengths)
    np.testing.assert_array_equal(y, ref.h)
    if lengths is None:
        np.testing.assert_array_equal(h[0], ref.h[-1])
        np.testing.assert_array_equal(c[0], ref.cs[-1])
    gru = GRU(I, H, reset_after=False, dtype=dtype, seed=0)
    y, h, _ = gru.forward(x, h0, sequence_length=lengths)
    ref = blockrnn.block_gru(steps, x, h0[0], *gru.params.values(), sequence_length=lengths)
    np.testing.assert_array_equal(y, ref.h)
    gru = GRU(I, H, dtype=dtype, seed=0)
    y, h, _ = gru.forward(x, h0, sequence_length=lengths)
    ref = blockrnn.block_gru_reset_after(steps, x, h0[0], *gru.params.values(),
                                         sequence_length=lengths)
    np.testing.assert_array_equal(y, ref.h)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_reverse_half_is_the_op_on_reversed_input(kind):
    """y[..., H:] of a 1-layer bidirectional layer = reverse_sequence(op(reverse_sequence(x)))
    by hand; its final state is the op's state after each row's last (reversed) step, i.e.
    after original step 0."""
    layer = (GRU(I, H, bidirectional=True, reset_after=False, dtype=np.float64, seed=3)
             if kind == "gru"
             else LSTM(I, H, bidirectional=True, dtype=np.float64, seed=3))
    x = _rand(13, T, B, I)
    h0 = _rand(14, 2, B, H)
    c0 = _rand(15, 2, B, H)
    state = h0 if kind == "gru" else (h0, c0)
    y, sn, _ = layer.forward(x, state, sequence_length=LENGTHS)
    h_n = sn if kind == "gru" else sn[0]
    xr = blockrnn.reverse_sequence(x, LENGTHS)
    for t in range(T):            # the reversal by hand: each row's prefix backwards
        for b in range(B):
            want = x[LENGTHS[b] - 1 - t, b] if t < LENGTHS[b] else x[t, b]
            np.testing.assert_array_equal(xr[t, b], want)
    p = layer.params
    if kind == "gru":
        fwd = blockrnn.block_gru(T, x, h0[0], *(p[f"{n}_l0"] for n in ("w_ru", "w_c", "b_ru",
                                                                          "b_c")),
                                 sequence_length=LENGTHS)
        rev = blockrnn.block_gru(T, xr, h0[1], *(p[f"{n}_l0_reverse"] for n in
                                                 ("w_ru", "w_c", "b_ru", "b_c")),
                                 sequence_length=LENGTHS)
    else:
        z = np.zeros(H)
        fwd = blockrnn.block_lstm_v2(T, x, c0[0], h0[0], p["w_l0"], z, z, z, p["b_l0"],
                                     sequence_length=LENGTHS)
        rev = blockrnn.block_lstm_v2(T, xr, c0[1], h0[1], p["w_l0_reverse"], z, z, z,
                                     p["b_l0_reverse"], sequence_length=LENGTHS)
    np.testing.assert_array_equal(y[..., :H], fwd.h)
    np.testing.assert_array_equal(y[..., H:], blockrnn.reverse_sequence(rev.h, LENGTHS))
    for b in range(B):
        n = LENGTHS[b]
        np.testing.assert_array_equal(h_n[1, b], rev.h[n - 1, b] if n else h0[1, b])
        np.testing.assert_array_equal(h_n[0, b], fwd.h[n - 1, b] if n else h0[0, b])
    # the reverse direction's output at original step 0 is its LAST step: it has seen the
    # whole row, so changing x at the row's last valid step changes it
    x2 = x.copy()
    x2[1, 3] += 1.0                                          # row 3 has length 2
    y2 = layer.forward(x2, state, sequence_length=LENGTHS)[0]
    assert np.all(y2[0, 3, H:] != y[0, 3, H:])
    np.testing.assert_array_equal(y2[0, 3, :H], y[0, 3, :H])   # forward step 0 has not


def test_stacked_layers_chain():
    """A 2-layer bidirectional LSTM = two 1-layer bidirectional LSTMs with its weights,
    the second reading the first's (T, B, 2H) output; states stacked layer by layer."""
    deep = LSTM(I, H, 2, bidirectional=True, use_peephole=True, dtype=np.float64, seed=4)
    one = [LSTM(I, H, bidirectional=True, use_peephole=True, dtype=np.float64),
           LSTM(2 * H, H, bidirectional=True, use_peephole=True, dtype=np.float64)]
    for k, layer in enumerate(one):
        for name in layer.params:
            getattr(layer, name)[...] = deep.params[name.replace("_l0", f"_l{k}")]
    x = _rand(16, T, B, I)
    h0, c0 = _rand(17, 4, B, H), _rand(18, 4, B, H)
    y, (h, c), ctx = deep.forward(x, (h0, c0), sequence_length=LENGTHS)
    y0, (h_a, c_a), ctx0 = one[0].forward(x, (h0[:2], c0[:2]), sequence_length=LENGTHS)
    y1, (h_b, c_b), ctx1 = one[1].forward(y0, (h0[2:], c0[2:]), sequence_length=LENGTHS)
    np.testing.assert_array_equal(y, y1)
    np.testing.assert_array_equal(h, np.concatenate([h_a, h_b]))
    np.testing.assert_array_equal(c, np.concatenate([c_a, c_b]))
    dy = _rand(19, T, B, 2 * H)
    dx, (dh0, dc0) = deep.backward(ctx, dy)
    d1, (dh_b, dc_b) = one[1].backward(ctx1, dy)
    d0, (dh_a, dc_a) = one[0].backward(ctx0, d1)
    np.testing.assert_allclose(dx, d0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(dh0, np.concatenate([dh_a, dh_b]), rtol=0, atol=1e-15)
    for k, layer in enumerate(one):
        for name, g in layer.grads.items():
            np.testing.assert_allclose(deep.grads[name.replace("_l0", f"_l{k}")], g,
                                       rtol=0, atol=1e-15, err_msg=name)


def test_names_order_shapes_and_grads_in_place():
    lstm = LSTM(I, H, 3, bidirectional=True, use_peephole=True, seed=0)
    per_dir = ["w", "b", "wci", "wcf", "wco"]
    assert list(lstm.params) == [f"{n}_l{k}{s}" for k in range(3) for s in ("", "_reverse")
                                 for n in per_dir]
    assert lstm.w_l0.shape == (I + H, 4 * H) and lstm.w_l1_reverse.shape == (3 * H, 4 * H)
    gru = GRU(I, H, 2, reset_after=False, seed=0)
    assert {k: v.shape for k, v in gru.params.items()} == {
        "w_ru_l0": (I + H, 2 * H), "w_c_l0": (I + H, H), "b_ru_l0": (2 * H,), "b_c_l0": (H,),
        "w_ru_l1": (2 * H, 2 * H), "w_c_l1": (2 * H, H), "b_ru_l1": (2 * H,), "b_c_l1": (H,)}
    assert repr(gru) == ("GRU(input_size=3, hidden_size=3, num_layers=2, reset_after=False, "
                         "dtype=float32)")
    gru_ra = GRU(I, H, 2, bidirectional=True, seed=0)
    assert list(gru_ra.params) == [f"{n}_l{k}{s}" for k in range(2) for s in ("", "_reverse")
                                   for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    assert gru_ra.weight_ih_l0.shape == (3 * H, I)
    assert gru_ra.weight_ih_l1_reverse.shape == (3 * H, 2 * H)
    assert gru_ra.weight_hh_l1.shape == (3 * H, H) and gru_ra.bias_hh_l0.shape == (3 * H,)
    assert repr(gru_ra) == ("GRU(input_size=3, hidden_size=3, num_layers=2, "
                            "bidirectional=True, dtype=float32)")
    x = _rand(0, T, B, I).astype(np.float32)
    for layer in (lstm, gru, gru_ra):
        grads, arrays = layer.grads, dict(layer.grads)
        y, _, ctx = layer.forward(x)
        layer.backward(ctx, np.ones_like(y))
        assert layer.grads is grads and all(grads[k] is a for k, a in arrays.items())
        assert all(np.any(a != 0) for a in arrays.values())


def test_errors():
    with pytest.raises(ValueError, match="LSTM: num_layers must be positive, got 0"):
        LSTM(I, H, 0)
    with pytest.raises(TypeError, match="GRU: num_layers must be an int, got float"):
        GRU(I, H, 1.5)
    with pytest.raises(TypeError, match="LSTM: bidirectional must be a bool, got int"):
        LSTM(I, H, bidirectional=1)
    with pytest.raises(TypeError, match="GRU: bidirectional must be a bool, got str"):
        GRU(I, H, bidirectional="yes")
    lstm = LSTM(I, H, 2, bidirectional=True)
    gru = GRU(I, H, 2, bidirectional=True)
    x = np.zeros((T, B, I), np.float32)
    s = np.zeros((4, B, H), np.float32)
    with pytest.raises(ValueError, match=r"state\[0\] \(h\) must have shape \(4, 4, 3\), "
                                         r"got \(1, 4, 3\)"):
        lstm.forward(x, (s[:1], s))
    with pytest.raises(ValueError, match=r"GRU.forward: state must have shape \(4, 4, 3\)"):
        gru.forward(x, s[:2])
    y, _, ctx = lstm.forward(x)
    with pytest.raises(ValueError, match=r"dy must have shape \(4, 4, 6\), got \(4, 4, 3\)"):
        lstm.backward(ctx, y[..., :H])
    with pytest.raises(ValueError, match=r"dstate\[1\] \(c\) must have shape \(4, 4, 3\)"):
        lstm.backward(ctx, y, (None, s[0]))
