"""PyTorch adapter: blockrnn's fused sequence ops as autograd functions and nn.Modules.

Optional: needs PyTorch (``import blockrnn`` never imports it; this module does).
CPU only; float32 and float64 tensors. CPU tensors are handed to the kernels
without copies (``Tensor.numpy()`` views) and the results come back as
``torch.from_numpy`` views.

* ``LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
  dropout=0.0, bidirectional=False, proj_size=0, *, use_peephole=False,
  cell_clip=0.0, device=None, dtype=None)`` and ``GRU(input_size, hidden_size,
  num_layers=1, bias=True, batch_first=False, dropout=0.0, bidirectional=False,
  *, device=None, dtype=None)``: ``torch.nn.LSTM`` / ``nn.GRU``'s constructor
  and call convention, ``y, (h_n, c_n) = lstm(x, (h0, c0))``,
  ``y, h_n = gru(x, h0)``, stacked layers, both directions, dropout between
  layers and ``PackedSequence`` input. The GRU is TensorFlow's GRUBlockCell
  (reset gate applied BEFORE the recurrent matmul), not nn.GRU's reset-after
  math: their weights are not interchangeable. ``LSTM.from_torch(nn_lstm)``
  converts an ``nn.LSTM``'s weights.
* ``BlockLSTMFunction``, ``BlockGRUFunction``: the ``torch.autograd.Function``s
  underneath, one layer in one direction (forward = ``block_lstm_v2`` /
  ``block_gru``, backward = their grad ops; first-order gradients only: a
  double backward, ``create_graph=True``, raises a RuntimeError).

Parameters are ``nn.Parameter``s in TensorFlow's layouts (see
``blockrnn.layers``), named with nn.LSTM's suffixes: layer k's LSTM weights
``w_l{k}`` (I_k+H, 4H) with IFCO gate columns, ``b_l{k}`` (4H,), peepholes
``wci_l{k}``, ``wcf_l{k}``, ``wco_l{k}`` (H,) when ``use_peephole``; GRU
``w_ru_l{k}`` (I_k+H, 2H) columns [r | u], ``w_c_l{k}`` (I_k+H, H),
``b_ru_l{k}`` (2H,), ``b_c_l{k}`` (H,); the reverse direction's add
``_reverse``. I_0 = input_size, I_k = num_directions * H above.
Any torch optimizer, ``.double()``, ``state_dict()`` and
``DistributedDataParallel`` work as with any module.
"""
import math
import numbers
import warnings

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

import blockrnn
from blockrnn._validation import RESET_AFTER, check_float, check_sequence_length, steps_to_run

__all__ = ["LSTM", "GRU", "BlockLSTMFunction", "BlockGRUFunction"]

_DTYPES = (torch.float32, torch.float64)


def _numpy(where, name, t, dtype=None):
    """A NumPy view of a CPU float32/float64 tensor (no copy), with clear errors."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{where}: blockrnn runs on the CPU only; {name} is on {t.device} "
                         f"(move it with .cpu())")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{where}: {name} must be float32 or float64, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{where}: {name} has dtype {t.dtype} but the parameters have "
                        f"{dtype}; convert the input or the module (e.g. module.double())")
    return t.detach().numpy()


def _lengths(where, sequence_length, T, B):
    """sequence_length (tensor, array or list of B ints in [0, T]) as int64 NumPy, or None."""
    if isinstance(sequence_length, torch.Tensor):
        sequence_length = sequence_length.detach().cpu().numpy()
    return check_sequence_length(where, sequence_length, B, T)


def _tensor(a):
    return torch.from_numpy(np.ascontiguousarray(a))


def _first_order_only(where):
    """Raise when the backward runs under create_graph=True (double backward).

    The gradient ops are not differentiable: under create_graph=True their
    result would carry no graph, and a gradient penalty or Hessian product
    through them would silently contribute nothing.
    """
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"{where}: double backward (torch.autograd.grad(..., create_graph=True) or "
            f".backward(create_graph=True)) is not supported; blockrnn's gradients are "
            f"first-order only. Use torch.nn.LSTM / nn.GRU for higher-order gradients.")


def _grad(where, name, g, dtype, lengths, reverse):
    """An incoming gradient (T, B, H) as NumPy in the op's time order."""
    g = _numpy(where, name, g, None).astype(dtype, copy=False)
    return blockrnn.reverse_sequence(g, lengths) if reverse else g


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
        x, h0, c0, w, wci, wcf, wco, b, h, cs = (t.detach().numpy() for t in ctx.saved_tensors)
        if ctx.reverse:
            x, h, cs = ctx.reversed
        i, f, o, ci, co = ctx.gates
        dh = _grad(where, "grad of h", dh, x.dtype, ctx.lengths, ctx.reverse)
        dcs = _grad(where, "grad of cs", dcs, x.dtype, ctx.lengths, ctx.reverse)
        g = blockrnn.block_lstm_grad_v2(ctx.L, x, c0, h0, w, wci, wcf, wco, b,
                                        i, cs, f, o, ci, co, h, dcs, dh,
                                        use_peephole=ctx.use_peephole, sequence_length=ctx.lengths)
        x_grad = g.x_grad
        if ctx.reverse and need[0]:
            x_grad = blockrnn.reverse_sequence(x_grad, ctx.lengths)
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
        x, h0, w_ru, w_c, b_ru, b_c, h = (t.detach().numpy() for t in ctx.saved_tensors)
        if ctx.reverse:
            x, h = ctx.reversed
        r, u, c = ctx.gates
        dh = _grad(where, "grad of h", dh, x.dtype, ctx.lengths, ctx.reverse)
        g = blockrnn.block_gru_grad(ctx.L, x, h0, w_ru, w_c, b_ru, b_c, r, u, c, h, dh,
                                    sequence_length=ctx.lengths)
        x_grad = g.x_grad
        if ctx.reverse and need[0]:
            x_grad = blockrnn.reverse_sequence(x_grad, ctx.lengths)
        grads = (x_grad, g.h_prev_grad, g.w_ru_grad, g.w_c_grad, g.b_ru_grad, g.b_c_grad)
        return (*[_tensor(gr) if n else None for gr, n in zip(grads, need)], None, None)


