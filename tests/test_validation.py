"""Malformed-input and edge-case tests (SPEC.md §9, api_contract.md "Validation rules").

Every malformed call must raise ValueError (shape / rank / value) or TypeError (dtype /
attribute type) whose message NAMES the offending argument, before any compiled code
runs.  Several of these inputs abort or segfault TensorFlow 2.21 (SPEC §9 crash table);
the tests run in-process, so if blockrnn crashed instead of raising, the pytest process
itself would die and the run would be reported as failed (faulthandler prints the test).

The tables below are generated from symbolic shape specifications of each op: a valid
base call, then one argument replaced by a wrong-rank / wrong-dim / wrong-dtype version.
The second half checks the ACCEPTED edge cases (zero-sized dimensions, seq_len_max = 0,
unused peephole vectors of any length, NaN / Inf propagation).
"""
import re

import numpy as np
import pytest

import blockrnn
from blockrnn import raw_ops

# ----------------------------------------------------------------------------------
# Symbolic op descriptions
# ----------------------------------------------------------------------------------

DIMS = dict(T=3, B=2, I=3, H=4, L=3)  # L = seq_len_max = T: a time dim T-1 is < L

_LSTM_CELL = [("x", "B I"), ("cs_prev", "B H"), ("h_prev", "B H"), ("w", "I+H 4H"),
              ("wci", "H"), ("wcf", "H"), ("wco", "H"), ("b", "4H")]
_LSTM_CELL_GRAD = _LSTM_CELL + [(n, "B H") for n in
                                ("i", "cs", "f", "o", "ci", "co", "cs_grad", "h_grad")]
_LSTM_SEQ = [("seq_len_max", ""), ("x", "T B I")] + _LSTM_CELL[1:]
_LSTM_SEQ_GRAD = _LSTM_SEQ + [(n, "T B H") for n in
                              ("i", "cs", "f", "o", "ci", "co", "h", "cs_grad", "h_grad")]
_GRU = [("x", "B I"), ("h_prev", "B H"), ("w_ru", "I+H 2H"), ("w_c", "I+H H"),
        ("b_ru", "2H"), ("b_c", "H")]
_GRU_GRAD = _GRU + [(n, "B H") for n in ("r", "u", "c", "d_h")]

# which (argument, axis) defines each size symbol (api_contract: B, I from x; H from
# cs_prev for LSTM, from h_prev for GRU; T from x for the sequence ops)
_DEF_CELL = {("x", 0): "B", ("x", 1): "I", ("cs_prev", 1): "H"}
_DEF_SEQ = {("x", 0): "T", ("x", 1): "B", ("x", 2): "I", ("cs_prev", 1): "H"}
_DEF_GRU = {("x", 0): "B", ("x", 1): "I", ("h_prev", 1): "H"}

_PEEP = dict(use_peephole=True)
OPS = {
    # name: (argument spec, definers, base attrs, raw_ops name or None)
    "lstm_block_cell": (_LSTM_CELL, _DEF_CELL,
                        dict(forget_bias=1.0, cell_clip=3.0, use_peephole=True), "LSTMBlockCell"),
    "lstm_block_cell_grad": (_LSTM_CELL_GRAD, _DEF_CELL, _PEEP, "LSTMBlockCellGrad"),
    "lstm_block_cell_grad_full": (_LSTM_CELL_GRAD, _DEF_CELL, _PEEP, None),
    "block_lstm": (_LSTM_SEQ, _DEF_SEQ,
                   dict(forget_bias=1.0, cell_clip=3.0, use_peephole=True), "BlockLSTM"),
    "block_lstm_v2": (_LSTM_SEQ, _DEF_SEQ, dict(cell_clip=0.0, use_peephole=True), "BlockLSTMV2"),
    "block_lstm_grad": (_LSTM_SEQ_GRAD, _DEF_SEQ, _PEEP, "BlockLSTMGrad"),
    "block_lstm_grad_v2": (_LSTM_SEQ_GRAD, _DEF_SEQ, _PEEP, "BlockLSTMGradV2"),
    "gru_block_cell": (_GRU, _DEF_GRU, {}, "GRUBlockCell"),
    "gru_block_cell_grad": (_GRU_GRAD, _DEF_GRU, {}, "GRUBlockCellGrad"),
    "gru_block_cell_grad_full": (_GRU_GRAD, _DEF_GRU, {}, None),
}
SEQ_FWD = ("block_lstm", "block_lstm_v2")
SEQ_GRAD = ("block_lstm_grad", "block_lstm_grad_v2")
SEQ_OPS = SEQ_FWD + SEQ_GRAD
CELL_GRADS = ("lstm_block_cell_grad", "lstm_block_cell_grad_full")
LSTM_GRADS = CELL_GRADS + SEQ_GRAD
PEEPS = ("wci", "wcf", "wco")


def _syms(spec):
    return spec.split()


def _deps(sym):
    """Base size symbols a shape symbol depends on."""
    return {"I+H": {"I", "H"}, "4H": {"H"}, "2H": {"H"}}.get(sym, {sym})


def _size(sym, dims):
    return {"I+H": dims["I"] + dims["H"], "4H": 4 * dims["H"], "2H": 2 * dims["H"]}.get(
        sym, dims.get(sym))


def arg_names(op):
    return [n for n, _ in OPS[op][0]]


def shape_of(op, name, dims=DIMS):
    return tuple(_size(s, dims) for s in _syms(dict(OPS[op][0])[name]))


def base_args(op, dtype=np.float32, dims=DIMS, seed=0):
    """A valid argument dict (in positional order) for `op`."""
    rng = np.random.default_rng(seed)
    args = {}
    for name, spec in OPS[op][0]:
        if name == "seq_len_max":
            args[name] = dims["L"]
        else:
            args[name] = rng.uniform(-1, 1, shape_of(op, name, dims)).astype(dtype)
    return args


def base_attrs(op, **over):
    attrs = dict(OPS[op][2])
    attrs.update(over)
    return attrs


def call(op, args, attrs, api="snake"):
    if api == "snake":
        return getattr(blockrnn, op)(*args.values(), **attrs)
    return getattr(raw_ops, OPS[op][3])(**args, **attrs)


def names_re(*names):
    """Regex matching a message that names one of `names` as a whole word."""
    return r"(?<![\w])(" + "|".join(re.escape(n) for n in names) + r")(?![\w])"


