"""blockrnn.jax: the fused sequence ops under jax.jit, jax.grad and jax.vmap."""
import jax
import numpy as np
import pytest

jax.config.update("jax_enable_x64", True)   # the float64 gradient checks need it

import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import blockrnn  # noqa: E402
import blockrnn.jax as bj  # noqa: E402

T, B, I, H = 5, 3, 4, 6
LENGTHS = [5, 0, 2]


def _x(dtype, seed=0, shape=(T, B, I)):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def _state(kind, dtype, seed=1):
    h0, c0 = np.random.default_rng(seed).uniform(-1, 1, (2, 1, B, H)).astype(dtype)
    return (h0, c0) if kind == "lstm" else h0


def _model(kind, dtype, peephole=False, seed=3):
    """kind: "lstm", "gru" (GRUBlockCell's reset-before GRU) or "gru_ra" (nn.GRU's
    reset-after GRU): the NumPy layer and the blockrnn.jax function."""
    if kind == "lstm":
        return blockrnn.LSTM(I, H, use_peephole=peephole, dtype=dtype, seed=seed), bj.lstm
    return blockrnn.GRU(I, H, reset_after=kind == "gru_ra", dtype=dtype, seed=seed), bj.gru


def _loss(fn, lengths):
    """A scalar touching every output: y and the final state(s), weighted."""
    def loss(params, x, state):
        y, final = fn(params, x, state, lengths)
        finals = final if isinstance(final, tuple) else (final,)
        weights = jnp.linspace(-1, 1, H, dtype=y.dtype)
        return (jnp.sum(jnp.sin(y) * weights)
                + sum(jnp.sum(f ** 2 * (k + 1)) for k, f in enumerate(finals)))
    return loss


CASES = [("lstm", False), ("lstm", True), ("gru", False), ("gru_ra", False)]


@pytest.mark.parametrize("kind,peephole", CASES)
@pytest.mark.parametrize("lengths", [None, LENGTHS])
def test_gradients_match_finite_differences_float64(kind, peephole, lengths):
    layer, fn = _model(kind, np.float64, peephole)
    args = (layer.params, _x(np.float64), _state(kind, np.float64))
    check_grads(_loss(fn, lengths), args, order=1, modes=["rev"], eps=1e-6,
                atol=1e-7, rtol=1e-7)