def nn_lstm_arrays(module, where="blockrnn.torch.LSTM.from_torch"):
    """The weights of any ``torch.nn.LSTM`` without projection, in TensorFlow's layout.

    Returns a dict with ``input_size``, ``hidden_size``, ``num_layers``,
    ``bidirectional``, ``batch_first``, ``bias`` (nn.LSTM's flag),
    ``torch_dtype`` and ``params``: NumPy arrays named as blockrnn's layers name
    them, for layer k and direction suffix s ("" forward, "_reverse" reverse):
    ``w_l{k}{s}`` (I_k+H, 4H) = ``[W_ih_l{k}{s}.T; W_hh_l{k}{s}.T]``, IFCO gate
    columns (nn.LSTM's gate rows i, f, g, o), and ``b_l{k}{s}`` (4H,) =
    ``b_ih + b_hh`` (zeros without bias), layer by layer, forward before
    reverse. I_0 = input_size, I_k = num_directions * H for k >= 1.
    ``blockrnn.convert.from_torch`` uses it too (convert imports this module,
    never the reverse).
    """
    if isinstance(module, nn.GRU):
        raise ValueError(f"{where}: " + RESET_AFTER.format(
            what="torch.nn.GRU", hint=" Use blockrnn.torch.GRU and train it instead."))
    if not isinstance(module, nn.LSTM):
        raise TypeError(f"{where}: expected a torch.nn.LSTM, got {type(module).__name__}")
    if getattr(module, "proj_size", 0):
        raise ValueError(f"{where}: nn.LSTM with proj_size={module.proj_size} (projected "
                         f"LSTM) is not supported")
    if module.weight_ih_l0.dtype not in _DTYPES:
        raise TypeError(f"{where}: nn.LSTM weights must be float32 or float64, got "
                        f"{module.weight_ih_l0.dtype}")
    H = module.hidden_size

    def array(name):
        return getattr(module, name).detach().cpu().numpy()

    params = {}
    for k in range(module.num_layers):
        for s in ("", "_reverse") if module.bidirectional else ("",):
            w_ih, w_hh = array(f"weight_ih_l{k}{s}"), array(f"weight_hh_l{k}{s}")
            params[f"w_l{k}{s}"] = np.concatenate([w_ih.T, w_hh.T], axis=0)
            params[f"b_l{k}{s}"] = (array(f"bias_ih_l{k}{s}") + array(f"bias_hh_l{k}{s}")
                                    if module.bias else np.zeros(4 * H, w_ih.dtype))
    return {"input_size": module.input_size, "hidden_size": H,
            "num_layers": module.num_layers, "bidirectional": bool(module.bidirectional),
            "batch_first": bool(module.batch_first), "bias": bool(module.bias),
            "torch_dtype": module.weight_ih_l0.dtype, "params": params}