def check_raises(exc, names, op, args, attrs, api="snake"):
    with pytest.raises(exc, match=names_re(*names)):
        call(op, args, attrs, api)


# ----------------------------------------------------------------------------------
# Base calls are valid (otherwise every case below would be meaningless)
# ----------------------------------------------------------------------------------

def _apis(op):
    """The APIs an op is reachable through (the *_grad_full helpers have no raw op)."""
    return ["snake", "raw"] if OPS[op][3] is not None else ["snake"]


@pytest.mark.parametrize("op,api", [(o, a) for o in OPS for a in _apis(o)])
def test_base_call_is_valid(op, api):
    out = call(op, base_args(op), base_attrs(op), api)
    for a in out:
        assert a.dtype == np.float32


# ----------------------------------------------------------------------------------
# Programmatic tables: wrong rank, wrong dim, wrong dtype for every argument
# ----------------------------------------------------------------------------------

def _rank_variants(arr):
    """(label, array) pairs with a rank different from arr's."""
    r = arr.ndim
    out = []
    if r >= 2:
        out.append(("rank0", np.array(0.5, arr.dtype)))
    out.append((f"rank{r - 1}", arr[..., 0]))             # drop the last axis
    out.append((f"rank{r + 1}_trailing1", arr[..., None]))  # [.., 1]: "silently reshaped" in TF
    out.append((f"rank{r + 1}_leading1", arr[None]))
    return out


def _rank_cases():
    for op in OPS:
        for name, spec in OPS[op][0]:
            if name == "seq_len_max":
                continue
            arr = base_args(op)[name]
            for label, bad in _rank_variants(arr):
                yield pytest.param(op, name, bad, id=f"{op}-{name}-{label}")


@pytest.mark.parametrize("op,name,bad", list(_rank_cases()))
def test_wrong_rank(op, name, bad):
    args = base_args(op)
    args[name] = bad
    check_raises(ValueError, [name], op, args, base_attrs(op))


def _dim_cases():
    for op in OPS:
        spec, definers, _, _ = OPS[op]
        for name, s in spec:
            for axis, sym in enumerate(_syms(s)):
                for delta in (+1, -1):
                    if (name, axis) in definers:
                        base_sym = definers[(name, axis)]
                        if op in SEQ_FWD and base_sym == "T":
                            if delta > 0:
                                continue  # x with T+1 steps is a valid call (L < T)
                            expect = ["seq_len_max", "x"]  # now seq_len_max > T
                        else:
                            # the defining dimension changed: every argument sharing that
                            # size is inconsistent; the message must name one of them
                            expect = [n for n, s2 in spec
                                      if any(base_sym in _deps(q) for q in _syms(s2))]
                            if base_sym == "T":
                                expect.append("seq_len_max")
                    else:
                        expect = [name]
                    yield pytest.param(op, name, axis, delta, expect,
                                       id=f"{op}-{name}-axis{axis}{delta:+d}")


@pytest.mark.parametrize("op,name,axis,delta,expect", list(_dim_cases()))
def test_wrong_dim(op, name, axis, delta, expect):
    """use_peephole=True in the base attrs: then wci/wcf/wco must be [H] everywhere."""
    args = base_args(op)
    shape = list(args[name].shape)
    shape[axis] += delta
    args[name] = np.full(shape, 0.25, np.float32)
    check_raises(ValueError, expect, op, args, base_attrs(op))


def _array_names(op):
    return [n for n in arg_names(op) if n != "seq_len_max"]


def _dtype_cases():
    for op in OPS:
        for name in _array_names(op):
            for other in (np.float64, np.float16):
                # the odd one out is named; if it is x, any argument may be named
                expect = _array_names(op) if name == "x" else [name]
                yield pytest.param(op, name, other, expect,
                                   id=f"{op}-{name}-{np.dtype(other).name}")


@pytest.mark.parametrize("op,name,other,expect", list(_dtype_cases()))
def test_mixed_dtypes(op, name, other, expect):
    args = base_args(op, np.float32)
    args[name] = args[name].astype(other)
    check_raises(TypeError, expect, op, args, base_attrs(op))


def test_mixed_dtype_example_h_prev():
    args = base_args("lstm_block_cell", np.float32)
    args["h_prev"] = args["h_prev"].astype(np.float64)
    with pytest.raises(TypeError, match=r"\bh_prev\b"):
        blockrnn.lstm_block_cell(*args.values(), use_peephole=False)


_BAD_KINDS = {
    "int64": lambda a: np.ones(a.shape, np.int64),
    "int32": lambda a: np.ones(a.shape, np.int32),
    "bool": lambda a: np.ones(a.shape, bool),
    "complex128": lambda a: a.astype(np.complex128),
    "object": lambda a: a.astype(object),
}


def _kind_cases():
    for op in OPS:
        for name in _array_names(op):
            for kind in _BAD_KINDS:
                yield pytest.param(op, name, kind, id=f"{op}-{name}-{kind}")


@pytest.mark.parametrize("op,name,kind", list(_kind_cases()))
def test_unsupported_dtype_one_argument(op, name, kind):
    args = base_args(op, np.float64)
    args[name] = _BAD_KINDS[kind](args[name])
    check_raises(TypeError, [name], op, args, base_attrs(op))


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kind", ["int64", "bool", "complex128", "object"])
def test_unsupported_dtype_all_arguments(op, kind):
    args = base_args(op, np.float64)
    for name in _array_names(op):
        args[name] = _BAD_KINDS[kind](args[name])
    check_raises(TypeError, _array_names(op), op, args, base_attrs(op))


# ----------------------------------------------------------------------------------
# SPEC §9 crash table, row by row (snake-case API and blockrnn.raw_ops)
# ----------------------------------------------------------------------------------

