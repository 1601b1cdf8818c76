"""PyTorch adapter: ``torch.nn.LSTM`` / ``nn.GRU`` drop-ins on blockrnn's fused sequence ops.

Optional: needs PyTorch (``import blockrnn`` never imports it; this module does).
CPU only; float32 and float64 tensors (under ``torch.autocast("cpu")`` a bfloat16 or
float16 input or state runs in the parameters' dtype, with outputs of that dtype). A
bfloat16 / float16 module computes in float32 and rounds its outputs, final states and
gradients once to its dtype.

* ``LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
  dropout=0.0, bidirectional=False, proj_size=0, *, use_peephole=False,
  cell_clip=0.0, forget_bias=0.0, device=None, dtype=None)`` and
  ``GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
  dropout=0.0, bidirectional=False, *, reset_after=True, device=None,
  dtype=None)``: ``torch.nn.LSTM`` / ``nn.GRU``'s constructor, call convention
  (``y, (h_n, c_n) = lstm(x, (h0, c0))``, ``y, h_n = gru(x, h0)``, stacked
  layers, both directions, dropout between layers, ``PackedSequence`` input),
  parameters (names, shapes, gate order, registration order, initialisation),
  so that a ``state_dict`` moves strictly both ways and an optimizer, weight
  decay and gradient clipping see what they see with nn.LSTM / nn.GRU; nn's
  ``all_weights``, ``_all_weights``, ``_flat_weights_names``, ``_flat_weights``
  (read-only), ``mode``, ``flatten_parameters()`` (a no-op, as nn's on CPU) and
  the argument checks ``check_input``, ``check_forward_args``,
  ``get_expected_hidden_size`` / ``get_expected_cell_size``, ``check_hidden_size``
  and ``permute_hidden`` (nn's own functions) for code that uses them.
  ``LSTM.from_torch(nn_lstm)``, ``GRU.from_torch(nn_gru)`` copy a module.
  blockrnn's extras (peepholes, cell clipping, forget bias; the GRUBlockCell
  GRU with ``reset_after=False``) exist only when asked for.
* The ops underneath are PyTorch custom operators (``torch.library.custom_op``,
  namespace ``blockrnn``): ``lstm_op`` / ``lstm_backward_op``, ``gru_op`` /
  ``gru_backward_op`` (nn.GRU's math), ``gru_block_op`` /
  ``gru_block_backward_op`` (GRUBlockCell), ``lstm_proj_op`` /
  ``lstm_proj_backward_op`` (nn.LSTM with proj_size), one layer in one direction each,
  with fake (shape) implementations and autograd, so ``torch.compile(...,
  fullgraph=True)`` and ``torch.export`` trace a model holding these modules.
  Gradients are first-order only: a double backward raises a RuntimeError, and so
  does forward-mode AD into a module or an op (``torch.func.jvp``, ``jacfwd``, dual
  tensors), except ``torch.func.jvp`` around an op called directly, which PyTorch
  hides from the op (zero tangents; README). The modules run under torch.func's
  grad, vjp, jacrev and vmap: there each op runs as an autograd.Function of the
  style functorch needs (_func_function), since torch 2.13's custom-op autograd
  refuses torch.func.
* No-grad calls (``torch.no_grad()``, ``torch.inference_mode()``, or nothing --
  input, states, parameters -- requiring grad) of a float32 module run the
  inference forward (``blockrnn.inference``: y and the final states only, the
  weights packed once): each layer's and direction's weights are packed at the
  first such call and cached on the module (an attribute, not state_dict, not a
  buffer), keyed on every parameter's ``_version``, ``data_ptr()``, dtype, shape
  and device, so any update (optimizer step, ``load_state_dict``, in place under
  ``no_grad``, ``.double()``/``.float()``, a new tensor) repacks that cell at the
  next call. ``.data`` changes bypass the version counter: every forward that
  records a graph drops the cache, and ``clear_inference_cache()`` does by hand.
  A weight that is not a registered parameter (a parametrization such as
  ``weight_norm`` computes it at each access) is packed at each call, never cached.
  The answers equal the grad path's bit for bit (batch 1 included: the training
  forwards' batch-1 steps run the same one-row kernel). Memory: the packed copy, per
  layer and direction 4 (LSTM) or 3 (GRU) x (I_k + 2H) x H' float32 (H' = H rounded
  up to a multiple of 16; the recurrent weight twice, as panels and in the one-row
  kernel's wide layout, on x86 with AVX2 or AVX-512) plus the biases, about 1.5x
  the weights;
  ``inference_cache_info()["nbytes"]``. float64 modules, ``proj_size > 0`` and
  traced calls (torch.compile, torch.export) run the training ops (same bits).
* ``upgrade_state_dict_v01(state_dict, module)``: a blockrnn 0.1 state_dict
  (TensorFlow-layout ``w_l{k}``, ``b_l{k}``) in 0.2's names (CHANGELOG.md).
* ``BlockLSTMFunction``, ``BlockGRUFunction``: autograd Functions over the ops in
  TensorFlow's layouts (``block_lstm_v2``'s w (I+H, 4H), ``block_gru``'s w_ru,
  w_c), kept from 0.1 for code that calls them directly.
"""
import functools
import math
import numbers
import warnings
from typing import Optional, Tuple

import numpy as np
import torch
from torch import nn
from torch.autograd import forward_ad
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

import blockrnn
from blockrnn import _kernels
from blockrnn import gru as _gru
from blockrnn import gru_reset_after as _gru_ra
from blockrnn import lstm as _lstm
from blockrnn import lstm_proj as _lstm_proj
from blockrnn.gru_reset_after import _block_gru_reset_after, _block_gru_reset_after_grad
from blockrnn.lstm import _block_lstm_nn, _block_lstm_nn_grad
from blockrnn._validation import RESET_AFTER, check_float, check_sequence_length, steps_to_run
from blockrnn.lstm_proj import block_lstm_proj, block_lstm_proj_grad
from blockrnn.sequence import reverse_sequence_in_place

__all__ = ["LSTM", "GRU", "upgrade_state_dict_v01", "lstm_op", "lstm_backward_op", "gru_op",
           "gru_backward_op", "gru_block_op", "gru_block_backward_op", "lstm_proj_op",
           "lstm_proj_backward_op", "BlockLSTMFunction",
           "BlockGRUFunction"]

_DTYPES = (torch.float32, torch.float64)
# A module whose parameters have one of these dtypes (module.to(torch.bfloat16),
# .half(), dtype=...) computes in float32: its input and states (of its dtype) and its
# parameters are converted to float32 for the kernels, and its outputs back. They are
# also the dtypes CPU autocast hands a module (_RNNBase._autocast).
_LOW_PRECISION = (torch.bfloat16, torch.float16)
_MODULE_DTYPES = _DTYPES + _LOW_PRECISION


def _to_compute(t):
    """A bfloat16 / float16 tensor as float32 (differentiable), anything else as is."""
    return t.float() if t.dtype in _LOW_PRECISION else t


def _check_tensor(where, name, t, dtype=None, device=None, source=None):
    """A CPU (or meta) float32/float64 tensor -- or of dtype `dtype` and on `device` if
    given (a module's parameters': bfloat16 and float16 too; `source`: the name of the op
    argument `dtype` is from, None for a module's parameters) -- with clear errors. It
    reads the tensor's metadata only, so that torch.compile traces it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not (t.is_cpu or t.is_meta):    # (meta: shapes only, see _tracing; is_cpu is a
        # fifth of the cost of t.device.type, which a call pays once per argument)
        raise ValueError(f"{where}: blockrnn runs on the CPU only; {name} is on {t.device} "
                         f"(move it with .cpu())")
    if dtype is None and t.dtype not in _DTYPES:
        raise TypeError(f"{where}: {name} must be float32 or float64, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(
            f"{where}: {name} has dtype {t.dtype} but "
            + (f"the parameters have {dtype}; convert the input or the module (e.g. "
               f"module.double())" if source is None else
               f"{source} has {dtype}; the op's tensors must share one dtype"))
    if device is not None and t.device != device:
        raise ValueError(f"{where}: {name} is on {t.device} but the parameters are on "
                         f"{device}")


def _numpy(where, name, t, dtype=None, source=None):
    """A NumPy view of a CPU float32/float64 tensor (no copy), checked by _check_tensor;
    an op body runs on CPU tensors, so a meta one among them is refused."""
    _check_tensor(where, name, t, dtype, source=source)
    if t.is_meta:
        raise ValueError(f"{where}: {name} is on the meta device while the call's other "
                         f"tensors are on the CPU (move it with .cpu())")
    return _values(t)


def _values(t):
    """A NumPy view of CPU tensor t (no copy, any strides; None stays None), detached
    only if it requires grad: detach() costs more than the view. A lazily negated view
    (its negative bit set, e.g. ``z.conj().imag``; torch's numpy() refuses it) becomes a
    copy holding its values."""
    if t is None:
        return None
    t = t.detach() if t.requires_grad else t
    try:
        return t.numpy()
    except RuntimeError:
        if t.is_neg():
            return t.resolve_neg().numpy()
        raise


def _tensor(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _grad(where, name, g, dtype, lengths, reverse):
    """An incoming gradient (T, B, H) as NumPy in the op's time order."""
    g = _numpy(where, name, g, None).astype(dtype, copy=False)
    return blockrnn.reverse_sequence(g, lengths) if reverse else g


# ---------------------------------------------------------------------------
# The ops as PyTorch custom operators (namespace "blockrnn")
#
# torch.compile and torch.export see each op as one opaque node: its eager
# implementation (NumPy views, the compiled kernels, the thread-limit rules that
# read os.getpid) never runs under tracing; register_fake gives the shapes. Each
# op is functional: its outputs are new tensors, never views of an input, and no
# two of them overlap. The forward ops also return the gate activations the backward
# needs (in the op's time order; the LSTM's and reset-after GRU's reverse direction
# without lengths: in the input's, see _reverse_route); the backward is a custom
# op of its own.
# ---------------------------------------------------------------------------

_T = torch.Tensor
_OptT = Optional[torch.Tensor]

# Each op's Python implementation, and for the forward ops an autograd.Function
# that runs it with the op's own autograd: what a plain eager call runs
# (_apply). The dispatcher and custom_op's autograd wrapper cost ~120 us per
# forward and more per backward in Python (T=20, B=4, I=16, H=24 on one core:
# the module's forward 278 us, of which the op's own work 68), which at small
# shapes made a training step slower than nn.LSTM's.
_IMPLEMENTATION = {}
_EAGER_FUNCTION = {}
_FAST_FUNCTION = {}     # op -> its eager autograd.Function on plain arguments (_fast_function)
_FUNC_FUNCTION = {}     # op -> its autograd.Function under torch.func (see _func_function)


def _custom_op(name, mutates_args):
    """torch.library.custom_op, keeping the undecorated implementation."""
    def wrap(fn):
        op = torch.library.custom_op(name, mutates_args=mutates_args)(fn)
        _IMPLEMENTATION[op] = fn
        return op
    return wrap


try:   # (private in torch 2.13: where a version lacks one, every call takes the custom op)
    _MODES = (torch.utils._python_dispatch._get_current_dispatch_mode,
              torch._C._is_torch_function_mode_enabled,
              torch._C._functorch.peek_interpreter_stack)
except AttributeError:   # pragma: no cover - depends on the torch version
    _MODES = None


def _route(x):
    """How a call with first tensor x runs its op: "eager" (the implementation under
    an autograd.Function, skipping the dispatcher: a plain torch.Tensor, no tracing,
    dispatch or function mode, no torch.func transform), "func" (under torch.func's
    grad, vjp, jacrev or vmap and nothing else: the op's _FUNC_FUNCTION, which
    functorch can transform; jvp is refused before, see _refuse_forward_ad) or None
    (the custom op, which torch.compile, torch.export, FakeTensor and dispatch modes
    know)."""
    if _MODES is None or _tracing(x):
        return None
    dispatch_mode, function_mode, _ = _MODES
    if dispatch_mode() is not None or function_mode():
        return None
    return "func" if _under_func_transform() else "eager"


def _under_func_transform():
    """Whether a torch.func transform (grad, vjp, jacrev, vmap, jvp) is running."""
    return _MODES is not None and _MODES[2]() is not None


def _apply(op, *args):
    """A forward op's call from the modules: op(*args), run as _route says (the same
    results and gradients every way); any other callable (a test's spy) is called. An
    eager call whose arguments are all plain (_FAST_FUNCTION) skips the op's own
    argument handling."""
    function = _EAGER_FUNCTION.get(op)
    if function is None:
        return op(*args)
    route = _route(args[0])
    if route == "eager":
        fast = _FAST_FUNCTION.get(op)
        if fast is not None and fast.accepts(*args):
            return fast.apply(*args)
        return function.apply(*args)
    return (_FUNC_FUNCTION[op].apply if route == "func" else op)(*args)


def _call(ctx, where, op, *args):
    """A backward op's call from a forward op's autograd backward (where: its name
    in errors). After a forward under torch.func (ctx.func, set by _func_function's
    setup_context) the backward op's _FUNC_FUNCTION, whose own backward raises if
    its result is differentiated: torch.func runs every backward with grad mode on
    (grad, jacrev) or as the caller's grad mode says (the function vjp returns).
    Otherwise first-order only (_first_order_only), then the implementation or the
    custom op, as _route says."""
    if getattr(ctx, "func", False):
        return _FUNC_FUNCTION[op].apply(*args)
    _first_order_only(where)
    if _route(args[0]) == "eager" and not _legacy_batched(args[-2:]):
        return _IMPLEMENTATION[op](*args)
    return op(*args)


try:   # (private in torch 2.13: where a version lacks it, no legacy vmap is seen)
    _IS_LEGACY_BATCHED = torch._C._functorch.is_legacy_batchedtensor
except AttributeError:   # pragma: no cover - depends on the torch version
    _IS_LEGACY_BATCHED = None


def _legacy_batched(grads):
    """Whether an incoming gradient (the backward op's last arguments) is batched by
    the vmap of torch.autograd.grad(..., is_grads_batched=True) (and of
    torch.autograd.functional.jacobian(vectorize=True)), which no torch.func
    interpreter shows: the custom op then runs it, one sample at a time (PyTorch's
    fallback), where the implementation cannot read its data."""
    return _IS_LEGACY_BATCHED is not None and any(
        isinstance(g, torch.Tensor) and _IS_LEGACY_BATCHED(g) for g in grads)


def _func_function(name, implementation, setup, backward):
    """The autograd.Function an op runs as under torch.func transforms, which
    torch.library.custom_op's own autograd does not support in torch 2.13 ("must
    override the setup_context staticmethod"): setup_context style, as functorch
    requires, and a vmap rule that applies the Function once per vmapped sample
    (as PyTorch's fallback for an op without a batching rule; nn.LSTM's own op has
    neither and raises under vmap) and stacks the results along dim 0."""
    def forward(*inputs):
        return implementation(*inputs)

    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)    # as the custom op: None for unused outputs
        ctx.func = True                     # see _call
        setup(ctx, inputs, output)

    def vmap(info, in_dims, *inputs):
        if info.batch_size == 0:      # (no sample to call: no output shape)
            raise ValueError(f"{name}: torch.func.vmap over a dimension of size 0 is not "
                             f"supported")
        # apply, not the implementation: a transform below vmap (grad(vmap(f)))
        # still has to see each sample's call.
        outs = [function.apply(*(a if d is None else a.select(d, i)
                                 for a, d in zip(inputs, in_dims)))
                for i in range(info.batch_size)]
        return tuple(torch.stack(o) for o in zip(*outs)), (0,) * len(outs[0])

    function = type(name, (torch.autograd.Function,),
                    {"forward": staticmethod(forward),
                     "setup_context": staticmethod(setup_context),
                     "backward": staticmethod(backward), "vmap": staticmethod(vmap)})
    return function


def _register_autograd(op, backward_op, setup, backward, name):
    """op's autograd (setup_context, backward) for the custom op, its eager
    autograd.Function and its torch.func one; the backward op itself is first-order
    only."""
    no_double_backward = _no_double_backward(name)
    op.register_autograd(backward, setup_context=setup)
    backward_op.register_autograd(no_double_backward)

    implementation = _IMPLEMENTATION[op]

    def forward(ctx, *inputs):   # (not setup_context: apply then binds a signature, ~30 us)
        ctx.set_materialize_grads(False)    # as the custom op: None for unused outputs
        output = implementation(*inputs)
        setup(ctx, inputs, output)
        return output

    forward_name = f"blockrnn_{name[:-len('_backward')]}"
    _EAGER_FUNCTION[op] = type(forward_name, (torch.autograd.Function,),
                               {"forward": staticmethod(forward),
                                "backward": staticmethod(backward)})
    _FUNC_FUNCTION[op] = _func_function(forward_name, implementation, setup, backward)
    _FUNC_FUNCTION[backward_op] = _func_function(
        f"blockrnn_{name}", _IMPLEMENTATION[backward_op], lambda ctx, inputs, output: None,
        no_double_backward)


