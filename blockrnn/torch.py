"""PyTorch adapter: blockrnn's fused sequence ops as autograd functions and nn.Modules.

Optional: needs PyTorch (``import blockrnn`` never imports it; this module does).
CPU only; float32 and float64 tensors. CPU tensors are handed to the kernels
without copies (``Tensor.numpy()`` views) and the results come back as
``torch.from_numpy`` views.

* ``LSTM(input_size, hidden_size, batch_first=False, use_peephole=False,
  cell_clip=0.0)`` and ``GRU(input_size, hidden_size, batch_first=False)``:
  drop-in for single-layer unidirectional ``torch.nn.LSTM`` / ``nn.GRU`` calls,
  ``y, (h_n, c_n) = lstm(x, (h0, c0))``, ``y, h_n = gru(x, h0)``. The GRU is
  TensorFlow's GRUBlockCell (reset gate applied BEFORE the recurrent matmul),
  not nn.GRU's reset-after math: their weights are not interchangeable.
  ``LSTM.from_torch(nn_lstm)`` converts an ``nn.LSTM``'s weights.
* ``BlockLSTMFunction``, ``BlockGRUFunction``: the ``torch.autograd.Function``s
  underneath (forward = ``block_lstm_v2`` / ``block_gru``, backward = their
  grad ops; first-order gradients only: a double backward,
  ``create_graph=True``, raises a RuntimeError).

Parameters are ``nn.Parameter``s in TensorFlow's layouts (see
``blockrnn.layers``): LSTM ``w`` (I+H, 4H) with IFCO gate columns, ``b`` (4H,),
peepholes ``wci``, ``wcf``, ``wco`` (H,) when ``use_peephole``; GRU ``w_ru``
(I+H, 2H) columns [r | u], ``w_c`` (I+H, H), ``b_ru`` (2H,), ``b_c`` (H,).
Any torch optimizer, ``.double()``, ``state_dict()`` and
``DistributedDataParallel`` work as with any module.
"""
import math

import numpy as np
import torch
from torch import nn

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


class BlockLSTMFunction(torch.autograd.Function):
    """``(h, cs) = BlockLSTMFunction.apply(x, h0, c0, w, wci, wcf, wco, b, use_peephole,
    cell_clip, lengths)``.

    x (T, B, I); h0, c0 (B, H); w (I+H, 4H) IFCO; wci, wcf, wco (H,); b (4H,);
    use_peephole bool; cell_clip float; lengths None or an int64 NumPy array (B,).
    Returns h and cs, each (T, B, H) (zero past each row's length): the outputs
    and cell states at every step. The backward is ``block_lstm_grad_v2`` (cell
    clipping is ignored by the gradient, as in TensorFlow).
    """

    @staticmethod
    def forward(ctx, x, h0, c0, w, wci, wcf, wco, b, use_peephole, cell_clip, lengths):
        where = "blockrnn.torch.BlockLSTMFunction"
        dt = w.dtype
        arrays = [_numpy(where, n, t, dt) for n, t in
                  zip(("x", "h0", "c0", "w", "wci", "wcf", "wco", "b"),
                      (x, h0, c0, w, wci, wcf, wco, b))]
        xa, h0a, c0a, wa, wcia, wcfa, wcoa, ba = arrays
        L = steps_to_run(xa.shape[0], lengths)
        fwd = blockrnn.block_lstm_v2(L, xa, c0a, h0a, wa, wcia, wcfa, wcoa, ba,
                                     cell_clip=cell_clip, use_peephole=use_peephole,
                                     sequence_length=lengths)
        h, cs = _tensor(fwd.h), _tensor(fwd.cs)
        ctx.save_for_backward(x, h0, c0, w, wci, wcf, wco, b, h, cs)
        ctx.gates = (fwd.i, fwd.f, fwd.o, fwd.ci, fwd.co)
        ctx.use_peephole, ctx.L, ctx.lengths = use_peephole, L, lengths
        return h, cs

    @staticmethod
    def backward(ctx, dh, dcs):
        where = "blockrnn.torch.BlockLSTMFunction.backward"
        _first_order_only(where)
        need = ctx.needs_input_grad
        if not any(need[:8]):
            return (None,) * 11
        x, h0, c0, w, wci, wcf, wco, b, h, cs = (t.detach().numpy() for t in ctx.saved_tensors)
        i, f, o, ci, co = ctx.gates
        dh = _numpy(where, "grad of h", dh, None).astype(x.dtype, copy=False)
        dcs = _numpy(where, "grad of cs", dcs, None).astype(x.dtype, copy=False)
        g = blockrnn.block_lstm_grad_v2(ctx.L, x, c0, h0, w, wci, wcf, wco, b,
                                        i, cs, f, o, ci, co, h, dcs, dh,
                                        use_peephole=ctx.use_peephole, sequence_length=ctx.lengths)
        grads = (g.x_grad, g.h_prev_grad, g.cs_prev_grad, g.w_grad,
                 g.wci_grad, g.wcf_grad, g.wco_grad, g.b_grad)
        out = [_tensor(gr) if n else None for gr, n in zip(grads, need)]
        if not ctx.use_peephole:
            out[4:7] = [None] * 3
        return (*out, None, None, None)


