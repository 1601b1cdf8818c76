"""blockrnn.layers: NumPy LSTM / GRU layers over the sequence ops.

* forward equals a step-by-step loop of lstm_block_cell / gru_block_cell (float64);
* backward equals float64 central finite differences of a scalar loss that uses the
  outputs AND the final state, for x, the initial state and every parameter, with and
  without sequence_length;
* argument checking names the argument.
"""
import numpy as np
import pytest

import blockrnn
from blockrnn.layers import GRU, LSTM

T, B, I, H = 5, 4, 3, 4
LENGTHS = np.array([5, 2, 0, 3])          # full, partial, empty, partial (max 5 = T)
SHORT = np.array([1, 3, 0, 2])            # max 3 < T: the op runs fewer steps


def _ifco_to_icfo(a, H):
    i, f, c, o = (a[..., k * H:(k + 1) * H] for k in range(4))
    return np.concatenate([i, c, f, o], axis=-1)


def _lstm_loop(layer, x, h0, c0, lengths=None):
    """Reference: one lstm_block_cell per step (ICFO, forget_bias 0), rows frozen past
    their length, outputs zero there."""
    w, b = _ifco_to_icfo(layer.w_l0, layer.hidden_size), _ifco_to_icfo(layer.b_l0,
                                                                       layer.hidden_size)
    peep = ([layer.wci_l0, layer.wcf_l0, layer.wco_l0] if layer.use_peephole
            else [np.zeros(layer.hidden_size)] * 3)
    n = np.full(x.shape[1], x.shape[0]) if lengths is None else np.asarray(lengths)
    h, c, ys = h0[0].copy(), c0[0].copy(), []
    for t in range(x.shape[0]):
        out = blockrnn.lstm_block_cell(x[t], c, h, w, *peep, b,
                                       forget_bias=0.0, cell_clip=layer.cell_clip,
                                       use_peephole=layer.use_peephole)
        live = (t < n)[:, None]
        h = np.where(live, out.h, h)
        c = np.where(live, out.cs, c)
        ys.append(np.where(live, out.h, 0.0))
    return np.stack(ys), h[None], c[None]


def _gru_loop(layer, x, h0, lengths=None):
    n = np.full(x.shape[1], x.shape[0]) if lengths is None else np.asarray(lengths)
    h, ys = h0[0].copy(), []
    for t in range(x.shape[0]):
        if layer.reset_after:
            out = blockrnn.gru_cell_reset_after(x[t], h, layer.weight_ih_l0,
                                                layer.weight_hh_l0, layer.bias_ih_l0,
                                                layer.bias_hh_l0)
        else:
            out = blockrnn.gru_block_cell(x[t], h, layer.w_ru_l0, layer.w_c_l0,
                                          layer.b_ru_l0, layer.b_c_l0)
        live = (t < n)[:, None]
        h = np.where(live, out.h, h)
        ys.append(np.where(live, out.h, 0.0))
    return np.stack(ys), h[None]


def _inputs(seed, cell="lstm"):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (T, B, I))
    h0 = rng.uniform(-1, 1, (1, B, H))
    c0 = rng.uniform(-1, 1, (1, B, H))
    return x, h0, c0


@pytest.mark.parametrize("lengths", [None, LENGTHS, SHORT], ids=["full", "lengths", "short"])
@pytest.mark.parametrize("peephole,clip", [(False, 0.0), (True, 0.0), (True, 0.5)])
def test_lstm_forward_matches_cell_loop(peephole, clip, lengths):
    layer = LSTM(I, H, use_peephole=peephole, cell_clip=clip, dtype=np.float64, seed=1)
    x, h0, c0 = _inputs(2)
    y, (h_n, c_n), _ = layer.forward(x, (h0, c0), sequence_length=lengths)
    y_ref, h_ref, c_ref = _lstm_loop(layer, x, h0, c0, lengths)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(h_n, h_ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(c_n, c_ref, rtol=0, atol=1e-13)


@pytest.mark.parametrize("reset_after", [True, False], ids=["reset_after", "reset_before"])
@pytest.mark.parametrize("lengths", [None, LENGTHS, SHORT], ids=["full", "lengths", "short"])
def test_gru_forward_matches_cell_loop(lengths, reset_after):
    layer = GRU(I, H, reset_after=reset_after, dtype=np.float64, seed=1)
    x, h0, _ = _inputs(3)
    y, h_n, _ = layer.forward(x, h0, sequence_length=lengths)
    y_ref, h_ref = _gru_loop(layer, x, h0, lengths)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(h_n, h_ref, rtol=0, atol=1e-13)


def _loss_weights(seed, has_c):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (T, B, H)), rng.uniform(-1, 1, (1, B, H)),
            rng.uniform(-1, 1, (1, B, H)) if has_c else None)


