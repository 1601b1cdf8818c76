"""JAX adapter: blockrnn's fused sequence ops as pure, differentiable JAX functions (CPU).

Optional: needs jax (``import blockrnn`` never imports it; this module does).

* ``lstm(params, x, state=None, sequence_length=None, *, cell_clip=0.0)``
  -> ``(y, (h_n, c_n))`` over ``block_lstm_v2`` / ``block_lstm_grad_v2``.
* ``gru(params, x, state=None, sequence_length=None)`` -> ``(y, h_n)`` over
  ``block_gru_reset_after`` / ``block_gru_reset_after_grad`` (nn.GRU's, Keras 3's
  and Flax's reset-after GRU: a ``blockrnn.GRU()``'s params) or ``block_gru`` /
  ``block_gru_grad`` (GRUBlockCell's reset-before GRU: a
  ``blockrnn.GRU(reset_after=False)``'s params), by the keys of ``params``.

One layer, one direction. ``params`` is a dict with the keys and TensorFlow
layouts of a one-layer unidirectional NumPy layer's ``params``, so
``blockrnn.LSTM(I, H).params`` passes straight in: LSTM ``w_l0`` (I+H, 4H)
IFCO, ``b_l0`` (4H,), and with peepholes ``wci_l0``, ``wcf_l0``, ``wco_l0``
(H,) (their presence turns peepholes on); the reset-after GRU nn.GRU's
``weight_ih_l0`` (3H, I), ``weight_hh_l0`` (3H, H), ``bias_ih_l0``,
``bias_hh_l0`` (3H,); the reset-before GRU ``w_ru_l0`` (I+H, 2H) [r | u],
``w_c_l0`` (I+H, H), ``b_ru_l0`` (2H,), ``b_c_l0`` (H,). ``x`` is time-major
(T, B, I); ``state`` is ``(h0, c0)`` for the LSTM and ``h0`` for the GRU,
each (1, B, H) as the layers' (None: zeros); ``sequence_length`` None or (B,)
integers in [0, T] (later outputs are zero, the final state is each row's
last). Returns y (T, B, H) and the final state(s) (1, B, H). float32 or
float64 throughout (float64 needs ``jax_enable_x64``); every array must have
the dtype of ``x``.

How: the sequence op runs in ``jax.pure_callback`` (blockrnn's compiled
kernels on NumPy views, the GIL released) under a ``jax.custom_vjp`` whose
backward calls the gradient op with the forward's saved gates. So ``jax.jit``,
``jax.grad`` / ``jax.vjp`` (first order, reverse mode) and ``jax.vmap`` (one
callback per mapped element) work. Cell clipping is ignored by the gradient,
as in TensorFlow.

``reference_lstm``, ``reference_gru`` and ``reference_gru_reset_after`` are the
same math written in ``jax.numpy`` with ``lax.scan`` (no callbacks, no
sequence_length): the comparison point for tests and the benchmark. They take
the unsuffixed keys (``w``, ``b``; ``w_ru``, ``w_c``, ``b_ru``, ``b_c``;
``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``) and states (B, H).
"""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import blockrnn
from blockrnn._validation import check_float, check_sequence_length, steps_to_run