def _final(seq, init, lengths):
    """The state after each row's last step: seq[n_b - 1, b], or init[b] when n_b == 0
    (differentiable: the gradient lands in seq's gradient at [n_b - 1, b])."""
    T = seq.shape[0]
    if lengths is None:
        return seq[T - 1] if T else init
    if steps_to_run(T, lengths) == 0:
        return init
    B = seq.shape[1]
    idx = torch.from_numpy(np.maximum(lengths - 1, 0))
    picked = seq[idx, torch.arange(B)]
    live = torch.from_numpy(lengths > 0)[:, None]
    return torch.where(live, picked, init)


def _first(seq, init, lengths):
    """The reverse direction's final state: the state after its last step, taken at
    original time 0 -- seq[0, b], or init[b] when n_b == 0."""
    T = seq.shape[0]
    if lengths is None:
        return seq[0] if T else init
    if steps_to_run(T, lengths) == 0:
        return init
    return torch.where(torch.from_numpy(lengths > 0)[:, None], seq[0], init)


def _check_device(where, device):
    """device: None or any spelling of the CPU (blockrnn has no GPU kernels)."""
    if device is None:
        return
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"{where}: device must be None or 'cpu', got {device!r} ({exc})") \
            from exc
    if kind != "cpu":
        raise ValueError(f"{where}: blockrnn runs on the CPU only; device must be None or "
                         f"'cpu', got {device!r}")


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
        if dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype must be torch.float32 or torch.float64, got {dtype}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first = bool(bias), bool(batch_first)
        self.dropout, self.bidirectional = float(dropout), bool(bidirectional)
        self._factory = {"dtype": dtype}

    @property
    def num_directions(self):
        return 2 if self.bidirectional else 1

    def _cells(self):
        """(layer k, direction d, name suffix, layer input size I_k) in nn.LSTM's order."""
        D, H = self.num_directions, self.hidden_size
        for k in range(self.num_layers):
            for d in range(D):
                yield k, d, f"_l{k}" + ("_reverse" if d else ""), \
                    self.input_size if k == 0 else D * H

    def _add(self, name, shape, trainable):
        """A parameter (trainable) or a zero buffer kept out of state_dict."""
        t = torch.empty(*shape, **self._factory)
        if trainable:
            setattr(self, name, nn.Parameter(t))
        else:
            self.register_buffer(name, t.zero_(), persistent=False)

    def reset_parameters(self):
        """Uniform in [-1/sqrt(H), 1/sqrt(H)], as torch.nn.LSTM / nn.GRU."""
        k = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-k, k)

    def _input(self, where, x, sequence_length):
        """input -> (time-major x (T, B, I), batched?, lengths, PackedSequence or None)."""
        if isinstance(x, PackedSequence):
            if sequence_length is not None:
                raise ValueError(f"{where}: sequence_length must be None with a "
                                 f"PackedSequence input (the lengths are in it)")
            _numpy(where, "input.data", x.data, self._param_dtype())
            if x.data.dim() != 2 or x.data.shape[-1] != self.input_size:
                raise ValueError(f"{where}: a PackedSequence's data must have shape (N, I) "
                                 f"with I = {self.input_size}, got {tuple(x.data.shape)}")
            padded, lengths = pad_packed_sequence(x)      # (T, B, I), original batch order
            return padded, True, lengths.numpy().astype(np.int64), x
        _numpy(where, "input", x, self._param_dtype())
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_size:
            layout = "(B, T, I)" if self.batch_first else "(T, B, I)"
            raise ValueError(f"{where}: input must have shape {layout} or (T, I) with "
                             f"I = {self.input_size}, got {tuple(x.shape)}")
        batched = x.dim() == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, batched, _lengths(where, sequence_length, *x.shape[:2]), None

    def _state(self, where, name, s, B, batched):
        """h0 / c0: None (zeros) or (L*D, B, H) ((L*D, H) unbatched) -> (L*D, B, H)."""
        LD, H = self.num_layers * self.num_directions, self.hidden_size
        if s is None:
            return torch.zeros(LD, B, H, **self._factory_now())
        _numpy(where, name, s, self._param_dtype())
        want = (LD, B, H) if batched else (LD, H)
        if tuple(s.shape) != want:
            raise ValueError(f"{where}: {name} must have shape {want} (num_layers * "
                             f"num_directions = {LD}, B, H), got {tuple(s.shape)}")
        return s if batched else s.unsqueeze(1)

    def _run(self, x, states, lengths, batched, step):
        """All layers and directions. states: tuple of (L*D, B, H) initial states;
        step(layer_input, initial states of one cell, suffix, reverse) -> tuple of
        (T, B, H) sequences, the first the output h. Returns (y (T, B, D*H), final
        states: tuple of (L*D, B, H), or (L*D, H) unbatched -- new tensors, not views)."""
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
        return x, tuple(torch.stack(f) for f in finals)

    def _output(self, y, batched, packed, lengths):
        """y (T, B, D*H) time-major -> nn.LSTM's output layout (a PackedSequence with the
        input's batch_sizes and indices for a packed input)."""
        if packed is not None:
            order = packed.sorted_indices
            lens = torch.from_numpy(lengths)
            if order is not None:
                y, lens = y.index_select(1, order), lens[order]
            data = pack_padded_sequence(y, lens, enforce_sorted=True).data
            return PackedSequence(data, packed.batch_sizes, packed.sorted_indices,
                                  packed.unsorted_indices)
        if not batched:
            return y[:, 0]
        return y.transpose(0, 1) if self.batch_first else y

    def _param_dtype(self):
        return next(self.parameters()).dtype

    def _factory_now(self):
        return {"dtype": self._param_dtype()}

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