def _op_lengths(where, lengths, x):
    """The lengths argument of an op with input x (T, B, I) (None or an integer tensor
    (B,)) as checked int64 NumPy; first, x of another rank raises."""
    if len(x.shape) != 3:
        raise ValueError(f"{where}: x must have shape (T, B, I), got {tuple(x.shape)}")
    if lengths is None:
        return None
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"{where}: sequence_length must be an integer tensor, got {lengths.dtype}")
    return check_sequence_length(where, lengths.detach().cpu().numpy(), x.shape[1], x.shape[0])


def _in_op_order(a, lengths, reverse):
    """A (T, B, ·) array in the op's time order: each row's valid prefix reversed for the
    reverse direction (reverse_sequence is its own inverse, so this also maps back)."""
    return blockrnn.reverse_sequence(a, lengths) if reverse else a


def _reverse_route(reverse, lengths):
    """(in_kernels, copies) for the LSTM and reset-after GRU ops: whether their kernels
    read the reverse direction themselves (every row at full length: ``_block_lstm_nn``'s
    and ``_block_gru_reset_after``'s ``reverse``; x, the outputs and the gradients stay
    in the input's time order), else whether it is reversed with copies (lengths)."""
    in_kernels = reverse and lengths is None
    return in_kernels, reverse and not in_kernels


def _input_order_in_place(a, lengths, reverse):
    """A kernel's new (T, B, ·) output (h, cs, the x gradient), in the op's time order,
    put back in the input's: for the reverse direction reversed in place, no second
    array (nothing else holds the kernel's outputs yet)."""
    return reverse_sequence_in_place(a, lengths) if reverse else a


def _fresh(*arrays):
    """The op's NumPy results as C-contiguous tensors (what the fake kernels promise).

    The arrays are the kernels' new outputs (never an input: a non-reversed
    ``_in_op_order`` returns its argument only for the kernels' own outputs), so
    only a transposed gradient is copied."""
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


def _together(where, names, *arrays):
    """Optional arrays a cell takes together (its two biases, its three peepholes): all
    given or all None, else a ValueError naming them (one given alone would be ignored,
    or read where there is nothing)."""
    if any(a is None for a in arrays) and not all(a is None for a in arrays):
        listed = " and ".join(names) if len(names) == 2 else \
            ", ".join(names[:-1]) + " and " + names[-1]
        each = "both" if len(names) == 2 else "all"
        raise ValueError(f"{where}: {listed} must {each} be given or {each} be None")


def _lstm_bias(where, b_ih, b_hh, forget_bias, H, dtype):
    """BlockLSTMV2's b (4H,) = b_ih + b_hh (zeros without bias) + forget_bias on the f
    block (gate blocks i, f, g, o). The weights need nothing: the kernels read
    weight_ih (4H, I) and weight_hh (4H, H) as stored (``_block_lstm_nn``)."""
    _together(where, ("bias_ih", "bias_hh"), b_ih, b_hh)
    if b_ih is None:
        b = np.zeros(4 * H, dtype)
    elif b_ih.shape != b_hh.shape:
        raise ValueError(f"{where}: bias_ih {b_ih.shape} and bias_hh {b_hh.shape} must have "
                         f"one shape, (4H,) = ({4 * H},)")
    else:
        b = b_ih + b_hh
    if forget_bias:
        b[H:2 * H] += forget_bias
    return b


def _hidden_size(where, w_hh):
    if w_hh.ndim != 2:
        raise ValueError(f"{where}: weight_hh must have shape (4H, H), got {w_hh.shape}")
    return w_hh.shape[1]


# lstm_op's and gru_op's work on NumPy arrays, between the checks and the kernels.
# kernel: a function of the kernel function's signature (lstm._nn_forward_kernel,
# _nn_backward_kernel, gru_reset_after._forward_kernel, _backward_kernel): the bare
# kernel function on arguments the caller has checked (the modules' eager fast
# path), or _checked_* (the op bodies), which runs it through the NumPy op, whose
# checks cover every array. Either way the same kernel call on the same arrays.

def _contiguous_in_op_order(a, lengths, reverse):
    """_in_op_order(a, ...) as one C-contiguous array: a itself if it is one and is not
    reversed, else a single copy (reverse_sequence's copy is C-contiguous)."""
    return np.ascontiguousarray(_in_op_order(a, lengths, reverse))


def _lstm_peepholes(where, wci, wcf, wco, H, dtype):
    """The three peephole arrays the kernels read: the given ones, or zeros (H,)."""
    _together(where, _PEEPHOLES, wci, wcf, wco)
    return (wci, wcf, wco) if wci is not None else (np.zeros(H, dtype),) * 3


def _lstm_forward(kernel, where, x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lengths,
                  cell_clip, forget_bias, reverse):
    """lstm_op on NumPy views of its arguments (x in any layout), lengths checked:
    (h, cs, i, f, o, ci, co) as lstm_op returns them."""
    H = _hidden_size(where, w_hh)
    b = _lstm_bias(where, b_ih, b_hh, forget_bias, H, w_hh.dtype)
    peep = wci is not None
    in_kernels, copies = _reverse_route(reverse, lengths)
    i, cs, f, o, ci, co, h = kernel(
        steps_to_run(x.shape[0], lengths), lengths, in_kernels,
        _contiguous_in_op_order(x, lengths, copies), c0, h0, w_ih, w_hh,
        *_lstm_peepholes(where, wci, wcf, wco, H, w_hh.dtype), b, cell_clip, peep)
    back = lambda a: _input_order_in_place(a, lengths, copies)  # noqa: E731
    return back(h), back(cs), i, f, o, ci, co


def _lstm_backward(kernel, x, h0, c0, w_ih, w_hh, wci, wcf, wco, lengths, reverse, h, cs, i,
                   f, o, ci, co, h_grad, cs_grad):
    """lstm_backward_op on NumPy views in any layout (saved tensors come back from a
    saved_tensors_hooks unpack hook in whatever layout it gives), lengths checked:
    the gradients of (x, h0, c0, w_ih, w_hh, b, wci, wcf, wco)."""
    peep = wci is not None
    in_kernels, copies = _reverse_route(reverse, lengths)
    order = lambda a: _contiguous_in_op_order(a, lengths, copies)  # noqa: E731
    c0, h0, w_ih, w_hh, i, f, o, ci, co = map(np.ascontiguousarray,
                                              (c0, h0, w_ih, w_hh, i, f, o, ci, co))
    peepholes = map(np.ascontiguousarray, _lstm_peepholes("blockrnn.torch.lstm_backward_op",
                                                          wci, wcf, wco, w_hh.shape[1],
                                                          w_hh.dtype))
    dx, dc0, dh0, dw_ih, dw_hh, dwci, dwcf, dwco, db = kernel(
        steps_to_run(x.shape[0], lengths), lengths, in_kernels, order(x), c0, h0, w_ih, w_hh,
        *peepholes, i, order(cs), f, o, ci, co, order(h), order(cs_grad), order(h_grad), peep)
    return (_input_order_in_place(dx, lengths, copies), dh0, dc0, dw_ih, dw_hh, db, dwci,
            dwcf, dwco)


def _checked_lstm_forward(steps, lengths, reverse, x, c0, h0, w_ih, w_hh, wci, wcf, wco, b,
                          cell_clip, peep):
    return _block_lstm_nn(steps, x, c0, h0, w_ih, w_hh, wci, wcf, wco, b, cell_clip=cell_clip,
                          use_peephole=peep, sequence_length=lengths, reverse=reverse)


def _checked_lstm_backward(b, steps, lengths, reverse, x, c0, h0, w_ih, w_hh, wci, wcf, wco,
                           i, cs, f, o, ci, co, h, cs_grad, h_grad, peep):
    """(b: only its shape is checked; the peephole gradients are zeros without
    peepholes, as lstm_backward_op documents)"""
    return _block_lstm_nn_grad(steps, x, c0, h0, w_ih, w_hh, wci, wcf, wco, b, i, cs, f, o,
                               ci, co, h, cs_grad, h_grad, use_peephole=peep,
                               sequence_length=lengths, reverse=reverse)


def _dim(w, axis):
    """w.shape[axis] of a 2-D weight, else 0: the size of the zero biases that stand in
    for missing ones, taken before the kernel's checks refuse a weight of another rank."""
    return w.shape[axis] if w.ndim == 2 else 0


def _gru_biases(where, b_ih, b_hh, w_hh):
    """The bias arrays the kernels read: the given ones, or zeros (3H,)."""
    _together(where, ("bias_ih", "bias_hh"), b_ih, b_hh)
    if b_ih is None:
        return (np.zeros(_dim(w_hh, 0), w_hh.dtype),) * 2
    return b_ih, b_hh


def _gru_forward(kernel, x, h0, w_ih, w_hh, b_ih, b_hh, lengths, reverse):
    """gru_op on NumPy views of its arguments (x in any layout), lengths checked:
    (h, r, z, n, hn) as gru_op returns them."""
    in_kernels, copies = _reverse_route(reverse, lengths)
    r, z, n, hn, h = kernel(
        steps_to_run(x.shape[0], lengths), lengths, in_kernels,
        _contiguous_in_op_order(x, lengths, copies), h0, w_ih, w_hh,
        *_gru_biases("blockrnn.torch.gru_op", b_ih, b_hh, w_hh))
    return _input_order_in_place(h, lengths, copies), r, z, n, hn


def _gru_backward(kernel, x, h0, w_ih, w_hh, lengths, reverse, h, r, z, n, hn, h_grad):
    """gru_backward_op on NumPy views in any layout (as _lstm_backward's), lengths
    checked: the gradients of (x, h0, w_ih, w_hh, b_ih, b_hh)."""
    in_kernels, copies = _reverse_route(reverse, lengths)
    order = lambda a: _contiguous_in_op_order(a, lengths, copies)  # noqa: E731
    h0, w_ih, w_hh, r, z, n, hn = map(np.ascontiguousarray, (h0, w_ih, w_hh, r, z, n, hn))
    dx, *grads = kernel(steps_to_run(x.shape[0], lengths), lengths, in_kernels, order(x), h0,
                        w_ih, w_hh, r, z, n, hn, order(h), order(h_grad))
    return (_input_order_in_place(dx, lengths, copies), *grads)


def _checked_gru_forward(steps, lengths, reverse, x, h0, w_ih, w_hh, b_ih, b_hh):
    return _block_gru_reset_after(steps, x, h0, w_ih, w_hh, b_ih, b_hh,
                                  sequence_length=lengths, reverse=reverse)


def _checked_gru_backward(b_ih, b_hh, steps, lengths, reverse, x, h0, w_ih, w_hh, r, z, n,
                          hn, h, h_grad):
    """(b_ih, b_hh: None or arrays whose shapes are checked)"""
    return _block_gru_reset_after_grad(steps, x, h0, w_ih, w_hh,
                                       *_gru_biases("blockrnn.torch.gru_backward_op", b_ih,
                                                    b_hh, w_hh),
                                       r, z, n, hn, h, h_grad, sequence_length=lengths,
                                       reverse=reverse)


def _gru_block_biases(where, b_ru, b_c, w_ru, w_c):
    """The bias arrays the TF GRU's kernels read: the given ones, or zeros (2H,), (H,)."""
    _together(where, ("b_ru", "b_c"), b_ru, b_c)
    if b_ru is None:
        return np.zeros(_dim(w_ru, 1), w_ru.dtype), np.zeros(_dim(w_c, 1), w_c.dtype)
    return b_ru, b_c


def _gru_block_forward(kernel, x, h0, w_ru, w_c, b_ru, b_c, lengths, reverse):
    """gru_block_op on NumPy views of its arguments (x in any layout), lengths checked:
    (h, r, u, c) as gru_block_op returns them. Its kernels have no reverse of their own:
    the reverse direction reads x reversed (a copy) and writes h back in place."""
    r, u, c, h = kernel(steps_to_run(x.shape[0], lengths), lengths,
                        _contiguous_in_op_order(x, lengths, reverse), h0, w_ru, w_c,
                        *_gru_block_biases("blockrnn.torch.gru_block_op", b_ru, b_c, w_ru,
                                           w_c))
    return _input_order_in_place(h, lengths, reverse), r, u, c


def _gru_block_backward(kernel, x, h0, w_ru, w_c, lengths, reverse, h, r, u, c, h_grad):
    """gru_block_backward_op on NumPy views in any layout (as _lstm_backward's), lengths
    checked: the gradients of (x, h0, w_ru, w_c, b_ru, b_c)."""
    order = lambda a: _contiguous_in_op_order(a, lengths, reverse)  # noqa: E731
    h0, w_ru, w_c, r, u, c = map(np.ascontiguousarray, (h0, w_ru, w_c, r, u, c))
    dx, *grads = kernel(steps_to_run(x.shape[0], lengths), lengths, order(x), h0, w_ru, w_c,
                        r, u, c, order(h), order(h_grad))
    return (_input_order_in_place(dx, lengths, reverse), *grads)


def _checked_gru_block_forward(steps, lengths, x, h0, w_ru, w_c, b_ru, b_c):
    return blockrnn.block_gru(steps, x, h0, w_ru, w_c, b_ru, b_c, sequence_length=lengths)


def _checked_gru_block_backward(b_ru, b_c, steps, lengths, x, h0, w_ru, w_c, r, u, c, h,
                                h_grad):
    """(b_ru, b_c: None or arrays whose shapes are checked)"""
    return blockrnn.block_gru_grad(steps, x, h0, w_ru, w_c,
                                   *_gru_block_biases("blockrnn.torch.gru_block_backward_op",
                                                      b_ru, b_c, w_ru, w_c), r, u, c, h,
                                   h_grad, sequence_length=lengths)


def _lstm_proj_biases(where, b_ih, b_hh, w_ih):
    """The bias arrays the projected LSTM's kernels read: the given ones, or zeros (4H,)."""
    _together(where, ("bias_ih", "bias_hh"), b_ih, b_hh)
    if b_ih is None:
        return (np.zeros(_dim(w_ih, 0), w_ih.dtype),) * 2
    return b_ih, b_hh


def _lstm_proj_forward(kernel, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths, reverse):
    """lstm_proj_op on NumPy views of its arguments (x in any layout), lengths checked:
    (h, cs, i, f, o, ci, co, m) as lstm_proj_op returns them (the reverse direction:
    by copies, as _gru_block_forward)."""
    i, f, o, ci, cs, co, m, h = kernel(
        steps_to_run(x.shape[0], lengths), lengths, _contiguous_in_op_order(x, lengths, reverse),
        h0, c0, w_ih, w_hh, *_lstm_proj_biases("blockrnn.torch.lstm_proj_op", b_ih, b_hh, w_ih),
        w_hr)
    back = lambda a: _input_order_in_place(a, lengths, reverse)  # noqa: E731
    return back(h), back(cs), i, f, o, ci, co, m


def _lstm_proj_backward(kernel, x, h0, c0, w_ih, w_hh, w_hr, lengths, reverse, h, cs, i, f, o,
                        ci, co, m, h_grad, cs_grad):
    """lstm_proj_backward_op on NumPy views in any layout (as _lstm_backward's), lengths
    checked: the gradients of (x, h0, c0, w_ih, w_hh, b, w_hr)."""
    order = lambda a: _contiguous_in_op_order(a, lengths, reverse)  # noqa: E731
    h0, c0, w_ih, w_hh, w_hr, i, f, o, ci, co, m = map(
        np.ascontiguousarray, (h0, c0, w_ih, w_hh, w_hr, i, f, o, ci, co, m))
    dx, *grads = kernel(steps_to_run(x.shape[0], lengths), lengths, order(x), h0, c0, w_ih,
                        w_hh, w_hr, i, f, o, ci, order(cs), co, m, order(h), order(cs_grad),
                        order(h_grad))
    return (_input_order_in_place(dx, lengths, reverse), *grads)


def _checked_lstm_proj_forward(steps, lengths, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr):
    return block_lstm_proj(steps, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr,
                           sequence_length=lengths)


