"""Property-based fuzzing of all 10 entry points (hypothesis, derandomized for CI).

Strategies draw every size in 0..5 (B, H >= 1 for lstm_block_cell, which rejects an
empty state), the dtype (float16/32/64), one memory layout per argument (C order,
Fortran order, strided slice, negative strides, read-only, Python list), the
attributes (use_peephole, cell_clip, forget_bias as Python or NumPy numbers), the
length of unused peephole vectors, seq_len_max (any integer type, 0..T) and whether
lstm_block_cell_grad_full gets None gradients.

Properties:
* valid inputs: outputs have the input dtype and the reference's shapes, and agree
  with ``blockrnn._reference`` on the float64 upcast of the same inputs (float64 to
  1e-10, float32 to 1e-5, float16 to 2e-3, relative with a floor of 1); the inputs are
  left untouched, and no RuntimeWarning is raised;
* one argument broken (wrong rank, a wrong dimension, an integer/bool/complex dtype,
  another float dtype than the rest, a bad seq_len_max, a wrongly typed attribute):
  ValueError or TypeError whose message names that argument;
* never any other exception, and never a crash (a crash kills the pytest process).
"""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blockrnn
from _inputs import rel_err
from blockrnn import _reference

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
VALID_EXAMPLES = 400
INVALID_EXAMPLES = 300
# Element-wise |got - ref| / max(1, |ref|) against the float64 reference. float32:
# sums with cancellation reach 1e-5 in the oracle itself (block_lstm_grad_v2 at
# B,I,H,T = 4,4,5,4, peepholes, one of these examples: w_grad off by 1.08e-5 in
# tf.raw_ops.BlockLSTMGradV2, 0.84e-5 in blockrnn at -O3, 1.23e-5 in the -O0
# sanitizer build, whose gate math has no FMA), so the bound is 3e-5.
TOLERANCE = {np.float16: 2e-3, np.float32: 3e-5, np.float64: 1e-10}

_CELL = [("x", "B I"), ("cs_prev", "B H"), ("h_prev", "B H"), ("w", "I+H 4H"),
         ("wci", "P"), ("wcf", "P"), ("wco", "P"), ("b", "4H")]
_CELL_GRAD = _CELL + [(n, "B H") for n in ("i", "cs", "f", "o", "ci", "co", "cs_grad",
                                           "h_grad")]
_SEQ = [("x", "T B I")] + _CELL[1:]
_SEQ_GRAD = _SEQ + [(n, "T B H") for n in ("i", "cs", "f", "o", "ci", "co", "h", "cs_grad",
                                           "h_grad")]
_GRU = [("x", "B I"), ("h_prev", "B H"), ("w_ru", "I+H 2H"), ("w_c", "I+H H"),
        ("b_ru", "2H"), ("b_c", "H")]
_GRU_GRAD = _GRU + [(n, "B H") for n in ("r", "u", "c", "d_h")]
# (argument, axis) pairs that define a size: changing one changes what the others
# must be, so the "wrong dimension" mutation leaves them alone.
_DEFINERS = {("x", 0), ("x", 1), ("x", 2), ("cs_prev", 1), ("h_prev", 1)}

# name: (arguments, sequence op, attributes, peepholes always [H])
OPS = {
    "lstm_block_cell": (_CELL, False, ("forget_bias", "cell_clip", "use_peephole"), False),
    "lstm_block_cell_grad": (_CELL_GRAD, False, ("use_peephole",), False),
    "lstm_block_cell_grad_full": (_CELL_GRAD, False, ("use_peephole",), False),
    "block_lstm": (_SEQ, True, ("forget_bias", "cell_clip", "use_peephole"), True),
    "block_lstm_v2": (_SEQ, True, ("cell_clip", "use_peephole"), True),
    "block_lstm_grad": (_SEQ_GRAD, True, ("use_peephole",), False),
    "block_lstm_grad_v2": (_SEQ_GRAD, True, ("use_peephole",), False),
    "gru_block_cell": (_GRU, False, (), False),
    "gru_block_cell_grad": (_GRU_GRAD, False, (), False),
    "gru_block_cell_grad_full": (_GRU_GRAD, False, (), False),
}
LAYOUTS = ("C", "F", "strided", "negative", "readonly", "list")