class LSTM(_RNNBase):
    """An LSTM on blockrnn's ``block_lstm_v2``, constructed and called like ``nn.LSTM``.

    Parameters
    ----------
    input_size, hidden_size : int
    num_layers : int, default 1
        Stacked layers; layer k > 0 reads layer k-1's output (T, B, D*H).
    bias : bool, default True
        False: no ``b_l*`` parameters (the op adds zeros).
    batch_first : bool, default False
        Input and output are (B, T, ·) instead of (T, B, ·) (states are not).
    dropout : float in [0, 1], default 0.0
        Dropout on each layer's output except the last, in training mode only
        (``torch.nn.functional.dropout``, as nn.LSTM).
    bidirectional : bool, default False
        A reverse direction per layer that reads each row's valid prefix
        backwards; the layer output is [forward | reverse] (T, B, 2H).
    proj_size : 0
        Anything else raises ValueError (blockrnn has no projected LSTM).
    use_peephole : bool, default False (keyword only; every layer)
    cell_clip : float, default 0.0 (no clipping; keyword only; every layer)
    device : None or 'cpu' (blockrnn is CPU-only; anything else raises ValueError)
    dtype : torch.float32 / torch.float64, default torch's default dtype

    Parameters (``nn.Parameter``), per layer k and direction (suffix ``_l{k}``,
    ``_l{k}_reverse``), in nn.LSTM's order: ``w_l{k}`` (I_k+H, 4H), rows [x; h],
    gate columns i, f, g (cell input), o (IFCO = nn.LSTM's order); ``b_l{k}``
    (4H,) (absent with bias=False); with ``use_peephole``, ``wci_l{k}``,
    ``wcf_l{k}``, ``wco_l{k}`` (H,). I_0 = input_size, I_k = D*H for k > 0.

    ``forward(x, hx=None, sequence_length=None)``: x (T, B, I) (or (B, T, I)
    with batch_first, or unbatched (T, I), or a ``PackedSequence``); hx None or
    (h0, c0), each (L*D, B, H) ((L*D, H) unbatched), index layer * D +
    direction; sequence_length None or B ints in [0, T] (padded input only).
    Returns ``y, (h_n, c_n)``: y (T, B, D*H) the output of the last layer
    (zero past a row's length; a PackedSequence with the input's batch_sizes
    and indices for a packed input), h_n and c_n (L*D, B, H) the state after
    each row's last step (for the reverse direction: after its step at time 0),
    in the input's batch order.
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, *, use_peephole=False,
                 cell_clip=0.0, device=None, dtype=None):
        if proj_size != 0:
            raise ValueError(f"LSTM: proj_size must be 0, got {proj_size!r}: blockrnn has no "
                             f"projected LSTM (use torch.nn.LSTM for proj_size)")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype)
        if not isinstance(use_peephole, bool):
            raise TypeError(f"LSTM: use_peephole must be a bool, got "
                            f"{type(use_peephole).__name__}")
        self.use_peephole = use_peephole
        self.cell_clip = check_float("LSTM", "cell_clip", cell_clip)
        H = hidden_size
        for _, _, sfx, I in self._cells():
            self._add(f"w{sfx}", (I + H, 4 * H), True)
            self._add(f"b{sfx}", (4 * H,), self.bias)
            for name in ("wci", "wcf", "wco"):
                self._add(f"{name}{sfx}", (H,), use_peephole)
        self.reset_parameters()

    def forward(self, x, hx=None, sequence_length=None):
        where = "blockrnn.torch.LSTM"
        xt, batched, lengths, packed = self._input(where, x, sequence_length)
        B = xt.shape[1]
        if hx is None:
            hx = (None, None)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{where}: hx must be None or a tuple (h0, c0), got "
                            f"{type(hx).__name__}")
        states = (self._state(where, "h0", hx[0], B, batched),
                  self._state(where, "c0", hx[1], B, batched))

        def step(x, init, sfx, reverse):
            p = [getattr(self, f"{n}{sfx}") for n in ("w", "wci", "wcf", "wco", "b")]
            return BlockLSTMFunction.apply(x, *init, *p, self.use_peephole, self.cell_clip,
                                           lengths, reverse)

        y, (h_n, c_n) = self._run(xt, states, lengths, batched, step)
        return self._output(y, batched, packed, lengths), (h_n, c_n)

    @classmethod
    def from_torch(cls, module):
        """A ``blockrnn.torch.LSTM`` with the weights and configuration of a
        ``torch.nn.LSTM`` without projection (num_layers, bidirectional, bias,
        batch_first, dropout, dtype and training mode kept).

        nn.LSTM's gate order (i, f, g, o) is IFCO, so per layer and direction
        ``w_l{k} = [W_ih_l{k}.T; W_hh_l{k}.T]`` and ``b_l{k} = b_ih + b_hh``.
        The gradients map back as ``W_ih.grad = w.grad[:I_k].T``,
        ``W_hh.grad = w.grad[I_k:].T``; ``b_ih.grad = b_hh.grad = b.grad``.
        """
        a = nn_lstm_arrays(module)
        out = cls(a["input_size"], a["hidden_size"], a["num_layers"], a["bias"],
                  a["batch_first"], module.dropout, a["bidirectional"], dtype=a["torch_dtype"])
        mine = dict(out.named_parameters())
        with torch.no_grad():
            for name, value in a["params"].items():
                if name in mine:      # without bias the zero b_l* stay buffers
                    mine[name].copy_(torch.from_numpy(value))
        return out.train(module.training)

    def extra_repr(self):
        s = super().extra_repr()
        if self.use_peephole:
            s += ", use_peephole=True"
        if self.cell_clip > 0:
            s += f", cell_clip={self.cell_clip}"
        return s


class GRU(_RNNBase):
    """A GRU on blockrnn's ``block_gru``, constructed and called like ``nn.GRU``.

    The math is TensorFlow's GRUBlockCell: ``r, u = sigmoid([x, h] @ w_ru + b_ru)``,
    ``c = tanh([x, r * h] @ w_c + b_c)``, ``h' = u * h + (1 - u) * c`` (reset
    before the recurrent matmul; nn.GRU resets after it, so nn.GRU weights
    cannot be converted).

    Constructor: nn.GRU's, ``GRU(input_size, hidden_size, num_layers=1,
    bias=True, batch_first=False, dropout=0.0, bidirectional=False, *,
    device=None, dtype=None)``, with the meanings of ``LSTM``'s.

    Parameters (``nn.Parameter``), per layer k and direction (suffix ``_l{k}``,
    ``_l{k}_reverse``): ``w_ru_l{k}`` (I_k+H, 2H) columns [r | u], ``w_c_l{k}``
    (I_k+H, H), ``b_ru_l{k}`` (2H,), ``b_c_l{k}`` (H,) (biases absent with
    bias=False).

    ``forward(x, hx=None, sequence_length=None)``: x as for ``LSTM``; hx None
    or h0 (L*D, B, H). Returns ``y, h_n``: y (T, B, D*H) (or a PackedSequence),
    h_n (L*D, B, H).
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, *, device=None, dtype=None):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype)
        H = hidden_size
        for _, _, sfx, I in self._cells():
            self._add(f"w_ru{sfx}", (I + H, 2 * H), True)
            self._add(f"w_c{sfx}", (I + H, H), True)
            self._add(f"b_ru{sfx}", (2 * H,), self.bias)
            self._add(f"b_c{sfx}", (H,), self.bias)
        self.reset_parameters()

    def forward(self, x, hx=None, sequence_length=None):
        where = "blockrnn.torch.GRU"
        xt, batched, lengths, packed = self._input(where, x, sequence_length)
        states = (self._state(where, "hx", hx, xt.shape[1], batched),)

        def step(x, init, sfx, reverse):
            p = [getattr(self, f"{n}{sfx}") for n in ("w_ru", "w_c", "b_ru", "b_c")]
            return (BlockGRUFunction.apply(x, *init, *p, lengths, reverse),)

        y, (h_n,) = self._run(xt, states, lengths, batched, step)
        return self._output(y, batched, packed, lengths), h_n
