"""Trainable NumPy layers over blockrnn's sequence ops: ``LSTM`` and ``GRU``.

Each layer holds its parameters as NumPy arrays in TensorFlow's layouts and
runs a whole time-major sequence through one fused op per layer and direction:

* ``LSTM``: ``block_lstm_v2`` / ``block_lstm_grad_v2`` (IFCO gate columns, no
  forget bias, optional peepholes and cell clipping).
* ``GRU``: by default nn.GRU's reset-after GRU (``block_gru_reset_after`` and
  its gradient; parameters named and laid out as nn.GRU's); with
  ``reset_after=False`` GRUBlockCell's reset-before GRU (``block_gru`` /
  ``block_gru_grad``, ``h = u * h_prev + (1 - u) * c``).

Like ``torch.nn.LSTM``, a layer may stack ``num_layers`` layers (layer k > 0
reads layer k-1's output) and be ``bidirectional``: each layer then also runs
a reverse direction over every row's valid prefix backwards
(``blockrnn.reverse_sequence``), and its output is ``[forward | reverse]``
along the last axis. ``D`` = 2 if bidirectional else 1.

Shapes: ``T`` time steps, ``B`` batch, ``I`` input size, ``H`` hidden size,
``L`` num_layers. Inputs are time-major, ``x`` of shape (T, B, I); the output
``y`` is (T, B, D*H); states are (L*D, B, H) as nn.LSTM's, entry
``layer * D + direction`` (forward 0, reverse 1).

The calling convention is explicit (no autograd)::

    y, state, ctx = layer.forward(x, state)       # y (T, B, D*H)
    dx, dstate0 = layer.backward(ctx, dy, dstate)  # fills layer.grads
    for name, p in layer.params.items():
        p -= lr * layer.grads[name]                # in-place update

``layer.params`` maps names to the parameter arrays themselves (update them
in place, or assign new arrays to the attributes: ``params`` always reflects
the attributes); ``layer.grads`` has the same keys and arrays of the same
shapes, and every ``backward`` call OVERWRITES them in place (it does not
accumulate; the dict and its arrays stay the same objects). ``y`` is the
caller's own array: changing it does not change what ``backward`` computes.

Parameter names follow nn.LSTM's suffixes (the reset-after GRU's are nn.GRU's
own, ``weight_ih_l0``, ...): ``w_l0``, ``b_l0``, ... for layer 0,
``w_l0_reverse``, ... for its reverse direction, always suffixed (also with one
layer and one direction); ``params`` is ordered layer by layer, forward before
reverse.

LSTM state is the tuple ``(h, c)``, in that order (as ``torch.nn.LSTM``'s
``(h_n, c_n)``); GRU state is the array ``h``. Either may be None (zeros).

``sequence_length`` (an integer vector of shape (B,), 0 <= len_b <= T) makes
row b stop after ``len_b`` steps: its outputs at later steps are zero and its
final state is the state after step ``len_b - 1`` (the initial state when
``len_b == 0``); the reverse direction reads steps ``len_b - 1`` down to 0,
and its final state is the one after step 0.
"""
import numbers
from collections import namedtuple

import numpy as np

import blockrnn  # the ops are looked up at call time (blockrnn imports this module)
from blockrnn._validation import check_float, check_sequence_length, native, steps_to_run
from blockrnn.sequence import reverse_sequence, reverse_sequence_in_place

__all__ = ["LSTM", "GRU", "LSTMContext", "GRUContext"]

_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

LSTMContext = namedtuple("LSTMContext", "runs seq_len_max lengths")
LSTMContext.__doc__ = """What ``LSTM.backward`` needs from ``LSTM.forward`` (treat as opaque).

runs: one ``(x, (h0, c0), out)`` per layer and direction (index ``layer * D +
direction``): the op's input x (T, B, I_k) (time-reversed per row for the
reverse direction), its initial states (B, H) and its BlockLSTMOutput (each
(T, B, H)); seq_len_max the number of steps run; lengths None or the per-row
step counts (B,) int64."""