def _shape(spec, dims):
    return tuple(eval(d.replace("4H", "4*H").replace("2H", "2*H"), {}, dims)
                 for d in spec.split())


def _layout(a, kind):
    """The same values as ``a`` in another memory layout."""
    if kind == "F":
        return np.asfortranarray(a)
    if kind == "strided":  # every other element of a larger array along the last axis
        big = np.zeros(a.shape[:-1] + (2 * a.shape[-1] + 1,), a.dtype)
        big[..., 1::2] = a
        return big[..., 1::2]
    if kind == "negative":  # reversed storage along every axis
        rev = tuple(slice(None, None, -1) for _ in a.shape)
        return np.ascontiguousarray(a[rev])[rev]
    if kind == "readonly":
        a = a.copy()
        a.flags.writeable = False
        return a
    if kind == "list":
        return a.tolist()
    return np.ascontiguousarray(a)


def _layouts(name, values):
    """Layouts for one argument. x is never a list (it sets the dtype of the lists), and
    an empty array is never one either ([] has lost the shape (0, 3))."""
    return st.sampled_from(LAYOUTS[:-1] if name == "x" or values.size == 0 else LAYOUTS)


@st.composite
def calls(draw, op):
    """(kwargs for blockrnn, kwargs for the reference, dtype, dims, use_peephole_required)."""
    spec, sequence, attr_names, peep_required = OPS[op]
    low = 1 if op == "lstm_block_cell" else 0
    dims = dict(B=draw(st.integers(low, 5)), I=draw(st.integers(0, 5)),
                H=draw(st.integers(low, 5)), T=draw(st.integers(0, 5)))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    attrs = {}
    if "use_peephole" in attr_names:
        attrs["use_peephole"] = draw(st.sampled_from([True, False, np.bool_(True)]))
    if "forget_bias" in attr_names:
        attrs["forget_bias"] = draw(st.sampled_from([1.0, 0.0, -0.5, 2, np.float32(0.25)]))
    if "cell_clip" in attr_names:
        attrs["cell_clip"] = draw(st.sampled_from([0.0, -1.0, 0.3, 3.0, 1, np.float64(0.5)]))
    peephole_used = bool(attrs.get("use_peephole", False))
    dims["P"] = dims["H"] if (peep_required or peephole_used) else draw(st.integers(0, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    args, ref = {}, {}
    for name, shape_spec in spec:
        values = rng.uniform(-1.5, 1.5, _shape(shape_spec, dims)).astype(dtype)
        if name.startswith("w"):
            values = (values / 2).astype(dtype)
        args[name] = _layout(values, draw(_layouts(name, values)))
        ref[name] = values.astype(np.float64)
    if op == "lstm_block_cell_grad_full":
        for name in ("cs_grad", "h_grad"):
            if draw(st.booleans()) and draw(st.booleans()):
                args[name] = ref[name] = None
    if sequence:
        L = draw(st.integers(0, dims["T"]))
        kind = draw(st.sampled_from([int, np.int8, np.uint16, np.int32, np.int64, np.array]))
        args = dict(seq_len_max=kind(L), **args)
        ref = dict(seq_len_max=L, **ref)
    args.update(attrs)
    ref.update(attrs)
    return args, ref, dtype, dims


def _snapshot(args):
    return {k: (np.array(v, copy=True) if v is not None else None) for k, v in args.items()}


# A valid call must not warn either: e.g. casting an unfilled float32 buffer to float16
# ("overflow encountered in cast") is an error under `python -W error`.
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=VALID_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_valid_inputs_match_the_reference(op, data):
    args, ref_args, dtype, dims = data.draw(calls(op), label="call")
    before = _snapshot(args)
    out = getattr(blockrnn, op)(**args)
    expected = getattr(_reference, op)(**ref_args)
    assert type(out).__name__ == type(expected).__name__
    assert out._fields == expected._fields
    for field, got, want in zip(out._fields, out, expected):
        assert isinstance(got, np.ndarray), (field, type(got))
        assert got.dtype == dtype, (field, got.dtype, dtype)
        assert got.shape == want.shape, (field, got.shape, want.shape)
        err = rel_err(got, want)
        assert err <= TOLERANCE[dtype], (op, field, np.dtype(dtype).name, err, dims)
    for name, value in before.items():  # inputs untouched
        if value is not None:
            assert np.array_equal(np.asarray(args[name]), value), name


# ------------------------------------------------------------------------------------
# One argument broken
# ------------------------------------------------------------------------------------

_BAD_ATTRS = {
    "use_peephole": [1, 0, "yes", None, 1.0],
    "forget_bias": ["1", None, True, 1j, [1.0]],
    "cell_clip": ["3", None, False, 2j],
}


@st.composite
def broken_calls(draw, op):
    """(kwargs, the argument that was broken, the exception types allowed)."""
    args, _, dtype, dims = draw(calls(op))
    spec, sequence, attr_names, peep_required = OPS[op]
    peephole_free = not (peep_required or args.get("use_peephole", False))
    arrays = [n for n, _ in spec if args.get(n) is not None]
    kinds = ["rank", "dim", "int_dtype", "float_dtype"]
    if sequence:
        kinds.append("seq_len_max")
    if attr_names:
        kinds.append("attr")
    if op == "block_lstm_v2":
        kinds.append("v2_forget_bias")
    kind = draw(st.sampled_from(kinds))
    if kind == "seq_len_max":
        bad = draw(st.sampled_from([
            dims["T"] + 1, dims["T"] + 7, -1, np.int64(-3), 1.0, np.float32(2.0), True,
            np.array([0]), np.zeros((1, 1), np.int64), "2", None]))
        args["seq_len_max"] = bad
        return args, "seq_len_max", (ValueError, TypeError)
    if kind == "attr":
        name = draw(st.sampled_from(attr_names))
        args[name] = draw(st.sampled_from(_BAD_ATTRS[name]))
        return args, name, (TypeError,)
    if kind == "v2_forget_bias":
        args["forget_bias"] = 1.0
        return args, "forget_bias", (TypeError,)
    name = draw(st.sampled_from(arrays))
    value = np.asarray(args[name], dtype=dtype)
    if kind == "rank":
        if value.ndim > 1 and draw(st.booleans()):
            value = value.reshape(value.shape[:-2] + (-1,)) if value.size else \
                np.zeros(value.shape[:-1], dtype)
        else:
            value = value[..., None]
        args[name] = _layout(value, draw(_layouts(name, value)))
        return args, name, (ValueError,)
    if kind == "dim":
        spec_of = dict(spec)[name]
        axes = [ax for ax in range(value.ndim) if (name, ax) not in _DEFINERS
                and not (spec_of == "P" and peephole_free)]
        if not axes:  # nothing to resize without redefining a size: break the dtype
            kind = "int_dtype"
        else:
            ax = draw(st.sampled_from(axes))
            grow = value.shape[ax] == 0 or draw(st.booleans())
            new = list(value.shape)
            new[ax] += 1 if grow else -1
            args[name] = _layout(np.zeros(new, dtype), draw(st.sampled_from(LAYOUTS[:-1])))
            return args, name, (ValueError,)
    if kind == "int_dtype":
        bad = draw(st.sampled_from([np.int32, np.int64, np.uint8, np.bool_, np.complex64,
                                    np.complex128, object]))
        args[name] = value.astype(bad)
        return args, name, (TypeError,)
    other = draw(st.sampled_from([d for d in (np.float16, np.float32, np.float64) if d != dtype]))
    args[name] = value.astype(other)
    # "h has dtype float32 but x has dtype float64": names the argument, or x when x
    # itself was the odd one out (then the message names the first other argument).
    return args, name, (TypeError,)


@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=INVALID_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_broken_argument_raises_and_names_it(op, data):
    args, name, allowed = data.draw(broken_calls(op), label="broken call")
    with pytest.raises((ValueError, TypeError)) as info:
        getattr(blockrnn, op)(**args)
    assert isinstance(info.value, allowed), (name, repr(info.value))
    message = str(info.value)
    assert re.search(rf"\b{re.escape(name)}\b", message), \
        f"{op}: the error for a broken {name!r} does not name it: {message!r}"