def _checked_lstm_proj_backward(b_ih, b_hh, steps, lengths, x, h0, c0, w_ih, w_hh, w_hr, i,
                                f, o, ci, cs, co, m, h, cs_grad, h_grad):
    """(b_ih, b_hh: None or arrays whose shapes are checked)"""
    return block_lstm_proj_grad(steps, x, h0, c0, w_ih, w_hh,
                                *_lstm_proj_biases("blockrnn.torch.lstm_proj_backward_op",
                                                   b_ih, b_hh, w_ih), w_hr, i, f, o, ci, cs,
                                co, m, h, cs_grad, h_grad, sequence_length=lengths)


def _arrays(where, names, tensors, source):
    """NumPy views of the op's tensor arguments (None stays None), each of the dtype of
    the argument named `source` (the op's first weight; a mismatch names both), after
    refusing forward-mode AD (_refuse_forward_ad: a view would drop the tangents)."""
    _refuse_forward_ad(where, tensors[0], tensors[1:])
    dtype = tensors[names.index(source)].dtype
    return [None if t is None else _numpy(where, n, t, dtype, source)
            for n, t in zip(names, tensors)]


@_custom_op("blockrnn::lstm", mutates_args=())
def lstm_op(x: _T, h0: _T, c0: _T, weight_ih: _T, weight_hh: _T, bias_ih: _OptT,
            bias_hh: _OptT, weight_ci: _OptT, weight_cf: _OptT, weight_co: _OptT,
            lengths: _OptT, cell_clip: float, forget_bias: float,
            reverse: bool) -> Tuple[_T, _T, _T, _T, _T, _T, _T]:
    """One LSTM layer in one direction on ``block_lstm_v2``, nn.LSTM's parameter layout.

    x (T, B, I); h0, c0 (B, H); weight_ih (4H, I), weight_hh (4H, H), bias_ih,
    bias_hh (4H,) or None (no bias), gate rows i, f, g, o; weight_ci/cf/co (H,)
    peepholes or None (no peepholes); lengths None or an integer tensor (B,) in
    [0, T]. reverse: each row's valid prefix runs backwards (the reverse direction
    of a bidirectional layer). Returns (h, cs, i, f, o, ci, co), each (T, B, H):
    h and cs in the input's time order (zero past a row's length), the gates as
    ``lstm_backward_op`` reads them: in the op's time order, or (reverse without
    lengths, which the kernels run backwards in time themselves) in the input's.
    """
    where = "blockrnn.torch.lstm_op"
    xa, h0a, c0a, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco = _arrays(
        where, ("x", "h0", "c0", "weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_ci",
                "weight_cf", "weight_co"),
        (x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_ci, weight_cf, weight_co),
        "weight_ih")
    n = _op_lengths(where, lengths, xa)
    return _fresh(*_lstm_forward(_checked_lstm_forward, where, xa, h0a, c0a, w_ih, w_hh, b_ih,
                                 b_hh, wci, wcf, wco, n, cell_clip, forget_bias, reverse))


@lstm_op.register_fake
def _(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_ci, weight_cf, weight_co,
      lengths, cell_clip, forget_bias, reverse):
    T, B, H = x.shape[0], x.shape[1], weight_hh.shape[1]
    return tuple(x.new_empty(T, B, H) for _ in range(7))


@_custom_op("blockrnn::lstm_backward", mutates_args=())
def lstm_backward_op(x: _T, h0: _T, c0: _T, weight_ih: _T, weight_hh: _T, bias_ih: _OptT,
                     bias_hh: _OptT, weight_ci: _OptT, weight_cf: _OptT, weight_co: _OptT,
                     lengths: _OptT, forget_bias: float, reverse: bool, h: _T, cs: _T, i: _T,
                     f: _T, o: _T, ci: _T, co: _T, h_grad: _T,
                     cs_grad: _T) -> Tuple[_T, _T, _T, _T, _T, _T, _T, _T, _T]:
    """The gradient of ``lstm_op`` (``block_lstm_grad_v2``; cell clipping is ignored by the
    gradient, as in TensorFlow). h, cs and the grads in the input's time order, the gates
    as ``lstm_op`` returned them. Returns the gradients of (x, h0, c0, weight_ih,
    weight_hh, bias (4H,: that of bias_ih and of bias_hh alike), weight_ci, weight_cf,
    weight_co) -- the last three zero without peepholes."""
    where = "blockrnn.torch.lstm_backward_op"
    dt = weight_ih.dtype
    xa, h0a, c0a, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, ha, csa, ia, fa, oa, cia, coa = \
        _arrays(where, ("x", "h0", "c0", "weight_ih", "weight_hh", "bias_ih", "bias_hh",
                        "weight_ci", "weight_cf", "weight_co", "h", "cs", "i", "f", "o", "ci",
                        "co"),
                (x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_ci, weight_cf,
                 weight_co, h, cs, i, f, o, ci, co), "weight_ih")
    dh, dcs = (_numpy(where, name, g).astype(_np_dtype(dt), copy=False)
               for name, g in (("h_grad", h_grad), ("cs_grad", cs_grad)))
    n = _op_lengths(where, lengths, xa)
    b = _lstm_bias(where, b_ih, b_hh, forget_bias, _hidden_size(where, w_hh), w_hh.dtype)
    return _fresh(*_lstm_backward(
        functools.partial(_checked_lstm_backward, b), xa, h0a, c0a, w_ih, w_hh, wci, wcf, wco,
        n, reverse, ha, csa, ia, fa, oa, cia, coa, dh, dcs))


@lstm_backward_op.register_fake
def _(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_ci, weight_cf, weight_co,
      lengths, forget_bias, reverse, h, cs, i, f, o, ci, co, h_grad, cs_grad):
    H = weight_hh.shape[1]
    return (torch.empty_like(x), torch.empty_like(h0), torch.empty_like(c0),
            torch.empty_like(weight_ih), torch.empty_like(weight_hh),
            x.new_empty(4 * H), x.new_empty(H), x.new_empty(H), x.new_empty(H))


def _np_dtype(dtype):
    return np.float64 if dtype == torch.float64 else np.float32


def _first_order_only(where):
    """Raise when the backward runs under create_graph=True (double backward).

    The gradient ops are not differentiable: under create_graph=True their
    result would carry no graph, and a gradient penalty or Hessian product
    through them would silently contribute nothing. (Under torch.compile the
    backward is traced, not run: there the backward ops' own autograd raises.)
    """
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise RuntimeError(
            f"{where}: double backward (torch.autograd.grad(..., create_graph=True) or "
            f".backward(create_graph=True)) is not supported; blockrnn's gradients are "
            f"first-order only. Use torch.nn.LSTM / nn.GRU for higher-order gradients.")


def _no_double_backward(op_name):
    def backward(ctx, *grads):
        raise RuntimeError(
            f"blockrnn.torch: {op_name} is not differentiable (double backward is not "
            f"supported; blockrnn's gradients are first-order only)")
    return backward


def _lstm_setup(ctx, inputs, output):
    (x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lengths, _, forget_bias,
     reverse) = inputs
    ctx.save_for_backward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lengths, *output)
    ctx.forget_bias, ctx.reverse = forget_bias, reverse


def _lstm_autograd(ctx, h_grad, cs_grad, *gate_grads):
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lengths, h, cs, *gates = \
        ctx.saved_tensors
    if h_grad is None:
        h_grad = torch.zeros_like(h)
    if cs_grad is None:
        cs_grad = torch.zeros_like(cs)
    return _lstm_grads(b_ih is not None, wci is not None, *_call(
        ctx, "blockrnn.torch.LSTM backward", lstm_backward_op, x, h0, c0, w_ih, w_hh, b_ih,
        b_hh, wci, wcf, wco, lengths, ctx.forget_bias, ctx.reverse, h, cs, *gates, h_grad,
        cs_grad))


def _lstm_grads(has_b, peep, dx, dh0, dc0, dw_ih, dw_hh, db, dwci, dwcf, dwco):
    """The gradients lstm_op's backward returns (of its fourteen inputs), for a call
    with biases (has_b) and peepholes (peep) or without."""
    return (dx, dh0, dc0, dw_ih, dw_hh, db if has_b else None,
            db.clone() if has_b else None,          # its own tensor: b_hh.grad is not b_ih.grad
            *((dwci, dwcf, dwco) if peep else (None,) * 3), None, None, None, None)


_register_autograd(lstm_op, lstm_backward_op, _lstm_setup, _lstm_autograd, "lstm_backward")


@_custom_op("blockrnn::gru", mutates_args=())
def gru_op(x: _T, h0: _T, weight_ih: _T, weight_hh: _T, bias_ih: _OptT, bias_hh: _OptT,
           lengths: _OptT, reverse: bool) -> Tuple[_T, _T, _T, _T, _T]:
    """One nn.GRU layer in one direction on ``blockrnn.block_gru_reset_after`` (nn.GRU's
    math and layout, gate rows r, z, n). x (T, B, I); h0 (B, H); weight_ih (3H, I);
    weight_hh (3H, H); bias_ih, bias_hh (3H,) or None; lengths, reverse as for
    ``lstm_op``. Returns (h, r, z, n, hn), each (T, B, H): h in the input's time
    order, the rest as ``gru_backward_op`` reads them (as ``lstm_op``'s gates)."""
    where = "blockrnn.torch.gru_op"
    xa, h0a, w_ih, w_hh, b_ih, b_hh = _arrays(
        where, ("x", "h0", "weight_ih", "weight_hh", "bias_ih", "bias_hh"),
        (x, h0, weight_ih, weight_hh, bias_ih, bias_hh), "weight_ih")
    n = _op_lengths(where, lengths, xa)
    return _fresh(*_gru_forward(_checked_gru_forward, xa, h0a, w_ih, w_hh, b_ih, b_hh, n,
                                reverse))


@gru_op.register_fake
def _(x, h0, weight_ih, weight_hh, bias_ih, bias_hh, lengths, reverse):
    T, B, H = x.shape[0], x.shape[1], weight_hh.shape[1]
    return tuple(x.new_empty(T, B, H) for _ in range(5))


@_custom_op("blockrnn::gru_backward", mutates_args=())
def gru_backward_op(x: _T, h0: _T, weight_ih: _T, weight_hh: _T, bias_ih: _OptT,
                    bias_hh: _OptT, lengths: _OptT, reverse: bool, h: _T, r: _T, z: _T,
                    n: _T, hn: _T, h_grad: _T) -> Tuple[_T, _T, _T, _T, _T, _T]:
    """The gradient of ``gru_op`` (``block_gru_reset_after_grad``): the gradients of
    (x, h0, weight_ih, weight_hh, bias_ih, bias_hh)."""
    where = "blockrnn.torch.gru_backward_op"
    dt = weight_ih.dtype
    xa, h0a, w_ih, w_hh, b_ih, b_hh, ha, ra, za, na, hna = _arrays(
        where, ("x", "h0", "weight_ih", "weight_hh", "bias_ih", "bias_hh", "h", "r", "z", "n",
                "hn"), (x, h0, weight_ih, weight_hh, bias_ih, bias_hh, h, r, z, n, hn),
        "weight_ih")
    dh = _numpy(where, "h_grad", h_grad).astype(_np_dtype(dt), copy=False)
    m = _op_lengths(where, lengths, xa)
    return _fresh(*_gru_backward(functools.partial(_checked_gru_backward, b_ih, b_hh), xa, h0a,
                                 w_ih, w_hh, m, reverse, ha, ra, za, na, hna, dh))


@gru_backward_op.register_fake
def _(x, h0, weight_ih, weight_hh, bias_ih, bias_hh, lengths, reverse, h, r, z, n, hn,
      h_grad):
    G = weight_hh.shape[0]
    return (torch.empty_like(x), torch.empty_like(h0), torch.empty_like(weight_ih),
            torch.empty_like(weight_hh), x.new_empty(G), x.new_empty(G))


def _gru_setup(ctx, inputs, output):
    """A GRU op's (either variant: x, h0, two weights, two optional biases, lengths
    and reverse in; h and the gates out) autograd context."""
    x, h0, w1, w2, b1, b2, lengths, reverse = inputs
    ctx.save_for_backward(x, h0, w1, w2, b1, b2, lengths, *output)
    ctx.reverse = reverse


def _gru_grads(has_b, dx, dh0, dw1, dw2, db1, db2):
    """The gradients a GRU op's backward returns (of its eight inputs), for a call
    with biases (has_b) or without."""
    return (dx, dh0, dw1, dw2, db1 if has_b else None, db2 if has_b else None, None, None)


def _register_gru_autograd(op, backward_op, name):
    """Registers the autograd of a GRU op (_gru_setup) on its backward op, which takes
    the forward's inputs, its outputs and h's gradient and returns the gradients of
    the six tensors; the backward op itself is first-order only."""
    def backward(ctx, h_grad, *gate_grads):
        x, h0, w1, w2, b1, b2, lengths, h, *gates = ctx.saved_tensors
        if h_grad is None:
            h_grad = torch.zeros_like(h)
        return _gru_grads(b1 is not None, *_call(ctx, "blockrnn.torch.GRU backward",
                                                 backward_op, x, h0, w1, w2, b1, b2, lengths,
                                                 ctx.reverse, h, *gates, h_grad))

    _register_autograd(op, backward_op, _gru_setup, backward, name)


_register_gru_autograd(gru_op, gru_backward_op, "gru_backward")


# ---------------------------------------------------------------------------
# The modules' eager fast path
#
# A module's eager call of one of its ops (lstm_op, gru_op, gru_block_op -- the TF
# GRU -- or lstm_proj_op) whose arguments are all plain -- every tensor on the CPU
# in the compute dtype, each weight and bias C-contiguous with its exact shape,
# lengths None or an int64 tensor (B,) (accepts) -- runs this Function instead of
# the op's: the module has checked x and the states, accepts checks the rest (the
# lengths' values are checked in forward, as the op does), so the forward and
# backward run the op bodies' _lstm_forward, _gru_backward, ... on NumPy views with
# the bare kernel functions (gru_reset_after._forward_kernel,
# lstm._nn_forward_kernel, gru._forward_kernel, lstm_proj._forward_kernel, ...),
# without the ops' and the NumPy ops' argument handling, and the gate outputs are
# marked non-differentiable (the modules read h and cs only). The same kernel
# calls, the same bits, the same saved tensors and gradients; anything else (a
# weight of another shape or dtype raises there) goes the op's way. At small
# shapes that handling was a quarter to a third of a training step (one thread,
# fresh processes alternating the two trees, forward + backward at T, B, I, H =
# 1, 8, 128, 128: GRU 596 -> 478 us, LSTM 855 -> 614 us; nn.GRU 374, nn.LSTM 698).
# ---------------------------------------------------------------------------

_PLAIN_TYPES = (torch.Tensor, nn.Parameter)   # (not a subclass: FakeTensor, a wrapper)


def _plain(t, dtype, shape):
    """Whether t is None or a C-contiguous CPU tensor of this dtype and shape."""
    return t is None or (type(t) in _PLAIN_TYPES and t.dtype == dtype and t.shape == shape
                         and t.is_cpu and t.is_contiguous())


def _plain_call(x, h0, weights, shapes, lengths):
    """accepts' rule for a call with x (T, B, I), state h0 (B, S) and the weights of
    the shapes shapes(I, S) (the first two given, the others None or plain; S = H, or
    the projected LSTM's P): a non-empty float32 / float64 CPU x, lengths None or an
    int64 tensor (B,)."""
    if type(x) is not torch.Tensor or x.dtype not in _DTYPES or x.dim() != 3 \
            or not x.is_cpu or x.numel() == 0 or type(h0) is not torch.Tensor \
            or h0.dim() != 2:
        return False
    dt, (T, B, I), H = x.dtype, x.shape, h0.shape[1]
    return H > 0 and weights[0] is not None and weights[1] is not None and \
        _plain(h0, dt, (B, H)) and all(_plain(t, dt, shape) for t, shape in
                                       zip(weights, shapes(I, H))) and \
        _plain(lengths, torch.int64, (B,))


def _lstm_shapes(I, H):
    """lstm_op's weights: weight_ih, weight_hh, bias_ih, bias_hh, the peepholes."""
    return (4 * H, I), (4 * H, H), (4 * H,), (4 * H,), (H,), (H,), (H,)


def _gru_shapes(I, H):
    """gru_op's weights: weight_ih, weight_hh, bias_ih, bias_hh."""
    return (3 * H, I), (3 * H, H), (3 * H,), (3 * H,)


def _gru_block_shapes(I, H):
    """gru_block_op's weights: w_ru, w_c, b_ru, b_c."""
    return (I + H, 2 * H), (I + H, H), (2 * H,), (H,)


