"""Reusable random-input generators for the blockrnn tests.

All generators are deterministic (``numpy.random.default_rng(seed)``), produce unit-scale
values (``uniform(-1, 1)``; weight matrices scaled by ``1/sqrt(I+H)``), cast to ``dtype``,
and return ``dict``s keyed by TF's / blockrnn's argument names, so they can be splatted into
``tf.raw_ops.<Op>(**d)``, ``blockrnn.raw_ops.<Op>(**d)`` or the snake-case functions.

Forward-op inputs:
    lstm_cell_inputs(B, I, H, ...)          x[B,I], cs_prev, h_prev, w[I+H,4H], wci, wcf, wco, b
    block_lstm_inputs(T, B, I, H, ...)      the same with x[T,B,I] (no seq_len_max)
    gru_cell_inputs(B, I, H, ...)           x, h_prev, w_ru, w_c, b_ru, b_c
Upstream gradients:
    upstream_grads(shape, names, ...)       e.g. ("cs_grad", "h_grad") or ("d_h",)
Complete grad-op inputs (forward values computed by the float64 reference, then cast):
    lstm_cell_grad_inputs(B, I, H, ...)     all LSTMBlockCellGrad inputs
    block_lstm_grad_inputs(T, B, I, H, L, ...)  all BlockLSTMGrad(V2) inputs (incl. seq_len_max)
    gru_cell_grad_inputs(B, I, H, ...)      all GRUBlockCellGrad inputs
Helpers:
    LSTM_FORWARD_FIELDS, LSTM_ARGS, ...     argument / output name tuples
    rel_err(a, ref)                         max |a - ref| / max(1, |ref|) (elementwise floor)
"""

import os
import sys

import numpy as np
import pytest

LSTM_ARGS = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
LSTM_FORWARD_FIELDS = ("i", "cs", "f", "o", "ci", "co")          # + "h" for sequence ops
GATE_FIELDS = ("i", "f", "o", "ci", "co")                       # TF garbage at t >= L
GRU_ARGS = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
GRU_FORWARD_FIELDS = ("r", "u", "c")


def _u(rng, shape, scale=1.0):
    return rng.uniform(-scale, scale, size=shape)


def lstm_cell_inputs(B, I, H, dtype=np.float32, seed=0):
    """Inputs of LSTMBlockCell: x[B,I], cs_prev/h_prev[B,H], w[I+H,4H], wci/wcf/wco[H], b[4H]."""
    rng = np.random.default_rng(seed)
    ws = 1.0 / np.sqrt(max(I + H, 1))
    d = dict(x=_u(rng, (B, I)), cs_prev=_u(rng, (B, H)), h_prev=_u(rng, (B, H)),
             w=_u(rng, (I + H, 4 * H), ws), wci=_u(rng, (H,)), wcf=_u(rng, (H,)),
             wco=_u(rng, (H,)), b=_u(rng, (4 * H,), 0.5))
    return {k: v.astype(dtype) for k, v in d.items()}


def block_lstm_inputs(T, B, I, H, dtype=np.float32, seed=0):
    """Inputs of BlockLSTM(V2) except seq_len_max: like lstm_cell_inputs with x[T,B,I]."""
    d = lstm_cell_inputs(B, I, H, dtype, seed)
    rng = np.random.default_rng(seed + 7919)
    d["x"] = _u(rng, (T, B, I)).astype(dtype)
    return d


def gru_cell_inputs(B, I, H, dtype=np.float32, seed=0):
    """Inputs of GRUBlockCell: x[B,I], h_prev[B,H], w_ru[I+H,2H], w_c[I+H,H], b_ru[2H], b_c[H]."""
    rng = np.random.default_rng(seed)
    ws = 1.0 / np.sqrt(max(I + H, 1))
    d = dict(x=_u(rng, (B, I)), h_prev=_u(rng, (B, H)), w_ru=_u(rng, (I + H, 2 * H), ws),
             w_c=_u(rng, (I + H, H), ws), b_ru=_u(rng, (2 * H,), 0.5), b_c=_u(rng, (H,), 0.5))
    return {k: v.astype(dtype) for k, v in d.items()}