def _crash_cases():
    """(op, replacements, attr overrides, exception, names, id)."""
    T, B, I, H, L = (DIMS[k] for k in "TBIHL")
    C = []

    def add(op, repl, attrs, exc, names, label):
        C.append((op, repl, attrs, exc, names, f"{op}-{label}"))

    for op in SEQ_OPS:
        # seq_len_max > T / < 0 (forward and grad): SIGABRT in TF
        for v in (T + 1, -1, 2 ** 40, -(2 ** 40)):
            add(op, {"seq_len_max": v}, {}, ValueError, ["seq_len_max"], f"seq_len_max={v}")
        add(op, {"seq_len_max": np.int64(T + 1)}, {}, ValueError, ["seq_len_max"],
            "seq_len_max=np.int64(T+1)")
        add(op, {"seq_len_max": np.array(-1, np.int32)}, {}, ValueError, ["seq_len_max"],
            "seq_len_max=int32(-1)")
        # forward: peephole vectors must be [H] always, even when unused
        if op in SEQ_FWD:
            for p in PEEPS:
                for n in (0, H - 1, H + 1):
                    for use in (False, True):
                        add(op, {p: np.zeros(n, np.float32)}, {"use_peephole": use},
                            ValueError, [p], f"{p}-len{n}-peep{use}")
    for op in SEQ_GRAD:
        # cs_grad / h_grad of rank 2 or rank 4
        for g in ("cs_grad", "h_grad"):
            add(op, {g: np.zeros((B, H), np.float32)}, {}, ValueError, [g], f"{g}-rank2")
            add(op, {g: np.zeros((T, B, H, 1), np.float32)}, {}, ValueError, [g], f"{g}-rank4")
            add(op, {g: np.zeros((1, T, B, H), np.float32)}, {}, ValueError, [g],
                f"{g}-rank4-leading")
        # i..h, cs_grad, h_grad with time dim < seq_len_max
        for n in ("i", "cs", "f", "o", "ci", "co", "h", "cs_grad", "h_grad"):
            add(op, {n: np.zeros((L - 1, B, H), np.float32)}, {}, ValueError, [n],
                f"{n}-time{L - 1}<L")
            add(op, {n: np.zeros((0, B, H), np.float32)}, {}, ValueError, [n], f"{n}-time0")
            # wrong B or H: heap corruption in TF
            add(op, {n: np.zeros((T, B + 1, H), np.float32)}, {}, ValueError, [n], f"{n}-B+1")
            add(op, {n: np.zeros((T, B, H + 1), np.float32)}, {}, ValueError, [n], f"{n}-H+1")
            add(op, {n: np.zeros((T, B, H - 1), np.float32)}, {}, ValueError, [n], f"{n}-H-1")
            add(op, {n: np.zeros((T, H, B), np.float32)}, {}, ValueError, [n], f"{n}-[T,H,B]")
        # cs_prev / h_prev not [B, H]
        for n in ("cs_prev", "h_prev"):
            for shp in ((B, H + 1), (B + 1, H), (B - 1, H), (H, B), (0, H)):
                names = [n]
                if n == "cs_prev" and shp[1] != H:
                    # cs_prev defines H: any H-sized argument may be the one blamed
                    names = [a for a, s in _LSTM_SEQ_GRAD if "H" in s]
                add(op, {n: np.zeros(shp, np.float32)}, {}, ValueError, names,
                    f"{n}-{shp}")
        # x with B = 0 while the others have B > 0 (SIGSEGV in TF): B is taken from x,
        # so any B-sized argument may be blamed
        b_args = [a for a, s in _LSTM_SEQ_GRAD if "B" in s.split()]
        add(op, {"x": np.zeros((T, 0, I), np.float32)}, {}, ValueError, b_args, "x-B0")
        # w with < 4 columns while cs_prev etc. have H > 0 (SIGSEGV in TF)
        for cols in (0, 1, 3):
            add(op, {"w": np.zeros((I + H, cols), np.float32)}, {}, ValueError, ["w"],
                f"w-{cols}cols")
        # w.dim1 = 4H+1 .. 4H+3, b likewise (silently wrong in TF)
        for k in (1, 2, 3):
            add(op, {"w": np.zeros((I + H, 4 * H + k), np.float32)}, {}, ValueError, ["w"],
                f"w-4H+{k}")
            add(op, {"b": np.zeros(4 * H + k, np.float32)}, {}, ValueError, ["b"], f"b-4H+{k}")
            add(op, {"w": np.zeros((I + H, 4 * H + k), np.float32),
                     "b": np.zeros(4 * H + k, np.float32)}, {}, ValueError, ["w", "b"],
                f"w,b-4H+{k}")
        # b of the wrong length
        for n in (0, 4 * H - 1, H):
            add(op, {"b": np.zeros(n, np.float32)}, {}, ValueError, ["b"], f"b-len{n}")
        # wci/wcf/wco length != H with peepholes (OOB read in TF)
        for p in PEEPS:
            for n in (0, H - 1, H + 1):
                add(op, {p: np.zeros(n, np.float32)}, {"use_peephole": True}, ValueError, [p],
                    f"{p}-len{n}-peepTrue")
            add(op, {p: np.zeros((H, 1), np.float32)}, {"use_peephole": False}, ValueError,
                [p], f"{p}-rank2-peepFalse")

    # LSTMBlockCell: x, cs_prev, h_prev, w of rank 0 or 1 (SIGABRT in TF)
    op = "lstm_block_cell"
    for n in ("x", "cs_prev", "h_prev", "w"):
        add(op, {n: np.array(0.5, np.float32)}, {}, ValueError, [n], f"{n}-rank0")
        add(op, {n: np.zeros(shape_of(op, n)[:1], np.float32)}, {}, ValueError, [n],
            f"{n}-rank1")
        add(op, {n: np.zeros(shape_of(op, n)[1:], np.float32)}, {}, ValueError, [n],
            f"{n}-rank1-lastdim")
        add(op, {n: np.zeros(shape_of(op, n) + (1,), np.float32)}, {}, ValueError, [n],
            f"{n}-rank3")
    for use in (False, True):
        add(op, {"b": np.array(0.5, np.float32)}, {"use_peephole": use}, ValueError, ["b"],
            f"b-rank0-peep{use}")
        add(op, {"b": np.zeros((4 * H, 1), np.float32)}, {"use_peephole": use}, ValueError,
            ["b"], f"b-rank2-peep{use}")
        for p in PEEPS:
            add(op, {p: np.zeros((H, 1), np.float32)}, {"use_peephole": use}, ValueError, [p],
                f"{p}-rank2-peep{use}")
            add(op, {p: np.array(0.5, np.float32)}, {"use_peephole": use}, ValueError, [p],
                f"{p}-rank0-peep{use}")
    # LSTMBlockCell: wci/wcf/wco length != H with use_peephole=True (OOB read in TF)
    for p in PEEPS:
        for n in (0, 1, H - 1, H + 1):
            add(op, {p: np.zeros(n, np.float32)}, {"use_peephole": True}, ValueError, [p],
                f"{p}-len{n}-peepTrue")

    # LSTMBlockCellGrad (and the _full helper)
    for op in CELL_GRADS:
        bh_args = [n for n, s in _LSTM_CELL_GRAD if s.startswith("B")]
        for n in bh_args:
            shp = shape_of(op, n)
            add(op, {n: np.array(0.5, np.float32)}, {}, ValueError, [n], f"{n}-rank0")
            add(op, {n: np.zeros(shp[:1], np.float32)}, {}, ValueError, [n], f"{n}-rank1")
            add(op, {n: np.zeros(shp + (1,), np.float32)}, {}, ValueError, [n], f"{n}-rank3")
        for n in ("i", "cs", "f", "o", "ci", "co", "cs_grad", "h_grad"):
            add(op, {n: np.zeros((B + 1, H), np.float32)}, {}, ValueError, [n], f"{n}-B+1")
            add(op, {n: np.zeros((B, H + 1), np.float32)}, {}, ValueError, [n], f"{n}-H+1")
        for use in (False, True):
            for n in PEEPS + ("b",):
                shp = shape_of(op, n)
                add(op, {n: np.zeros(shp + (1,), np.float32)}, {"use_peephole": use},
                    ValueError, [n], f"{n}-rank2-peep{use}")
            add(op, {"b": np.array(0.5, np.float32)}, {"use_peephole": use}, ValueError,
                ["b"], f"b-rank0-peep{use}")
        for p in PEEPS:
            for n in (0, H - 1, H + 1):
                add(op, {p: np.zeros(n, np.float32)}, {"use_peephole": True}, ValueError, [p],
                    f"{p}-len{n}-peepTrue")
        for k in (1, 3):
            add(op, {"w": np.zeros((I + H, 4 * H + k), np.float32)}, {}, ValueError, ["w"],
                f"w-4H+{k}")
    return C