class BlockGRUFunction(torch.autograd.Function):
    """``h = BlockGRUFunction.apply(x, h0, w_ru, w_c, b_ru, b_c, lengths)``.

    x (T, B, I); h0 (B, H); w_ru (I+H, 2H) columns [r | u]; w_c (I+H, H);
    b_ru (2H,); b_c (H,); lengths None or an int64 NumPy array (B,).
    Returns h (T, B, H), zero past each row's length. Backward: ``block_gru_grad``.
    """

    @staticmethod
    def forward(ctx, x, h0, w_ru, w_c, b_ru, b_c, lengths):
        where = "blockrnn.torch.BlockGRUFunction"
        dt = w_ru.dtype
        xa, h0a, wrua, wca, brua, bca = (
            _numpy(where, n, t, dt) for n, t in
            zip(("x", "h0", "w_ru", "w_c", "b_ru", "b_c"), (x, h0, w_ru, w_c, b_ru, b_c)))
        L = steps_to_run(xa.shape[0], lengths)
        fwd = blockrnn.block_gru(L, xa, h0a, wrua, wca, brua, bca, sequence_length=lengths)
        h = _tensor(fwd.h)
        ctx.save_for_backward(x, h0, w_ru, w_c, b_ru, b_c, h)
        ctx.gates = (fwd.r, fwd.u, fwd.c)
        ctx.L, ctx.lengths = L, lengths
        return h

    @staticmethod
    def backward(ctx, dh):
        where = "blockrnn.torch.BlockGRUFunction.backward"
        _first_order_only(where)
        need = ctx.needs_input_grad
        if not any(need[:6]):
            return (None,) * 7
        x, h0, w_ru, w_c, b_ru, b_c, h = (t.detach().numpy() for t in ctx.saved_tensors)
        r, u, c = ctx.gates
        dh = _numpy(where, "grad of h", dh, None).astype(x.dtype, copy=False)
        g = blockrnn.block_gru_grad(ctx.L, x, h0, w_ru, w_c, b_ru, b_c, r, u, c, h, dh,
                                    sequence_length=ctx.lengths)
        grads = (g.x_grad, g.h_prev_grad, g.w_ru_grad, g.w_c_grad, g.b_ru_grad, g.b_c_grad)
        return (*[_tensor(gr) if n else None for gr, n in zip(grads, need)], None)


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


