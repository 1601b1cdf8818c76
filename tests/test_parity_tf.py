"""Parity of blockrnn with ``tf.raw_ops`` (TensorFlow 2.21, called eagerly) for all eight ops.

Every float32 test runs three implementations against TF on the same inputs:
``reference`` (``blockrnn._reference``, validates the float64 oracle itself), ``blockrnn``
(the snake-case functions, positional array arguments) and ``raw_ops``
(``blockrnn.raw_ops.<Name>(**tf_kwargs)``, TF's keyword names).  Tolerance (SPEC §11):
``max |ours - tf| / max(1, |tf|) <= 1e-4`` elementwise.

* BlockLSTM / BlockLSTMV2: i, f, o, ci, co are compared only at t < seq_len_max (TF leaves
  garbage there, SPEC §3); blockrnn must return zeros there (checked separately).
* Grad ops are fed TF's own forward outputs (garbage at t >= L zeroed), plus random
  upstream gradients; blockrnn must also ignore (NaN-poisoned) inputs at t >= L (SPEC §5).
* ``lstm_block_cell_grad_full`` / ``gru_block_cell_grad_full`` (no TF op) are checked against
  TF's cell-grad op completed with tf.matmul / tf.reduce_sum (SPEC §4, §7).
* float16 (SPEC §10): blockrnn's error against a float64 ground truth (the reference on the
  same half values) must not exceed TF's own float16 error (floor 1e-3) and stay <= 2e-3;
  TF's GRU ops are float32-only, so blockrnn's float16 GRU is checked against the reference.
"""

import itertools

import numpy as np
import pytest

import blockrnn
from blockrnn import _reference as ref
from blockrnn import raw_ops as br_raw_ops

from _inputs import (GATE_FIELDS, GRU_ARGS, LSTM_ARGS, LSTM_FORWARD_FIELDS,
                     block_lstm_grad_inputs, block_lstm_inputs, gru_cell_grad_inputs,
                     gru_cell_inputs, lstm_cell_grad_inputs, lstm_cell_inputs, rel_err,
                     upstream_grads)

TOL32 = 1e-4          # float32 parity, relative with floor 1
F16_FLOOR = 1e-3      # float16: ours <= max(tf_err, F16_FLOOR)
F16_MAX = 2e-3        # float16: ours <= F16_MAX (relative with floor 1)

SEQ_OUT = LSTM_FORWARD_FIELDS + ("h",)
LSTM_GRAD_FIELDS = ("cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad")
SEQ_GRAD_FIELDS = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad",
                   "wcf_grad", "wco_grad", "b_grad")
GRU_OUT = ("r", "u", "c", "h")
GRU_GRAD_FIELDS = ("d_x", "d_h_prev", "d_c_bar", "d_r_bar_u_bar")
GRU_FULL_FIELDS = ("d_x", "d_h_prev", "d_w_ru", "d_w_c", "d_b_ru", "d_b_c")

# op name -> (snake-case name, positional argument order, output fields)
OPS = {
    "LSTMBlockCell": ("lstm_block_cell", LSTM_ARGS, LSTM_FORWARD_FIELDS + ("h",)),
    "LSTMBlockCellGrad": ("lstm_block_cell_grad",
                          LSTM_ARGS + LSTM_FORWARD_FIELDS + ("cs_grad", "h_grad"),
                          LSTM_GRAD_FIELDS),
    "BlockLSTM": ("block_lstm", ("seq_len_max",) + LSTM_ARGS, SEQ_OUT),
    "BlockLSTMV2": ("block_lstm_v2", ("seq_len_max",) + LSTM_ARGS, SEQ_OUT),
    "BlockLSTMGrad": ("block_lstm_grad",
                      ("seq_len_max",) + LSTM_ARGS + SEQ_OUT + ("cs_grad", "h_grad"),
                      SEQ_GRAD_FIELDS),
    "BlockLSTMGradV2": ("block_lstm_grad_v2",
                        ("seq_len_max",) + LSTM_ARGS + SEQ_OUT + ("cs_grad", "h_grad"),
                        SEQ_GRAD_FIELDS),
    "GRUBlockCell": ("gru_block_cell", GRU_ARGS, GRU_OUT),
    "GRUBlockCellGrad": ("gru_block_cell_grad", GRU_ARGS + ("r", "u", "c", "d_h"),
                         GRU_GRAD_FIELDS),
}
IMPLS = ("reference", "blockrnn", "raw_ops")


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------