_CRASH = _crash_cases()


@pytest.mark.parametrize("op,repl,attrs,exc,names,api", [
    pytest.param(*c[:5], api, id=f"{c[5]}-{api}") for c in _CRASH for api in _apis(c[0])])
def test_crash_table(op, repl, attrs, exc, names, api):
    args = base_args(op)
    args.update(repl)
    check_raises(exc, names, op, args, base_attrs(op, **attrs), api)


# ----------------------------------------------------------------------------------
# seq_len_max type / rank, attribute types, keyword rules
# ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op", SEQ_OPS)
@pytest.mark.parametrize("bad,exc", [
    pytest.param(2.0, TypeError, id="float"),
    pytest.param(np.float64(2.0), TypeError, id="np.float64"),
    pytest.param(np.array(2.0), TypeError, id="float-0d-array"),
    pytest.param(True, TypeError, id="True"),
    pytest.param(np.bool_(True), TypeError, id="np.bool_"),
    pytest.param(np.array(True), TypeError, id="bool-0d-array"),
    pytest.param("2", TypeError, id="str"),
    pytest.param(None, TypeError, id="None"),
    pytest.param(1 + 0j, TypeError, id="complex"),
    pytest.param(np.array([2]), ValueError, id="int-rank1"),
    pytest.param([2], ValueError, id="list-rank1"),
    pytest.param(np.array([[2]]), ValueError, id="int-rank2"),
    pytest.param(np.array([], np.int64), ValueError, id="int-rank1-empty"),
])
def test_seq_len_max_bad_type_or_rank(op, bad, exc):
    args = base_args(op)
    args["seq_len_max"] = bad
    check_raises(exc, ["seq_len_max"], op, args, base_attrs(op))


@pytest.mark.parametrize("op", SEQ_OPS)
@pytest.mark.parametrize("good", [2, np.int64(2), np.int32(2), np.uint8(2), np.int16(2),
                                  np.array(2), np.array(2, np.int32), np.array(2, np.uint64)],
                         ids=lambda v: f"{type(v).__name__}-{getattr(v, 'dtype', '')}")
def test_seq_len_max_integer_types_accepted(op, good):
    args = base_args(op, np.float64)
    ref_args = dict(args, seq_len_max=2)
    out = call(op, dict(args, seq_len_max=good), base_attrs(op))
    ref = call(op, ref_args, base_attrs(op))
    for a, r in zip(out, ref):
        np.testing.assert_array_equal(a, r)


_BOOL_ATTR_OPS = ("lstm_block_cell",) + SEQ_OPS + CELL_GRADS


@pytest.mark.parametrize("op", _BOOL_ATTR_OPS)
@pytest.mark.parametrize("bad", ["yes", "True", 1.5, 1, 0, np.array([True]), [True]],
                         ids=repr)
def test_use_peephole_not_bool(op, bad):
    args = base_args(op)
    check_raises(TypeError, ["use_peephole"], op, args, base_attrs(op, use_peephole=bad))


@pytest.mark.parametrize("op", LSTM_GRADS)
def test_use_peephole_none_in_grad_ops(op):
    """use_peephole is a required attribute of the grad ops: None is not a bool."""
    check_raises(TypeError, ["use_peephole"], op, base_args(op),
                 base_attrs(op, use_peephole=None))


@pytest.mark.parametrize("op,api", [(o, a) for o in LSTM_GRADS for a in _apis(o)])
def test_grad_op_without_use_peephole(op, api):
    attrs = base_attrs(op)
    del attrs["use_peephole"]
    with pytest.raises(TypeError, match=r"\buse_peephole\b"):
        call(op, base_args(op), attrs, api)


@pytest.mark.parametrize("op", ("lstm_block_cell", "block_lstm", "block_lstm_grad"))
def test_attributes_are_keyword_only(op):
    args = base_args(op)
    extra = [True] if op.endswith("grad") else [1.0]
    with pytest.raises(TypeError):
        getattr(blockrnn, op)(*args.values(), *extra)


@pytest.mark.parametrize("op", ("lstm_block_cell", "block_lstm"))
@pytest.mark.parametrize("attr", ["forget_bias", "cell_clip"])
@pytest.mark.parametrize("bad", ["1.0", "x", [1.0], 1j, object()], ids=repr)
def test_float_attr_bad_type(op, attr, bad):
    check_raises(TypeError, [attr], op, base_args(op), base_attrs(op, **{attr: bad}))


@pytest.mark.parametrize("op, attr", [
    ("lstm_block_cell", "forget_bias"), ("lstm_block_cell", "cell_clip"),
    ("block_lstm", "forget_bias"), ("block_lstm", "cell_clip"), ("block_lstm_v2", "cell_clip")])