def _fast_function(op, name, accepts, forward, backward):
    """The fast Function of op (named as its eager Function, blockrnn_lstm,
    blockrnn_gru, blockrnn_gru_block, as the graph's nodes show; name: the module's,
    for errors): forward(ctx, *inputs) -> the op's outputs (it saves what the op's
    setup saves), backward(ctx, saved, *grads) -> the op's input gradients (saved:
    ctx.saved_tensors); a backward under a tracer or of vmap-batched gradients (see
    _call) runs the eager Function's backward, the op's own."""
    general = _EAGER_FUNCTION[op]

    def fast_backward(ctx, *grads):
        saved = ctx.saved_tensors
        if _route(saved[0]) != "eager" or _legacy_batched(grads):
            return general.backward(ctx, *grads)
        _first_order_only(f"blockrnn.torch.{name} backward")
        return backward(ctx, saved, *grads)

    function = type(general.__name__, (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(fast_backward)})
    function.accepts = staticmethod(accepts)
    return function


def _fast_lengths(ctx, where, lengths, x):
    """The call's lengths checked (_op_lengths), kept on ctx for the backward."""
    ctx.fast_lengths = _op_lengths(where, lengths, x)
    return ctx.fast_lengths


def _incoming(grad, like):
    """An incoming gradient as NumPy of like's dtype (zeros for None; any layout)."""
    dtype = _np_dtype(like.dtype)
    return np.zeros(like.shape, dtype) if grad is None else _values(grad).astype(dtype,
                                                                                 copy=False)


def _gru_fast_function(op, where, shapes, plumbing, kernels):
    """The fast Function of a GRU op, either variant (where: the op's name in errors;
    shapes: its weights', as _gru_shapes): plumbing = (_gru_forward, _gru_backward) or
    the TF GRU's twins, run on the bare kernel functions kernels = (forward,
    backward)."""
    forward, backward = plumbing
    forward_kernel, backward_kernel = kernels

    def accepts(x, h0, w1, w2, b1, b2, lengths, reverse):
        return _plain_call(x, h0, (w1, w2, b1, b2), shapes, lengths)

    def fast_forward(ctx, x, h0, w1, w2, b1, b2, lengths, reverse):
        ctx.set_materialize_grads(False)
        n = _fast_lengths(ctx, where, lengths, x)
        output = _fresh(*forward(forward_kernel, *map(_values, (x, h0, w1, w2, b1, b2)), n,
                                 reverse))
        _gru_setup(ctx, (x, h0, w1, w2, b1, b2, lengths, reverse), output)
        ctx.mark_non_differentiable(*output[1:])
        return output

    def fast_backward(ctx, saved, h_grad, *gate_grads):
        x, h0, w1, w2, b1, _, _, h, *gates = saved
        return _gru_grads(b1 is not None, *_fresh(*backward(
            backward_kernel, *map(_values, (x, h0, w1, w2)), ctx.fast_lengths, ctx.reverse,
            *map(_values, (h, *gates)), _incoming(h_grad, h))))

    return _fast_function(op, "GRU", accepts, fast_forward, fast_backward)


def _lstm_fast_accepts(x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lengths, cell_clip,
                       forget_bias, reverse):
    return (_plain_call(x, h0, (w_ih, w_hh, b_ih, b_hh, wci, wcf, wco), _lstm_shapes,
                        lengths) and _plain(c0, x.dtype, h0.shape))


def _lstm_fast_forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lengths,
                       cell_clip, forget_bias, reverse):
    ctx.set_materialize_grads(False)
    n = _fast_lengths(ctx, "blockrnn.torch.lstm_op", lengths, x)
    output = _fresh(*_lstm_forward(
        _lstm._nn_forward_kernel, "blockrnn.torch.LSTM",
        *map(_values, (x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco)), n,
        float(cell_clip), forget_bias, reverse))
    _lstm_setup(ctx, (x, h0, c0, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco, lengths, cell_clip,
                      forget_bias, reverse), output)
    ctx.mark_non_differentiable(*output[2:])
    return output


def _lstm_fast_backward(ctx, saved, h_grad, cs_grad, *gate_grads):
    x, h0, c0, w_ih, w_hh, b_ih, _, wci, wcf, wco, _, h, cs, *gates = saved
    return _lstm_grads(b_ih is not None, wci is not None, *_fresh(*_lstm_backward(
        _lstm._nn_backward_kernel, *map(_values, (x, h0, c0, w_ih, w_hh, wci, wcf, wco)),
        ctx.fast_lengths, ctx.reverse, *map(_values, (h, cs, *gates)),
        _incoming(h_grad, h), _incoming(cs_grad, cs))))


_FAST_FUNCTION[lstm_op] = _fast_function(lstm_op, "LSTM", _lstm_fast_accepts,
                                         _lstm_fast_forward, _lstm_fast_backward)
_FAST_FUNCTION[gru_op] = _gru_fast_function(
    gru_op, "blockrnn.torch.gru_op", _gru_shapes, (_gru_forward, _gru_backward),
    (_gru_ra._forward_kernel, _gru_ra._backward_kernel))


@_custom_op("blockrnn::gru_block", mutates_args=())
def gru_block_op(x: _T, h0: _T, w_ru: _T, w_c: _T, b_ru: _OptT, b_c: _OptT, lengths: _OptT,
                 reverse: bool) -> Tuple[_T, _T, _T, _T]:
    """One TensorFlow GRUBlockCell layer in one direction on ``block_gru`` (reset before
    the recurrent matmul). x (T, B, I); h0 (B, H); w_ru (I+H, 2H) columns [r | u];
    w_c (I+H, H); b_ru (2H,), b_c (H,) or None. Returns (h, r, u, c), each (T, B, H):
    h in the input's time order, the gates in the op's."""
    where = "blockrnn.torch.gru_block_op"
    xa, h0a, wru, wc, bru, bc = _arrays(where, ("x", "h0", "w_ru", "w_c", "b_ru", "b_c"),
                                        (x, h0, w_ru, w_c, b_ru, b_c), "w_ru")
    n = _op_lengths(where, lengths, xa)
    return _fresh(*_gru_block_forward(_checked_gru_block_forward, xa, h0a, wru, wc, bru, bc,
                                      n, reverse))


@gru_block_op.register_fake
def _(x, h0, w_ru, w_c, b_ru, b_c, lengths, reverse):
    T, B, H = x.shape[0], x.shape[1], w_c.shape[1]
    return tuple(x.new_empty(T, B, H) for _ in range(4))


@_custom_op("blockrnn::gru_block_backward", mutates_args=())
def gru_block_backward_op(x: _T, h0: _T, w_ru: _T, w_c: _T, b_ru: _OptT, b_c: _OptT,
                          lengths: _OptT, reverse: bool, h: _T, r: _T, u: _T, c: _T,
                          h_grad: _T) -> Tuple[_T, _T, _T, _T, _T, _T]:
    """The gradient of ``gru_block_op`` (``block_gru_grad``): the gradients of
    (x, h0, w_ru, w_c, b_ru, b_c)."""
    where = "blockrnn.torch.gru_block_backward_op"
    dt = w_ru.dtype
    xa, h0a, wru, wc, bru, bc, ha, ra, ua, ca = _arrays(
        where, ("x", "h0", "w_ru", "w_c", "b_ru", "b_c", "h", "r", "u", "c"),
        (x, h0, w_ru, w_c, b_ru, b_c, h, r, u, c), "w_ru")
    dh = _numpy(where, "h_grad", h_grad).astype(_np_dtype(dt), copy=False)
    n = _op_lengths(where, lengths, xa)
    return _fresh(*_gru_block_backward(functools.partial(_checked_gru_block_backward, bru, bc),
                                       xa, h0a, wru, wc, n, reverse, ha, ra, ua, ca, dh))


@gru_block_backward_op.register_fake
def _(x, h0, w_ru, w_c, b_ru, b_c, lengths, reverse, h, r, u, c, h_grad):
    return (torch.empty_like(x), torch.empty_like(h0), torch.empty_like(w_ru),
            torch.empty_like(w_c), w_ru.new_empty(w_ru.shape[1]), w_c.new_empty(w_c.shape[1]))


_register_gru_autograd(gru_block_op, gru_block_backward_op, "gru_block_backward")
_FAST_FUNCTION[gru_block_op] = _gru_fast_function(
    gru_block_op, "blockrnn.torch.gru_block_op", _gru_block_shapes,
    (_gru_block_forward, _gru_block_backward), (_gru._forward_kernel, _gru._backward_kernel))


# ---------------------------------------------------------------------------
# The projected LSTM (nn.LSTM with proj_size = P > 0): its own op pair
# ---------------------------------------------------------------------------

@_custom_op("blockrnn::lstm_proj", mutates_args=())
def lstm_proj_op(x: _T, h0: _T, c0: _T, weight_ih: _T, weight_hh: _T, bias_ih: _OptT,
                 bias_hh: _OptT, weight_hr: _T, lengths: _OptT,
                 reverse: bool) -> Tuple[_T, _T, _T, _T, _T, _T, _T, _T]:
    """One projected nn.LSTM layer in one direction on ``blockrnn.lstm_proj.block_lstm_proj``
    (nn.LSTM's math and layout). x (T, B, I); h0 (B, P); c0 (B, H); weight_ih (4H, I);
    weight_hh (4H, P); bias_ih, bias_hh (4H,) or None; weight_hr (P, H); lengths, reverse
    as for ``lstm_op``. Returns (h (T, B, P), cs, i, f, o, ci, co, m (T, B, H)): h and cs
    in the input's time order (zero past a row's length), the rest in the op's (saved for
    the backward)."""
    where = "blockrnn.torch.lstm_proj_op"
    xa, h0a, c0a, w_ih, w_hh, b_ih, b_hh, w_hr = _arrays(
        where, ("x", "h0", "c0", "weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"),
        (x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_hr), "weight_ih")
    n = _op_lengths(where, lengths, xa)
    return _fresh(*_lstm_proj_forward(_checked_lstm_proj_forward, xa, h0a, c0a, w_ih, w_hh,
                                      b_ih, b_hh, w_hr, n, reverse))


@lstm_proj_op.register_fake
def _(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_hr, lengths, reverse):
    T, B, P, H = x.shape[0], x.shape[1], weight_hr.shape[0], weight_hr.shape[1]
    return (x.new_empty(T, B, P), *(x.new_empty(T, B, H) for _ in range(7)))


@_custom_op("blockrnn::lstm_proj_backward", mutates_args=())
def lstm_proj_backward_op(x: _T, h0: _T, c0: _T, weight_ih: _T, weight_hh: _T,
                          bias_ih: _OptT, bias_hh: _OptT, weight_hr: _T, lengths: _OptT,
                          reverse: bool, h: _T, cs: _T, i: _T, f: _T, o: _T, ci: _T, co: _T,
                          m: _T, h_grad: _T,
                          cs_grad: _T) -> Tuple[_T, _T, _T, _T, _T, _T, _T]:
    """The gradient of ``lstm_proj_op`` (``block_lstm_proj_grad``). h, cs and the grads in
    the input's time order, the rest as ``lstm_proj_op`` returned them. Returns the
    gradients of (x, h0, c0, weight_ih, weight_hh, bias (4H,: that of bias_ih and of
    bias_hh alike), weight_hr)."""
    where = "blockrnn.torch.lstm_proj_backward_op"
    dt = weight_ih.dtype
    xa, h0a, c0a, w_ih, w_hh, b_ih, b_hh, w_hr, ha, csa, ia, fa, oa, cia, coa, ma = _arrays(
        where, ("x", "h0", "c0", "weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr",
                "h", "cs", "i", "f", "o", "ci", "co", "m"),
        (x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_hr, h, cs, i, f, o, ci, co,
         m), "weight_ih")
    dh, dcs = (_numpy(where, name, g).astype(_np_dtype(dt), copy=False)
               for name, g in (("h_grad", h_grad), ("cs_grad", cs_grad)))
    n = _op_lengths(where, lengths, xa)
    return _fresh(*_lstm_proj_backward(
        functools.partial(_checked_lstm_proj_backward, b_ih, b_hh), xa, h0a, c0a, w_ih, w_hh,
        w_hr, n, reverse, ha, csa, ia, fa, oa, cia, coa, ma, dh, dcs))


@lstm_proj_backward_op.register_fake
def _(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, weight_hr, lengths, reverse, h, cs,
      i, f, o, ci, co, m, h_grad, cs_grad):
    return (torch.empty_like(x), torch.empty_like(h0), torch.empty_like(c0),
            torch.empty_like(weight_ih), torch.empty_like(weight_hh),
            x.new_empty(weight_ih.shape[0]), torch.empty_like(weight_hr))


def _lstm_proj_setup(ctx, inputs, output):
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths, reverse = inputs
    ctx.save_for_backward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths, *output)
    ctx.reverse = reverse


def _lstm_proj_autograd(ctx, h_grad, cs_grad, *gate_grads):
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths, h, cs, *gates = ctx.saved_tensors
    if h_grad is None:
        h_grad = torch.zeros_like(h)
    if cs_grad is None:
        cs_grad = torch.zeros_like(cs)
    return _lstm_proj_grads(b_ih is not None, *_call(
        ctx, "blockrnn.torch.LSTM backward", lstm_proj_backward_op, x, h0, c0, w_ih, w_hh,
        b_ih, b_hh, w_hr, lengths, ctx.reverse, h, cs, *gates, h_grad, cs_grad))


def _lstm_proj_grads(has_b, dx, dh0, dc0, dw_ih, dw_hh, db, dw_hr):
    """The gradients lstm_proj_op's backward returns (of its ten inputs), for a call with
    biases (has_b) or without."""
    return (dx, dh0, dc0, dw_ih, dw_hh, db if has_b else None,
            db.clone() if has_b else None,          # its own tensor: b_hh.grad is not b_ih.grad
            dw_hr, None, None)


_register_autograd(lstm_proj_op, lstm_proj_backward_op, _lstm_proj_setup,
                   _lstm_proj_autograd, "lstm_proj_backward")


def _lstm_proj_fast_accepts(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths, reverse):
    """(h0 (B, P), c0 (B, H); the weights' shapes need both P and H)"""
    if type(c0) is not torch.Tensor or c0.dim() != 2 or w_hr is None:
        return False
    H = c0.shape[1]
    return H > 0 and _plain_call(
        x, h0, (w_ih, w_hh, b_ih, b_hh, w_hr),
        lambda I, P: ((4 * H, I), (4 * H, P), (4 * H,), (4 * H,), (P, H)),
        lengths) and _plain(c0, x.dtype, (h0.shape[0], H))


def _lstm_proj_fast_forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths, reverse):
    ctx.set_materialize_grads(False)
    n = _fast_lengths(ctx, "blockrnn.torch.lstm_proj_op", lengths, x)
    output = _fresh(*_lstm_proj_forward(
        _lstm_proj._forward_kernel,
        *map(_values, (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)), n, reverse))
    _lstm_proj_setup(ctx, (x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, lengths, reverse), output)
    ctx.mark_non_differentiable(*output[2:])
    return output


def _lstm_proj_fast_backward(ctx, saved, h_grad, cs_grad, *gate_grads):
    x, h0, c0, w_ih, w_hh, b_ih, _, w_hr, _, h, cs, *gates = saved
    return _lstm_proj_grads(b_ih is not None, *_fresh(*_lstm_proj_backward(
        _lstm_proj._backward_kernel, *map(_values, (x, h0, c0, w_ih, w_hh, w_hr)),
        ctx.fast_lengths, ctx.reverse, *map(_values, (h, cs, *gates)), _incoming(h_grad, h),
        _incoming(cs_grad, cs))))


_FAST_FUNCTION[lstm_proj_op] = _fast_function(lstm_proj_op, "LSTM", _lstm_proj_fast_accepts,
                                              _lstm_proj_fast_forward, _lstm_proj_fast_backward)


# ---------------------------------------------------------------------------
# 0.1's autograd Functions (TensorFlow layouts)
# ---------------------------------------------------------------------------