def call_tf(tf, op, inputs, **attrs):
    """Eager tf.raw_ops call; returns {field: numpy array}."""
    out = getattr(tf.raw_ops, op)(**inputs, **attrs)
    return {k: getattr(out, k).numpy() for k in OPS[op][2]}


def call_impl(impl, op, inputs, **attrs):
    """Call one implementation; returns {field: numpy array} after checking the namedtuple."""
    snake, args, fields = OPS[op]
    if impl == "raw_ops":
        out = getattr(br_raw_ops, op)(**inputs, **attrs)
    else:
        mod = ref if impl == "reference" else blockrnn
        out = getattr(mod, snake)(*[inputs[a] for a in args], **attrs)
    assert tuple(out._fields) == fields, (impl, op, out._fields)
    res = {k: np.asarray(getattr(out, k)) for k in fields}
    if impl != "reference":
        dtype = np.asarray(inputs["x"]).dtype
        for k, v in res.items():
            assert v.dtype == dtype, f"{impl} {op}.{k}: dtype {v.dtype}, expected {dtype}"
    return res


def compare(label, ours, theirs, fields, record, tol=TOL32, t_limit=None):
    """Assert rel_err(ours[k], theirs[k]) <= tol for each field (only t < t_limit if given)."""
    errs = {}
    for k in fields:
        a, b = ours[k], theirs[k]
        assert a.shape == b.shape, f"{label}.{k}: shape {a.shape} vs {b.shape}"
        if t_limit is not None:
            a, b = a[:t_limit], b[:t_limit]
        errs[k] = rel_err(a, b)
        record(label, errs[k])
    bad = {k: e for k, e in errs.items() if not e <= tol}
    assert not bad, f"{label}: max rel error above {tol}: {bad}"
    return errs


def sanitize(fwd, L):
    """Copy of TF's sequence forward outputs with every entry at t >= L set to zero."""
    out = {}
    for k, v in fwd.items():
        v = v.copy()
        v[L:] = 0
        out[k] = v
    return out


def assert_clipping_active(cs, cell_clip, L=None):
    """The cell_clip = 0.6 configurations must really clip some cs entries (TF clips to
    float32(cell_clip) exactly)."""
    cs = np.abs(np.asarray(cs, dtype=np.float64))
    if L is not None:
        cs = cs[:L]
    assert np.any(np.isclose(cs, np.float32(cell_clip), rtol=1e-6, atol=0)), \
        f"cell_clip={cell_clip} never reached (max |cs| = {cs.max():.3f})"


# ------------------------------------------------------------------------------------------
# configuration grids
# ------------------------------------------------------------------------------------------

CLIP_ACTIVE = 0.6
CLIP_CHECK_MIN = 24   # configs with >= this many cs entries must show active clipping
FORGET_BIASES = (1.0, 0.25, -1.5, 0.0)