@pytest.mark.parametrize("kind,peephole", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lengths", [None, LENGTHS])
def test_equals_numpy_layer_forward_and_backward(kind, peephole, dtype, lengths):
    layer, fn = _model(kind, dtype, peephole)
    x, state = _x(dtype), _state(kind, dtype)
    (y, final), vjp = jax.vjp(lambda p, x, s: fn(p, x, s, lengths), layer.params, x, state)
    y_np, final_np, ctx = layer.forward(x, state, lengths)
    np.testing.assert_array_equal(np.asarray(y), y_np)
    for a, b in zip(jax.tree_util.tree_leaves(final), jax.tree_util.tree_leaves(final_np)):
        np.testing.assert_array_equal(np.asarray(a), b)
    rng = np.random.default_rng(2)
    dy = rng.uniform(-1, 1, y_np.shape).astype(dtype)
    dfinal = jax.tree_util.tree_map(lambda a: rng.uniform(-1, 1, a.shape).astype(dtype),
                                    final_np)
    dparams, dx, dstate = vjp((dy, dfinal))
    dx_np, dstate_np = layer.backward(ctx, dy, dfinal)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(np.asarray(dx), dx_np, rtol=tol, atol=tol)
    for a, b in zip(jax.tree_util.tree_leaves(dstate), jax.tree_util.tree_leaves(dstate_np)):
        np.testing.assert_allclose(np.asarray(a), b, rtol=tol, atol=tol)
    assert dparams.keys() == layer.grads.keys()
    for k, g in layer.grads.items():
        assert dparams[k].dtype == dtype
        np.testing.assert_allclose(np.asarray(dparams[k]), g, rtol=tol, atol=tol, err_msg=k)


@pytest.mark.parametrize("kind", ["lstm", "gru", "gru_ra"])
@pytest.mark.parametrize("shape", [(12, 8, 16, 32), (1, 1, 3, 5), (30, 2, 10, 64)])
def test_float32_matches_a_lax_scan_model(kind, shape):
    T_, B_, I_, H_ = shape
    layer = (blockrnn.LSTM(I_, H_, seed=4) if kind == "lstm"
             else blockrnn.GRU(I_, H_, reset_after=kind == "gru_ra", seed=4))
    fn, ref = {"lstm": (bj.lstm, bj.reference_lstm), "gru": (bj.gru, bj.reference_gru),
               "gru_ra": (bj.gru, bj.reference_gru_reset_after)}[kind]
    x = _x(np.float32, 5, (T_, B_, I_))
    y, final = fn(layer.params, x)
    y_ref, final_ref = ref(_unsuffixed(layer.params), x)
    final = jax.tree_util.tree_map(lambda s: s[0], final)      # (1, B, H) -> (B, H)
    assert y.dtype == y_ref.dtype == jnp.float32
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(final), jax.tree_util.tree_leaves(final_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    g = jax.grad(lambda p: jnp.sum(jnp.tanh(fn(p, x)[0])))(layer.params)
    g_ref = _suffixed(jax.grad(lambda p: jnp.sum(jnp.tanh(ref(p, x)[0])))(
        _unsuffixed(layer.params)))
    assert g.keys() == g_ref.keys()
    for k in g:
        scale = float(jnp.max(jnp.abs(g_ref[k])))
        np.testing.assert_allclose(g[k], g_ref[k], rtol=0, atol=1e-5 * max(scale, 1.0),
                                   err_msg=k)


def _unsuffixed(params):
    """The reference models' keys: a one-layer layer's params without ``_l0``."""
    return {k.removesuffix("_l0"): v for k, v in params.items()}


def _suffixed(params):
    return {k + "_l0": v for k, v in params.items()}


@pytest.mark.parametrize("kind,peephole", CASES)
def test_jit_and_vmap_equal_the_plain_call(kind, peephole):
    layer, fn = _model(kind, np.float32, peephole)
    x, state = _x(np.float32), _state(kind, np.float32)
    loss = _loss(fn, LENGTHS)
    plain = fn(layer.params, x, state, LENGTHS)
    jitted = jax.jit(lambda p, x, s, n: fn(p, x, s, n))(layer.params, x, state,
                                                         np.array(LENGTHS))
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_array_equal(a, b)
    grad = jax.grad(loss)(layer.params, x, state)
    grad_jit = jax.jit(jax.grad(loss))(layer.params, x, state)
    for k in grad:   # XLA fuses the loss's own math differently under jit: ulps, not bits
        np.testing.assert_allclose(grad[k], grad_jit[k], rtol=1e-6, atol=1e-6)
    # vmap over a stack of sequences (and of parameters) equals one call per element
    xs = np.stack([x, 0.5 * x, -x])
    ys = jax.vmap(lambda x: fn(layer.params, x, state, LENGTHS)[0])(xs)
    gs = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, None)))(layer.params, xs, state)
    for n in range(3):
        np.testing.assert_array_equal(ys[n], fn(layer.params, xs[n], state, LENGTHS)[0])
        g_n = jax.grad(loss)(layer.params, xs[n], state)
        for k in g_n:
            np.testing.assert_allclose(gs[k][n], g_n[k], rtol=1e-6, atol=1e-6)
    params2 = jax.tree_util.tree_map(lambda p: jnp.stack([p, 0.5 * p]), layer.params)
    y2 = jax.vmap(lambda p: fn(p, x)[0])(params2)
    half = jax.tree_util.tree_map(lambda p: 0.5 * p, layer.params)
    np.testing.assert_array_equal(y2[1], fn(half, x)[0])


def test_traced_lengths_and_zero_length_rows():
    layer, _ = _model("lstm", np.float64)
    x, state = _x(np.float64), _state("lstm", np.float64)
    f = jax.jit(lambda n: bj.lstm(layer.params, x, state, n)[1])
    h, c = f(jnp.array([0, 0, 0]))
    np.testing.assert_array_equal(h, state[0])
    np.testing.assert_array_equal(c, state[1])