def _fd_check(layer, loss_of, x, state, analytic_x, analytic_state, eps=1e-6, tol=1e-8):
    """Compare analytic gradients with central differences of loss_of(x, state)."""
    def fd(arr):
        g = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + eps
            lp = loss_of(x, state)
            arr[idx] = old - eps
            lm = loss_of(x, state)
            arr[idx] = old
            g[idx] = (lp - lm) / (2 * eps)
        return g

    np.testing.assert_allclose(analytic_x, fd(x), rtol=0, atol=tol, err_msg="x")
    states = state if isinstance(state, tuple) else (state,)
    astates = analytic_state if isinstance(analytic_state, tuple) else (analytic_state,)
    for k, (s, a) in enumerate(zip(states, astates)):
        np.testing.assert_allclose(a, fd(s), rtol=0, atol=tol, err_msg=f"state[{k}]")
    grads = {k: v.copy() for k, v in layer.grads.items()}
    assert set(grads) == set(layer.params)
    for name, p in layer.params.items():
        assert grads[name].shape == p.shape
        np.testing.assert_allclose(grads[name], fd(p), rtol=0, atol=tol, err_msg=name)


@pytest.mark.parametrize("lengths", [None, LENGTHS, SHORT], ids=["full", "lengths", "short"])
@pytest.mark.parametrize("peephole", [False, True])
def test_lstm_backward_finite_differences(peephole, lengths):
    layer = LSTM(I, H, use_peephole=peephole, dtype=np.float64, seed=4)
    x, h0, c0 = _inputs(5)
    wy, wh, wc = _loss_weights(6, True)

    def loss_of(x, state):
        y, (h_n, c_n), _ = layer.forward(x, state, sequence_length=lengths)
        return np.sum(wy * y) + np.sum(wh * h_n) + np.sum(wc * c_n ** 2)

    y, (h_n, c_n), ctx = layer.forward(x, (h0, c0), sequence_length=lengths)
    dx, (dh0, dc0) = layer.backward(ctx, wy, (wh, 2 * wc * c_n))
    _fd_check(layer, loss_of, x, (h0, c0), dx, (dh0, dc0))


@pytest.mark.parametrize("reset_after", [True, False], ids=["reset_after", "reset_before"])
@pytest.mark.parametrize("lengths", [None, LENGTHS, SHORT], ids=["full", "lengths", "short"])
def test_gru_backward_finite_differences(lengths, reset_after):
    layer = GRU(I, H, reset_after=reset_after, dtype=np.float64, seed=4)
    x, h0, _ = _inputs(7)
    wy, wh, _ = _loss_weights(8, False)

    def loss_of(x, h0):
        y, h_n, _ = layer.forward(x, h0, sequence_length=lengths)
        return np.sum(wy * y) + np.sum(wh * h_n ** 2)

    y, h_n, ctx = layer.forward(x, h0, sequence_length=lengths)
    dx, dh0 = layer.backward(ctx, wy, 2 * wh * h_n)
    _fd_check(layer, loss_of, x, h0, dx, dh0)


def test_lstm_partial_and_missing_upstream_gradients():
    """dy=None, dstate entries None: the same as passing zeros there."""
    layer = LSTM(I, H, dtype=np.float64, seed=0)
    x, h0, c0 = _inputs(0)
    _, (h_n, c_n), ctx = layer.forward(x, (h0, c0))
    dc = np.ones((1, B, H))
    dx1, s1 = layer.backward(ctx, None, (None, dc))
    g1 = {k: v.copy() for k, v in layer.grads.items()}
    dx2, s2 = layer.backward(ctx, np.zeros((T, B, H)), (np.zeros((1, B, H)), dc))
    np.testing.assert_array_equal(dx1, dx2)
    for a, b in zip(s1, s2):
        np.testing.assert_array_equal(a, b)
    for k in g1:
        np.testing.assert_array_equal(g1[k], layer.grads[k])