@pytest.mark.parametrize("huge", [10**400, -10**400, __import__("fractions").Fraction(10**400)],
                         ids=["1e400", "-1e400", "Fraction"])
@pytest.mark.parametrize("api", ["snake", "raw"])
def test_float_attr_too_large_for_a_float(op, attr, huge, api):
    """A real number no float can hold raises the documented ValueError naming the
    argument (on the compiled fast path too), not a bare OverflowError."""
    with pytest.raises(ValueError, match=rf"{op}: {attr} must fit a float"):
        call(op, base_args(op), base_attrs(op, **{attr: huge}), api)


def test_layer_cell_clip_too_large_for_a_float():
    with pytest.raises(ValueError, match="LSTM: cell_clip must fit a float"):
        blockrnn.LSTM(2, 3, cell_clip=10**400)


@pytest.mark.parametrize("bad", ["0.5", [0.5]], ids=repr)
def test_cell_clip_bad_type_v2(bad):
    op = "block_lstm_v2"
    check_raises(TypeError, ["cell_clip"], op, base_args(op), base_attrs(op, cell_clip=bad))


@pytest.mark.parametrize("op", ("lstm_block_cell", "block_lstm"))
@pytest.mark.parametrize("good", [1, 0, np.float32(0.5), np.int64(2), 2.5])
def test_float_attr_real_numbers_accepted(op, good):
    call(op, base_args(op), base_attrs(op, forget_bias=good, cell_clip=good))


@pytest.mark.parametrize("api", ["snake", "raw"])
@pytest.mark.parametrize("fb", [0.0, 1.0])
def test_block_lstm_v2_rejects_forget_bias(api, fb):
    with pytest.raises(TypeError, match=r"forget_bias"):
        call("block_lstm_v2", base_args("block_lstm_v2"),
             base_attrs("block_lstm_v2", forget_bias=fb), api)


@pytest.mark.parametrize("op", [o for o in OPS if OPS[o][3] is not None])
def test_raw_ops_accept_name_and_are_keyword_only(op):
    args = base_args(op)
    out = call(op, args, base_attrs(op, name="whatever"), "raw")
    ref = call(op, args, base_attrs(op), "snake")
    for a, r in zip(out, ref):
        np.testing.assert_array_equal(a, r)
    with pytest.raises(TypeError):
        getattr(raw_ops, OPS[op][3])(*args.values(), **base_attrs(op))


@pytest.mark.parametrize("api", ["snake", "raw"])
@pytest.mark.parametrize("b,h", [(0, 4), (2, 0), (0, 0)])
def test_lstm_block_cell_rejects_empty_batch_or_cell(api, b, h):
    op = "lstm_block_cell"
    args = base_args(op, dims=dict(DIMS, B=b, H=h))
    for use in (False, True):
        check_raises(ValueError, ["x", "cs_prev", "h_prev"], op, args,
                     base_attrs(op, use_peephole=use), api)


# ----------------------------------------------------------------------------------
# ACCEPTED edge cases
# ----------------------------------------------------------------------------------

def _seq_forward(op_fwd, dims, dtype=np.float64, use_peephole=True, seed=1, **attrs):
    args = base_args(op_fwd, dtype, dims, seed)
    return args, call(op_fwd, args, dict(use_peephole=use_peephole, cell_clip=0.0, **attrs))


def _seq_grad_args(fwd, args, out, dims, seed=2):
    rng = np.random.default_rng(seed)
    T, B, H = dims["T"], dims["B"], dims["H"]
    g = dict(args)
    g.update(out._asdict())
    g["cs_grad"] = rng.uniform(-1, 1, (T, B, H)).astype(args["x"].dtype)
    g["h_grad"] = rng.uniform(-1, 1, (T, B, H)).astype(args["x"].dtype)
    return g


def _expected_grad_shapes(args):
    return dict(x_grad=args["x"].shape, cs_prev_grad=args["cs_prev"].shape,
                h_prev_grad=args["h_prev"].shape, w_grad=args["w"].shape,
                wci_grad=args["wci"].shape, wcf_grad=args["wcf"].shape,
                wco_grad=args["wco"].shape, b_grad=args["b"].shape)


ZERO_SEQ_DIMS = [
    pytest.param(dict(T=0, B=2, I=3, H=4, L=0), id="T0"),
    pytest.param(dict(T=3, B=0, I=3, H=4, L=3), id="B0"),
    pytest.param(dict(T=3, B=2, I=0, H=4, L=3), id="I0"),
    pytest.param(dict(T=3, B=2, I=3, H=0, L=3), id="H0"),
    pytest.param(dict(T=3, B=0, I=0, H=0, L=2), id="B0I0H0"),
    pytest.param(dict(T=0, B=0, I=0, H=0, L=0), id="all0"),
]


@pytest.mark.parametrize("fwd,grad", [("block_lstm", "block_lstm_grad"),
                                      ("block_lstm_v2", "block_lstm_grad_v2")])
@pytest.mark.parametrize("dims", ZERO_SEQ_DIMS)
@pytest.mark.parametrize("use_peephole", [False, True])
def test_seq_ops_zero_sized(fwd, grad, dims, use_peephole):
    T, B, I, H = (dims[k] for k in "TBIH")
    args, out = _seq_forward(fwd, dims, use_peephole=use_peephole)
    assert out._fields == ("i", "cs", "f", "o", "ci", "co", "h")
    for a in out:
        assert a.shape == (T, B, H) and a.dtype == np.float64
        assert np.all(np.isfinite(a))
    gargs = _seq_grad_args(fwd, args, out, dims)
    gout = call(grad, gargs, dict(use_peephole=use_peephole))
    exp = _expected_grad_shapes(args)
    assert gout._fields == tuple(exp)
    for f, a in gout._asdict().items():
        assert a.shape == exp[f], f
        assert a.dtype == np.float64
        assert np.all(np.isfinite(a)), f
    if B == 0 or H == 0 or T == 0:
        # every gradient is an empty sum (or empty): exactly zero, never garbage
        for f, a in gout._asdict().items():
            assert not np.any(a), f


@pytest.mark.parametrize("fwd,grad", [("block_lstm", "block_lstm_grad"),
                                      ("block_lstm_v2", "block_lstm_grad_v2")])