class BlockLSTMFunction(torch.autograd.Function):
    """``(h, cs) = BlockLSTMFunction.apply(x, h0, c0, w, wci, wcf, wco, b, use_peephole,
    cell_clip, lengths, reverse=False)``.

    x (T, B, I); h0, c0 (B, H); w (I+H, 4H) IFCO; wci, wcf, wco (H,); b (4H,);
    use_peephole bool; cell_clip float; lengths None or an int64 NumPy array (B,).
    Returns h and cs, each (T, B, H) (zero past each row's length): the outputs
    and cell states at every step. The backward is ``block_lstm_grad_v2`` (cell
    clipping is ignored by the gradient, as in TensorFlow).

    ``reverse=True`` runs each row's valid prefix backwards (the reverse
    direction of a bidirectional layer): x is reversed with
    ``blockrnn.reverse_sequence`` before the op and h, cs after it, so h[t]
    is still the output for input step t; the backward reverses the incoming
    gradients and the x gradient the same way (a reversal is its own inverse).
    """

    @staticmethod
    def forward(ctx, x, h0, c0, w, wci, wcf, wco, b, use_peephole, cell_clip, lengths,
                reverse=False):
        where = "blockrnn.torch.BlockLSTMFunction"
        dt = w.dtype
        arrays = [_numpy(where, n, t, dt) for n, t in
                  zip(("x", "h0", "c0", "w", "wci", "wcf", "wco", "b"),
                      (x, h0, c0, w, wci, wcf, wco, b))]
        xa, h0a, c0a, wa, wcia, wcfa, wcoa, ba = arrays
        if reverse:
            xa = blockrnn.reverse_sequence(xa, lengths)
        L = steps_to_run(xa.shape[0], lengths)
        fwd = blockrnn.block_lstm_v2(L, xa, c0a, h0a, wa, wcia, wcfa, wcoa, ba,
                                     cell_clip=cell_clip, use_peephole=use_peephole,
                                     sequence_length=lengths)
        if reverse:   # the op's time order is kept for the backward
            ctx.reversed = (xa, fwd.h, fwd.cs)
            h, cs = (_tensor(blockrnn.reverse_sequence(a, lengths)) for a in (fwd.h, fwd.cs))
        else:
            h, cs = _tensor(fwd.h), _tensor(fwd.cs)
        ctx.save_for_backward(x, h0, c0, w, wci, wcf, wco, b, h, cs)
        ctx.gates = (fwd.i, fwd.f, fwd.o, fwd.ci, fwd.co)
        ctx.use_peephole, ctx.L, ctx.lengths, ctx.reverse = use_peephole, L, lengths, reverse
        return h, cs

    @staticmethod
    def backward(ctx, dh, dcs):
        where = "blockrnn.torch.BlockLSTMFunction.backward"
        _first_order_only(where)
        need = ctx.needs_input_grad
        if not any(need[:8]):
            return (None,) * 12
        x, h0, c0, w, wci, wcf, wco, b, h, cs = (_values(t) for t in ctx.saved_tensors)
        if ctx.reverse:
            x, h, cs = ctx.reversed
        i, f, o, ci, co = ctx.gates
        dh = _grad(where, "grad of h", dh, x.dtype, ctx.lengths, ctx.reverse)
        dcs = _grad(where, "grad of cs", dcs, x.dtype, ctx.lengths, ctx.reverse)
        g = blockrnn.block_lstm_grad_v2(ctx.L, x, c0, h0, w, wci, wcf, wco, b,
                                        i, cs, f, o, ci, co, h, dcs, dh,
                                        use_peephole=ctx.use_peephole, sequence_length=ctx.lengths)
        x_grad = g.x_grad
        if ctx.reverse and need[0]:   # the kernel's new array: reversed in place
            x_grad = reverse_sequence_in_place(x_grad, ctx.lengths)
        grads = (x_grad, g.h_prev_grad, g.cs_prev_grad, g.w_grad,
                 g.wci_grad, g.wcf_grad, g.wco_grad, g.b_grad)
        out = [_tensor(gr) if n else None for gr, n in zip(grads, need)]
        if not ctx.use_peephole:
            out[4:7] = [None] * 3
        return (*out, None, None, None, None)


class BlockGRUFunction(torch.autograd.Function):
    """``h = BlockGRUFunction.apply(x, h0, w_ru, w_c, b_ru, b_c, lengths, reverse=False)``.

    x (T, B, I); h0 (B, H); w_ru (I+H, 2H) columns [r | u]; w_c (I+H, H);
    b_ru (2H,); b_c (H,); lengths None or an int64 NumPy array (B,).
    Returns h (T, B, H), zero past each row's length. Backward: ``block_gru_grad``.
    ``reverse=True``: each row's valid prefix backwards, as in BlockLSTMFunction.
    """

    @staticmethod
    def forward(ctx, x, h0, w_ru, w_c, b_ru, b_c, lengths, reverse=False):
        where = "blockrnn.torch.BlockGRUFunction"
        dt = w_ru.dtype
        xa, h0a, wrua, wca, brua, bca = (
            _numpy(where, n, t, dt) for n, t in
            zip(("x", "h0", "w_ru", "w_c", "b_ru", "b_c"), (x, h0, w_ru, w_c, b_ru, b_c)))
        if reverse:
            xa = blockrnn.reverse_sequence(xa, lengths)
        L = steps_to_run(xa.shape[0], lengths)
        fwd = blockrnn.block_gru(L, xa, h0a, wrua, wca, brua, bca, sequence_length=lengths)
        if reverse:
            ctx.reversed = (xa, fwd.h)
            h = _tensor(blockrnn.reverse_sequence(fwd.h, lengths))
        else:
            h = _tensor(fwd.h)
        ctx.save_for_backward(x, h0, w_ru, w_c, b_ru, b_c, h)
        ctx.gates = (fwd.r, fwd.u, fwd.c)
        ctx.L, ctx.lengths, ctx.reverse = L, lengths, reverse
        return h

    @staticmethod
    def backward(ctx, dh):
        where = "blockrnn.torch.BlockGRUFunction.backward"
        _first_order_only(where)
        need = ctx.needs_input_grad
        if not any(need[:6]):
            return (None,) * 8
        x, h0, w_ru, w_c, b_ru, b_c, h = (_values(t) for t in ctx.saved_tensors)
        if ctx.reverse:
            x, h = ctx.reversed
        r, u, c = ctx.gates
        dh = _grad(where, "grad of h", dh, x.dtype, ctx.lengths, ctx.reverse)
        g = blockrnn.block_gru_grad(ctx.L, x, h0, w_ru, w_c, b_ru, b_c, r, u, c, h, dh,
                                    sequence_length=ctx.lengths)
        x_grad = g.x_grad
        if ctx.reverse and need[0]:   # the kernel's new array: reversed in place
            x_grad = reverse_sequence_in_place(x_grad, ctx.lengths)
        grads = (x_grad, g.h_prev_grad, g.w_ru_grad, g.w_c_grad, g.b_ru_grad, g.b_c_grad)
        return (*[_tensor(gr) if n else None for gr, n in zip(grads, need)], None, None)


# ---------------------------------------------------------------------------
# The modules
# ---------------------------------------------------------------------------

def _check_source(where, module, types, name, dtypes=_DTYPES):
    """The checks of a module to convert: one of `types`, every weight a tensor (not
    None, which torch lets a user assign), weights (its first parameter: weight_ih_l0,
    or w_ru_l0 of a TensorFlow-layout GRU) of one of `dtypes`."""
    if not isinstance(module, types):
        raise TypeError(f"{where}: expected a {name}, got {type(module).__name__}")
    for n in module._flat_weights_names:
        t = getattr(module, n)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: the module's {n} must be a tensor, got "
                            f"{type(t).__name__}")
    dtype = next(module.parameters()).dtype
    if dtype not in dtypes:
        names = [str(d).replace("torch.", "") for d in dtypes]
        names = ", ".join(names[:-1]) + " or " + names[-1]
        raise TypeError(f"{where}: {name} weights must be {names}, got {dtype}")


def param_array(t):
    """A parameter's values as a NumPy array (a copy only where needed): bfloat16 /
    float16 as float32 (NumPy has no bfloat16; the modules compute both in float32),
    exactly (every bfloat16 / float16 value is a float32)."""
    t = t.detach().cpu()
    return _values(t.float() if t.dtype in _LOW_PRECISION else t)


def _state_pair(where, hx):
    """An LSTM's hx: None -> (None, None); otherwise a pair (h0, c0)."""
    if hx is None:
        return None, None
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise TypeError(f"{where}: hx must be None or a tuple (h0, c0), got "
                        f"{type(hx).__name__}")
    return hx


def nn_lstm_arrays(module, where="blockrnn.torch.LSTM.from_torch"):
    """The weights of a ``torch.nn.LSTM`` without projection (or of a
    ``blockrnn.torch.LSTM``: the same parameters) in TensorFlow's layout.

    Returns a dict with ``input_size``, ``hidden_size``, ``num_layers``,
    ``bidirectional``, ``batch_first``, ``bias`` (the module's flag),
    ``torch_dtype`` and ``params``: NumPy arrays named as blockrnn's NumPy
    layers name them, for layer k and direction suffix s ("" forward,
    "_reverse" reverse): ``w_l{k}{s}`` (I_k+H, 4H) = ``[W_ih_l{k}{s}.T;
    W_hh_l{k}{s}.T]``, IFCO gate columns (nn.LSTM's gate rows i, f, g, o), and
    ``b_l{k}{s}`` (4H,) = ``b_ih + b_hh`` (zeros without bias; plus a
    blockrnn module's forget_bias on the f block), and a blockrnn module's
    peepholes ``wci_l{k}{s}``, ``wcf_l{k}{s}``, ``wco_l{k}{s}``, layer by layer,
    forward before reverse. I_0 = input_size, I_k = num_directions * H for
    k >= 1. The arrays are float32 for a bfloat16 / float16 module (param_array).
    ``blockrnn.convert.from_torch`` uses it too (convert imports this module,
    never the reverse).
    """
    if isinstance(module, (nn.GRU, GRU)):
        raise ValueError(f"{where}: " + RESET_AFTER.format(
            what="torch.nn.GRU", hint=" Use blockrnn.torch.GRU.from_torch instead."))
    _check_source(where, module, (nn.LSTM, LSTM), "torch.nn.LSTM", _MODULE_DTYPES)
    if getattr(module, "proj_size", 0):
        raise ValueError(f"{where}: nn.LSTM with proj_size={module.proj_size} (projected "
                         f"LSTM) is not supported")
    ours = isinstance(module, LSTM)

    def array(name):
        return param_array(getattr(module, name))

    params = {}
    for k in range(module.num_layers):
        for s in ("", "_reverse") if module.bidirectional else ("",):
            sfx = f"_l{k}{s}"
            w_ih, w_hh = array(f"weight_ih{sfx}"), array(f"weight_hh{sfx}")
            # the layers hold TensorFlow's layout: one copy, here, at conversion
            params[f"w{sfx}"] = np.concatenate([w_ih.T, w_hh.T], axis=0)
            params[f"b{sfx}"] = _lstm_bias(
                where, *((array(f"bias_ih{sfx}"), array(f"bias_hh{sfx}")) if module.bias
                         else (None, None)), module.forget_bias if ours else 0.0,
                module.hidden_size, w_ih.dtype)
            if ours and module.use_peephole:
                for tf_name, name in zip(("wci", "wcf", "wco"), _PEEPHOLES):
                    params[f"{tf_name}{sfx}"] = array(f"{name}{sfx}").copy()
    return {"input_size": module.input_size, "hidden_size": module.hidden_size,
            "num_layers": module.num_layers, "bidirectional": bool(module.bidirectional),
            "batch_first": bool(module.batch_first), "bias": bool(module.bias),
            "torch_dtype": module.weight_ih_l0.dtype, "params": params}


def _final(seq, init, lengths):
    """The state after each row's last step: seq[n_b - 1, b], or init[b] when n_b == 0
    (differentiable: the gradient lands in seq's gradient at [n_b - 1, b]). lengths: None
    or an int64 tensor (B,); no data-dependent branch, so torch.compile traces it."""
    T = seq.shape[0]
    if T == 0:
        return init
    if lengths is None:
        return seq[T - 1]
    lengths = torch.as_tensor(lengths)
    picked = seq[(lengths - 1).clamp(min=0), torch.arange(seq.shape[1], device=seq.device)]
    return torch.where((lengths > 0)[:, None], picked, init)


def _first(seq, init, lengths):
    """The reverse direction's final state: the state after its last step, taken at
    original time 0 -- seq[0, b], or init[b] when n_b == 0."""
    if seq.shape[0] == 0:
        return init
    if lengths is None:
        return seq[0]
    return torch.where((torch.as_tensor(lengths) > 0)[:, None], seq[0], init)


def _unpack(packed):
    """A PackedSequence -> (padded (T, B, I) in the caller's batch order, lengths int64 (B,)).

    pad_packed_sequence's result, written with index ops that torch.compile traces (Dynamo
    does not trace pad_packed_sequence). Packed element p of time t is sorted row
    j = p - offset[t], offset = cumsum(batch_sizes) - batch_sizes. B is known from the
    shape of sorted_indices; a sorted input (no indices) has B = batch_sizes[0], a value,
    and goes through pad_packed_sequence."""
    if packed.sorted_indices is None:
        padded, lengths = pad_packed_sequence(packed)
        return padded, lengths.to(torch.int64)
    bs, data = packed.batch_sizes, packed.data
    B = packed.sorted_indices.shape[0]
    j = torch.arange(B)
    live = j[None, :] < bs[:, None]                          # (T, B), sorted rows
    idx = ((torch.cumsum(bs, 0) - bs)[:, None] + j[None, :]).clamp(max=data.shape[0] - 1)
    padded = torch.where(live[..., None], data[idx], torch.zeros((), dtype=data.dtype))
    order = packed.unsorted_indices
    return padded.index_select(1, order), live.sum(0).index_select(0, order)


def _repack(y, packed):
    """y (T, B, ·) padded, in the caller's batch order -> a PackedSequence with packed's
    batch_sizes and indices (pack_padded_sequence's data, gathered with traceable index
    ops: packed element p is y[t, sorted row p - offset[t]], t = the step p falls in)."""
    bs = packed.batch_sizes
    if packed.sorted_indices is not None:
        y = y.index_select(1, packed.sorted_indices)
    cum = torch.cumsum(bs, 0)
    p = torch.arange(packed.data.shape[0])
    t = torch.searchsorted(cum, p, right=True)
    data = y[t, p - (cum - bs)[t]]
    return PackedSequence(data, bs, packed.sorted_indices, packed.unsorted_indices)


def _lengths_tensor(where, sequence_length, T, B, meta=False):
    """sequence_length (None, an integer tensor, an array or a list of B ints) -> None or an
    int64 tensor (B,), on the CPU, or on the meta device for a meta input (shapes only).
    The values (in [0, T]) are checked inside the ops."""
    if sequence_length is None:
        return None
    if not isinstance(sequence_length, torch.Tensor):
        lengths = torch.from_numpy(check_sequence_length(where, sequence_length, B, T))
        return lengths.to("meta") if meta else lengths
    if sequence_length.dtype.is_floating_point or sequence_length.dtype.is_complex \
            or sequence_length.dtype == torch.bool:
        raise TypeError(f"{where}: sequence_length must be an integer array of shape (B,), "
                        f"got a tensor of {sequence_length.dtype}")
    if tuple(sequence_length.shape) != (B,):
        raise ValueError(f"{where}: sequence_length must have shape (B,) = ({B},), got "
                         f"{tuple(sequence_length.shape)}")
    return sequence_length.to(device="meta" if meta else "cpu", dtype=torch.int64)


def _check_device(where, device):
    """device: None, any spelling of the CPU (blockrnn has no GPU kernels) or meta
    (parameters without data: shapes only, or to_empty later)."""
    if device is None:
        return
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{where}: device must be None, 'cpu' or 'meta', got {device!r} "
                         f"({exc})") from exc
    if kind not in ("cpu", "meta"):
        raise ValueError(f"{where}: blockrnn runs on the CPU only; device must be None, "
                         f"'cpu' or 'meta', got {device!r}")


# ---------------------------------------------------------------------------
# The no-grad path (issue 26): the inference forward on weights packed once
# ---------------------------------------------------------------------------

class _PackCache(dict):
    """A module's packed weights: cell suffix -> (key, names, pinned, packed).

    ``key`` is every parameter's (``_version``, ``data_ptr()``, dtype, shape,
    device) and the module's cell options, ``names`` the parameters' names (a hit
    reads them from the module's own dict); ``pinned`` holds a detached alias of
    each parameter (the same storage and version counter) so that its memory
    cannot be reused by a new tensor while the entry exists: a new tensor always
    has another data_ptr. A copy or pickle of the module gets an empty cache
    (the packed objects are rebuilt on the first no-grad call)."""

    packings = 0   # how many cells were packed (tests count it)

    def __reduce__(self):
        return type(self), ()

    def __copy__(self):
        return type(self)()

    def __deepcopy__(self, memo):
        return type(self)()


def _tracing(x):
    """Whether this call is being traced (torch.compile / torch.export / jit.trace /
    fake or functional tensors) or runs on the meta device (shapes only): then the
    module runs the training ops through the dispatcher (their fake implementations
    give meta tensors their shapes), never the packed cache (see
    _RNNBase._wants_inference)."""
    return (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or type(x) is not torch.Tensor or x.is_meta)