class _RNNBase(nn.Module):
    def __init__(self, input_size, hidden_size, batch_first, dtype):
        super().__init__()
        for name, v in (("input_size", input_size), ("hidden_size", hidden_size)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{type(self).__name__}: {name} must be an int, got "
                                f"{type(v).__name__}")
            if v <= 0:
                raise ValueError(f"{type(self).__name__}: {name} must be positive, got {v}")
        if dtype is None:
            dtype = torch.get_default_dtype()
        if dtype not in _DTYPES:
            raise TypeError(f"{type(self).__name__}: dtype must be torch.float32 or "
                            f"torch.float64, got {dtype}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.batch_first = bool(batch_first)
        self._factory = {"dtype": dtype}

    def reset_parameters(self):
        """Uniform in [-1/sqrt(H), 1/sqrt(H)], as torch.nn.LSTM / nn.GRU."""
        k = 1.0 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-k, k)

    def _input(self, x):
        """x -> (time-major x (T, B, I), batched?) with checks."""
        name = type(self).__name__
        where = f"blockrnn.torch.{name}"
        _numpy(where, "input", x, self._param_dtype())
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_size:
            layout = "(B, T, I)" if self.batch_first else "(T, B, I)"
            raise ValueError(f"{where}: input must have shape {layout} or (T, I) with "
                             f"I = {self.input_size}, got {tuple(x.shape)}")
        if x.dim() == 2:
            return x.unsqueeze(1), False
        return (x.transpose(0, 1) if self.batch_first else x), True

    def _state(self, where, name, s, B, batched):
        H = self.hidden_size
        if s is None:
            return torch.zeros(B, H, **self._factory_now())
        _numpy(where, name, s, self._param_dtype())
        want = (1, B, H) if batched else (1, H)
        if tuple(s.shape) != want:
            raise ValueError(f"{where}: {name} must have shape {want} "
                             f"(num_layers * num_directions = 1), got {tuple(s.shape)}")
        return s[0] if batched else s  # (B, H); unbatched: (1, H) is B = 1

    def _output(self, y, batched):
        if not batched:
            return y[:, 0]
        return y.transpose(0, 1) if self.batch_first else y

    def _param_dtype(self):
        return next(self.parameters()).dtype

    def _factory_now(self):
        return {"dtype": self._param_dtype()}

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.batch_first:
            s += ", batch_first=True"
        return s


class LSTM(_RNNBase):
    """A single-layer LSTM on blockrnn's ``block_lstm_v2``, called like ``nn.LSTM``.

    Parameters
    ----------
    input_size, hidden_size : int
    batch_first : bool, default False
        Input and output are (B, T, ·) instead of (T, B, ·). (h_n, c_n) are
        always (1, B, H).
    use_peephole : bool, default False
    cell_clip : float, default 0.0 (no clipping)
    dtype : torch.float32 / torch.float64, default torch's default dtype

    Parameters (``nn.Parameter``): ``w`` (I+H, 4H), rows [x; h], gate columns
    i, f, g (cell input), o (IFCO = nn.LSTM's order); ``b`` (4H,); with
    ``use_peephole``, ``wci``, ``wcf``, ``wco`` (H,) (otherwise zero buffers).

    ``forward(x, hx=None, sequence_length=None)``: x (T, B, I) (or (B, T, I)
    with batch_first, or unbatched (T, I)); hx None or (h0, c0), each
    (1, B, H) ((1, H) unbatched); sequence_length None or B ints in [0, T].
    Returns ``y, (h_n, c_n)``: y (T, B, H) the h of every step (zero past a
    row's length), h_n and c_n (1, B, H) the state after each row's last step.
    """

    def __init__(self, input_size, hidden_size, batch_first=False, use_peephole=False,
                 cell_clip=0.0, *, dtype=None):
        super().__init__(input_size, hidden_size, batch_first, dtype)
        if not isinstance(use_peephole, bool):
            raise TypeError(f"LSTM: use_peephole must be a bool, got "
                            f"{type(use_peephole).__name__}")
        self.use_peephole = use_peephole
        self.cell_clip = check_float("LSTM", "cell_clip", cell_clip)
        I, H, fk = input_size, hidden_size, self._factory
        self.w = nn.Parameter(torch.empty(I + H, 4 * H, **fk))
        self.b = nn.Parameter(torch.empty(4 * H, **fk))
        for name in ("wci", "wcf", "wco"):
            if use_peephole:
                setattr(self, name, nn.Parameter(torch.empty(H, **fk)))
            else:
                self.register_buffer(name, torch.zeros(H, **fk), persistent=False)
        self.reset_parameters()

    def forward(self, x, hx=None, sequence_length=None):
        where = "blockrnn.torch.LSTM"
        xt, batched = self._input(x)
        T, B = xt.shape[:2]
        if hx is None:
            hx = (None, None)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{where}: hx must be None or a tuple (h0, c0), got "
                            f"{type(hx).__name__}")
        h0 = self._state(where, "h0", hx[0], B, batched)
        c0 = self._state(where, "c0", hx[1], B, batched)
        lengths = _lengths(where, sequence_length, T, B)
        h, cs = BlockLSTMFunction.apply(xt, h0, c0, self.w, self.wci, self.wcf, self.wco,
                                        self.b, self.use_peephole, self.cell_clip, lengths)
        h_n, c_n = _final(h, h0, lengths), _final(cs, c0, lengths)
        if batched:  # (1, B, H) like nn.LSTM; unbatched: (1, H)
            h_n, c_n = h_n.unsqueeze(0), c_n.unsqueeze(0)
        return self._output(h, batched), (h_n, c_n)

    @classmethod
    def from_torch(cls, module):
        """A ``blockrnn.torch.LSTM`` with the weights of a single-layer, unidirectional
        ``torch.nn.LSTM`` (no projection; with or without bias; batch_first kept).

        nn.LSTM's gate order (i, f, g, o) is IFCO, so ``w = [W_ih.T; W_hh.T]`` and
        ``b = b_ih + b_hh`` (zeros without bias; ``b`` is trainable either way).
        The gradient of ``w`` maps back as ``W_ih.grad = w.grad[:I].T``,
        ``W_hh.grad = w.grad[I:].T``; ``b_ih.grad = b_hh.grad = b.grad``.
        """
        a = nn_lstm_arrays(module)
        out = cls(a["input_size"], a["hidden_size"], batch_first=a["batch_first"],
                  dtype=a["torch_dtype"])
        with torch.no_grad():
            out.w.copy_(torch.from_numpy(a["w"]))
            out.b.copy_(torch.from_numpy(a["b"]))
        return out

    def extra_repr(self):
        s = super().extra_repr()
        if self.use_peephole:
            s += ", use_peephole=True"
        if self.cell_clip > 0:
            s += f", cell_clip={self.cell_clip}"
        return s