def test_grads_are_overwritten_not_accumulated():
    layer = GRU(I, H, dtype=np.float64, seed=0)
    x, h0, _ = _inputs(0)
    y, _, ctx = layer.forward(x, h0)
    layer.backward(ctx, np.ones_like(y))
    first = {k: v.copy() for k, v in layer.grads.items()}
    layer.backward(ctx, np.ones_like(y))
    for k in first:
        np.testing.assert_array_equal(first[k], layer.grads[k])


def _layers():
    return [LSTM(I, H, dtype=np.float64, seed=0),
            LSTM(I, H, dtype=np.float64, seed=0, use_peephole=True),
            GRU(I, H, dtype=np.float64, seed=0)]


@pytest.mark.parametrize("lengths", [None, LENGTHS])
def test_grads_are_filled_in_place(lengths):
    """An optimizer that kept layer.grads (or one of its arrays) sees every new
    gradient: backward fills the same dict and the same arrays."""
    for layer in _layers():
        grads = layer.grads
        arrays = dict(grads)
        x, h0, c0 = _inputs(1)
        for scale in (1.0, 3.0):
            state = (h0, c0) if isinstance(layer, LSTM) else h0
            y, _, ctx = layer.forward(x, state, sequence_length=lengths)
            layer.backward(ctx, scale * np.ones_like(y))
            assert layer.grads is grads and set(grads) == set(layer.params)
            for name, a in arrays.items():
                assert grads[name] is a, name
            assert any(np.any(a != 0) for a in arrays.values())
        fresh = type(layer)(I, H, dtype=np.float64, seed=0,
                            **({"use_peephole": True} if "wci_l0" in grads else {}))
        y, _, ctx = fresh.forward(x, state, sequence_length=lengths)
        fresh.backward(ctx, 3.0 * np.ones_like(y))
        for name, a in arrays.items():
            np.testing.assert_array_equal(a, fresh.grads[name], err_msg=name)


@pytest.mark.parametrize("lengths", [None, LENGTHS])
def test_changing_the_returned_y_does_not_change_the_gradients(lengths):
    """y is the caller's array, not the one backward reads: y *= 2 before backward
    leaves every gradient as it was."""
    for make in (lambda: _layers()[1], lambda: _layers()[2]):
        x, h0, c0 = _inputs(2)
        results = []
        for scale in (1.0, 2.0):
            layer = make()
            y, _, ctx = layer.forward(x, sequence_length=lengths)
            dy = np.cos(np.arange(y.size)).reshape(y.shape)
            y *= scale
            dx, _ = layer.backward(ctx, dy)
            results.append([dx] + [layer.grads[k].copy() for k in sorted(layer.grads)])
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)


def test_default_state_is_zeros_and_T_zero():
    layer = LSTM(I, H, seed=0)
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    y1, s1, _ = layer.forward(x)
    y2, s2, _ = layer.forward(x, (np.zeros((1, B, H), np.float32),
                                  np.zeros((1, B, H), np.float32)))
    np.testing.assert_array_equal(y1, y2)
    assert y1.dtype == np.float32 and s1[0].dtype == np.float32
    # T = 0: the final state is the initial state, gradients pass straight through.
    h0 = np.ones((1, B, H), np.float32)
    y, (h_n, c_n), ctx = layer.forward(np.zeros((0, B, I), np.float32), (h0, 2 * h0))
    assert y.shape == (0, B, H)
    np.testing.assert_array_equal(h_n, h0)
    np.testing.assert_array_equal(c_n, 2 * h0)
    dx, (dh0, dc0) = layer.backward(ctx, None, (3 * h0, 4 * h0))
    np.testing.assert_array_equal(dh0, 3 * h0)
    np.testing.assert_array_equal(dc0, 4 * h0)