try:   # (private in torch 2.13: where a version lacks them, torch.onnx's public check)
    from torch.onnx._internal.exporter import _flags as _ONNX_FLAGS
    from torch.onnx._internal.torchscript_exporter._globals import GLOBALS as _ONNX_GLOBALS
except ImportError:   # pragma: no cover - depends on the torch version
    _ONNX_FLAGS = _ONNX_GLOBALS = None


def _in_onnx_export():
    """torch.onnx.is_in_onnx_export(), read from its two flags directly: torch.compile's
    tracer (which torch.onnx.export(dynamo=True) falls back to, strict=True) answers
    False to the public function, and the function imports both modules at each call.
    Under that tracer only the dynamo exporter's flag is read (a module global; the
    TorchScript exporter's is a property the tracer refuses, and it never runs there)."""
    if _ONNX_FLAGS is None:   # pragma: no cover - depends on the torch version
        return torch.onnx.is_in_onnx_export()
    if torch.compiler.is_compiling():
        return _ONNX_FLAGS._is_onnx_exporting
    return _ONNX_FLAGS._is_onnx_exporting or _ONNX_GLOBALS.in_onnx_export


try:   # (private in torch 2.13: where a version lacks them, only dual tensors are checked)
    _INTERPRETERS, _JVP = (torch._C._functorch.get_interpreter_stack,
                           torch._C._functorch.TransformType.Jvp)
except AttributeError:   # pragma: no cover - depends on the torch version
    _INTERPRETERS = _JVP = None


def _refuse_forward_ad(where, x, tensors=(), module=None):
    """RuntimeError if forward-mode AD would flow through this call: a torch.func.jvp
    transform on the stack (jvp, jacfwd, hessian) or a dual tensor of
    torch.autograd.forward_ad among x, `tensors` and `module`'s weights (read only
    while a dual level is open). blockrnn's ops have no JVP rule: under
    torch.func.jvp PyTorch runs a custom op as a constant and the tangents came back
    zero, silently. (Nothing to check under torch.compile; ~0.3 us in eager, where a
    batch-1 call is ~30 us.)"""
    if torch.compiler.is_compiling():
        return
    stack = _INTERPRETERS() if _INTERPRETERS is not None else None
    dual = stack is not None and any(i.key() == _JVP for i in stack)
    if not dual and getattr(forward_ad, "_current_level", 0) >= 0:
        if module is not None:
            tensors = (*tensors, *(p for _, _, sfx, _ in module._cells()
                                   for p in module._cell_params(sfx)))
        dual = any(isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None
                   for t in (x, *tensors))
    if dual:
        raise RuntimeError(f"{where}: forward-mode AD (torch.func.jvp, jacfwd, hessian, "
                           f"torch.autograd.forward_ad) is not supported: blockrnn's ops "
                           f"have no JVP rule, and their tangents would be zero. Use "
                           f"torch.nn.LSTM / nn.GRU for forward-mode derivatives.")


def _param_key(t):
    if t is None:
        return None
    return t._version, t.data_ptr(), t.dtype, t.shape, t.device