def _clip_values(k):
    # "off" alternates (every other pair of configs, so both off values meet both peephole
    # settings) between 0 and a negative value -- both mean: no clipping
    return (0.0 if (k // 2) % 2 == 0 else -1.0, CLIP_ACTIVE, 3.0)


def _forget_bias(k, j, clip):
    # with clip = 0.6 only forget biases that keep f large enough for |cs| to reach the clip
    return FORGET_BIASES[k % 2] if clip == CLIP_ACTIVE else FORGET_BIASES[(k + j) % 4]


# LSTM cell: (B, I, H); batch 1, cell size 1 and I = 0 included
CELL_SHAPES = [(1, 1, 1), (1, 5, 3), (3, 4, 5), (4, 0, 6), (5, 16, 1), (8, 32, 32)]
CELL_CONFIGS = []
for _k, ((_B, _I, _H), _peep) in enumerate(itertools.product(CELL_SHAPES, (False, True))):
    for _j, _clip in enumerate(_clip_values(_k)):
        _fb = _forget_bias(_k, _j, _clip)
        CELL_CONFIGS.append(pytest.param(
            _B, _I, _H, _peep, _clip, _fb, 10 * _k + _j,
            id=f"B{_B}-I{_I}-H{_H}-peep{int(_peep)}-clip{_clip}-fb{_fb}"))

# LSTM sequence: (T, B, I, H) x L in {0, below T, T}
SEQ_SHAPES = [(1, 1, 1, 1), (5, 1, 3, 2), (6, 3, 4, 1), (12, 8, 32, 32)]
SEQ_CONFIGS = []
_k = 0
for (_T, _B, _I, _H) in SEQ_SHAPES:
    for _L in sorted({0, _T // 2, _T}):
        for _peep in (False, True):
            for _j, _clip in enumerate(_clip_values(_k)):
                _fb = _forget_bias(_k, _j, _clip)
                SEQ_CONFIGS.append(pytest.param(
                    _T, _B, _I, _H, _L, _peep, _clip, _fb, 10 * _k + _j,
                    id=f"T{_T}-B{_B}-I{_I}-H{_H}-L{_L}-peep{int(_peep)}-clip{_clip}-fb{_fb}"))
            _k += 1

# GRU: (B, I, H), 15 configurations
GRU_SHAPES = [(1, 1, 1), (1, 6, 4), (3, 4, 5), (4, 7, 1), (2, 0, 3), (8, 32, 32), (16, 3, 12)]
GRU_CONFIGS = [pytest.param(B, I, H, s, id=f"B{B}-I{I}-H{H}-s{s}")
               for s, (B, I, H) in enumerate(GRU_SHAPES + GRU_SHAPES + [(5, 16, 8)])]


# ------------------------------------------------------------------------------------------
# LSTMBlockCell / LSTMBlockCellGrad / full cell gradient
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,I,H,use_peephole,cell_clip,forget_bias,seed", CELL_CONFIGS)
def test_lstm_block_cell(tf, parity_record, impl, B, I, H, use_peephole, cell_clip,
                         forget_bias, seed):
    inputs = lstm_cell_inputs(B, I, H, np.float32, seed)
    attrs = dict(forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole)
    theirs = call_tf(tf, "LSTMBlockCell", inputs, **attrs)
    if cell_clip == CLIP_ACTIVE and B * H >= CLIP_CHECK_MIN:
        assert_clipping_active(theirs["cs"], cell_clip)
    ours = call_impl(impl, "LSTMBlockCell", inputs, **attrs)
    compare(f"LSTMBlockCell [{impl}]", ours, theirs, OPS["LSTMBlockCell"][2], parity_record)


def _tf_cell_grad_inputs(tf, B, I, H, use_peephole, cell_clip, forget_bias, seed):
    """LSTMBlockCellGrad inputs: random cell inputs, TF's own forward outputs, upstream grads."""
    inputs = lstm_cell_inputs(B, I, H, np.float32, seed)
    fwd = call_tf(tf, "LSTMBlockCell", inputs, forget_bias=forget_bias, cell_clip=cell_clip,
                  use_peephole=use_peephole)
    inputs.update({k: fwd[k] for k in LSTM_FORWARD_FIELDS})
    inputs.update(upstream_grads((B, H), dtype=np.float32, seed=seed))
    return inputs


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,I,H,use_peephole,cell_clip,forget_bias,seed", CELL_CONFIGS)
def test_lstm_block_cell_grad(tf, parity_record, impl, B, I, H, use_peephole, cell_clip,
                              forget_bias, seed):
    inputs = _tf_cell_grad_inputs(tf, B, I, H, use_peephole, cell_clip, forget_bias, seed)
    theirs = call_tf(tf, "LSTMBlockCellGrad", inputs, use_peephole=use_peephole)
    ours = call_impl(impl, "LSTMBlockCellGrad", inputs, use_peephole=use_peephole)
    compare(f"LSTMBlockCellGrad [{impl}]", ours, theirs, LSTM_GRAD_FIELDS, parity_record)


def _tf_lstm_full_grad(tf, inputs, use_peephole):
    """SPEC §4 full cell gradient from TF's LSTMBlockCellGrad plus TF matmuls."""
    k = call_tf(tf, "LSTMBlockCellGrad", inputs, use_peephole=use_peephole)
    I = inputs["x"].shape[1]
    dicfo = tf.constant(k["dicfo"])
    xh = tf.concat([inputs["x"], inputs["h_prev"]], axis=1)
    xh_grad = tf.matmul(dicfo, inputs["w"], transpose_b=True).numpy()
    return dict(x_grad=xh_grad[:, :I], cs_prev_grad=k["cs_prev_grad"],
                h_prev_grad=xh_grad[:, I:],
                w_grad=tf.matmul(xh, dicfo, transpose_a=True).numpy(),
                wci_grad=k["wci_grad"], wcf_grad=k["wcf_grad"], wco_grad=k["wco_grad"],
                b_grad=tf.reduce_sum(dicfo, axis=0).numpy())


LSTM_FULL_FIELDS = SEQ_GRAD_FIELDS


@pytest.mark.parametrize("impl", ("reference", "blockrnn"))
@pytest.mark.parametrize("B,I,H,use_peephole,cell_clip,forget_bias,seed", CELL_CONFIGS)
def test_lstm_block_cell_grad_full(tf, parity_record, impl, B, I, H, use_peephole, cell_clip,
                                   forget_bias, seed):
    inputs = _tf_cell_grad_inputs(tf, B, I, H, use_peephole, cell_clip, forget_bias, seed)
    theirs = _tf_lstm_full_grad(tf, inputs, use_peephole)
    mod = ref if impl == "reference" else blockrnn
    args = [inputs[a] for a in OPS["LSTMBlockCellGrad"][1]]
    out = mod.lstm_block_cell_grad_full(*args, use_peephole=use_peephole)
    assert tuple(out._fields) == LSTM_FULL_FIELDS
    ours = {k: np.asarray(getattr(out, k)) for k in LSTM_FULL_FIELDS}
    if impl == "blockrnn":
        assert all(v.dtype == np.float32 for v in ours.values())
        # ... and against the float64 reference on the same inputs
        r = ref.lstm_block_cell_grad_full(*args, use_peephole=use_peephole)
        compare("lstm_block_cell_grad_full [blockrnn vs reference]", ours, r._asdict(),
                LSTM_FULL_FIELDS, parity_record)
    compare(f"lstm_block_cell_grad_full [{impl}]", ours, theirs, LSTM_FULL_FIELDS,
            parity_record)


@pytest.mark.parametrize("impl", ("reference", "blockrnn"))
@pytest.mark.parametrize("missing", ("cs_grad", "h_grad"))
def test_lstm_block_cell_grad_full_none_is_zero(tf, parity_record, impl, missing):
    """A missing (None) upstream gradient counts as zero (SPEC §4)."""
    B, I, H, peep = 4, 6, 5, True
    inputs = lstm_cell_inputs(B, I, H, np.float32, 3)
    fwd = call_tf(tf, "LSTMBlockCell", inputs, use_peephole=peep)
    inputs.update({k: fwd[k] for k in LSTM_FORWARD_FIELDS})
    inputs.update(upstream_grads((B, H), dtype=np.float32, seed=3))
    inputs[missing] = np.zeros((B, H), np.float32)
    theirs = _tf_lstm_full_grad(tf, inputs, peep)
    inputs[missing] = None
    mod = ref if impl == "reference" else blockrnn
    out = mod.lstm_block_cell_grad_full(*[inputs[a] for a in OPS["LSTMBlockCellGrad"][1]],
                                        use_peephole=peep)
    compare(f"lstm_block_cell_grad_full None [{impl}]", out._asdict(), theirs,
            LSTM_FULL_FIELDS, parity_record)


# ------------------------------------------------------------------------------------------
# BlockLSTM / BlockLSTMV2 and their gradients
# ------------------------------------------------------------------------------------------

def _seq_attrs(v2, forget_bias, cell_clip, use_peephole):
    attrs = dict(cell_clip=cell_clip, use_peephole=use_peephole)
    if not v2:
        attrs["forget_bias"] = forget_bias
    return attrs


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("v2", (False, True), ids=("BlockLSTM", "BlockLSTMV2"))
@pytest.mark.parametrize("T,B,I,H,L,use_peephole,cell_clip,forget_bias,seed", SEQ_CONFIGS)
def test_block_lstm(tf, parity_record, impl, v2, T, B, I, H, L, use_peephole, cell_clip,
                    forget_bias, seed):
    op = "BlockLSTMV2" if v2 else "BlockLSTM"
    inputs = dict(seq_len_max=np.int64(L), **block_lstm_inputs(T, B, I, H, np.float32, seed))
    attrs = _seq_attrs(v2, forget_bias, cell_clip, use_peephole)
    theirs = call_tf(tf, op, inputs, **attrs)
    if cell_clip == CLIP_ACTIVE and B * H * L >= CLIP_CHECK_MIN:
        assert_clipping_active(theirs["cs"], cell_clip, L)
    ours = call_impl(impl, op, inputs, **attrs)
    label = f"{op} [{impl}]"
    # cs, h: everywhere (TF zeroes them at t >= L); gates: only t < L
    compare(label, ours, theirs, ("cs", "h"), parity_record)
    compare(label, ours, theirs, GATE_FIELDS, parity_record, t_limit=L)
    for k in SEQ_OUT:
        assert ours[k].shape == (T, B, H)
        assert np.all(ours[k][L:] == 0), f"{label}.{k} not zero at t >= seq_len_max={L}"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("v2", (False, True), ids=("BlockLSTMGrad", "BlockLSTMGradV2"))
@pytest.mark.parametrize("T,B,I,H,L,use_peephole,cell_clip,forget_bias,seed", SEQ_CONFIGS)
def test_block_lstm_grad(tf, parity_record, impl, v2, T, B, I, H, L, use_peephole, cell_clip,
                         forget_bias, seed):
    fwd_op, op = ("BlockLSTMV2", "BlockLSTMGradV2") if v2 else ("BlockLSTM", "BlockLSTMGrad")
    inputs = dict(seq_len_max=np.int64(L), **block_lstm_inputs(T, B, I, H, np.float32, seed))
    fwd = call_tf(tf, fwd_op, inputs, **_seq_attrs(v2, forget_bias, cell_clip, use_peephole))
    inputs.update(sanitize(fwd, L))
    inputs.update(upstream_grads((T, B, H), dtype=np.float32, seed=seed))
    theirs = call_tf(tf, op, inputs, use_peephole=use_peephole)
    ours = call_impl(impl, op, inputs, use_peephole=use_peephole)
    compare(f"{op} [{impl}]", ours, theirs, SEQ_GRAD_FIELDS, parity_record)
    assert np.all(ours["x_grad"][L:] == 0)

    # Inputs at t >= L must be ignored (SPEC §5): poison them with NaN.
    if L < T:
        poisoned = dict(inputs)
        for k in SEQ_OUT + ("cs_grad", "h_grad"):
            v = inputs[k].copy()
            v[L:] = np.nan
            poisoned[k] = v
        ours_p = call_impl(impl, op, poisoned, use_peephole=use_peephole)
        compare(f"{op} [{impl}, NaN at t>=L vs clean]", ours_p, ours, SEQ_GRAD_FIELDS,
                parity_record, tol=1e-6)


# ------------------------------------------------------------------------------------------
# GRU
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,I,H,seed", GRU_CONFIGS)
def test_gru_block_cell(tf, parity_record, impl, B, I, H, seed):
    inputs = gru_cell_inputs(B, I, H, np.float32, seed)
    theirs = call_tf(tf, "GRUBlockCell", inputs)
    ours = call_impl(impl, "GRUBlockCell", inputs)
    compare(f"GRUBlockCell [{impl}]", ours, theirs, GRU_OUT, parity_record)


def _gru_grad_inputs_from_tf(tf, B, I, H, seed):
    inputs = gru_cell_inputs(B, I, H, np.float32, seed)
    fwd = call_tf(tf, "GRUBlockCell", inputs)
    inputs.update(r=fwd["r"], u=fwd["u"], c=fwd["c"])
    inputs.update(upstream_grads((B, H), names=("d_h",), dtype=np.float32, seed=seed))
    return inputs


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,I,H,seed", GRU_CONFIGS)
def test_gru_block_cell_grad(tf, parity_record, impl, B, I, H, seed):
    inputs = _gru_grad_inputs_from_tf(tf, B, I, H, seed)
    theirs = call_tf(tf, "GRUBlockCellGrad", inputs)
    ours = call_impl(impl, "GRUBlockCellGrad", inputs)
    compare(f"GRUBlockCellGrad [{impl}]", ours, theirs, GRU_GRAD_FIELDS, parity_record)


@pytest.mark.parametrize("impl", ("reference", "blockrnn"))
@pytest.mark.parametrize("B,I,H,seed", GRU_CONFIGS)
def test_gru_block_cell_grad_full(tf, parity_record, impl, B, I, H, seed):
    inputs = _gru_grad_inputs_from_tf(tf, B, I, H, seed)
    k = call_tf(tf, "GRUBlockCellGrad", inputs)
    d_rbub, d_c_bar = tf.constant(k["d_r_bar_u_bar"]), tf.constant(k["d_c_bar"])
    xh = tf.concat([inputs["x"], inputs["h_prev"]], axis=1)
    xrh = tf.concat([inputs["x"], inputs["r"] * inputs["h_prev"]], axis=1)
    theirs = dict(d_x=k["d_x"], d_h_prev=k["d_h_prev"],
                  d_w_ru=tf.matmul(xh, d_rbub, transpose_a=True).numpy(),
                  d_w_c=tf.matmul(xrh, d_c_bar, transpose_a=True).numpy(),
                  d_b_ru=tf.reduce_sum(d_rbub, axis=0).numpy(),
                  d_b_c=tf.reduce_sum(d_c_bar, axis=0).numpy())
    mod = ref if impl == "reference" else blockrnn
    args = [inputs[a] for a in OPS["GRUBlockCellGrad"][1]]
    out = mod.gru_block_cell_grad_full(*args)
    assert tuple(out._fields) == GRU_FULL_FIELDS
    ours = {f: np.asarray(getattr(out, f)) for f in GRU_FULL_FIELDS}
    if impl == "blockrnn":
        assert all(v.dtype == np.float32 for v in ours.values())
        compare("gru_block_cell_grad_full [blockrnn vs reference]", ours,
                ref.gru_block_cell_grad_full(*args)._asdict(), GRU_FULL_FIELDS, parity_record)
    compare(f"gru_block_cell_grad_full [{impl}]", ours, theirs, GRU_FULL_FIELDS, parity_record)


# ------------------------------------------------------------------------------------------
# float16 (SPEC §10): at least as accurate as TF against a float64 ground truth
# ------------------------------------------------------------------------------------------

F16_CELL = [  # B, I, H, use_peephole, cell_clip, forget_bias, seed
    (1, 3, 1, False, 3.0, 1.0, 1),
    (4, 16, 8, True, CLIP_ACTIVE, 0.25, 2),
    (8, 64, 32, True, 3.0, 1.0, 3),
    (8, 64, 32, False, 0.0, -1.5, 4),
    (6, 10, 12, True, CLIP_ACTIVE, 1.0, 5),
]
F16_SEQ = [  # T, B, I, H, L, use_peephole, cell_clip, forget_bias, seed
    (5, 1, 3, 2, 5, False, 3.0, 1.0, 1),
    (10, 4, 16, 8, 6, True, CLIP_ACTIVE, 0.25, 2),
    (20, 8, 64, 32, 20, True, 3.0, 1.0, 3),
    (20, 8, 64, 32, 13, False, 0.0, -1.5, 4),
    (12, 3, 8, 16, 12, True, 0.0, 1.0, 5),
]


def _f16_check(label, ours, theirs, truth, fields, record, t_limit=None):
    """ours (f16) vs truth (f64): rel_err <= max(TF's rel_err, F16_FLOOR) and <= F16_MAX."""
    worst_ours = worst_tf = 0.0
    for k in fields:
        assert ours[k].dtype == np.float16, f"{label}.{k}: dtype {ours[k].dtype}"
        o, t, g = ours[k], theirs[k], truth[k]
        e_ours_all = rel_err(o, g)          # ours is compared everywhere (zeros at t >= L)
        if t_limit is not None:
            t, g = t[:t_limit], g[:t_limit]
        e_tf = rel_err(t, g)
        worst_ours, worst_tf = max(worst_ours, e_ours_all), max(worst_tf, e_tf)
        assert e_ours_all <= max(e_tf, F16_FLOOR), \
            f"{label}.{k}: blockrnn f16 error {e_ours_all:.2e} > TF f16 error {e_tf:.2e}"
        assert e_ours_all <= F16_MAX, f"{label}.{k}: blockrnn f16 error {e_ours_all:.2e}"
    record(f"{label} f16 [blockrnn vs f64]", worst_ours)
    record(f"{label} f16 [TF vs f64]", worst_tf)


@pytest.mark.parametrize("B,I,H,use_peephole,cell_clip,forget_bias,seed", F16_CELL)
def test_float16_lstm_block_cell(tf, parity_record, B, I, H, use_peephole, cell_clip,
                                 forget_bias, seed):
    attrs = dict(forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole)
    inputs = lstm_cell_inputs(B, I, H, np.float16, seed)
    theirs = call_tf(tf, "LSTMBlockCell", inputs, **attrs)
    ours = call_impl("blockrnn", "LSTMBlockCell", inputs, **attrs)
    truth = ref.lstm_block_cell(*[inputs[a] for a in LSTM_ARGS], **attrs)._asdict()
    if cell_clip == CLIP_ACTIVE:
        assert_clipping_active(truth["cs"], cell_clip)
    _f16_check("LSTMBlockCell", ours, theirs, truth, OPS["LSTMBlockCell"][2], parity_record)
    ours_raw = call_impl("raw_ops", "LSTMBlockCell", inputs, **attrs)
    _f16_check("LSTMBlockCell raw_ops", ours_raw, theirs, truth, OPS["LSTMBlockCell"][2],
               parity_record)


@pytest.mark.parametrize("B,I,H,use_peephole,cell_clip,forget_bias,seed", F16_CELL)
def test_float16_lstm_block_cell_grad(tf, parity_record, B, I, H, use_peephole, cell_clip,
                                      forget_bias, seed):
    inputs = lstm_cell_grad_inputs(B, I, H, np.float16, seed, forget_bias, cell_clip,
                                   use_peephole)
    theirs = call_tf(tf, "LSTMBlockCellGrad", inputs, use_peephole=use_peephole)
    ours = call_impl("blockrnn", "LSTMBlockCellGrad", inputs, use_peephole=use_peephole)
    args = [inputs[a] for a in OPS["LSTMBlockCellGrad"][1]]
    truth = ref.lstm_block_cell_grad(*args, use_peephole=use_peephole)._asdict()
    _f16_check("LSTMBlockCellGrad", ours, theirs, truth, LSTM_GRAD_FIELDS, parity_record)
    # full gradient: no TF op; blockrnn f16 vs the f64 reference
    full = blockrnn.lstm_block_cell_grad_full(*args, use_peephole=use_peephole)
    full_ref = ref.lstm_block_cell_grad_full(*args, use_peephole=use_peephole)
    for k in LSTM_FULL_FIELDS:
        assert getattr(full, k).dtype == np.float16
        e = rel_err(getattr(full, k), getattr(full_ref, k))
        parity_record("lstm_block_cell_grad_full f16 [blockrnn vs f64]", e)
        assert e <= F16_MAX, f"lstm_block_cell_grad_full.{k}: f16 error {e:.2e}"


@pytest.mark.parametrize("v2", (False, True), ids=("BlockLSTM", "BlockLSTMV2"))
@pytest.mark.parametrize("T,B,I,H,L,use_peephole,cell_clip,forget_bias,seed", F16_SEQ)
def test_float16_block_lstm(tf, parity_record, v2, T, B, I, H, L, use_peephole, cell_clip,
                            forget_bias, seed):
    op = "BlockLSTMV2" if v2 else "BlockLSTM"
    attrs = _seq_attrs(v2, forget_bias, cell_clip, use_peephole)
    inputs = dict(seq_len_max=np.int64(L), **block_lstm_inputs(T, B, I, H, np.float16, seed))
    theirs = call_tf(tf, op, inputs, **attrs)
    ours = call_impl("blockrnn", op, inputs, **attrs)
    fn = ref.block_lstm_v2 if v2 else ref.block_lstm
    truth = fn(*[inputs[a] for a in OPS[op][1]], **attrs)._asdict()
    if cell_clip == CLIP_ACTIVE:
        assert_clipping_active(truth["cs"], cell_clip, L)
    _f16_check(op, ours, theirs, truth, ("cs", "h"), parity_record)
    _f16_check(op, ours, theirs, truth, GATE_FIELDS, parity_record, t_limit=L)


@pytest.mark.parametrize("v2", (False, True), ids=("BlockLSTMGrad", "BlockLSTMGradV2"))
@pytest.mark.parametrize("T,B,I,H,L,use_peephole,cell_clip,forget_bias,seed", F16_SEQ)
def test_float16_block_lstm_grad(tf, parity_record, v2, T, B, I, H, L, use_peephole,
                                 cell_clip, forget_bias, seed):
    op = "BlockLSTMGradV2" if v2 else "BlockLSTMGrad"
    inputs = block_lstm_grad_inputs(T, B, I, H, L, np.float16, seed, forget_bias, cell_clip,
                                    use_peephole, v2=v2)
    theirs = call_tf(tf, op, inputs, use_peephole=use_peephole)
    ours = call_impl("blockrnn", op, inputs, use_peephole=use_peephole)
    fn = ref.block_lstm_grad_v2 if v2 else ref.block_lstm_grad
    truth = fn(*[inputs[a] for a in OPS[op][1]], use_peephole=use_peephole)._asdict()
    _f16_check(op, ours, theirs, truth, SEQ_GRAD_FIELDS, parity_record)


@pytest.mark.parametrize("B,I,H,seed", GRU_CONFIGS[:8])
def test_float16_gru_vs_reference(parity_record, B, I, H, seed):
    """TF's GRU ops are float32-only: blockrnn's float16 GRU against the f64 reference."""
    inputs = gru_cell_grad_inputs(B, I, H, np.float16, seed)
    fwd_args = [inputs[a] for a in GRU_ARGS]
    grad_args = [inputs[a] for a in OPS["GRUBlockCellGrad"][1]]
    checks = [
        ("gru_block_cell", blockrnn.gru_block_cell(*fwd_args), ref.gru_block_cell(*fwd_args)),
        ("gru_block_cell_grad", blockrnn.gru_block_cell_grad(*grad_args),
         ref.gru_block_cell_grad(*grad_args)),
        ("gru_block_cell_grad_full", blockrnn.gru_block_cell_grad_full(*grad_args),
         ref.gru_block_cell_grad_full(*grad_args)),
        ("GRUBlockCell raw_ops", br_raw_ops.GRUBlockCell(**{a: inputs[a] for a in GRU_ARGS}),
         ref.gru_block_cell(*fwd_args)),
    ]
    for name, ours, truth in checks:
        assert ours._fields == truth._fields
        for k in ours._fields:
            assert getattr(ours, k).dtype == np.float16, f"{name}.{k}"
            e = rel_err(getattr(ours, k), getattr(truth, k))
            parity_record(f"{name} f16 [blockrnn vs f64]", e)
            assert e <= F16_MAX, f"{name}.{k}: f16 error {e:.2e}"


# ------------------------------------------------------------------------------------------
# Batch 1 to 3 with large weights: the GEMV routes of blockrnn/_blas.pxd (on the caller in
# blocks, one call above 2^20 multiply-adds, one GEMV per row at 2 or 3 rows), which the
# small shapes above do not reach. tests/test_blas.py checks the routine itself.
# ------------------------------------------------------------------------------------------

# (T, B, I, H): recurrent weights 4H x H of 2^18 (blocks, and per-row GEMV at B = 2, 3)
# and above 2^20 (one call) elements.
LARGE_SEQ_SHAPES = [(3, 1, 16, 256), (3, 2, 8, 256), (2, 3, 4, 256), (2, 1, 8, 520)]


@pytest.mark.parametrize("impl", ("blockrnn", "raw_ops"))
@pytest.mark.parametrize("T,B,I,H", LARGE_SEQ_SHAPES,
                         ids=[f"T{T}-B{B}-I{I}-H{H}" for T, B, I, H in LARGE_SEQ_SHAPES])
def test_block_lstm_v2_large_weights_small_batch(tf, parity_record, impl, T, B, I, H):
    inputs = dict(seq_len_max=np.int64(T), **block_lstm_inputs(T, B, I, H, np.float32, H))
    attrs = dict(cell_clip=0.0, use_peephole=True)
    theirs = call_tf(tf, "BlockLSTMV2", inputs, **attrs)
    ours = call_impl(impl, "BlockLSTMV2", inputs, **attrs)
    compare(f"BlockLSTMV2 large weights [{impl}]", ours, theirs, SEQ_OUT, parity_record)
    inputs.update(theirs)
    inputs.update(upstream_grads((T, B, H), dtype=np.float32, seed=H))
    theirs = call_tf(tf, "BlockLSTMGradV2", inputs, use_peephole=True)
    ours = call_impl(impl, "BlockLSTMGradV2", inputs, use_peephole=True)
    compare(f"BlockLSTMGradV2 large weights [{impl}]", ours, theirs, SEQ_GRAD_FIELDS,
            parity_record)


@pytest.mark.parametrize("B", (1, 2))
def test_cells_large_weights_small_batch(tf, parity_record, B):
    """LSTMBlockCell with w of 272 x 1024 and GRUBlockCell with w_ru of 408 x 800."""
    inputs = lstm_cell_inputs(B, 16, 256, np.float32, B)
    attrs = dict(forget_bias=1.0, cell_clip=3.0, use_peephole=True)
    compare("LSTMBlockCell large weights [blockrnn]",
            call_impl("blockrnn", "LSTMBlockCell", inputs, **attrs),
            call_tf(tf, "LSTMBlockCell", inputs, **attrs), OPS["LSTMBlockCell"][2],
            parity_record)
    inputs = gru_cell_inputs(B, 8, 400, np.float32, B)
    compare("GRUBlockCell large weights [blockrnn]",
            call_impl("blockrnn", "GRUBlockCell", inputs),
            call_tf(tf, "GRUBlockCell", inputs), GRU_OUT, parity_record)