def test_params_are_the_layer_arrays_and_sgd_step_reduces_loss():
    layer = LSTM(I, H, dtype=np.float64, seed=0)
    assert layer.params["w_l0"] is layer.w_l0 and list(layer.params) == ["w_l0", "b_l0"]
    assert layer.w_l0.shape == (I + H, 4 * H) and layer.b_l0.shape == (4 * H,)
    assert np.all(np.abs(layer.w_l0) <= 1 / np.sqrt(H))
    x, _, _ = _inputs(1)
    target = np.random.default_rng(2).uniform(-0.5, 0.5, (T, B, H))
    losses = []
    for _ in range(100):
        y, _, ctx = layer.forward(x)
        losses.append(0.5 * np.sum((y - target) ** 2))
        layer.backward(ctx, y - target)
        for name, p in layer.params.items():
            p -= 0.1 * layer.grads[name]
    assert losses[-1] < 0.6 * losses[0], losses[::10]
    peep = LSTM(I, H, use_peephole=True, seed=0)
    assert list(peep.params) == ["w_l0", "b_l0", "wci_l0", "wcf_l0", "wco_l0"]
    g = GRU(I, H, reset_after=False, seed=0)
    assert {k: v.shape for k, v in g.params.items()} == {
        "w_ru_l0": (I + H, 2 * H), "w_c_l0": (I + H, H), "b_ru_l0": (2 * H,), "b_c_l0": (H,)}
    g = GRU(I, H, seed=0)   # reset_after=True by default: nn.GRU's names and shapes
    assert g.reset_after and {k: v.shape for k, v in g.params.items()} == {
        "weight_ih_l0": (3 * H, I), "weight_hh_l0": (3 * H, H), "bias_ih_l0": (3 * H,),
        "bias_hh_l0": (3 * H,)}
    assert all(np.all(np.abs(p) <= 1 / np.sqrt(H)) for p in g.params.values())


@pytest.mark.parametrize("call,exc,match", [
    (lambda: LSTM(0, 4), ValueError, "input_size"),
    (lambda: LSTM(3, -1), ValueError, "hidden_size"),
    (lambda: LSTM(3.0, 4), TypeError, "input_size"),
    (lambda: LSTM(3, 4, dtype=np.float16), TypeError, "dtype"),
    (lambda: LSTM(3, 4, use_peephole=1), TypeError, "use_peephole"),
    (lambda: LSTM(3, 4, cell_clip="1"), TypeError, "cell_clip"),
    (lambda: GRU(3, 4, dtype=np.int32), TypeError, "dtype"),
    (lambda: GRU(3, 4, reset_after=1), TypeError, "GRU: reset_after must be a bool, got int"),
])
def test_constructor_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_forward_backward_errors():
    lstm, gru = LSTM(I, H, seed=0), GRU(I, H, seed=0)
    x = np.zeros((T, B, I), np.float32)
    z = np.zeros((1, B, H), np.float32)
    with pytest.raises(ValueError, match=r"x must have shape \(\?, \?, 3\), got \(5, 4, 2\)"):
        lstm.forward(np.zeros((T, B, 2), np.float32))
    with pytest.raises(ValueError, match="x must have shape"):
        lstm.forward(np.zeros((B, I), np.float32))
    with pytest.raises(TypeError, match="x must have dtype float32"):
        lstm.forward(x.astype(np.float64))
    with pytest.raises(TypeError, match=r"state must be None or a tuple \(h, c\)"):
        lstm.forward(x, z)
    with pytest.raises(ValueError, match=r"state\[1\] \(c\) must have shape \(1, 4, 4\)"):
        lstm.forward(x, (z, np.zeros((1, B, H + 1), np.float32)))
    with pytest.raises(ValueError, match=r"state must have shape \(1, 4, 4\), got \(4, 4\)"):
        gru.forward(x, np.zeros((B, H), np.float32))
    with pytest.raises(TypeError, match="sequence_length must have an integer dtype"):
        lstm.forward(x, sequence_length=np.ones(B))
    with pytest.raises(ValueError, match=r"sequence_length must have shape \(B,\) = \(4,\)"):
        gru.forward(x, sequence_length=np.ones(B + 1, int))
    with pytest.raises(ValueError, match=r"sequence_length entries must be in \[0, T\]"):
        lstm.forward(x, sequence_length=np.array([1, 2, 6, 0]))
    y, _, ctx = lstm.forward(x)
    _, _, gctx = gru.forward(x)
    with pytest.raises(ValueError, match="dy must have shape"):
        lstm.backward(ctx, np.zeros((T, B, H + 1), np.float32))
    with pytest.raises(TypeError, match="context must be the LSTMContext"):
        lstm.backward(gctx, y)
    with pytest.raises(TypeError, match="context must be the GRUContext"):
        gru.backward(ctx, y)
    with pytest.raises(ValueError, match="dstate must have shape"):
        gru.backward(gctx, y, np.zeros(H, np.float32))