GRUContext = namedtuple("GRUContext", "runs seq_len_max lengths")
GRUContext.__doc__ = """What ``GRU.backward`` needs from ``GRU.forward`` (treat as opaque).

runs: one ``(x, (h0,), out)`` per layer and direction, out the
BlockGRUResetAfterOutput of block_gru_reset_after (BlockGRUOutput of block_gru
with reset_after=False), each (T, B, H); seq_len_max; lengths None or (B,)
int64."""


# --------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------

def _check_size(cls, name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{cls}: {name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{cls}: {name} must be positive, got {value}")
    return int(value)


def _check_bool(cls, name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{cls}: {name} must be a bool, got {type(value).__name__}")
    return bool(value)


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


def _runs_repr(runs):
    return "[" + ", ".join(f"({i}, {h}, {dt})" for i, h, dt in runs) + "]"


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
    """Common parts of LSTM and GRU: the loop over layers and directions.

    A subclass gives ``_state_names`` (("h", "c") or ("h",)), ``_shapes(I_k)``
    (name -> shape of one direction's parameters), ``_op`` and ``_op_grad``
    (one direction of one layer), ``_context`` and ``_pack``/``_unpack`` of
    the user-facing state."""

    def __init__(self, cls, input_size, hidden_size, num_layers, bidirectional, dtype, seed):
        self.input_size = _check_size(cls, "input_size", input_size)
        self.hidden_size = H = _check_size(cls, "hidden_size", hidden_size)
        self.num_layers = _check_size(cls, "num_layers", num_layers)
        self.bidirectional = _check_bool(cls, "bidirectional", bidirectional)
        self.dtype = _check_dtype(cls, dtype)
        self._seed = seed

    def _init_params(self):
        """Create every parameter, uniform in [-1/sqrt(H), 1/sqrt(H)], in ``params`` order."""
        H, D = self.hidden_size, self.num_directions
        rng = np.random.default_rng(self._seed)
        self._specs = {}   # (k, s) -> ((base name, name, shape), ...) of layer k, direction s
        for k in range(self.num_layers):
            I_k = self.input_size if k == 0 else D * H
            for s in self._suffixes:
                self._specs[k, s] = tuple((base, f"{base}_l{k}{s}", shape)
                                          for base, shape in self._shapes(I_k).items())
                for _, name, shape in self._specs[k, s]:
                    setattr(self, name, _uniform(rng, shape, 1.0 / np.sqrt(H), self.dtype))
        self._param_names = tuple(name for spec in self._specs.values() for _, name, _ in spec)
        self.grads = {name: np.zeros_like(p) for name, p in self.params.items()}

    @property
    def num_directions(self):
        return 2 if self.bidirectional else 1

    @property
    def _suffixes(self):
        return ("", "_reverse") if self.bidirectional else ("",)

    @property
    def params(self):
        """dict name -> parameter array (the layer's own arrays: update in place)."""
        return {name: getattr(self, name) for name in self._param_names}

    def _checked(self, where, k, s):
        """Layer k, direction suffix s's parameters {base name: array}, each checked to be
        an array of the layer's dtype and shape (a user may have assigned anything to the
        attribute), so that an error names the parameter, not the op's argument."""
        out = {}
        for base, name, shape in self._specs[k, s]:
            a = getattr(self, name)
            if not (type(a) is np.ndarray and a.dtype == self.dtype and a.shape == shape):
                a = _array(where, name, a, self.dtype, shape)   # or raise
            out[base] = a
        return out

    def _checked_params(self, where):
        """``params``, every array checked as by ``_checked``."""
        return {f"{base}_l{k}{s}": a for k in range(self.num_layers) for s in self._suffixes
                for base, a in self._checked(where, k, s).items()}

    def _states(self, where, name, value, B, zeros):
        """The user's state (tuple or array) as a list of (L*D, B, H) arrays (None entries
        become zeros when ``zeros``)."""
        parts = self._unpack(where, name, value)
        shape = (self.num_layers * self.num_directions, B, self.hidden_size)
        out = []
        for part_name, part in zip(self._state_part_names(name), parts):
            if part is not None:
                part = _array(where, part_name, part, self.dtype, shape)
            elif zeros:
                part = np.zeros(shape, self.dtype)
            out.append(part)
        return out

    def forward(self, x, state=None, sequence_length=None):
        """Run the layer over a time-major sequence.

        Parameters
        ----------
        x : array (T, B, I) of the layer's dtype
        state : None, or the initial state: LSTM a tuple (h0, c0), GRU an array h0,
            each (L*D, B, H); None (or a None entry) means zeros.
        sequence_length : None or integer array (B,), 0 <= len_b <= T
            Steps to run per row; later outputs are zero.

        Returns
        -------
        y : array (T, B, D*H)
            The last layer's h at every step, [forward | reverse] (zero past a
            row's length).
        state : the final state (LSTM tuple (h_n, c_n), GRU h_n), each (L*D, B, H):
            the state after each row's last step, per layer and direction.
        context : LSTMContext / GRUContext
            Pass to ``backward``.
        """
        where = f"{type(self).__name__}.forward"
        x = _array(where, "x", x, self.dtype, (None, None, self.input_size))
        T, B = x.shape[:2]
        init = self._states(where, "state", state, B, zeros=True)
        lengths = check_sequence_length(where, sequence_length, B, T)
        L = steps_to_run(T, lengths)
        D = self.num_directions
        final = [np.empty_like(s) for s in init]
        runs, inp = [], x
        for k in range(self.num_layers):
            outs = []
            for d, s in enumerate(self._suffixes):
                xin = inp if d == 0 else reverse_sequence(inp, lengths)
                s0 = tuple(part[k * D + d] for part in init)
                out = self._op(where, k, s, L, xin, s0, lengths)
                for f, seq, s0_part in zip(final, self._sequences(out), s0):
                    f[k * D + d] = _last(seq, s0_part, lengths)
                outs.append(out.h if d == 0 else reverse_sequence(out.h, lengths))
                runs.append((xin, s0, out))
            inp = outs[0] if D == 1 else np.concatenate(outs, axis=-1)
        # y is a copy: backward reads out.h, which the caller must not be able to change.
        y = inp.copy() if D == 1 else inp
        return y, self._pack(final), self._context(tuple(runs), L, lengths)

    __call__ = forward

    def inference(self, max_threads=None):
        """A frozen copy of this layer for inference, its weights packed once:
        ``blockrnn.LSTMInference`` / ``blockrnn.GRUInference`` (blockrnn/inference.py),
        called as ``y, state = obj(x, state=None, sequence_length=None)``, which
        computes ``forward``'s y and state and nothing else. It holds a COPY of the
        weights: later updates of this layer are not seen; call ``inference()``
        again to serve them. ``max_threads`` (default: OpenMP's maximum) bounds the
        threads one call takes from blockrnn's thread budget."""
        from blockrnn.inference import GRUInference, LSTMInference
        return (LSTMInference if isinstance(self, LSTM) else GRUInference)(self, max_threads)

    def backward(self, context, dy, dstate=None):
        """Gradients of a loss, given its gradients w.r.t. ``forward``'s outputs.

        Parameters
        ----------
        context : the LSTMContext / GRUContext from this layer's ``forward`` (one from
            a layer of another configuration is refused)
        dy : None or array (T, B, D*H)
            dLoss/dy; None means zeros. Entries past a row's length are ignored.
        dstate : None, or dLoss/d(final state): LSTM a tuple (dh_n, dc_n), GRU an
            array dh_n, each None or (L*D, B, H).

        Returns
        -------
        dx : array (T, B, I)
        dstate0 : dLoss/d(initial state), LSTM a tuple (dh0, dc0), GRU dh0,
            each (L*D, B, H).

        Fills ``self.grads`` in place (overwriting its arrays) with dLoss/d(parameter).
        An LSTM's cell clipping is ignored by the gradient, as in TensorFlow.
        """
        cls = type(self).__name__
        where = f"{cls}.backward"
        if not isinstance(context, self._context):
            raise TypeError(f"{where}: context must be the {cls}Context returned by "
                            f"{cls}.forward, got {type(context).__name__}")
        runs, L, lengths = context
        H, D = self.hidden_size, self.num_directions
        # (input size, hidden size, dtype) of each run: a context from another layer's
        # forward would run this layer's weights on that layer's activations
        want = [(self.input_size if k == 0 else D * H, H, self.dtype)
                for k in range(self.num_layers) for _ in range(D)]
        got = [(x.shape[2], h0.shape[1], x.dtype) for x, (h0, *_), _ in runs]
        if got != want:
            raise ValueError(f"{where}: context is not from this layer's forward: its runs "
                             f"have (input size, hidden size, dtype) {_runs_repr(got)}, this "
                             f"layer's {_runs_repr(want)}")
        T, B = runs[0][0].shape[:2]
        if dy is None:
            dout = np.zeros((T, B, D * H), self.dtype)
        else:
            dout = _array(where, "dy", dy, self.dtype, (T, B, D * H))
        dfinal = self._states(where, "dstate", dstate, B, zeros=False)
        dinit = [np.empty((self.num_layers * D, B, H), self.dtype) for _ in dfinal]
        grads = {}
        for k in reversed(range(self.num_layers)):
            dinp = None
            for d, s in enumerate(self._suffixes):
                xin, s0, out = runs[k * D + d]
                dy_d = dout[..., d * H:(d + 1) * H]
                # in the op's time order, and a copy of our own (_route adds into it;
                # reverse_sequence always returns a new array)
                dy_d = reverse_sequence(dy_d, lengths) if d else np.array(dy_d, order="C")
                seq_grads = [dy_d] + [np.zeros_like(dy_d) for _ in dfinal[1:]]
                extra = [np.zeros((B, H), self.dtype) for _ in dfinal]
                for sg, e, df in zip(seq_grads, extra, dfinal):
                    _route(sg, e, None if df is None else df[k * D + d], lengths)
                dx, ds0, named = self._op_grad(where, k, s, L, xin, s0, out, seq_grads,
                                               lengths)
                for di, g, e in zip(dinit, ds0, extra):
                    di[k * D + d] = g + e
                grads.update(named)
                dx = dx if d == 0 else reverse_sequence_in_place(dx, lengths)   # dx: new
                dinp = dx if dinp is None else dinp + dx
            dout = dinp
        self._fill_grads(grads)
        return dout, self._pack(dinit)

    def _fill_grads(self, grads):
        """Overwrite ``self.grads`` in place with the gradients of the parameters: the
        same dict and, where the shapes still match, the same arrays, so that an
        optimizer holding a reference to either sees every new gradient."""
        for name in self._param_names:
            old, new = self.grads.get(name), grads[name]
            if isinstance(old, np.ndarray) and old.shape == new.shape and old.dtype == new.dtype:
                old[...] = new
            else:
                self.grads[name] = new

    def __repr__(self):
        s = (f"{type(self).__name__}(input_size={self.input_size}, "
             f"hidden_size={self.hidden_size}")
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s + f"{self._extra_repr()}, dtype={self.dtype.name})"

    def _extra_repr(self):
        return ""


class LSTM(_Layer):
    """A (stacked, optionally bidirectional) LSTM on ``block_lstm_v2`` (BlockLSTMV2 math).

    Parameters
    ----------
    input_size, hidden_size : int
        I and H.
    num_layers : int, default 1
        L stacked layers; layer k > 0 reads layer k-1's output (T, B, D*H).
    bidirectional : bool, default False
        Each layer also runs a reverse direction over each row's valid prefix
        backwards; the output is [forward | reverse] (T, B, 2H).
    use_peephole : bool, default False
        Add the peephole terms ``wci * c_prev``, ``wcf * c_prev``, ``wco * c``
        (every layer and direction).
    cell_clip : float, default 0.0
        Clip the cell state to [-cell_clip, cell_clip]; <= 0 disables it. As in
        TensorFlow the gradient ignores the clip (straight-through).
    dtype : float32 (default) or float64
    seed : int or None
        Seed of the initialisation.

    Attributes
    ----------
    w_l{k}[_reverse] : (I_k+H, 4H) array
        Rows 0:I_k multiply the layer's input x[t] (I_0 = I, I_k = D*H for
        k > 0), rows I_k:I_k+H multiply h[t-1]; columns are the gate blocks i,
        f, c (cell input), o (IFCO) of H columns each.
    b_l{k}[_reverse] : (4H,) array, IFCO. No forget bias is added (BlockLSTMV2).
    wci_l{k}, wcf_l{k}, wco_l{k} [_reverse] : (H,) arrays
        Peephole weights, only with ``use_peephole``.
    params, grads : dicts
        ``w_l0``, ``b_l0`` (``wci_l0``, ``wcf_l0``, ``wco_l0``), then
        ``..._l0_reverse``, ``..._l1``, ...; ``grads`` is overwritten in place
        by every ``backward``.

    All parameters are initialised uniform in [-1/sqrt(H), 1/sqrt(H)] (as
    PyTorch's nn.LSTM and blockrnn.torch.LSTM).
    """

    _context = LSTMContext

    def __init__(self, input_size, hidden_size, num_layers=1, *, bidirectional=False,
                 use_peephole=False, cell_clip=0.0, dtype=np.float32, seed=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bidirectional, dtype,
                         seed)
        self.use_peephole = _check_bool("LSTM", "use_peephole", use_peephole)
        self.cell_clip = check_float("LSTM", "cell_clip", cell_clip)
        self._no_peephole = np.zeros(self.hidden_size, self.dtype)   # the op's wci/wcf/wco
        self._init_params()

    def _shapes(self, I_k):
        H = self.hidden_size
        shapes = {"w": (I_k + H, 4 * H), "b": (4 * H,)}
        if self.use_peephole:
            shapes.update(wci=(H,), wcf=(H,), wco=(H,))
        return shapes

    def _weights(self, where, k, s):
        """w, wci, wcf, wco, b of layer k, direction suffix s (zeros without peepholes)."""
        p = self._checked(where, k, s)
        peep = ([p["wci"], p["wcf"], p["wco"]] if self.use_peephole
                else [self._no_peephole] * 3)
        return (p["w"], *peep, p["b"])

    def _op(self, where, k, s, L, x, s0, lengths):
        h0, c0 = s0
        return blockrnn.block_lstm_v2(L, x, c0, h0, *self._weights(where, k, s),
                                      cell_clip=self.cell_clip,
                                      use_peephole=self.use_peephole, sequence_length=lengths)

    @staticmethod
    def _sequences(out):
        return out.h, out.cs

    def _op_grad(self, where, k, s, L, x, s0, out, seq_grads, lengths):
        h0, c0 = s0
        h_grad, cs_grad = seq_grads
        g = blockrnn.block_lstm_grad_v2(L, x, c0, h0, *self._weights(where, k, s), *out,
                                        cs_grad, h_grad, use_peephole=self.use_peephole,
                                        sequence_length=lengths)
        named = {f"w_l{k}{s}": g.w_grad, f"b_l{k}{s}": g.b_grad}
        if self.use_peephole:
            named.update({f"wci_l{k}{s}": g.wci_grad, f"wcf_l{k}{s}": g.wcf_grad,
                          f"wco_l{k}{s}": g.wco_grad})
        return g.x_grad, (g.h_prev_grad, g.cs_prev_grad), named

    @staticmethod
    def _state_part_names(name):
        return f"{name}[0] (h)", f"{name}[1] (c)"

    @staticmethod
    def _unpack(where, name, state):
        if state is None:
            return None, None
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"{where}: {name} must be None or a tuple (h, c), got "
                            f"{type(state).__name__}")
        return tuple(state)

    @staticmethod
    def _pack(parts):
        return tuple(parts)

    def _extra_repr(self):
        s = ", use_peephole=True" if self.use_peephole else ""
        return s + (f", cell_clip={self.cell_clip}" if self.cell_clip > 0 else "")


class GRU(_Layer):
    """A (stacked, optionally bidirectional) GRU.

    ``reset_after=True`` (the default; Keras's name): PyTorch's ``nn.GRU``
    (Keras 3's default GRU, ONNX's ``linear_before_reset=1``), on
    ``block_gru_reset_after``, with nn.GRU's parameters, gate blocks r, z, n::

        r = sigmoid(x W_ir^T + b_ir + h W_hr^T + b_hr)
        z = sigmoid(x W_iz^T + b_iz + h W_hz^T + b_hz)
        n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn)),   h' = (1 - z) * n + z * h

    ``reset_after=False``: TensorFlow's GRUBlockCell (reset-before), on
    ``block_gru``::

        r = sigmoid([x, h] @ w_ru[:, :H] + b_ru[:H]),  u = sigmoid([x, h] @ w_ru[:, H:] + b_ru[H:])
        c = tanh([x, r * h] @ w_c + b_c),              h' = u * h + (1 - u) * c

    (Until this change the layer was always the reset-before GRU: code that
    relied on that passes ``reset_after=False``.)

    Parameters
    ----------
    input_size, hidden_size : int
        I and H.
    num_layers : int, default 1
    bidirectional : bool, default False
        As for ``LSTM``.
    reset_after : bool, default True
    dtype : float32 (default) or float64
    seed : int or None

    Attributes
    ----------
    With ``reset_after=True`` (nn.GRU's names and layouts):
    weight_ih_l{k}[_reverse] : (3H, I_k) array, rows [W_ir; W_iz; W_in]
        (I_0 = I, I_k = D*H for k > 0).
    weight_hh_l{k}[_reverse] : (3H, H) array, rows [W_hr; W_hz; W_hn].
    bias_ih_l{k}[_reverse], bias_hh_l{k}[_reverse] : (3H,) arrays.
    With ``reset_after=False``:
    w_ru_l{k}[_reverse] : (I_k+H, 2H) array, columns [r | u]; rows 0:I_k multiply
        the layer's input, I_k:I_k+H multiply h.
    w_c_l{k}[_reverse] : (I_k+H, H) array; rows I_k:I_k+H multiply r * h.
    b_ru_l{k}[_reverse] : (2H,) array; b_c_l{k}[_reverse] : (H,) array.
    params, grads : dicts with these names, layer by layer, forward before
        reverse; ``grads`` is overwritten in place by every ``backward``.

    All parameters are initialised uniform in [-1/sqrt(H), 1/sqrt(H)] (as
    nn.GRU's).
    """

    _context = GRUContext
    _RESET_AFTER = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    _RESET_BEFORE = ("w_ru", "w_c", "b_ru", "b_c")

    def __init__(self, input_size, hidden_size, num_layers=1, *, bidirectional=False,
                 reset_after=True, dtype=np.float32, seed=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bidirectional, dtype,
                         seed)
        self.reset_after = _check_bool("GRU", "reset_after", reset_after)
        self._init_params()

    def _shapes(self, I_k):
        H = self.hidden_size
        if self.reset_after:
            return {"weight_ih": (3 * H, I_k), "weight_hh": (3 * H, H), "bias_ih": (3 * H,),
                    "bias_hh": (3 * H,)}
        return {"w_ru": (I_k + H, 2 * H), "w_c": (I_k + H, H), "b_ru": (2 * H,), "b_c": (H,)}

    @property
    def _bases(self):
        return self._RESET_AFTER if self.reset_after else self._RESET_BEFORE

    def _weights(self, where, k, s):
        return tuple(self._checked(where, k, s).values())   # in _bases order

    def _op(self, where, k, s, L, x, s0, lengths):
        op = blockrnn.block_gru_reset_after if self.reset_after else blockrnn.block_gru
        return op(L, x, s0[0], *self._weights(where, k, s), sequence_length=lengths)

    @staticmethod
    def _sequences(out):
        return (out.h,)

    def _op_grad(self, where, k, s, L, x, s0, out, seq_grads, lengths):
        op = blockrnn.block_gru_reset_after_grad if self.reset_after else blockrnn.block_gru_grad
        g = op(L, x, s0[0], *self._weights(where, k, s), *out, seq_grads[0],
               sequence_length=lengths)
        # the op's four parameter gradients follow x_grad and h_prev_grad, in _bases order
        named = {f"{base}_l{k}{s}": grad for base, grad in zip(self._bases, g[2:])}
        return g.x_grad, (g.h_prev_grad,), named

    @staticmethod
    def _state_part_names(name):
        return (name,)

    @staticmethod
    def _unpack(where, name, state):
        return (state,)

    @staticmethod
    def _pack(parts):
        return parts[0]

    def _extra_repr(self):
        return "" if self.reset_after else ", reset_after=False"
