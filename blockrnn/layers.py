"""Trainable NumPy layers over blockrnn's sequence ops: ``LSTM`` and ``GRU``.

Each layer holds its parameters as NumPy arrays in TensorFlow's layouts and
runs a whole time-major sequence through one fused op per direction:

* ``LSTM``: ``block_lstm_v2`` / ``block_lstm_grad_v2`` (IFCO gate columns, no
  forget bias, optional peepholes and cell clipping).
* ``GRU``: ``block_gru`` / ``block_gru_grad`` (GRUBlockCell's reset-before GRU,
  ``h = u * h_prev + (1 - u) * c``).

Shapes: ``T`` time steps, ``B`` batch, ``I`` input size, ``H`` hidden size.
Inputs are time-major, ``x`` of shape (T, B, I).

The calling convention is explicit (no autograd)::

    y, state, ctx = layer.forward(x, state)       # y (T, B, H)
    dx, dstate0 = layer.backward(ctx, dy, dstate)  # fills layer.grads
    for name, p in layer.params.items():
        p -= lr * layer.grads[name]                # in-place update

``layer.params`` maps names to the parameter arrays themselves (update them
in place, or assign new arrays to the attributes: ``params`` always reflects
the attributes); ``layer.grads`` has the same keys and arrays of the same
shapes, and every ``backward`` call OVERWRITES them in place (it does not
accumulate; the dict and its arrays stay the same objects). ``y`` is the
caller's own array: changing it does not change what ``backward`` computes.

LSTM state is the tuple ``(h, c)``, in that order (as ``torch.nn.LSTM``'s
``(h_n, c_n)``); GRU state is the array ``h``. Either may be None (zeros).

``sequence_length`` (an integer vector of shape (B,), 0 <= len_b <= T) makes
row b stop after ``len_b`` steps: its outputs at later steps are zero and its
final state is the state after step ``len_b - 1`` (the initial state when
``len_b == 0``).
"""
import numbers
from collections import namedtuple

import numpy as np

import blockrnn  # the ops are looked up at call time (blockrnn imports this module)
from blockrnn._validation import check_float, check_sequence_length, native, steps_to_run