_KINDS = {"lstm": lambda **kw: LSTM(I, H, seed=0, **kw),
          "lstm_peephole": lambda **kw: LSTM(I, H, seed=0, use_peephole=True, **kw),
          "gru": lambda **kw: GRU(I, H, seed=0, **kw),
          "gru_reset_before": lambda **kw: GRU(I, H, seed=0, reset_after=False, **kw)}
# (a value assigned to the parameter, the exception, what its message says)
_SPOILS = {"none": (lambda p: None, TypeError, "is required, got None"),
           "float64": (lambda p: p.astype(np.float64), TypeError,
                       r"must have dtype float32 \(the layer's dtype\), got float64"),
           "int": (lambda p: p.astype(np.int64), TypeError, "must have dtype float32"),
           "rank": (lambda p: p.ravel()[:1].reshape(()), ValueError, "must have shape"),
           "shape": (lambda p: np.zeros(tuple(n + 1 for n in p.shape), np.float32), ValueError,
                     "must have shape"),
           "string": (lambda p: "w", TypeError, "cannot be converted to a float32 array")}


def _onnx_export():
    try:
        from blockrnn.onnx import export
    except ImportError:   # onnx is an extra (CI installs it: no test skips there)
        return None
    return export


@pytest.mark.parametrize("spoil", sorted(_SPOILS))
@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_spoiled_parameter_is_refused_by_its_name(kind, spoil):
    """A user may assign anything to a parameter attribute: forward, backward, inference()
    and the ONNX export name it (the op's own argument names were w, w_ih, ...)."""
    make, (spoiled, exc, match) = _KINDS[kind], _SPOILS[spoil]
    onnx_export = _onnx_export()
    x = np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)
    for bidirectional in (False, True):
        layer = make(num_layers=2, bidirectional=bidirectional)
        for name in layer._param_names:
            layer = make(num_layers=2, bidirectional=bidirectional)
            y, _, ctx = layer.forward(x)
            good = getattr(layer, name)
            setattr(layer, name, spoiled(good))
            cls = type(layer).__name__
            with pytest.raises(exc, match=rf"^{cls}\.forward: {name} {match}"):
                layer.forward(x)
            with pytest.raises(exc, match=rf"^{cls}\.backward: {name} {match}"):
                layer.backward(ctx, y)
            with pytest.raises(exc, match=rf"^{cls}Inference: {name} {match}"):
                layer.inference()
            if onnx_export is not None:
                with pytest.raises(exc, match=rf"^blockrnn.onnx.export: {name} {match}"):
                    onnx_export(layer)
            setattr(layer, name, good)
            layer.forward(x)   # and the layer works again


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_context_from_another_layer_is_refused(kind):
    """backward would run this layer's weights on another layer's activations (or index
    past its runs): refused when the context's runs do not match the layer's."""
    make = _KINDS[kind]
    x = np.zeros((T, B, I), np.float32)
    one, stacked, bidi = make(), make(num_layers=2), make(bidirectional=True)
    wider = (LSTM(I, H + 1, use_peephole=one.use_peephole) if isinstance(one, LSTM)
             else GRU(I, H + 1, reset_after=one.reset_after))
    wide64 = (LSTM(I, H, use_peephole=one.use_peephole, dtype=np.float64)
              if isinstance(one, LSTM) else GRU(I, H, reset_after=one.reset_after,
                                                dtype=np.float64))
    for a, b in [(one, stacked), (stacked, one), (one, bidi), (bidi, one), (one, wider),
                 (one, wide64)]:
        _, _, ctx = b.forward(x.astype(b.dtype))
        with pytest.raises(ValueError, match=r"context is not from this layer's forward: "
                                             r"its runs have \(input size, hidden size"):
            a.backward(ctx, None)
    _, _, ctx = one.forward(x)
    make().backward(ctx, None)   # a copy of the layer (same configuration) may take it