__all__ = ["lstm", "gru", "reference_lstm", "reference_gru", "reference_gru_reset_after"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# --------------------------------------------------------------------------
# argument checking (at trace time: shapes and dtypes are static)
# --------------------------------------------------------------------------

def _check(where, name, a, dtype, shape):
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise TypeError(f"{where}: {name} must be a JAX or NumPy array, got {type(a).__name__}")
    if np.dtype(a.dtype) != dtype:
        raise TypeError(f"{where}: {name} must have dtype {dtype} (the dtype of x), got "
                        f"{np.dtype(a.dtype)}")
    if len(a.shape) != len(shape) or any(s != d for s, d in zip(shape, a.shape)):
        raise ValueError(f"{where}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    return a


def _x(where, x, I):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{where}: x must be a JAX or NumPy array, got {type(x).__name__}")
    dtype = np.dtype(x.dtype)
    if dtype not in _DTYPES:
        raise TypeError(f"{where}: x must be float32 or float64, got {dtype}")
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        raise TypeError(f"{where}: x is float64 but JAX runs in float32 (jax_enable_x64 is "
                        f"off); enable it with jax.config.update('jax_enable_x64', True) "
                        f"or pass float32")
    if len(x.shape) != 3 or x.shape[2] != I:
        raise ValueError(f"{where}: x must have shape (T, B, I) with I = {I} (from the "
                         f"params), got {tuple(x.shape)}")
    return dtype, x.shape[0], x.shape[1]


def _params(where, params, keys, optional=()):
    if not isinstance(params, dict):
        raise TypeError(f"{where}: params must be a dict, got {type(params).__name__}")
    missing = [k for k in keys if k not in params]
    extra = sorted(set(params) - set(keys) - set(optional))
    if missing or extra:
        raise ValueError(f"{where}: params must have the keys {list(keys)}"
                         + (f" (optionally {list(optional)})" if optional else "")
                         + f", got {sorted(params)}")


def _lengths(where, sequence_length, T, B):
    """None, or an int32 array (B,); concrete values are range-checked here, traced ones
    by the op inside the callback."""
    if sequence_length is None:
        return None
    if isinstance(sequence_length, jax.core.Tracer):
        if tuple(sequence_length.shape) != (B,) or not jnp.issubdtype(sequence_length.dtype,
                                                                      jnp.integer):
            raise ValueError(f"{where}: sequence_length must be an integer array of shape "
                             f"({B},), got {sequence_length.dtype}{tuple(sequence_length.shape)}")
        return sequence_length.astype(jnp.int32)
    return jnp.asarray(check_sequence_length(where, np.asarray(sequence_length), B, T),
                       jnp.int32)


def _np_lengths(lengths):
    return None if lengths is None else np.asarray(lengths, np.int64)


def _final(seq, init, lengths):
    """The state after each row's last step (differentiable): seq[n_b - 1, b], init[b]
    when n_b == 0."""
    T, B = seq.shape[:2]
    if lengths is None:
        return seq[T - 1] if T else init
    picked = seq[jnp.maximum(lengths - 1, 0), jnp.arange(B)]
    return jnp.where((lengths > 0)[:, None], picked, init)


def _int_zero(lengths):
    """The cotangent of the integer lengths (float0 zeros), or None."""
    return None if lengths is None else np.zeros(lengths.shape, jax.dtypes.float0)


def _sds(a, n=1):
    return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for _ in range(n))


# --------------------------------------------------------------------------
# LSTM
# --------------------------------------------------------------------------

def _lstm_fwd_np(use_peephole, cell_clip, x, h0, c0, w, wci, wcf, wco, b, lengths):
    lengths = _np_lengths(lengths)
    out = blockrnn.block_lstm_v2(steps_to_run(x.shape[0], lengths), x, c0, h0, w, wci, wcf,
                                 wco, b, cell_clip=cell_clip, use_peephole=use_peephole,
                                 sequence_length=lengths)
    return tuple(out)   # i, cs, f, o, ci, co, h


def _lstm_bwd_np(use_peephole, x, h0, c0, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h,
                 dcs, dh, lengths):
    lengths = _np_lengths(lengths)
    g = blockrnn.block_lstm_grad_v2(steps_to_run(x.shape[0], lengths), x, c0, h0, w, wci,
                                    wcf, wco, b, i, cs, f, o, ci, co, h, dcs, dh,
                                    use_peephole=use_peephole, sequence_length=lengths)
    return (g.x_grad, g.h_prev_grad, g.cs_prev_grad, g.w_grad, g.wci_grad, g.wcf_grad,
            g.wco_grad, g.b_grad)


def _lstm_gates(use_peephole, cell_clip, x, h0, c0, w, wci, wcf, wco, b, lengths):
    T, B = x.shape[:2]
    seq = jax.ShapeDtypeStruct((T, B, h0.shape[1]), x.dtype)
    return jax.pure_callback(partial(_lstm_fwd_np, use_peephole, cell_clip), (seq,) * 7,
                             x, h0, c0, w, wci, wcf, wco, b, lengths, vmap_method="sequential")


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _lstm_seq(use_peephole, cell_clip, x, h0, c0, w, wci, wcf, wco, b, lengths):
    """(h, cs), each (T, B, H): block_lstm_v2's outputs and cell states at every step."""
    gates = _lstm_gates(use_peephole, cell_clip, x, h0, c0, w, wci, wcf, wco, b, lengths)
    return gates[6], gates[1]


def _lstm_seq_fwd(use_peephole, cell_clip, x, h0, c0, w, wci, wcf, wco, b, lengths):
    gates = _lstm_gates(use_peephole, cell_clip, x, h0, c0, w, wci, wcf, wco, b, lengths)
    return (gates[6], gates[1]), (x, h0, c0, w, wci, wcf, wco, b, lengths, gates)


def _lstm_seq_bwd(use_peephole, cell_clip, res, cot):
    x, h0, c0, w, wci, wcf, wco, b, lengths, gates = res
    dh, dcs = cot
    shapes = _sds(x) + _sds(h0, 2) + _sds(w) + _sds(wci, 3) + _sds(b)
    grads = jax.pure_callback(partial(_lstm_bwd_np, use_peephole), shapes,
                              x, h0, c0, w, wci, wcf, wco, b, *gates, dcs, dh, lengths,
                              vmap_method="sequential")
    return (*grads, _int_zero(lengths))


_lstm_seq.defvjp(_lstm_seq_fwd, _lstm_seq_bwd)


def lstm(params, x, state=None, sequence_length=None, *, cell_clip=0.0):
    """An LSTM (BlockLSTMV2 math) over a time-major sequence, differentiable in JAX.

    params: dict ``w_l0`` (I+H, 4H) IFCO, ``b_l0`` (4H,), optionally ``wci_l0``,
    ``wcf_l0``, ``wco_l0`` (H,) (peepholes): a one-layer unidirectional
    ``blockrnn.LSTM``'s params; x (T, B, I); state None or (h0, c0), each
    (1, B, H); sequence_length None or (B,) ints in [0, T]; cell_clip > 0 clips
    the cell state. Returns ``y, (h_n, c_n)``: y (T, B, H), h_n and c_n (1, B, H).
    """
    where = "blockrnn.jax.lstm"
    peep = ("wci_l0", "wcf_l0", "wco_l0")
    _params(where, params, ("w_l0", "b_l0"), peep)
    use_peephole = "wci_l0" in params
    if use_peephole and not all(k in params for k in peep):
        raise ValueError(f"{where}: peepholes need all of {list(peep)}, got {sorted(params)}")
    w = params["w_l0"]
    if (len(getattr(w, "shape", ())) != 2 or w.shape[1] % 4 or w.shape[1] == 0
            or w.shape[0] < w.shape[1] // 4):
        raise ValueError(f"{where}: params['w_l0'] must have shape (I+H, 4H), got "
                         f"{tuple(getattr(w, 'shape', ()))}")
    H = w.shape[1] // 4
    dtype, T, B = _x(where, x, w.shape[0] - H)
    _check(where, "params['w_l0']", w, dtype, (w.shape[0], 4 * H))
    b = _check(where, "params['b_l0']", params["b_l0"], dtype, (4 * H,))
    if use_peephole:
        wci, wcf, wco = (_check(where, f"params[{k!r}]", params[k], dtype, (H,)) for k in peep)
    else:
        wci = wcf = wco = jnp.zeros(H, dtype)
    cell_clip = check_float(where, "cell_clip", cell_clip)
    if state is None:
        state = (None, None)
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"{where}: state must be None or a tuple (h0, c0), got "
                        f"{type(state).__name__}")
    h0, c0 = (jnp.zeros((B, H), dtype) if s is None
              else _check(where, n, s, dtype, (1, B, H))[0]
              for n, s in zip(("state[0] (h0)", "state[1] (c0)"), state))
    lengths = _lengths(where, sequence_length, T, B)
    h, cs = _lstm_seq(use_peephole, cell_clip, x, h0, c0, w, wci, wcf, wco, b, lengths)
    return h, (_final(h, h0, lengths)[None], _final(cs, c0, lengths)[None])


# --------------------------------------------------------------------------
# GRU: both variants (GRUBlockCell's reset-before, nn.GRU's reset-after)
# --------------------------------------------------------------------------

def _gru_seq_function(forward_op, grad_op, n_outputs):
    """A GRU op pair as a differentiable JAX function seq(x, h0, w1, w2, b1, b2, lengths)
    -> h (T, B, H): forward_op's outputs (n_outputs (T, B, H) arrays, h last) run in a
    callback, and the backward calls grad_op with them (its gradients come in the
    order of the arguments: x, h0, w1, w2, b1, b2)."""
    def forward_np(x, h0, w1, w2, b1, b2, lengths):
        lengths = _np_lengths(lengths)
        return tuple(forward_op(steps_to_run(x.shape[0], lengths), x, h0, w1, w2, b1, b2,
                                sequence_length=lengths))

    def grad_np(x, h0, w1, w2, b1, b2, outputs, dh, lengths):
        lengths = _np_lengths(lengths)
        return tuple(grad_op(steps_to_run(x.shape[0], lengths), x, h0, w1, w2, b1, b2,
                             *outputs, dh, sequence_length=lengths))

    def outputs(x, h0, w1, w2, b1, b2, lengths):
        T, B = x.shape[:2]
        seq = jax.ShapeDtypeStruct((T, B, h0.shape[1]), x.dtype)
        return jax.pure_callback(forward_np, (seq,) * n_outputs, x, h0, w1, w2, b1, b2,
                                 lengths, vmap_method="sequential")

    @jax.custom_vjp
    def seq(x, h0, w1, w2, b1, b2, lengths):
        return outputs(x, h0, w1, w2, b1, b2, lengths)[-1]

    def seq_fwd(x, h0, w1, w2, b1, b2, lengths):
        outs = outputs(x, h0, w1, w2, b1, b2, lengths)
        return outs[-1], (x, h0, w1, w2, b1, b2, lengths, outs)

    def seq_bwd(res, dh):
        x, h0, w1, w2, b1, b2, lengths, outs = res
        shapes = _sds(x) + _sds(h0) + _sds(w1) + _sds(w2) + _sds(b1) + _sds(b2)
        grads = jax.pure_callback(grad_np, shapes, x, h0, w1, w2, b1, b2, outs, dh, lengths,
                                  vmap_method="sequential")
        return (*grads, _int_zero(lengths))

    seq.defvjp(seq_fwd, seq_bwd)
    return seq


_gru_seq = _gru_seq_function(blockrnn.block_gru, blockrnn.block_gru_grad, 4)   # r, u, c, h
_gru_reset_after_seq = _gru_seq_function(
    blockrnn.block_gru_reset_after, blockrnn.block_gru_reset_after_grad, 5)  # r, z, n, hn, h

_RESET_BEFORE_KEYS = ("w_ru_l0", "w_c_l0", "b_ru_l0", "b_c_l0")
_RESET_AFTER_KEYS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")


def gru(params, x, state=None, sequence_length=None):
    """A GRU over a time-major sequence, differentiable in JAX: the variant of the
    keys of ``params``, a one-layer unidirectional ``blockrnn.GRU``'s params.

    Reset after the recurrent matmul (nn.GRU, Keras 3, ONNX's linear_before_reset=1,
    ``blockrnn.GRU(reset_after=True)``, the default): ``weight_ih_l0`` (3H, I),
    ``weight_hh_l0`` (3H, H), ``bias_ih_l0``, ``bias_hh_l0`` (3H,), rows r, z, n
    (nn.GRU's layout). Reset before it (TensorFlow's GRUBlockCell,
    ``blockrnn.GRU(reset_after=False)``): ``w_ru_l0`` (I+H, 2H) [r | u], ``w_c_l0``
    (I+H, H), ``b_ru_l0`` (2H,), ``b_c_l0`` (H,).
    x (T, B, I); state None or h0 (1, B, H); sequence_length None or (B,) ints
    in [0, T]. Returns ``y, h_n``: y (T, B, H), h_n (1, B, H).
    """
    where = "blockrnn.jax.gru"
    if isinstance(params, dict) and "weight_ih_l0" in params:
        _params(where, params, _RESET_AFTER_KEYS)
        w_ih, w_hh = params["weight_ih_l0"], params["weight_hh_l0"]
        for name, w in (("weight_ih_l0", w_ih), ("weight_hh_l0", w_hh)):
            if len(getattr(w, "shape", ())) != 2 or w.shape[0] == 0 or w.shape[0] % 3:
                raise ValueError(f"{where}: params['{name}'] must have shape (3H, "
                                 f"{'I' if name == 'weight_ih_l0' else 'H'}), got "
                                 f"{tuple(getattr(w, 'shape', ()))}")
        H = w_hh.shape[0] // 3
        dtype, T, B = _x(where, x, w_ih.shape[1])
        weights = [_check(where, f"params['{k}']", params[k], dtype, shape) for k, shape in
                   zip(_RESET_AFTER_KEYS, ((3 * H, w_ih.shape[1]), (3 * H, H), (3 * H,),
                                           (3 * H,)))]
        seq = _gru_reset_after_seq
    else:
        _params(where, params, _RESET_BEFORE_KEYS)
        w_c = params["w_c_l0"]
        if len(getattr(w_c, "shape", ())) != 2 or w_c.shape[1] == 0 or w_c.shape[0] < w_c.shape[1]:
            raise ValueError(f"{where}: params['w_c_l0'] must have shape (I+H, H), got "
                             f"{tuple(getattr(w_c, 'shape', ()))}")
        H = w_c.shape[1]
        IH = w_c.shape[0]
        dtype, T, B = _x(where, x, IH - H)
        weights = [_check(where, f"params['{k}']", params[k], dtype, shape) for k, shape in
                   zip(_RESET_BEFORE_KEYS, ((IH, 2 * H), (IH, H), (2 * H,), (H,)))]
        seq = _gru_seq
    h0 = (jnp.zeros((B, H), dtype) if state is None
          else _check(where, "state", state, dtype, (1, B, H))[0])
    lengths = _lengths(where, sequence_length, T, B)
    h = seq(x, h0, *weights, lengths)
    return h, _final(h, h0, lengths)[None]


# --------------------------------------------------------------------------
# the same math in jax.numpy (lax.scan): tests and benchmarks compare with it
# --------------------------------------------------------------------------

def reference_lstm(params, x, state=None):
    """``lstm`` written with ``lax.scan`` (no peepholes, no clip, full length).

    Returns ``y, (h_n, c_n)``."""
    w, b = params["w"], params["b"]
    H = w.shape[1] // 4
    I = w.shape[0] - H
    wx, wh = w[:I], w[I:]
    h0, c0 = state if state is not None else (jnp.zeros((x.shape[1], H), x.dtype),) * 2
    xw = jnp.einsum("tbi,ig->tbg", x, wx) + b          # the input products, all steps at once

    def step(carry, xw_t):
        h, c = carry
        g = xw_t + h @ wh
        i, f, ci, o = jnp.split(g, 4, axis=-1)        # IFCO
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(ci)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    (h, c), y = jax.lax.scan(step, (h0, c0), xw)
    return y, (h, c)


def reference_gru(params, x, state=None):
    """``gru`` written with ``lax.scan`` (full length). Returns ``y, h_n``."""
    w_ru, w_c, b_ru, b_c = params["w_ru"], params["w_c"], params["b_ru"], params["b_c"]
    H = w_c.shape[1]
    I = w_c.shape[0] - H
    h0 = state if state is not None else jnp.zeros((x.shape[1], H), x.dtype)
    xru = jnp.einsum("tbi,ig->tbg", x, w_ru[:I]) + b_ru
    xc = jnp.einsum("tbi,ih->tbh", x, w_c[:I]) + b_c

    def step(h, xs):
        xru_t, xc_t = xs
        r, u = jnp.split(jax.nn.sigmoid(xru_t + h @ w_ru[I:]), 2, axis=-1)
        c = jnp.tanh(xc_t + (r * h) @ w_c[I:])
        h = u * h + (1 - u) * c
        return h, h

    h, y = jax.lax.scan(step, h0, (xru, xc))
    return y, h


def reference_gru_reset_after(params, x, state=None):
    """``gru`` with reset-after params written with ``lax.scan`` (full length): the keys
    without ``_l0`` (``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``), nn.GRU's
    math ``n = tanh(x W_in + b_in + r * (h W_hn + b_hn))``. Returns ``y, h_n``."""
    w_ih, w_hh = params["weight_ih"], params["weight_hh"]
    b_ih, b_hh = params["bias_ih"], params["bias_hh"]
    H = w_hh.shape[1]
    h0 = state if state is not None else jnp.zeros((x.shape[1], H), x.dtype)
    gi = jnp.einsum("tbi,gi->tbg", x, w_ih) + b_ih     # the input products, all steps

    def step(h, gi_t):
        gh = h @ w_hh.T + b_hh
        r = jax.nn.sigmoid(gi_t[:, :H] + gh[:, :H])
        z = jax.nn.sigmoid(gi_t[:, H:2 * H] + gh[:, H:2 * H])
        n = jnp.tanh(gi_t[:, 2 * H:] + r * gh[:, 2 * H:])
        h = (1 - z) * n + z * h
        return h, h

    h, y = jax.lax.scan(step, h0, gi)
    return y, h