def test_bad_input_is_refused():
    layer, _ = _model("lstm", np.float32)
    x = _x(np.float32)
    with pytest.raises(TypeError, match=r"params\['b_l0'\] must have dtype float32 .*"
                                        r"got float64"):
        bj.lstm(dict(layer.params, b_l0=layer.b_l0.astype(np.float64)), x)
    with pytest.raises(ValueError, match=r"x must have shape \(T, B, I\) with I = 4"):
        bj.lstm(layer.params, x[..., :3])
    with pytest.raises(ValueError, match=r"state\[1\] \(c0\) must have shape \(1, 3, 6\)"):
        bj.lstm(layer.params, x, (np.zeros((1, B, H), np.float32),
                                  np.zeros((1, B, 5), np.float32)))
    with pytest.raises(ValueError, match=r"params must have the keys \['w_l0', 'b_l0'\]"):
        bj.lstm({"w_l0": layer.w_l0}, x)
    with pytest.raises(ValueError, match=r"params must have the keys .*got \['b', 'w'\]"):
        bj.lstm({"w": layer.w_l0, "b": layer.b_l0}, x)
    with pytest.raises(ValueError, match="peepholes need all of"):
        bj.lstm(dict(layer.params, wci_l0=np.zeros(H, np.float32)), x)
    with pytest.raises(ValueError, match=r"sequence_length entries must be in \[0, T\]"):
        bj.lstm(layer.params, x, None, [1, 2, 9])
    with pytest.raises(TypeError, match="x must be float32 or float64, got int64"):
        bj.lstm(layer.params, np.zeros((T, B, I), np.int64))
    with pytest.raises(ValueError, match=r"params\['w_l0'\] must have shape \(I\+H, 4H\), "
                                         r"got \(5, 24\)"):   # fewer rows than H: I < 0
        bj.lstm(dict(layer.params, w_l0=layer.w_l0[:5]), x)
    with pytest.raises(TypeError, match="cell_clip must be a real number, got str"):
        bj.lstm(layer.params, x, cell_clip="1")
    # any real number: a NumPy float32 was refused
    np.testing.assert_array_equal(bj.lstm(layer.params, x, cell_clip=np.float32(0.25))[0],
                                  bj.lstm(layer.params, x, cell_clip=0.25)[0])
    gru = blockrnn.GRU(I, H, reset_after=False)
    with pytest.raises(ValueError, match=r"params\['w_ru_l0'\] must have shape \(10, 12\)"):
        bj.gru(dict(gru.params, w_ru_l0=gru.w_ru_l0[:, :6]), x)
    with pytest.raises(ValueError, match=r"state must have shape \(1, 3, 6\)"):
        bj.gru(gru.params, x, np.zeros((B, H), np.float32))
    with pytest.raises(ValueError, match=r"params\['w_c_l0'\] must have shape \(I\+H, H\), "
                                         r"got \(5, 6\)"):
        bj.gru(dict(gru.params, w_c_l0=gru.w_c_l0[:5]), x)
    gru = blockrnn.GRU(I, H)      # reset-after: nn.GRU's keys
    with pytest.raises(ValueError, match=r"params\['bias_hh_l0'\] must have shape \(18,\)"):
        bj.gru(dict(gru.params, bias_hh_l0=gru.bias_hh_l0[:6]), x)
    with pytest.raises(ValueError, match=r"params\['weight_hh_l0'\] must have shape "
                                         r"\(3H, H\), got \(17, 6\)"):
        bj.gru(dict(gru.params, weight_hh_l0=gru.weight_hh_l0[:17]), x)
    with pytest.raises(ValueError, match=r"x must have shape \(T, B, I\) with I = 4"):
        bj.gru(gru.params, x[..., :3])
    with pytest.raises(ValueError, match=r"params must have the keys \['weight_ih_l0', "):
        bj.gru(dict(gru.params, w_c_l0=gru.weight_hh_l0), x)
    with pytest.raises(TypeError, match=r"params\['weight_hh_l0'\] must have dtype float32"):
        bj.gru(dict(gru.params, weight_hh_l0=gru.weight_hh_l0.astype(np.float64)), x)


def test_float64_without_x64_is_refused_clearly():
    import subprocess
    import sys
    code = ("import numpy as np, blockrnn, blockrnn.jax as bj\n"
            "layer = blockrnn.LSTM(3, 4, dtype=np.float64)\n"
            "try:\n"
            "    bj.lstm(layer.params, np.zeros((2, 1, 3)))\n"
            "except TypeError as e:\n"
            "    assert 'jax_enable_x64 is off' in str(e), e\n"
            "else:\n"
            "    raise SystemExit('no error')\n")
    subprocess.run([sys.executable, "-c", code], check=True)