class _RNNBase(nn.Module):
    """What LSTM and GRU share: the constructor's checks, the parameter names, the
    input / state / output conventions of nn.LSTM and the loop over layers."""

    def __init__(self, input_size, hidden_size, num_layers, bias, batch_first, dropout,
                 bidirectional, device, dtype):
        super().__init__()
        name = type(self).__name__
        for arg, v in (("input_size", input_size), ("hidden_size", hidden_size),
                       ("num_layers", num_layers)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}: {arg} must be an int, got {type(v).__name__}")
            if v <= 0:
                raise ValueError(f"{name}: {arg} must be positive, got {v}")
        if (isinstance(dropout, bool) or not isinstance(dropout, numbers.Real)
                or not 0 <= dropout <= 1):
            raise ValueError(f"{name}: dropout must be a number in [0, 1] (the probability "
                             f"of an element being zeroed), got {dropout!r}")
        if dropout > 0 and num_layers == 1:   # nn.LSTM's warning
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, "
                          f"so non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}")
        _check_device(name, device)
        if dtype is None:
            dtype = torch.get_default_dtype()
        if dtype not in _MODULE_DTYPES:
            raise TypeError(f"{name}: dtype must be torch.float32, torch.float64, "
                            f"torch.bfloat16 or torch.float16, got {dtype}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first = bool(bias), bool(batch_first)
        self.dropout, self.bidirectional = float(dropout), bool(bidirectional)
        self._factory = {"dtype": dtype} if device is None else \
            {"dtype": dtype, "device": torch.device(device)}

    @property
    def num_directions(self):
        return 2 if self.bidirectional else 1

    def _name_weights(self):
        """nn.RNNBase's name lists, once the parameters are registered: _all_weights
        (each layer's and direction's parameter names, in registration order -- code
        written for nn.LSTM walks it, e.g. to set the forget gate's bias) and
        _flat_weights_names (all of them, in that order)."""
        self._all_weights = [[n for n in self._parameters if n.endswith(sfx)]
                             for _, _, sfx, _ in self._cells()]
        self._flat_weights_names = [n for names in self._all_weights for n in names]

    @property
    def all_weights(self):
        """nn.RNNBase.all_weights: the parameters of each layer and direction (a list
        of lists, in _all_weights' order)."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    @property
    def _flat_weights(self):
        """nn.RNNBase._flat_weights: every weight the call reads, in _flat_weights_names'
        order (read-only here: the kernels read the named attributes, so a list
        assigned to it would be ignored; assigning raises AttributeError)."""
        return [getattr(self, n) for n in self._flat_weights_names]

    def flatten_parameters(self):
        """A no-op, as nn.RNNBase's on CPU: the kernels read the parameters where
        they are. Here so that code written for nn.LSTM / nn.GRU runs unchanged."""

    def __prepare_scriptable__(self):
        """torch.jit.script calls this on the module and on every submodule of a model
        it scripts: the forward runs blockrnn's kernels from Python, which TorchScript
        cannot compile, so scripting stops here with what to do instead (rather than
        TorchScript's parse error deep in forward). torch.jit.trace works: it records
        the ``blockrnn::`` custom ops (the traced module needs ``import
        blockrnn.torch`` where it is loaded)."""
        name = type(self).__name__
        raise RuntimeError(
            f"blockrnn.torch.{name} cannot be compiled by torch.jit.script: its forward "
            f"runs blockrnn's kernels from Python. Use torch.jit.trace (it records the "
            f"blockrnn:: custom ops), torch.compile or torch.export; or script a model "
            f"holding torch.nn.{name} with this module's parameters "
            f"(nn_module.load_state_dict(module.state_dict())).")

    # nn.RNNBase's public argument checks, nn's own functions (the installed torch's):
    # they read what these modules share with nn (input_size, hidden_size, proj_size,
    # num_layers, bidirectional, batch_first, _flat_weights). Code written for nn.LSTM
    # (a subclass's forward) calls them; forward does its own checks.
    check_input = nn.RNNBase.check_input
    get_expected_hidden_size = nn.RNNBase.get_expected_hidden_size
    check_hidden_size = nn.RNNBase.check_hidden_size
    check_forward_args = nn.RNNBase.check_forward_args
    permute_hidden = nn.RNNBase.permute_hidden

    def _cells(self):
        """(layer k, direction d, name suffix, layer input size I_k) in nn.LSTM's order."""
        D, H = self.num_directions, self.hidden_size
        for k in range(self.num_layers):
            for d in range(D):
                yield k, d, f"_l{k}" + ("_reverse" if d else ""), \
                    self.input_size if k == 0 else D * H

    def _weight(self, name):
        """The weight `name` as the call reads it: the registered parameter, from the
        module's dict (a fifth of the cost of getattr through nn.Module.__getattr__, paid
        for every weight of every call), else getattr: a parametrization's computed
        weight (weight_norm) or a plain tensor attribute (or None, registered as None)."""
        p = self._parameters.get(name)
        return p if p is not None else getattr(self, name)

    def _required(self, name):
        """_weight(name) for a weight the call cannot run without (the input and
        recurrent weights, weight_hr): None there (assigned by the user) is refused."""
        p = self._weight(name)
        if p is None:
            raise TypeError(f"blockrnn.torch.{type(self).__name__}: {name} must be a "
                            f"tensor, got None (only a cell's biases, or its peepholes, "
                            f"may be None, and then all of them)")
        return p

    def _first_param(self):
        """The first registered parameter (weight_ih_l0, w_ru_l0), whose dtype and
        device are the module's; None there is refused (_required). Read from the
        module's own dict (a tenth of the cost of next(self.parameters()); callers
        that run several times a call inline the common case)."""
        name, p = next(iter(self._parameters.items()))
        return p if p is not None else self._required(name)

    def _check_cell(self, where, sfx, params):
        """One cell's weights as the call reads them (params: _cell_params(sfx)), each
        None or a CPU tensor of the module's dtype and of the shape the module gives it
        (_cell_shapes), or a clear error naming it. Run where the weights are converted
        for the kernels without the ops' own checks: the no-grad path's packing (an
        integer, float16 or float64 weight would be converted silently, a meta one or
        one of another rank fail in torch or NumPy), a bfloat16 / float16 module's
        float32 copies, a projected LSTM's weight_hr."""
        dtype, device = self._param_dtype_device()
        I = next(I for _, _, s, I in self._cells() if s == sfx)
        for name, p, shape in zip(self._cell_names(sfx), params, self._cell_shapes(I)):
            if p is not None:
                _check_tensor(where, name, p, dtype, device)
                if p.shape != shape:
                    raise ValueError(f"{where}: {name} must have shape {shape}, got "
                                     f"{tuple(p.shape)}")

    def _add(self, name, *shape):
        """A parameter (uninitialised until reset_parameters)."""
        setattr(self, name, nn.Parameter(torch.empty(*shape, **self._factory)))

    def reset_parameters(self):
        """Uniform in [-1/sqrt(H), 1/sqrt(H)], as torch.nn.LSTM / nn.GRU."""
        k = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-k, k)

    def _autocast(self, t):
        """Under CPU autocast (``torch.autocast("cpu")``) a bfloat16 or float16 input or
        state runs in the parameters' dtype, as autocast's float32 ops do: the kernels
        have no lower precision (nn.LSTM computes in the autocast dtype and returns
        it; these modules return the parameters' dtype); and so does a float32 or
        float64 one given to a bfloat16 / float16 module (nn.LSTM's autocast casts it
        to the low precision). Anything else is unchanged."""
        if isinstance(t, torch.Tensor) and torch.is_autocast_enabled("cpu"):
            dtype = self._param_dtype()
            if t.dtype != dtype and (t.dtype in _LOW_PRECISION or
                                     (dtype in _LOW_PRECISION and t.dtype in _DTYPES)):
                return t.to(dtype)
        return t

    def _input(self, where, x, sequence_length):
        """input -> (time-major x (T, B, I), batched?, lengths, PackedSequence or None)."""
        if (sequence_length is None and type(x) is torch.Tensor
                and x.dtype == self._plain_dtype() and x.is_cpu and x.dim() == 3
                and x.shape[2] == self.input_size):
            # the common call: what the checks and conversions below return unchanged
            return (x.transpose(0, 1) if self.batch_first else x), True, None, None
        if isinstance(x, PackedSequence):
            if sequence_length is not None:
                raise ValueError(f"{where}: sequence_length must be None with a "
                                 f"PackedSequence input (the lengths are in it)")
            x = x._replace(data=self._autocast(x.data))
            self._check_like_params(where, "input.data", x.data)
            if x.data.is_meta:
                raise ValueError(f"{where}: a PackedSequence on the meta device is not "
                                 f"supported (its lengths are values); pad it")
            if x.data.dim() != 2 or x.data.shape[-1] != self.input_size:
                raise ValueError(f"{where}: a PackedSequence's data must have shape (N, I) "
                                 f"with I = {self.input_size}, got {tuple(x.data.shape)}")
            padded, lengths = _unpack(x)      # (T, B, I), original batch order
            return _to_compute(padded), True, lengths, x
        x = self._autocast(x)
        self._check_like_params(where, "input", x)
        x = _to_compute(x)
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_size:
            layout = "(B, T, I)" if self.batch_first else "(T, B, I)"
            raise ValueError(f"{where}: input must have shape {layout} or (T, I) with "
                             f"I = {self.input_size}, got {tuple(x.shape)}")
        batched = x.dim() == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, batched, _lengths_tensor(where, sequence_length, *x.shape[:2], x.is_meta), None

    def _state(self, where, name, s, B, batched, size=None, zeros=True):
        """h0 / c0: None (zeros; None if not `zeros`) or (L*D, B, H) ((L*D, H) unbatched)
        -> (L*D, B, H); H = size if given (a projected LSTM's h0: P)."""
        LD, H = self.num_layers * self.num_directions, size or self.hidden_size
        if s is None:
            return torch.zeros(LD, B, H, **self._factory_now()) if zeros else None
        if (batched and type(s) is torch.Tensor and s.dtype == self._plain_dtype()
                and s.is_cpu and s.shape == (LD, B, H)):
            return s    # the common call: what the checks below return unchanged
        s = self._autocast(s)
        self._check_like_params(where, name, s)
        want = (LD, B, H) if batched else (LD, H)
        if tuple(s.shape) != want:
            raise ValueError(f"{where}: {name} must have shape {want} (num_layers * "
                             f"num_directions = {LD}, B, H), got {tuple(s.shape)}")
        s = _to_compute(s)
        return s if batched else s.unsqueeze(1)

    def _run(self, where, x, states, lengths, batched, packed, step):
        """All layers and directions, on the training ops. states: tuple of (L*D, B, H)
        initial states; step(layer_input, initial states of one cell, suffix, reverse)
        -> tuple of (T, B, H) sequences, the first the output h. Returns _output's (y,
        final states: tuple of (L*D, B, H), or (L*D, H) unbatched -- new tensors, not
        views). Under torch.onnx.export nn's own op runs instead (_run_onnx)."""
        if self._onnx_export(x):
            return self._output(*self._run_onnx(where, x, states, lengths, batched, packed),
                                batched, packed)
        D = self.num_directions
        finals, outs = [[] for _ in states], []
        for k, d, sfx, _ in self._cells():
            init = [s[k * D + d] for s in states]
            seqs = step(x, init, sfx, d == 1)
            outs.append(seqs[0])
            for acc, seq, s0 in zip(finals, seqs, init):
                last = _first(seq, s0, lengths) if d else _final(seq, s0, lengths)
                acc.append(last if batched else last[0])
            if d == D - 1:    # layer k done: its output is layer k+1's input
                x = outs[0] if D == 1 else torch.cat(outs, dim=-1)
                outs = []
                if self.dropout and self.training and k < self.num_layers - 1:
                    x = nn.functional.dropout(x, self.dropout, training=True)
        return self._output(x, tuple(torch.stack(f) for f in finals), batched, packed)

    # -- torch.onnx.export ------------------------------------------------------

    def _onnx_export(self, x):
        """Whether torch.onnx.export (either exporter) is tracing this call: both trace
        (_tracing), so the flags are read only then (see _in_onnx_export)."""
        return _tracing(x) and _in_onnx_export()

    def _run_onnx(self, where, x, states, lengths, batched, packed):
        """_run under torch.onnx.export: nn.LSTM's / nn.GRU's own op (torch._VF.lstm /
        gru, what their forward calls) on this module's parameters, which both of
        torch's exporters write as ONNX LSTM / GRU nodes as for nn's modules (they have
        no translation of the custom ops). Only nn's math has that form: the
        configurations that are not (_onnx_refusal), sequence_length and a
        PackedSequence raise, with what to do instead."""
        lens_hint = ("blockrnn.onnx.export(module, sequence_lens=True) writes the layer with "
                     "ONNX's sequence_lens")
        refusal = (self._onnx_refusal()
                   or (packed is not None and ("a PackedSequence input", lens_hint))
                   or (lengths is not None and ("sequence_length", lens_hint)))
        if refusal:
            raise ValueError(f"{where}: torch.onnx.export writes nn.{self.mode}'s op, which "
                             f"has no {refusal[0]}: {refusal[1]}")
        flat = [p for _, _, sfx, _ in self._cells() for p in self._nn_weights(sfx)]
        hx = states if self.mode == "LSTM" else states[0]
        y, *finals = getattr(torch._VF, self.mode.lower())(
            x, hx, flat, self._nn_has_bias(), self.num_layers, self.dropout, self.training,
            self.bidirectional, False)
        return y, tuple(f if batched else f[:, 0] for f in finals)

    def _nn_has_bias(self):
        """has_biases of nn's op (_run_onnx)."""
        return self.bias

    def _nn_weights(self, sfx):
        """One cell's weights in nn's order for its op (_run_onnx); GRU: nn.GRU's."""
        return [p for p in self._compute_params(sfx) if p is not None]

    # -- the no-grad path -------------------------------------------------------

    def _wants_inference(self, x, states):
        """Whether this call runs the inference forward on packed weights: no
        gradient can be needed (grad mode off -- torch.no_grad, inference_mode --
        or neither x, the states nor any weight the call reads requires grad), the
        module computes in float32 (float32, bfloat16 or float16 parameters;
        float64 has no inference kernel yet: the training
        ops then run, which is what float64 inference is today), no projection
        (proj_size > 0 has no inference kernel), and the call is not traced.

        Under tracing the training op runs, by choice: the packed cache is
        Python state on the module that a compiled or exported graph cannot
        see or guard (a graph would bake one version of it, or break), while
        the training op is a pure function of the weight tensors with the same
        bits (float32, batch 1 included). A custom inference op taking the
        weights would have to pack on every call inside the graph. Under a
        torch.func transform (vmap, or grad with torch.no_grad inside) x is a
        functorch wrapper without storage: the training op runs, as torch.func
        needs (see _func_function)."""
        if _tracing(x) or _under_func_transform() or getattr(self, "proj_size", 0):
            return False
        if torch.is_grad_enabled():
            # The registered parameters first (a training call: they require grad),
            # then the weights as the call reads them: a parametrization (weight_norm)
            # computes one from parameters elsewhere.
            if (x.requires_grad
                    or any(p is not None and p.requires_grad
                           for p in self._parameters.values())
                    or any(isinstance(s, torch.Tensor) and s.requires_grad for s in states)
                    or any(p is not None and p.requires_grad
                           for _, _, sfx, _ in self._cells()
                           for p in self._cell_params(sfx))):
                self.clear_inference_cache()   # a graph is recorded: see clear_inference_cache
                return False
        return self._compute_dtype() == torch.float32

    def clear_inference_cache(self):
        """Drop the packed weights of the no-grad path (the next no-grad call repacks).

        Needed only after an in-place change through ``.data`` (``p.data.add_(...)``),
        which bypasses the version counter the cache checks; every forward that records
        a graph drops the cache too, so a training loop that updates ``p.data`` by hand
        between its forwards and a ``torch.no_grad()`` evaluation is served fresh
        weights. ``torch.optim``, ``load_state_dict``, ``nn.init``, ``with
        torch.no_grad(): p.mul_(...)``, ``.double()`` / ``.float()`` and assigning new
        tensors are seen without it."""
        cache = self.__dict__.get("_inference_cache")
        if cache:
            cache.clear()

    def inference_cache_info(self):
        """{"cells": cells packed now, "packings": packings done since the cache was
        made, "nbytes": bytes of the packed copies held} (see the class docstring)."""
        cache = self.__dict__.get("_inference_cache")
        if cache is None:
            cache = _PackCache()
        return {"cells": len(cache), "packings": cache.packings,
                "nbytes": sum(entry[-1].nbytes for entry in cache.values())}

    def _packed_cell(self, sfx):
        """The packed weights of one cell, packed again only when a parameter or a
        cell option changed (see _PackCache)."""
        cache = self.__dict__.get("_inference_cache")
        if cache is None:
            cache = self.__dict__["_inference_cache"] = _PackCache()
        entry = cache.get(sfx)
        options = self._cell_options()
        if entry is not None:
            key, names, _, packed = entry
            own = self._parameters
            if key == (tuple(None if n is None else _param_key(own.get(n)) for n in names),
                       options):
                return packed
        params = self._cell_params(sfx)
        self._check_cell(f"blockrnn.torch.{type(self).__name__}", sfx, params)
        packed = self._pack_cell(*(None if p is None else _values(p.detach().float())
                                   for p in params))
        cache.packings += 1
        name_of = {id(p): n for n, p in self._parameters.items()}
        if any(p is not None and id(p) not in name_of for p in params):
            # A weight that is not a registered parameter -- computed at each access
            # (a parametrization such as weight_norm) or a plain tensor attribute --
            # has no version to key on: packed for this call only, never cached.
            cache.pop(sfx, None)
            return packed
        names = tuple(None if p is None else name_of[id(p)] for p in params)
        key = (tuple(_param_key(p) for p in params), options)
        cache[sfx] = (key, names, [None if p is None else p.detach() for p in params], packed)
        return packed

    def _run_inference(self, where, x, states, lengths, batched):
        """_run's result from the inference forward: per layer and direction, the
        cell's packed weights run x (reversed with reverse_sequence for the
        reverse direction, as the ops do) and give y and the final states at
        once; dropout between layers as _run (the same torch call, so the same
        random numbers in training mode)."""
        D, H = self.num_directions, self.hidden_size
        T, B = x.shape[:2]
        n = None if lengths is None else check_sequence_length(where, lengths.numpy(), B, T)
        inits = [_values(s) for s in states]
        inp = _values(x)
        if self.num_layers == 1 and D == 1:       # one cell: no copies
            y, *fin = self._packed_cell("_l0").forward(
                inp, *(None if s is None else s[0] for s in inits), n)
            return torch.from_numpy(y), tuple(torch.from_numpy(f[None] if batched else f)
                                              for f in fin)
        finals = [np.empty((self.num_layers * D, B, H), np.float32) for _ in states]
        outs = []
        for k, d, sfx, _ in self._cells():
            xin = inp if d == 0 else blockrnn.reverse_sequence(inp, n)
            y, *fin = self._packed_cell(sfx).forward(
                xin, *(None if s is None else s[k * D + d] for s in inits), n)
            for f, v in zip(finals, fin):
                f[k * D + d] = v
            outs.append(y if d == 0 else reverse_sequence_in_place(y, n))   # y: new
            if d == D - 1:
                inp = outs[0] if D == 1 else np.concatenate(outs, axis=-1)
                outs = []
                if self.dropout and self.training and k < self.num_layers - 1:
                    inp = nn.functional.dropout(torch.from_numpy(inp), self.dropout,
                                                training=True).numpy()
        return torch.from_numpy(inp), tuple(torch.from_numpy(f if batched else f[:, 0])
                                            for f in finals)

    def _output(self, y, finals, batched, packed):
        """(y (T, B, D*H) time-major, final states) -> nn.LSTM's output layout (a
        PackedSequence with the input's batch_sizes and indices for a packed input),
        and the final states; in the parameters' dtype (bfloat16 / float16 modules
        compute in float32)."""
        dtype = self._param_dtype()
        if dtype in _LOW_PRECISION:
            y, finals = y.to(dtype), tuple(f.to(dtype) for f in finals)
        if packed is not None:
            y = _repack(y, packed)
        elif not batched:
            y = y[:, 0]
        elif self.batch_first:
            y = y.transpose(0, 1)
        return y, finals

    def _check_like_params(self, where, name, t):
        """_check_tensor(t) against the parameters' dtype and device (the first
        parameter's). When t fails it and the parameters disagree among themselves, the
        error names the odd parameter: blaming the input would be wrong if a user
        replaced the first parameter."""
        try:
            _check_tensor(where, name, t, *self._param_dtype_device(where))
        except (TypeError, ValueError):
            self._check_params_agree(where, t)
            raise

    def _check_params_agree(self, where, t):
        """Raise, naming them, if some weights have another dtype or device than the
        others: than tensor t's if some weights have it, else than most weights'."""
        weights = [(n, getattr(self, n)) for n in self._flat_weights_names]
        weights = [(n, w) for n, w in weights if isinstance(w, torch.Tensor)]
        for attr, exc in (("dtype", TypeError), ("device", ValueError)):
            values = [getattr(w, attr) for _, w in weights]
            mine = getattr(t, attr, None)
            common = mine if mine in values else max(set(values), key=values.count,
                                                     default=None)
            odd = [f"{n} ({v})" for (n, _), v in zip(weights, values) if v != common]
            if odd:
                raise exc(f"{where}: the parameters must share one {attr}: {', '.join(odd)} "
                          f"{'differs' if len(odd) == 1 else 'differ'} from the others' "
                          f"{common}")

    def _param_dtype_device(self, where=None):
        """The parameters' dtype and device: the first parameter's (_first_param).
        With `where`, a dtype the module cannot compute in raises."""
        p = next(iter(self._parameters.values()))
        if p is None:
            p = self._first_param()
        if where is not None and p.dtype not in _MODULE_DTYPES:
            raise TypeError(f"{where}: the parameters must be float32, float64, bfloat16 "
                            f"or float16, got {p.dtype}")
        return p.dtype, p.device

    def _param_dtype(self):
        p = next(iter(self._parameters.values()))
        return (p if p is not None else self._first_param()).dtype

    def _plain_dtype(self):
        """The parameters' dtype if they are float32 / float64 CPU tensors, else None: an
        input or state of that dtype on the CPU then passes _autocast, _check_tensor and
        _to_compute unchanged (_input's and _state's fast cases)."""
        p = next(iter(self._parameters.values()))
        if p is None:
            p = self._first_param()
        return p.dtype if p.is_cpu and p.dtype in _DTYPES else None

    def _compute_dtype(self):
        """The dtype the kernels run in: the parameters', float32 for bfloat16 / float16."""
        dtype = self._param_dtype()
        return torch.float32 if dtype in _LOW_PRECISION else dtype

    def _compute_params(self, sfx):
        """_cell_params(sfx) in the compute dtype (float32 copies, differentiable, of a
        bfloat16 / float16 module's parameters)."""
        params = self._cell_params(sfx)
        if self._param_dtype() not in _LOW_PRECISION:
            return params
        self._check_cell(f"blockrnn.torch.{type(self).__name__}", sfx, params)
        return tuple(None if p is None else p.float() for p in params)

    def _factory_now(self):
        _, device = self._param_dtype_device()
        return {"dtype": self._compute_dtype(), "device": device}

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


_PEEPHOLES = ("weight_ci", "weight_cf", "weight_co")


def _check_proj_size(proj_size, hidden_size, use_peephole, cell_clip, forget_bias):
    """nn.LSTM's rules for proj_size (an int in [0, hidden_size)); a projected LSTM
    has none of blockrnn's extras (nn.LSTM has none to match)."""
    if isinstance(proj_size, bool) or not isinstance(proj_size, int):
        raise TypeError(f"LSTM: proj_size must be an int, got {type(proj_size).__name__}")
    if proj_size < 0:
        raise ValueError(f"LSTM: proj_size should be a positive integer or zero to disable "
                         f"projections, got {proj_size}")
    if proj_size and isinstance(hidden_size, int) and proj_size >= hidden_size:
        raise ValueError(f"LSTM: proj_size has to be smaller than hidden_size, got "
                         f"proj_size={proj_size}, hidden_size={hidden_size}")
    if proj_size and (use_peephole or cell_clip or forget_bias):
        raise ValueError(f"LSTM: proj_size={proj_size} cannot be combined with "
                         f"use_peephole, cell_clip or forget_bias (got use_peephole="
                         f"{use_peephole!r}, cell_clip={cell_clip!r}, forget_bias="
                         f"{forget_bias!r}): nn.LSTM's projected LSTM has none of them")


class LSTM(_RNNBase):
    """``torch.nn.LSTM`` on blockrnn's ``block_lstm_v2``: the same constructor, call,
    parameters, initialisation and state_dict.

    Parameters
    ----------
    input_size, hidden_size : int
    num_layers : int, default 1
        Stacked layers; layer k > 0 reads layer k-1's output (T, B, D*H).
    bias : bool, default True
        False: no ``bias_*`` parameters.
    batch_first : bool, default False
        Input and output are (B, T, ·) instead of (T, B, ·) (states are not).
    dropout : float in [0, 1], default 0.0
        Dropout on each layer's output except the last, in training mode only
        (``torch.nn.functional.dropout``, as nn.LSTM).
    bidirectional : bool, default False
        A reverse direction per layer that reads each row's valid prefix
        backwards; the layer output is [forward | reverse] (T, B, 2H).
    proj_size : int in [0, hidden_size), default 0
        P > 0: nn.LSTM's projected LSTM, h = (o * tanh(c)) @ W_hr^T of size P:
        adds ``weight_hr_l{k}`` (P, H) after each cell's biases, ``weight_hh_l{k}``
        is (4H, P), layer k > 0 reads (T, B, D*P), h0/h_n and y have P (not H)
        features, c0/c_n keep H. Not with the extras below (ValueError).
    use_peephole : bool, default False (keyword only; every layer)
        Adds the parameters ``weight_ci_l{k}``, ``weight_cf_l{k}``,
        ``weight_co_l{k}`` (H,): TensorFlow's peepholes wci, wcf, wco.
    cell_clip : float, default 0.0 (no clipping; keyword only; every layer)
    forget_bias : float, default 0.0 (keyword only): a constant added to the
        forget gate's pre-activation (TensorFlow's forget_bias; not a parameter).
    device : None or 'cpu' (blockrnn is CPU-only; anything else raises ValueError)
    dtype : torch.float32 / torch.float64, default torch's default dtype

    Parameters (``nn.Parameter``), exactly nn.LSTM's: per layer k and direction
    (suffix ``_l{k}``, ``_l{k}_reverse``), in nn.LSTM's order,
    ``weight_ih_l{k}`` (4H, I_k), ``weight_hh_l{k}`` (4H, H), ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` (4H,) (absent with bias=False), gate rows i, f, g, o;
    then the peepholes when asked for. I_0 = input_size, I_k = D*H for k > 0.
    Initialised uniform in [-1/sqrt(H), 1/sqrt(H)], as nn.LSTM. A
    ``state_dict`` loads strictly into / from an nn.LSTM of the same
    configuration (without the extras).

    ``forward(x, hx=None, sequence_length=None)``: x (T, B, I) (or (B, T, I)
    with batch_first, or unbatched (T, I), or a ``PackedSequence``); hx None or
    (h0, c0), each (L*D, B, H) ((L*D, H) unbatched), index layer * D +
    direction; sequence_length None or B ints in [0, T] (padded input only; a
    tensor under torch.compile). Returns ``y, (h_n, c_n)``: y (T, B, D*H) the
    output of the last layer (zero past a row's length; a PackedSequence with
    the input's batch_sizes and indices for a packed input), h_n and c_n
    (L*D, B, H) the state after each row's last step (for the reverse
    direction: after its step at time 0), in the input's batch order.
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, *, use_peephole=False,
                 cell_clip=0.0, forget_bias=0.0, device=None, dtype=None):
        _check_proj_size(proj_size, hidden_size, use_peephole, cell_clip, forget_bias)
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype)
        if not isinstance(use_peephole, bool):
            raise TypeError(f"LSTM: use_peephole must be a bool, got "
                            f"{type(use_peephole).__name__}")
        self.proj_size = proj_size     # before the parameters: _cells reads it
        self.use_peephole = use_peephole
        self.cell_clip = check_float("LSTM", "cell_clip", cell_clip)
        self.forget_bias = check_float("LSTM", "forget_bias", forget_bias)
        H = hidden_size
        for _, _, sfx, I in self._cells():
            self._add(f"weight_ih{sfx}", 4 * H, I)
            self._add(f"weight_hh{sfx}", 4 * H, proj_size or H)
            if self.bias:
                self._add(f"bias_ih{sfx}", 4 * H)
                self._add(f"bias_hh{sfx}", 4 * H)
            if proj_size:     # nn.LSTM's order: after the biases
                self._add(f"weight_hr{sfx}", proj_size, H)
            if use_peephole:
                for name in _PEEPHOLES:
                    self._add(f"{name}{sfx}", H)
        self.mode = "LSTM"
        self._name_weights()
        self.reset_parameters()

    def _cell_params(self, sfx):
        """(weight_ih, weight_hh, bias_ih, bias_hh, weight_ci, weight_cf, weight_co) of
        one cell, None for those it does not have."""
        names = self._cell_names(sfx)
        return (self._required(names[0]), self._required(names[1]),
                *((self._weight(n) for n in names[2:4]) if self.bias else (None, None)),
                *((self._weight(n) for n in names[4:7]) if self.use_peephole
                  else (None,) * 3))

    def _cell_names(self, sfx):
        """The names of _cell_params(sfx)'s weights, in its order; then weight_hr."""
        return tuple(n + sfx for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh",
                                       *_PEEPHOLES, "weight_hr"))

    def _cell_shapes(self, I):
        """The shapes of _cell_names' weights in a cell of input size I."""
        H, P = self.hidden_size, self.proj_size or self.hidden_size
        return (4 * H, I), (4 * H, P), (4 * H,), (4 * H,), (H,), (H,), (H,), (P, H)

    def _cells(self):
        """As _RNNBase._cells, with I_k = D*P for k > 0 when projected."""
        for k, d, sfx, I in super()._cells():
            yield k, d, sfx, (I if k == 0 or not self.proj_size
                              else self.num_directions * self.proj_size)

    def forward(self, x, hx=None, sequence_length=None):
        if self.proj_size:
            return self._forward_proj(x, hx, sequence_length)
        where = "blockrnn.torch.LSTM"
        xt, batched, lengths, packed = self._input(where, x, sequence_length)
        B = xt.shape[1]
        hx = _state_pair(where, hx)
        _refuse_forward_ad(where, xt, hx, self)
        infer = self._wants_inference(xt, hx)    # no gradient: the packed inference forward
        states = (self._state(where, "h0", hx[0], B, batched, zeros=not infer),
                  self._state(where, "c0", hx[1], B, batched, zeros=not infer))
        if infer:
            return self._output(*self._run_inference(where, xt, states, lengths, batched),
                                batched, packed)

        def step(x, init, sfx, reverse):
            out = _apply(lstm_op, x, *init, *self._compute_params(sfx), lengths,
                         self.cell_clip, self.forget_bias, reverse)
            return out[0], out[1]

        return self._run(where, xt, states, lengths, batched, packed, step)

    def _forward_proj(self, x, hx, sequence_length):
        """forward with proj_size = P > 0: h0/h_n (L*D, B, P), y (T, B, D*P), on
        lstm_proj_op."""
        where = "blockrnn.torch.LSTM"
        xt, batched, lengths, packed = self._input(where, x, sequence_length)
        B = xt.shape[1]
        hx = _state_pair(where, hx)
        _refuse_forward_ad(where, xt, hx, self)
        states = (self._state(where, "h0", hx[0], B, batched, size=self.proj_size),
                  self._state(where, "c0", hx[1], B, batched))

        def step(x, init, sfx, reverse):
            w_hr = self._required(f"weight_hr{sfx}")
            self._check_cell(where, sfx, (None,) * 7 + (w_hr,))    # (converted below)
            out = _apply(lstm_proj_op, x, *init, *self._compute_params(sfx)[:4],
                         _to_compute(w_hr), lengths, reverse)
            return out[0], out[1]

        return self._run(where, xt, states, lengths, batched, packed, step)

    def _cell_options(self):
        return self.use_peephole, self.cell_clip, self.forget_bias

    # nn.LSTM's versions of the checks (h and c; see _RNNBase.check_input)
    get_expected_cell_size = nn.LSTM.get_expected_cell_size
    check_forward_args = nn.LSTM.check_forward_args
    permute_hidden = nn.LSTM.permute_hidden

    def _onnx_refusal(self):
        """What nn.LSTM's op cannot express (_run_onnx): (what, what to do) or None."""
        if self.use_peephole:
            return ("peepholes", "blockrnn.onnx.export writes them as ONNX LSTM's P input")
        if self.cell_clip > 0:
            return ("cell clipping", "ONNX has none either (its clip bounds the gates' "
                                     "pre-activations)")
        if self.proj_size:
            return ("projection (proj_size)", "ONNX's LSTM has none either (for nn.LSTM's, "
                    "torch's exporters raise or write a graph ONNX Runtime refuses)")
        return None

    def _nn_has_bias(self):
        return self.bias or self.forget_bias != 0

    def _nn_weights(self, sfx):
        """w_ih, w_hh[, b_ih, b_hh] (nn.LSTM's _flat_weights of one cell without a
        projection, which _onnx_refusal refuses), the forget bias added to b_ih's f rows."""
        w_ih, w_hh, b_ih, b_hh = self._compute_params(sfx)[:4]
        weights = [w_ih, w_hh]
        if self._nn_has_bias():
            if b_ih is None:
                b_ih = b_hh = w_ih.new_zeros(w_ih.shape[0])
            if self.forget_bias:
                H = self.hidden_size
                b_ih = torch.cat([b_ih[:H], b_ih[H:2 * H] + self.forget_bias, b_ih[2 * H:]])
            weights += [b_ih, b_hh]
        return weights

    def _pack_cell(self, w_ih, w_hh, b_ih, b_hh, wci, wcf, wco):
        """One cell's weights (NumPy views of the parameters) packed for the inference
        forward, with the training op's bias (_lstm_bias: the same two float32 roundings,
        so the same bits)."""
        b = _lstm_bias("blockrnn.torch.LSTM", b_ih, b_hh, self.forget_bias,
                       w_hh.shape[1], np.float32)
        _together("blockrnn.torch.LSTM", _PEEPHOLES, wci, wcf, wco)
        return _kernels.PackedLSTMWeights(
            w_ih, w_hh, b, wci, wcf, wco, layout=int(_kernels.GateLayout.IFCO),
            cell_clip=self.cell_clip, use_peephole=self.use_peephole, gates_in_rows=True)

    @classmethod
    def from_torch(cls, module):
        """A ``blockrnn.torch.LSTM`` with the configuration (num_layers, bidirectional,
        bias, batch_first, dropout, proj_size, dtype, training mode) and the state_dict
        of a ``torch.nn.LSTM`` (the parameters are the same)."""
        where = "blockrnn.torch.LSTM.from_torch"
        if isinstance(module, (nn.GRU, GRU)):
            raise ValueError(f"{where}: " + RESET_AFTER.format(
                what="torch.nn.GRU", hint=" Use blockrnn.torch.GRU.from_torch instead."))
        _check_source(where, module, (nn.LSTM, LSTM), "torch.nn.LSTM", _MODULE_DTYPES)
        proj = module.proj_size
        out = cls(module.input_size, module.hidden_size, module.num_layers, module.bias,
                  module.batch_first, module.dropout, module.bidirectional, proj,
                  dtype=module.weight_ih_l0.dtype)
        out.load_state_dict(module.state_dict(), strict=True)
        return out.train(module.training)

    def extra_repr(self):
        s = super().extra_repr()
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.use_peephole:
            s += ", use_peephole=True"
        if self.cell_clip > 0:
            s += f", cell_clip={self.cell_clip}"
        if self.forget_bias:
            s += f", forget_bias={self.forget_bias}"
        return s