def upstream_grads(shape, names=("cs_grad", "h_grad"), dtype=np.float32, seed=0):
    """Random unit-scale upstream gradients of the given shape, one per name."""
    rng = np.random.default_rng(seed + 104729)
    return {n: _u(rng, shape).astype(dtype) for n in names}


def _reference():
    from blockrnn import _reference as ref
    return ref


def lstm_cell_grad_inputs(B, I, H, dtype=np.float32, seed=0, forget_bias=1.0,
                          cell_clip=3.0, use_peephole=False):
    """All inputs of LSTMBlockCellGrad (no use_peephole): forward values from the float64
    reference on the dtype-rounded inputs, then cast to dtype; random cs_grad/h_grad."""
    d = lstm_cell_inputs(B, I, H, dtype, seed)
    fwd = _reference().lstm_block_cell(**d, forget_bias=forget_bias, cell_clip=cell_clip,
                                       use_peephole=use_peephole)
    d.update({k: getattr(fwd, k).astype(dtype) for k in LSTM_FORWARD_FIELDS})
    d.update(upstream_grads((B, H), dtype=dtype, seed=seed))
    return d


def block_lstm_grad_inputs(T, B, I, H, L, dtype=np.float32, seed=0, forget_bias=1.0,
                           cell_clip=3.0, use_peephole=False, v2=False):
    """All inputs of BlockLSTMGrad (v2=False, ICFO) / BlockLSTMGradV2 (v2=True, IFCO), with
    seq_len_max=np.int64(L); forward values from the float64 reference (zeros at t >= L);
    random cs_grad/h_grad[T,B,H].  forget_bias is ignored for v2."""
    ref = _reference()
    d = block_lstm_inputs(T, B, I, H, dtype, seed)
    if v2:
        fwd = ref.block_lstm_v2(L, **d, cell_clip=cell_clip, use_peephole=use_peephole)
    else:
        fwd = ref.block_lstm(L, **d, forget_bias=forget_bias, cell_clip=cell_clip,
                             use_peephole=use_peephole)
    d.update({k: getattr(fwd, k).astype(dtype) for k in LSTM_FORWARD_FIELDS + ("h",)})
    d.update(upstream_grads((T, B, H), dtype=dtype, seed=seed))
    return dict(seq_len_max=np.int64(L), **d)


def gru_cell_grad_inputs(B, I, H, dtype=np.float32, seed=0):
    """All inputs of GRUBlockCellGrad: forward r, u, c from the reference, random d_h."""
    d = gru_cell_inputs(B, I, H, dtype, seed)
    fwd = _reference().gru_block_cell(**d)
    d.update({k: getattr(fwd, k).astype(dtype) for k in GRU_FORWARD_FIELDS})
    d.update(upstream_grads((B, H), names=("d_h",), dtype=dtype, seed=seed))
    return d


def rel_err(a, ref):
    """max over elements of |a - ref| / max(1, |ref|), computed in float64 (0 for empty)."""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert a.shape == ref.shape, (a.shape, ref.shape)
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a - ref) / np.maximum(1.0, np.abs(ref))))


def abs_err(a, ref):
    """max |a - ref| in float64 (0 for empty)."""
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert a.shape == ref.shape, (a.shape, ref.shape)
    return float(np.max(np.abs(a - ref))) if a.size else 0.0


def check_kernel_variant(variant, script):
    """Run `script` (python -c, argv[1] = variant) with BLOCKRNN_KERNEL=variant in a fresh
    process (the variant is chosen at import) and require it to print "ok"; a variant
    this CPU lacks must instead make `import blockrnn` fail."""
    import subprocess
    from blockrnn import _kernels
    env = dict(os.environ, BLOCKRNN_KERNEL=variant)
    if variant not in _kernels.packed_paths_supported():
        with pytest.raises(subprocess.CalledProcessError):
            subprocess.run([sys.executable, "-c", "import blockrnn"], check=True,
                           capture_output=True, env=env)
        return
    out = subprocess.run([sys.executable, "-c", script, variant], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