def test_seq_ops_zero_input_size_equals_zero_input(fwd, grad):
    """I = 0 behaves like I = 1 with x = 0 (and the extra w row dropped)."""
    d0 = dict(T=3, B=2, I=0, H=3, L=2)
    args0, out0 = _seq_forward(fwd, d0)
    args1 = dict(args0)
    args1["x"] = np.zeros((3, 2, 1))
    args1["w"] = np.vstack([np.full((1, 12), 0.7), args0["w"]])
    out1 = call(fwd, args1, dict(use_peephole=True, cell_clip=0.0))
    for a, r in zip(out0, out1):
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-14)
    g0 = call(grad, _seq_grad_args(fwd, args0, out0, d0), dict(use_peephole=True))
    g1 = call(grad, _seq_grad_args(fwd, args1, out1, d0), dict(use_peephole=True))
    assert g0.x_grad.shape == (3, 2, 0)
    assert g0.w_grad.shape == (3, 12)
    np.testing.assert_allclose(g0.w_grad, g1.w_grad[1:], rtol=1e-12, atol=1e-14)
    for f in ("cs_prev_grad", "h_prev_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad"):
        np.testing.assert_allclose(getattr(g0, f), getattr(g1, f), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fwd,grad", [("block_lstm", "block_lstm_grad"),
                                      ("block_lstm_v2", "block_lstm_grad_v2")])
@pytest.mark.parametrize("T", [0, 3])
def test_seq_len_max_zero(fwd, grad, T):
    dims = dict(T=T, B=2, I=3, H=4, L=0)
    args, out = _seq_forward(fwd, dims)
    for f, a in out._asdict().items():
        assert a.shape == (T, 2, 4)
        assert not np.any(a), f  # blockrnn writes zeros for all 7 outputs at t >= L
    gargs = _seq_grad_args(fwd, args, out, dims)
    # even with garbage-looking forward values and upstream grads, L = 0 gives zeros
    rng = np.random.default_rng(5)
    for n in ("i", "cs", "f", "o", "ci", "co", "h"):
        gargs[n] = rng.uniform(0.1, 0.9, (T, 2, 4))
    gout = call(grad, gargs, dict(use_peephole=True))
    for f, a in gout._asdict().items():
        assert a.shape == _expected_grad_shapes(args)[f]
        assert not np.any(a), f


@pytest.mark.parametrize("fwd", SEQ_FWD)
def test_seq_outputs_beyond_seq_len_max_are_zero(fwd):
    dims = dict(T=4, B=2, I=3, H=2, L=2)
    _, out = _seq_forward(fwd, dims)
    for f, a in out._asdict().items():
        assert not np.any(a[2:]), f
        assert np.any(a[:2]), f


ZERO_CELL_DIMS = [
    pytest.param(dict(B=0, I=3, H=4), id="B0"),
    pytest.param(dict(B=2, I=0, H=4), id="I0"),
    pytest.param(dict(B=2, I=3, H=0), id="H0"),
    pytest.param(dict(B=0, I=0, H=0), id="all0"),
]


@pytest.mark.parametrize("dims", ZERO_CELL_DIMS)
@pytest.mark.parametrize("use_peephole", [False, True])
def test_lstm_block_cell_grad_zero_sized(dims, use_peephole):
    B, H = dims["B"], dims["H"]
    op = "lstm_block_cell_grad"
    args = base_args(op, np.float64, dims, seed=3)
    out = call(op, args, dict(use_peephole=use_peephole))
    assert out._fields == ("cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad")
    assert out.cs_prev_grad.shape == (B, H) and out.dicfo.shape == (B, 4 * H)
    for p in PEEPS:
        g = getattr(out, p + "_grad")
        assert g.shape == (H,) and g.dtype == np.float64
        if B == 0 or not use_peephole:
            assert not np.any(g)
    full = call("lstm_block_cell_grad_full", args, dict(use_peephole=use_peephole))
    exp = _expected_grad_shapes(args)
    for f, a in full._asdict().items():
        assert a.shape == exp[f], f
        assert np.all(np.isfinite(a)), f
        if B == 0 or H == 0:
            assert not np.any(a), f


def test_lstm_block_cell_zero_input_size():
    """I = 0 is accepted and equals I = 1 with x = 0."""
    op = "lstm_block_cell"
    d0 = dict(B=2, I=0, H=3)
    args0 = base_args(op, np.float64, d0, seed=4)
    out0 = call(op, args0, dict(use_peephole=True, forget_bias=0.5, cell_clip=0.0))
    args1 = dict(args0, x=np.zeros((2, 1)),
                 w=np.vstack([np.full((1, 12), -0.3), args0["w"]]))
    out1 = call(op, args1, dict(use_peephole=True, forget_bias=0.5, cell_clip=0.0))
    for a, r in zip(out0, out1):
        assert a.shape == (2, 3)
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-14)
    fwd0 = {k: v for k, v in out0._asdict().items() if k != "h"}  # the cell grad takes no h
    gargs0 = dict(args0, **fwd0, cs_grad=np.ones((2, 3)), h_grad=np.ones((2, 3)))
    full0 = blockrnn.lstm_block_cell_grad_full(*gargs0.values(), use_peephole=True)
    assert full0.x_grad.shape == (2, 0) and full0.w_grad.shape == (3, 12)


@pytest.mark.parametrize("dims", ZERO_CELL_DIMS)
def test_gru_zero_sized(dims):
    B, I, H = dims["B"], dims["I"], dims["H"]
    args = base_args("gru_block_cell", np.float64, dims, seed=6)
    out = call("gru_block_cell", args, {})
    assert out._fields == ("r", "u", "c", "h")
    for a in out:
        assert a.shape == (B, H) and a.dtype == np.float64 and np.all(np.isfinite(a))
    gargs = dict(args, r=out.r, u=out.u, c=out.c, d_h=np.ones((B, H)))
    g = call("gru_block_cell_grad", gargs, {})
    assert g._fields == ("d_x", "d_h_prev", "d_c_bar", "d_r_bar_u_bar")
    assert [a.shape for a in g] == [(B, I), (B, H), (B, H), (B, 2 * H)]
    full = call("gru_block_cell_grad_full", gargs, {})
    assert full._fields == ("d_x", "d_h_prev", "d_w_ru", "d_w_c", "d_b_ru", "d_b_c")
    assert [a.shape for a in full] == [(B, I), (B, H), (I + H, 2 * H), (I + H, H), (2 * H,), (H,)]
    for a in list(g) + list(full):
        assert np.all(np.isfinite(a))
        if B == 0 or H == 0:
            assert not np.any(a)  # empty sums are zero