__all__ = ["LSTM", "GRU", "LSTMContext", "GRUContext"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

LSTMContext = namedtuple("LSTMContext", "x h0 c0 fwd seq_len_max lengths")
LSTMContext.__doc__ = """What ``LSTM.backward`` needs from ``LSTM.forward`` (treat as opaque).

x (T, B, I), h0 and c0 (B, H), fwd the BlockLSTMOutput of block_lstm_v2
(each (T, B, H)), seq_len_max the number of steps run, lengths None or the
per-row step counts (B,) int64."""

GRUContext = namedtuple("GRUContext", "x h0 fwd seq_len_max lengths")
GRUContext.__doc__ = """What ``GRU.backward`` needs from ``GRU.forward`` (treat as opaque).

x (T, B, I), h0 (B, H), fwd the BlockGRUOutput of block_gru (each (T, B, H)),
seq_len_max, lengths None or the per-row step counts (B,) int64."""


# --------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------

def _check_size(cls, name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{cls}: {name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{cls}: {name} must be positive, got {value}")
    return int(value)


def _check_dtype(cls, dtype):
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{cls}: dtype must be float32 or float64, got {dtype!r}") from exc
    if dt not in _DTYPES:
        raise TypeError(f"{cls}: dtype must be float32 or float64, got {dt}")
    return dt


def _array(where, name, value, dtype, shape):
    """``value`` as an array of ``dtype`` and ``shape`` (a tuple; None entries are free).

    Arrays that carry a dtype must already have ``dtype`` (no silent casts);
    Python lists and scalars are converted."""
    if value is None:
        raise TypeError(f"{where}: {name} is required, got None")
    if hasattr(value, "dtype"):
        arr = native(np.asarray(value))
        if arr.dtype != dtype:
            raise TypeError(f"{where}: {name} must have dtype {dtype} (the layer's dtype), "
                            f"got {arr.dtype}")
    else:
        try:
            arr = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{where}: {name} cannot be converted to a {dtype} array "
                            f"({exc})") from exc
    if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
        want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + \
            ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{where}: {name} must have shape {want}, got {arr.shape}")
    return arr


def _last(seq, init, lengths):
    """Final state: seq[n_b - 1, b] per row (init[b] when n_b == 0); a new array."""
    T = seq.shape[0]
    if lengths is None:
        return seq[T - 1].copy() if T else init.copy()
    out = init.copy()
    rows = np.nonzero(lengths > 0)[0]
    out[rows] = seq[lengths[rows] - 1, rows]
    return out


def _route(seq_grad, init_grad, dfinal, lengths):
    """Add the gradient of the final state into seq_grad (T, B, H) at [n_b - 1, b],
    or into init_grad (B, H) for rows with n_b == 0 (both modified in place)."""
    if dfinal is None:
        return
    T = seq_grad.shape[0]
    if lengths is None:
        if T:
            seq_grad[T - 1] += dfinal
        else:
            init_grad += dfinal
        return
    rows = np.nonzero(lengths > 0)[0]
    seq_grad[lengths[rows] - 1, rows] += dfinal[rows]
    empty = lengths == 0
    init_grad[empty] += dfinal[empty]


def _uniform(rng, shape, scale, dtype):
    return rng.uniform(-scale, scale, size=shape).astype(dtype)


class _Layer:
    """Common parts of LSTM and GRU."""

    _param_names = ()

    @property
    def params(self):
        """dict name -> parameter array (the layer's own arrays: update in place)."""
        return {name: getattr(self, name) for name in self._param_names}

    def _x(self, x):
        x = _array(f"{type(self).__name__}.forward", "x", x, self.dtype,
                   (None, None, self.input_size))
        return x, x.shape[0], x.shape[1]

    def _dy(self, dy, T, B):
        where = f"{type(self).__name__}.backward"
        if dy is None:
            return np.zeros((T, B, self.hidden_size), self.dtype)
        dy = _array(where, "dy", dy, self.dtype, (T, B, self.hidden_size))
        return np.array(dy, dtype=self.dtype, order="C", copy=True)

    def _fill_grads(self, **grads):
        """Overwrite ``self.grads`` in place with the gradients of the parameters: the
        same dict and, where the shapes still match, the same arrays, so that an
        optimizer holding a reference to either sees every new gradient."""
        for name in self._param_names:
            old, new = self.grads.get(name), grads[name]
            if isinstance(old, np.ndarray) and old.shape == new.shape and old.dtype == new.dtype:
                old[...] = new
            else:
                self.grads[name] = new

    def _state_part(self, where, name, value, B):
        if value is None:
            return None
        return _array(where, name, value, self.dtype, (B, self.hidden_size))

    def __repr__(self):
        return (f"{type(self).__name__}(input_size={self.input_size}, "
                f"hidden_size={self.hidden_size}, dtype={self.dtype.name})")


class LSTM(_Layer):
    """An LSTM layer on ``block_lstm_v2`` (TensorFlow's BlockLSTMV2 math).

    Parameters
    ----------
    input_size, hidden_size : int
        I and H.
    use_peephole : bool, default False
        Add the peephole terms ``wci * c_prev``, ``wcf * c_prev``, ``wco * c``.
    cell_clip : float, default 0.0
        Clip the cell state to [-cell_clip, cell_clip]; <= 0 disables it. As in
        TensorFlow the gradient ignores the clip (straight-through).
    dtype : float32 (default) or float64
    seed : int or None
        Seed of the initialisation.

    Attributes
    ----------
    w : (I+H, 4H) array
        Rows 0:I multiply x[t], rows I:I+H multiply h[t-1]; columns are the
        gate blocks i, f, c (cell input), o (IFCO) of H columns each.
    b : (4H,) array, IFCO. No forget bias is added (BlockLSTMV2).
    wci, wcf, wco : (H,) arrays
        Peephole weights; zeros and not in ``params`` without peepholes.
    params, grads : dicts
        ``w``, ``b`` (and ``wci``, ``wcf``, ``wco`` with peepholes);
        ``grads`` is overwritten in place by every ``backward``.

    All parameters are initialised uniform in [-1/sqrt(H), 1/sqrt(H)] (as
    PyTorch's nn.LSTM and blockrnn.torch.LSTM).
    """

    def __init__(self, input_size, hidden_size, *, use_peephole=False, cell_clip=0.0,
                 dtype=np.float32, seed=None):
        self.input_size = _check_size("LSTM", "input_size", input_size)
        self.hidden_size = H = _check_size("LSTM", "hidden_size", hidden_size)
        if not isinstance(use_peephole, (bool, np.bool_)):
            raise TypeError(f"LSTM: use_peephole must be a bool, got "
                            f"{type(use_peephole).__name__}")
        self.use_peephole = bool(use_peephole)
        self.cell_clip = check_float("LSTM", "cell_clip", cell_clip)
        self.dtype = _check_dtype("LSTM", dtype)
        rng = np.random.default_rng(seed)
        k = 1.0 / np.sqrt(H)
        I = self.input_size
        self.w = _uniform(rng, (I + H, 4 * H), k, self.dtype)
        self.b = _uniform(rng, (4 * H,), k, self.dtype)
        if self.use_peephole:
            self.wci, self.wcf, self.wco = (_uniform(rng, (H,), k, self.dtype) for _ in range(3))
        else:
            self.wci, self.wcf, self.wco = (np.zeros(H, self.dtype) for _ in range(3))
        self.grads = {name: np.zeros_like(p) for name, p in self.params.items()}

    @property
    def _param_names(self):
        return ("w", "b", "wci", "wcf", "wco") if self.use_peephole else ("w", "b")

    def forward(self, x, state=None, sequence_length=None):
        """Run the LSTM over a time-major sequence.

        Parameters
        ----------
        x : array (T, B, I) of the layer's dtype
        state : None or tuple (h0, c0), each (B, H)
            Initial output and cell state; None (or a None entry) means zeros.
        sequence_length : None or integer array (B,), 0 <= len_b <= T
            Steps to run per row; later outputs are zero.

        Returns
        -------
        y : array (T, B, H)
            h at every step (zero past a row's length).
        state : tuple (h_n, c_n), each (B, H)
            The final output and cell state of each row.
        context : LSTMContext
            Pass to ``backward``.
        """
        where = "LSTM.forward"
        x, T, B = self._x(x)
        h0, c0 = self._unpack(where, "state", state, B)
        lengths = check_sequence_length(where, sequence_length, B, T)
        L = steps_to_run(T, lengths)
        fwd = blockrnn.block_lstm_v2(L, x, c0, h0, self.w, self.wci, self.wcf, self.wco,
                                     self.b, cell_clip=self.cell_clip,
                                     use_peephole=self.use_peephole, sequence_length=lengths)
        state_n = (_last(fwd.h, h0, lengths), _last(fwd.cs, c0, lengths))
        # y is a copy: backward reads fwd.h, which the caller must not be able to change.
        return fwd.h.copy(), state_n, LSTMContext(x, h0, c0, fwd, L, lengths)

    __call__ = forward

    def _unpack(self, where, name, state, B, zeros=True):
        if state is None:
            h = c = None
        else:
            if not isinstance(state, (tuple, list)) or len(state) != 2:
                raise TypeError(f"{where}: {name} must be None or a tuple (h, c), got "
                                f"{type(state).__name__}")
            h = self._state_part(where, f"{name}[0] (h)", state[0], B)
            c = self._state_part(where, f"{name}[1] (c)", state[1], B)
        if zeros:
            H = self.hidden_size
            h = np.zeros((B, H), self.dtype) if h is None else h
            c = np.zeros((B, H), self.dtype) if c is None else c
        return h, c

    def backward(self, context, dy, dstate=None):
        """Gradients of a loss, given its gradients w.r.t. ``forward``'s outputs.

        Parameters
        ----------
        context : LSTMContext from ``forward``
        dy : None or array (T, B, H)
            dLoss/dy; None means zeros. Entries past a row's length are ignored.
        dstate : None or tuple (dh_n, dc_n), each None or (B, H)
            dLoss/d(final state).

        Returns
        -------
        dx : array (T, B, I)
        dstate0 : tuple (dh0, dc0), each (B, H)
            dLoss/d(initial state).

        Fills ``self.grads`` in place (overwriting its arrays) with dLoss/d(parameter).
        Cell clipping is ignored by the gradient, as in TensorFlow.
        """
        where = "LSTM.backward"
        if not isinstance(context, LSTMContext):
            raise TypeError(f"{where}: context must be the LSTMContext returned by "
                            f"LSTM.forward, got {type(context).__name__}")
        x, h0, c0, fwd, L, lengths = context
        T, B = x.shape[:2]
        h_grad = self._dy(dy, T, B)
        cs_grad = np.zeros_like(h_grad)
        dh_n, dc_n = self._unpack(where, "dstate", dstate, B, zeros=False)
        dh0_extra = np.zeros((B, self.hidden_size), self.dtype)
        dc0_extra = np.zeros_like(dh0_extra)
        _route(h_grad, dh0_extra, dh_n, lengths)
        _route(cs_grad, dc0_extra, dc_n, lengths)
        g = blockrnn.block_lstm_grad_v2(
            L, x, c0, h0, self.w, self.wci, self.wcf, self.wco, self.b, *fwd,
            cs_grad, h_grad, use_peephole=self.use_peephole, sequence_length=lengths)
        self._fill_grads(w=g.w_grad, b=g.b_grad, wci=g.wci_grad, wcf=g.wcf_grad,
                         wco=g.wco_grad)
        return g.x_grad, (g.h_prev_grad + dh0_extra, g.cs_prev_grad + dc0_extra)


class GRU(_Layer):
    """A GRU layer on ``block_gru`` (TensorFlow's GRUBlockCell math, reset-before).

    ``r = sigmoid([x, h] @ w_ru[:, :H] + b_ru[:H])``,
    ``u = sigmoid([x, h] @ w_ru[:, H:] + b_ru[H:])``,
    ``c = tanh([x, r * h] @ w_c + b_c)``, ``h' = u * h + (1 - u) * c``.

    Parameters
    ----------
    input_size, hidden_size : int
        I and H.
    dtype : float32 (default) or float64
    seed : int or None

    Attributes
    ----------
    w_ru : (I+H, 2H) array, columns [r | u]; rows 0:I multiply x, I:I+H multiply h.
    w_c : (I+H, H) array; rows 0:I multiply x, I:I+H multiply r * h.
    b_ru : (2H,) array; b_c : (H,) array.
    params, grads : dicts with these four names; ``grads`` is overwritten in
        place by every ``backward``.

    All parameters are initialised uniform in [-1/sqrt(H), 1/sqrt(H)].
    """

    _param_names = ("w_ru", "w_c", "b_ru", "b_c")

    def __init__(self, input_size, hidden_size, *, dtype=np.float32, seed=None):
        self.input_size = I = _check_size("GRU", "input_size", input_size)
        self.hidden_size = H = _check_size("GRU", "hidden_size", hidden_size)
        self.dtype = _check_dtype("GRU", dtype)
        rng = np.random.default_rng(seed)
        k = 1.0 / np.sqrt(H)
        self.w_ru = _uniform(rng, (I + H, 2 * H), k, self.dtype)
        self.w_c = _uniform(rng, (I + H, H), k, self.dtype)
        self.b_ru = _uniform(rng, (2 * H,), k, self.dtype)
        self.b_c = _uniform(rng, (H,), k, self.dtype)
        self.grads = {name: np.zeros_like(p) for name, p in self.params.items()}

    def forward(self, x, state=None, sequence_length=None):
        """Run the GRU over a time-major sequence.

        Parameters
        ----------
        x : array (T, B, I) of the layer's dtype
        state : None or array h0 (B, H)
        sequence_length : None or integer array (B,), 0 <= len_b <= T

        Returns
        -------
        y : array (T, B, H)
            h at every step (zero past a row's length).
        state : array h_n (B, H)
        context : GRUContext
        """
        where = "GRU.forward"
        x, T, B = self._x(x)
        h0 = self._state_part(where, "state", state, B)
        h0 = np.zeros((B, self.hidden_size), self.dtype) if h0 is None else h0
        lengths = check_sequence_length(where, sequence_length, B, T)
        L = steps_to_run(T, lengths)
        fwd = blockrnn.block_gru(L, x, h0, self.w_ru, self.w_c, self.b_ru, self.b_c,
                                 sequence_length=lengths)
        # y is a copy: backward reads fwd.h, which the caller must not be able to change.
        return fwd.h.copy(), _last(fwd.h, h0, lengths), GRUContext(x, h0, fwd, L, lengths)

    __call__ = forward

    def backward(self, context, dy, dstate=None):
        """Gradients of a loss, given its gradients w.r.t. ``forward``'s outputs.

        Parameters
        ----------
        context : GRUContext from ``forward``
        dy : None or array (T, B, H)
        dstate : None or array dh_n (B, H)

        Returns
        -------
        dx : array (T, B, I)
        dstate0 : array dh0 (B, H)

        Fills ``self.grads`` in place (overwriting its arrays).
        """
        where = "GRU.backward"
        if not isinstance(context, GRUContext):
            raise TypeError(f"{where}: context must be the GRUContext returned by "
                            f"GRU.forward, got {type(context).__name__}")
        x, h0, fwd, L, lengths = context
        T, B = x.shape[:2]
        h_grad = self._dy(dy, T, B)
        dh_n = self._state_part(where, "dstate", dstate, B)
        dh0_extra = np.zeros((B, self.hidden_size), self.dtype)
        _route(h_grad, dh0_extra, dh_n, lengths)
        g = blockrnn.block_gru_grad(L, x, h0, self.w_ru, self.w_c, self.b_ru, self.b_c,
                                    *fwd, h_grad, sequence_length=lengths)
        self._fill_grads(w_ru=g.w_ru_grad, w_c=g.w_c_grad, b_ru=g.b_ru_grad, b_c=g.b_c_grad)
        return g.x_grad, g.h_prev_grad + dh0_extra