class GRU(_RNNBase):
    """``torch.nn.GRU`` on blockrnn's ``block_gru_reset_after``: the same constructor,
    call, math, parameters, initialisation and state_dict (``reset_after=True``,
    the default), or TensorFlow's GRUBlockCell on ``block_gru``
    (``reset_after=False``).

    nn.GRU (reset after the recurrent matmul), gate rows r, z, n:
    ``r = σ(x W_ir^T + b_ir + h W_hr^T + b_hr)``, ``z`` likewise,
    ``n = tanh(x W_in^T + b_in + r ⊙ (h W_hn^T + b_hn))``, ``h' = (1 − z) ⊙ n + z ⊙ h``.
    Parameters per layer k and direction, in nn.GRU's order: ``weight_ih_l{k}``
    (3H, I_k), ``weight_hh_l{k}`` (3H, H), ``bias_ih_l{k}``, ``bias_hh_l{k}``
    (3H,) (absent with bias=False).

    ``reset_after=False``, GRUBlockCell (reset before the recurrent matmul):
    ``r, u = σ([x, h] @ w_ru + b_ru)``, ``c = tanh([x, r ⊙ h] @ w_c + b_c)``,
    ``h' = u ⊙ h + (1 − u) ⊙ c``; parameters ``w_ru_l{k}`` (I_k+H, 2H) columns
    [r | u], ``w_c_l{k}`` (I_k+H, H), ``b_ru_l{k}`` (2H,), ``b_c_l{k}`` (H,).
    The two GRUs are different functions: their weights do not convert.

    Constructor: nn.GRU's, ``GRU(input_size, hidden_size, num_layers=1,
    bias=True, batch_first=False, dropout=0.0, bidirectional=False, *,
    reset_after=True, device=None, dtype=None)``, with the meanings of
    ``LSTM``'s. ``forward(x, hx=None, sequence_length=None)``: x as for
    ``LSTM``; hx None or h0 (L*D, B, H). Returns ``y, h_n``: y (T, B, D*H) (or
    a PackedSequence), h_n (L*D, B, H).
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, *, reset_after=True, device=None,
                 dtype=None):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype)
        if not isinstance(reset_after, bool):
            raise TypeError(f"GRU: reset_after must be a bool, got {type(reset_after).__name__}")
        self.reset_after = reset_after
        H = hidden_size
        for _, _, sfx, I in self._cells():
            if reset_after:
                self._add(f"weight_ih{sfx}", 3 * H, I)
                self._add(f"weight_hh{sfx}", 3 * H, H)
                if self.bias:
                    self._add(f"bias_ih{sfx}", 3 * H)
                    self._add(f"bias_hh{sfx}", 3 * H)
            else:
                self._add(f"w_ru{sfx}", I + H, 2 * H)
                self._add(f"w_c{sfx}", I + H, H)
                if self.bias:
                    self._add(f"b_ru{sfx}", 2 * H)
                    self._add(f"b_c{sfx}", H)
        self.mode, self.proj_size = "GRU", 0     # nn.GRU's (it has no projection)
        self._name_weights()
        self.reset_parameters()

    def _cell_params(self, sfx):
        names = self._cell_names(sfx)
        p = [self._required(n) for n in names[:2]]
        return (*p, *((self._weight(n) for n in names[2:]) if self.bias else (None, None)))

    def _cell_names(self, sfx):
        """The names of _cell_params(sfx)'s weights, in its order."""
        return tuple(n + sfx for n in (("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                                       if self.reset_after else ("w_ru", "w_c", "b_ru", "b_c")))

    def _cell_shapes(self, I):
        """The shapes of _cell_names' weights in a cell of input size I."""
        return (_gru_shapes if self.reset_after else _gru_block_shapes)(I, self.hidden_size)

    def forward(self, x, hx=None, sequence_length=None):
        where = "blockrnn.torch.GRU"
        xt, batched, lengths, packed = self._input(where, x, sequence_length)
        _refuse_forward_ad(where, xt, (hx,), self)
        infer = self._wants_inference(xt, (hx,))  # no gradient: the packed inference forward
        states = (self._state(where, "hx", hx, xt.shape[1], batched, zeros=not infer),)
        if infer:
            y, (h_n,) = self._output(*self._run_inference(where, xt, states, lengths,
                                                          batched), batched, packed)
            return y, h_n
        op = gru_op if self.reset_after else gru_block_op

        def step(x, init, sfx, reverse):
            return (_apply(op, x, *init, *self._compute_params(sfx), lengths, reverse)[0],)

        y, (h_n,) = self._run(where, xt, states, lengths, batched, packed, step)
        return y, h_n

    def _cell_options(self):
        return self.reset_after

    def _onnx_refusal(self):
        """What nn.GRU's op cannot express (_run_onnx): (what, what to do) or None."""
        if not self.reset_after:
            return ("reset gate before the recurrent product (reset_after=False)",
                    "blockrnn.onnx.export writes it as ONNX GRU with linear_before_reset=0")
        return None

    def _pack_cell(self, w1, w2, b1, b2):
        """One cell's weights packed for the inference forward (no bias: zeros, as the
        training ops)."""
        H = self.hidden_size
        _together("blockrnn.torch.GRU", ("bias_ih", "bias_hh") if self.reset_after
                  else ("b_ru", "b_c"), b1, b2)
        if self.reset_after:
            if b1 is None:
                b1 = b2 = np.zeros(3 * H, np.float32)
            return _kernels.PackedGRUResetAfterWeights(w1, w2, b1, b2)
        if b1 is None:
            b1, b2 = np.zeros(2 * H, np.float32), np.zeros(H, np.float32)
        return _kernels.PackedGRUWeights(w1, w2, b1, b2)

    @classmethod
    def from_torch(cls, module):
        """A ``blockrnn.torch.GRU`` (nn.GRU's math) with the configuration and the
        state_dict of a ``torch.nn.GRU`` (the parameters are the same)."""
        _check_source("blockrnn.torch.GRU.from_torch", module, nn.GRU, "torch.nn.GRU",
                      _MODULE_DTYPES)
        out = cls(module.input_size, module.hidden_size, module.num_layers, module.bias,
                  module.batch_first, module.dropout, module.bidirectional,
                  dtype=module.weight_ih_l0.dtype)
        out.load_state_dict(module.state_dict(), strict=True)
        return out.train(module.training)

    def extra_repr(self):
        s = super().extra_repr()
        return s if self.reset_after else s + ", reset_after=False"


def upgrade_state_dict_v01(state_dict, module):
    """A blockrnn 0.1 ``state_dict`` of a ``blockrnn.torch.LSTM`` / ``GRU`` in the
    names and layouts of 0.2's ``module`` (load it with ``module.load_state_dict``).

    0.1's LSTM held TensorFlow's layout: ``w_l{k}{s}`` (I_k+H, 4H) = [W_ih^T; W_hh^T]
    (IFCO columns = nn.LSTM's i, f, g, o rows), ``b_l{k}{s}`` (4H,) = the folded
    b_ih + b_hh, peepholes ``wci/wcf/wco_l{k}{s}``. They become ``weight_ih_l{k}{s}
    = w[:I_k].T``, ``weight_hh_l{k}{s} = w[I_k:].T`` and, since only the sum of the two
    biases was stored, ``bias_ih_l{k}{s} = b`` and ``bias_hh_l{k}{s} = 0`` (the module
    computes exactly what 0.1 computed; under SGD the two biases then move together
    from there, as nn.LSTM's do); peepholes ``weight_ci/cf/co_l{k}{s}``. A 0.1 LSTM
    saved with bias=False has no b; a 0.2 module with bias=False refuses a nonzero b.

    0.1's GRU was TensorFlow's GRUBlockCell with the names 0.2 keeps for
    ``GRU(reset_after=False)``: its state_dict is returned unchanged for such a
    module; a ``reset_after=True`` module (nn.GRU's math) cannot take it.

    ``state_dict``: a mapping of the module's own keys (no prefix). Tensors are new
    (contiguous copies), the input is not modified.
    """
    where = "blockrnn.torch.upgrade_state_dict_v01"
    if isinstance(module, GRU):
        if module.reset_after:
            raise ValueError(
                f"{where}: blockrnn 0.1's GRU was TensorFlow's GRUBlockCell (reset before the "
                f"recurrent matmul); build the module with GRU(..., reset_after=False) to load "
                f"it (nn.GRU's reset-after GRU is a different function)")
        return {k: v.clone() for k, v in state_dict.items()}
    if not isinstance(module, LSTM):
        raise TypeError(f"{where}: module must be a blockrnn.torch.LSTM or GRU, got "
                        f"{type(module).__name__}")
    if module.proj_size:
        raise ValueError(f"{where}: blockrnn 0.1 had no projected LSTM; the module has "
                         f"proj_size={module.proj_size}")
    old = dict(state_dict)
    out = {}
    for _, _, sfx, I in module._cells():
        try:
            w = old.pop(f"w{sfx}")
        except KeyError:
            raise ValueError(f"{where}: no 'w{sfx}' in the state_dict: not a blockrnn 0.1 "
                             f"LSTM of this configuration (keys: {sorted(state_dict)})") from None
        if tuple(w.shape) != (I + module.hidden_size, 4 * module.hidden_size):
            raise ValueError(f"{where}: w{sfx} has shape {tuple(w.shape)}, the module needs "
                             f"({I + module.hidden_size}, {4 * module.hidden_size})")
        out[f"weight_ih{sfx}"] = w[:I].T.contiguous()
        out[f"weight_hh{sfx}"] = w[I:].T.contiguous()
        b = old.pop(f"b{sfx}", None)
        if module.bias:
            b = torch.zeros(4 * module.hidden_size, dtype=w.dtype) if b is None else b
            out[f"bias_ih{sfx}"] = b.clone()
            out[f"bias_hh{sfx}"] = torch.zeros_like(b)
        elif b is not None and bool(torch.any(b != 0)):
            raise ValueError(f"{where}: b{sfx} is nonzero but the module has bias=False")
        for tf_name, name in zip(("wci", "wcf", "wco"), _PEEPHOLES):
            p = old.pop(f"{tf_name}{sfx}", None)
            if module.use_peephole:
                out[f"{name}{sfx}"] = (torch.zeros(module.hidden_size, dtype=w.dtype)
                                       if p is None else p.clone())
            elif p is not None and bool(torch.any(p != 0)):
                raise ValueError(f"{where}: {tf_name}{sfx} is nonzero but the module has "
                                 f"use_peephole=False")
    if old:
        raise ValueError(f"{where}: keys not of a blockrnn 0.1 LSTM of this configuration: "
                         f"{sorted(old)}")
    return out