def test_gru_zero_input_size_equals_zero_input():
    d0 = dict(B=2, I=0, H=3)
    args0 = base_args("gru_block_cell", np.float64, d0, seed=7)
    out0 = call("gru_block_cell", args0, {})
    args1 = dict(args0, x=np.zeros((2, 1)),
                 w_ru=np.vstack([np.full((1, 6), 0.4), args0["w_ru"]]),
                 w_c=np.vstack([np.full((1, 3), -0.6), args0["w_c"]]))
    out1 = call("gru_block_cell", args1, {})
    for a, r in zip(out0, out1):
        np.testing.assert_allclose(a, r, rtol=1e-12, atol=1e-14)
    dh = np.random.default_rng(8).uniform(-1, 1, (2, 3))
    f0 = call("gru_block_cell_grad_full", dict(args0, r=out0.r, u=out0.u, c=out0.c, d_h=dh), {})
    f1 = call("gru_block_cell_grad_full", dict(args1, r=out1.r, u=out1.u, c=out1.c, d_h=dh), {})
    assert f0.d_x.shape == (2, 0)
    np.testing.assert_allclose(f0.d_h_prev, f1.d_h_prev, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(f0.d_w_ru, f1.d_w_ru[1:], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(f0.d_w_c, f1.d_w_c[1:], rtol=1e-12, atol=1e-14)


# --- unused peephole vectors of any length (use_peephole=False) --------------------

@pytest.mark.parametrize("n", [0, 1, DIMS["H"] + 3])
def test_unused_peepholes_any_length_cell(n):
    op = "lstm_block_cell"
    args = base_args(op, np.float64)
    ref = call(op, args, dict(use_peephole=False))
    odd = dict(args, wci=np.full(n, 9.0), wcf=np.full(n, -9.0), wco=np.full(n, 9.0))
    out = call(op, odd, dict(use_peephole=False))
    for a, r in zip(out, ref):
        np.testing.assert_array_equal(a, r)
    for api in ("snake", "raw"):
        call(op, odd, dict(use_peephole=False), api)


def _assert_zero_peephole_grads(out, ref, n):
    """Peephole grads are float64 zeros of length n; every other output equals ref's."""
    for f, a in out._asdict().items():
        if f in ("wci_grad", "wcf_grad", "wco_grad"):
            assert a.shape == (n,) and a.dtype == np.float64 and not np.any(a)
        else:
            np.testing.assert_array_equal(a, getattr(ref, f))


@pytest.mark.parametrize("op", CELL_GRADS)
@pytest.mark.parametrize("n", [0, 1, DIMS["H"] + 3])
def test_unused_peepholes_any_length_cell_grad(op, n):
    args = base_args(op, np.float64)
    ref = call(op, args, dict(use_peephole=False))
    odd = dict(args, wci=np.full(n, 9.0), wcf=np.full(n, -9.0), wco=np.full(n, 9.0))
    out = call(op, odd, dict(use_peephole=False))
    _assert_zero_peephole_grads(out, ref, n)


@pytest.mark.parametrize("fwd,grad", [("block_lstm", "block_lstm_grad"),
                                      ("block_lstm_v2", "block_lstm_grad_v2")])
@pytest.mark.parametrize("n", [0, 1, DIMS["H"] + 3])
def test_unused_peepholes_any_length_seq_grad(fwd, grad, n):
    dims = dict(DIMS, L=2)
    args, out = _seq_forward(fwd, dims, use_peephole=False)
    gargs = _seq_grad_args(fwd, args, out, dims)
    ref = call(grad, gargs, dict(use_peephole=False))
    odd = dict(gargs, wci=np.full(n, 9.0), wcf=np.full(n, -9.0), wco=np.full(n, 9.0))
    got = call(grad, odd, dict(use_peephole=False))
    _assert_zero_peephole_grads(got, ref, n)
    call(grad, odd, dict(use_peephole=False), "raw")


# --- NaN / Inf propagate without hang or crash ------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_nan_in_x_propagates_cell(dtype):
    op = "lstm_block_cell"
    args = base_args(op, dtype)
    args["x"][0, 0] = np.nan
    out = call(op, args, dict(use_peephole=True))
    assert np.all(np.isnan(out.h[0])) and np.all(np.isnan(out.cs[0]))
    assert np.all(np.isfinite(out.h[1]))  # rows are independent


@pytest.mark.parametrize("fwd", SEQ_FWD)
def test_nan_in_x_propagates_seq(fwd):
    args = base_args(fwd, np.float32)
    args["x"][0, 0, 0] = np.nan
    out = call(fwd, args, dict(use_peephole=False, cell_clip=3.0))
    assert np.all(np.isnan(out.h[:, 0]))     # through the recurrence
    assert np.all(np.isfinite(out.h[:, 1]))


def test_nan_in_cs_prev_propagates_through_clip():
    op = "lstm_block_cell"
    args = base_args(op, np.float64)
    args["cs_prev"][0, :] = np.nan
    out = call(op, args, dict(use_peephole=False, cell_clip=0.5))
    assert np.all(np.isnan(out.cs[0])) and np.all(np.isnan(out.h[0]))
    assert np.all(np.abs(out.cs[1]) <= 0.5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_inf_cell_state_is_clipped(dtype):
    op = "lstm_block_cell"
    args = base_args(op, dtype)
    args["cs_prev"][0, :] = np.inf
    args["cs_prev"][1, :] = -np.inf
    out = call(op, args, dict(use_peephole=False, cell_clip=2.0))
    np.testing.assert_array_equal(out.cs[0], dtype(2.0))
    np.testing.assert_array_equal(out.cs[1], dtype(-2.0))
    assert np.all(np.isfinite(out.h))
    # no clipping: the state stays infinite, co = tanh(inf) = 1, h = o
    out = call(op, args, dict(use_peephole=False, cell_clip=0.0))
    assert np.all(out.cs[0] == np.inf) and np.all(out.cs[1] == -np.inf)
    np.testing.assert_array_equal(out.co[0], 1)
    np.testing.assert_array_equal(out.h[0], out.o[0])


def test_inf_preactivation_clips_cs():
    """x = +inf with positive weights: every gate pre-activation is +inf, so
    i = ci = f = o = 1 and cs = clip(1 + cs_prev)."""
    op = "lstm_block_cell"
    args = base_args(op, np.float64)
    args["w"] = np.abs(args["w"]) + 0.1
    args["x"][:, 0] = np.inf
    clip = 0.75
    out = call(op, args, dict(use_peephole=False, cell_clip=clip))
    for g in ("i", "ci", "f", "o"):
        np.testing.assert_array_equal(getattr(out, g), 1.0)
    np.testing.assert_allclose(out.cs, np.clip(1.0 + args["cs_prev"], -clip, clip), rtol=1e-14)
    np.testing.assert_allclose(out.h, np.tanh(out.cs), rtol=1e-14)


def test_float32_activations_over_their_whole_range():
    """The float32 sigmoid and tanh (include/brnn_math.h) against float64, through
    lstm_block_cell with every pre-activation equal to x (w = 1 on x, b = 0,
    forget_bias = 0): within 3 ulp wherever the result is a normal float,
    including both ends of exp's clamp (rint(z log2e) = -125 and 127, where
    2^n is built in the exponent field) and tanh's switch at |z| = 0.625;
    sigmoid below z = -88.3 within 5e-39 of its value (TensorFlow flushes it to
    0); the infinities saturate and NaN propagates."""
    edges = [-88.3, -88.29, -87.4, -86.9, -86.89, 86.9, 88.29, 88.3, 0.625, -0.625,
             np.nextafter(np.float32(0.625), np.float32(0)), 1e-30, -1e-30, 0.0]
    z = np.concatenate([np.linspace(-100, 100, 200001), edges]).astype(np.float32)
    z = np.concatenate([z, [np.inf, -np.inf, np.nan]]).astype(np.float32)
    B = z.size
    zero = np.zeros((B, 1), np.float32)
    p0 = np.zeros(1, np.float32)
    w = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
    out = blockrnn.lstm_block_cell(z[:, None], zero, zero, w, p0, p0, p0,
                                   np.zeros(4, np.float32), forget_bias=0.0, cell_clip=0.0)
    fin = np.isfinite(z)
    with np.errstate(over="ignore"):
        zd = z[fin].astype(np.float64)
        refs = {"i": 1 / (1 + np.exp(-zd)), "ci": np.tanh(zd)}
    tiny = np.finfo(np.float32).tiny
    for name, ref in refs.items():
        got = getattr(out, name)[fin, 0].astype(np.float64)
        normal = np.abs(ref) >= tiny
        ulp = np.spacing(np.abs(ref[normal]).astype(np.float32)).astype(np.float64)
        err = np.abs(got[normal] - ref[normal]) / ulp
        assert err.max() <= 3, (name, err.max(), z[fin][normal][err.argmax()])
        assert np.abs(got[~normal] - ref[~normal]).max(initial=0) <= 5e-39, name
    for name in ("i", "f", "o"):
        g = getattr(out, name)[~fin, 0]
        assert g[0] == 1 and 0 <= g[1] <= 5e-39 and np.isnan(g[2]), (name, g)
    np.testing.assert_array_equal(out.ci[~fin, 0][:2], [1, -1])
    assert np.isnan(out.ci[~fin, 0][2]) and np.isnan(out.h[-1, 0])


def test_nan_inf_in_grads_do_not_crash():
    op = "block_lstm_grad"
    args = base_args(op, np.float64)
    args["cs_grad"][1, 0, 0] = np.nan
    args["h_grad"][2, 1, 1] = np.inf
    out = call(op, args, dict(use_peephole=True))
    assert np.isnan(out.cs_prev_grad[0]).any()
    gru = base_args("gru_block_cell_grad", np.float64)
    gru["d_h"][0, 0] = np.nan
    g = call("gru_block_cell_grad", gru, {})
    assert np.isnan(g.d_c_bar[0, 0]) and np.all(np.isfinite(g.d_c_bar[1]))


# --- memory layouts are accepted and give the same result --------------------------

def _relayout(a, how):
    if how == "fortran":
        return np.asfortranarray(a)
    if how == "negative_stride":
        return np.ascontiguousarray(a[::-1])[::-1] if a.ndim else a
    if how == "non_contiguous":
        big = np.zeros(a.shape + (2,), a.dtype)
        big[..., 0] = a
        return big[..., 0]
    if how == "readonly":
        a = a.copy()
        a.setflags(write=False)
        return a
    raise AssertionError(how)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("how", ["fortran", "negative_stride", "non_contiguous", "readonly"])
def test_memory_layouts_accepted(op, how):
    args = base_args(op, np.float64)
    ref = call(op, args, base_attrs(op))
    odd = {k: (_relayout(v, how) if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    for k, v in odd.items():
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(v, args[k])
    out = call(op, odd, base_attrs(op))
    for f in ref._fields:
        np.testing.assert_array_equal(getattr(out, f), getattr(ref, f), err_msg=f)


# ----------------------------------------------------------------------------------
# Sizes beyond SciPy's 32-bit BLAS integers: rejected before any copy or kernel.
# np.broadcast_to makes arrays of that size without allocating them.
# ----------------------------------------------------------------------------------

def _huge(shape):
    return np.broadcast_to(np.float32(0.5), shape)


def test_sequence_rows_beyond_blas_int_are_rejected():
    T, B, I, H = 2**16, 2**16, 1, 1  # T*B = 2**32 rows for the input GEMM
    small = np.zeros(H, np.float32)
    with pytest.raises(ValueError, match=r"T\*B = 4294967296"):
        blockrnn.block_lstm(1, _huge((T, B, I)), _huge((B, H)), _huge((B, H)),
                            np.zeros((I + H, 4 * H), np.float32), small, small, small,
                            np.zeros(4 * H, np.float32))


@pytest.mark.parametrize("op", ["lstm_block_cell", "gru_block_cell"])
def test_cell_batch_beyond_blas_int_is_rejected(op):
    B, I, H = 2**31, 1, 1
    x, state = _huge((B, I)), _huge((B, H))
    if op == "lstm_block_cell":
        p = np.zeros(H, np.float32)
        args = (x, state, state, np.zeros((I + H, 4 * H), np.float32), p, p, p,
                np.zeros(4 * H, np.float32))
    else:
        args = (x, state, np.zeros((I + H, 2 * H), np.float32),
                np.zeros((I + H, H), np.float32), np.zeros(2 * H, np.float32),
                np.zeros(H, np.float32))
    with pytest.raises(ValueError, match=r"\bB = 2147483648"):
        getattr(blockrnn, op)(*args)