class GRU(_RNNBase):
    """A single-layer GRU on blockrnn's ``block_gru``, called like ``nn.GRU``.

    The math is TensorFlow's GRUBlockCell: ``r, u = sigmoid([x, h] @ w_ru + b_ru)``,
    ``c = tanh([x, r * h] @ w_c + b_c)``, ``h' = u * h + (1 - u) * c`` (reset
    before the recurrent matmul; nn.GRU resets after it, so nn.GRU weights
    cannot be converted).

    Parameters (``nn.Parameter``): ``w_ru`` (I+H, 2H) columns [r | u], ``w_c``
    (I+H, H), ``b_ru`` (2H,), ``b_c`` (H,).

    ``forward(x, hx=None, sequence_length=None)``: x (T, B, I) (or (B, T, I)
    with batch_first, or (T, I)); hx None or h0 (1, B, H). Returns ``y, h_n``:
    y (T, B, H), h_n (1, B, H).
    """

    def __init__(self, input_size, hidden_size, batch_first=False, *, dtype=None):
        super().__init__(input_size, hidden_size, batch_first, dtype)
        I, H, fk = input_size, hidden_size, self._factory
        self.w_ru = nn.Parameter(torch.empty(I + H, 2 * H, **fk))
        self.w_c = nn.Parameter(torch.empty(I + H, H, **fk))
        self.b_ru = nn.Parameter(torch.empty(2 * H, **fk))
        self.b_c = nn.Parameter(torch.empty(H, **fk))
        self.reset_parameters()

    def forward(self, x, hx=None, sequence_length=None):
        where = "blockrnn.torch.GRU"
        xt, batched = self._input(x)
        T, B = xt.shape[:2]
        h0 = self._state(where, "hx", hx, B, batched)
        lengths = _lengths(where, sequence_length, T, B)
        h = BlockGRUFunction.apply(xt, h0, self.w_ru, self.w_c, self.b_ru, self.b_c, lengths)
        h_n = _final(h, h0, lengths)
        return self._output(h, batched), (h_n.unsqueeze(0) if batched else h_n)
