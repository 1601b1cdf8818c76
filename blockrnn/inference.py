"""Frozen inference objects: a layer's weights packed once, a forward that computes only y.

``blockrnn.LSTM(...).inference()`` / ``blockrnn.GRU(...).inference()`` return an
``LSTMInference`` / ``GRUInference``: a copy of every layer's and direction's
weights, packed (float32) into the packed kernel's layout once, at creation.
Calling it runs the inference forward of ``blockrnn._kernels`` (the
``Packed*Weights`` objects), which writes only ``y`` and the final states (no
gate outputs, no context for a backward) and never repacks::

    infer = layer.inference()
    y, state = infer(x, state=None, sequence_length=None)   # as layer.forward's

The one-layer building blocks, for other frontends (the torch modules' no-grad
path): ``PackedLSTMWeights(w_x, w_h, b, ..., gates_in_rows=False)`` (TF's
``w[:I]``, ``w[I:]``; or with ``gates_in_rows=True`` nn.LSTM's ``weight_ih_l0``
[4H, I], ``weight_hh_l0`` [4H, H] and ``b = bias_ih_l0 + bias_hh_l0``, gate order
i, f, g, o = layout IFCO), ``PackedGRUWeights(w_ru, w_c, b_ru, b_c)`` (GRUBlockCell)
and ``PackedGRUResetAfterWeights(weight_ih, weight_hh, bias_ih, bias_hh)``
(nn.GRU), each with ``forward(x, h0=None[, c0=None], sequence_length=None,
max_threads=None)`` returning y (T, B, H) and the final state(s) (B, H).

``y`` and ``state`` are bit for bit those of ``layer.forward`` at every batch
size (at batch 1 both run the same one-row packed kernel). float64 layers run
the training ops on the copied weights (same bits, no packing).

The weights are a COPY: an update of the layer after ``.inference()`` (in
place or by assigning new arrays) is not seen by the object; build a new one
with ``.inference()`` to serve the new weights. ``nbytes`` is the memory of
the copy (on x86 with AVX2 or AVX-512 the recurrent weights are held twice: as
the panels of the batched products and in the layout batch 1 reads: for the LSTM and
the reset-after GRU, each 16-cell panel's gate columns side by side, so that a batch-1
step computes a panel's gates in one pass and applies their gate math at once). Objects
may be called from several Python threads at once: each
call takes its threads from blockrnn's thread budget (README, Threads), so
concurrent callers never oversubscribe the cores, and the bits do not depend
on the number of threads. A call asks for one thread per 12288 multiply-adds
of a step (``work_per_thread``; 0: one per 16-cell panel), at most
``max_threads``: a lone batch-1 request runs on 2 cores from H = 96, batch 8
from H = 64 (0.44-0.82x the time of one thread at T = 64 on a quiet 2-core
Zen 5). From 4 rows a thread each thread runs every step of its own rows (no
barrier in the time loop); below, the threads split the cells of every step. A call gives its extra threads back at the end of a step when another
caller needs one, or when a partner thread waited for over 1 ms (another process
holds its core); after the latter the object runs its calls on one thread for a
spell, then tries again (``sheds`` counts the calls that shed): 4 ms, doubled up
to 50 ms each time the partner stalls again within 20 ms of a spell's end. A call of fewer
than 3 * 2**25 multiply-adds in all runs on one thread when the object's last
call ended over ``idle_ns`` = 200 us ago: the partner thread sleeps between
calls, and on a virtual machine waking it after an idle spell took ~300 us (a
batch-1 request at H = 128 is ~100 us on one thread), so the first call of a
burst runs alone and the next ones on every core. Back-to-back small calls ask for
every core unless the object's own small calls measured that slower per multiply-add
than one thread, by more than an eighth (``pace_fs_per_mac`` of each packed object:
the two means, each moved a quarter of the way by a new time; e.g. another process
busy on the partner's core): then every core is tried for 12 ms every 200 ms; while
every core is faster, every 64th call asks for one thread (every 256th while one
thread measured over twice as slow). A call on every core is
timed once such calls have run for 8 ms, and not right after a one-thread call (a core
that sat idle starts slowly). ``idle_ns=0``: neither rule, never alone. A call whose threads find themselves
on one CPU finishes on one thread (and the object runs on one for a spell).
Pass ``work_per_thread=2**20`` to keep small requests on one thread.
"""
import numpy as np

import blockrnn
from blockrnn import _kernels
from blockrnn._kernels import PackedGRUResetAfterWeights, PackedGRUWeights, PackedLSTMWeights
from blockrnn._validation import check_sequence_length, steps_to_run
from blockrnn.sequence import reverse_sequence, reverse_sequence_in_place

__all__ = ["LSTMInference", "GRUInference", "PackedLSTMWeights", "PackedGRUWeights",
           "PackedGRUResetAfterWeights"]


class _Inference:
    """The loop over layers and directions of LSTMInference and GRUInference."""

    def __init__(self, layer, max_threads, work_per_thread, idle_ns):
        where = type(self).__name__
        max_threads = _kernels.checked_max_threads(where, max_threads)
        self.input_size = layer.input_size
        self.hidden_size = layer.hidden_size
        self.num_layers = layer.num_layers
        self.bidirectional = layer.bidirectional
        self.dtype = layer.dtype
        self.max_threads = max_threads
        self._work = {} if work_per_thread is None else {"work_per_thread": int(work_per_thread)}
        if idle_ns is not None:
            self._work["idle_ns"] = int(idle_ns)
        D = 2 if layer.bidirectional else 1
        suffixes = ("", "_reverse") if layer.bidirectional else ("",)
        self._runs = []   # index layer * D + direction
        for k in range(layer.num_layers):
            I_k = layer.input_size if k == 0 else D * layer.hidden_size
            for s in suffixes:
                self._runs.append(self._build(layer._weights(where, k, s), I_k))
        self._D = D
        self._packed_single = (self._runs[0] if len(self._runs) == 1
                               and not isinstance(self._runs[0], tuple) else None)

    @property
    def last_threads(self):
        """The threads the last call asked of blockrnn's budget (the most that any
        of its layers and directions asked; it may have been granted fewer): 1 for
        a small call after an idle spell (``idle_ns``), a solo object or float64."""
        return max((r.last_threads for r in self._runs if hasattr(r, "last_threads")),
                   default=1)

    @property
    def nbytes(self):
        """Bytes of the weights this object holds (the packed copies for float32)."""
        return sum(r.nbytes if hasattr(r, "nbytes") else
                   sum(a.nbytes for a in r if isinstance(a, np.ndarray)) for r in self._runs)

    @property
    def packings(self):
        """How many times the weights were packed (once per layer and direction, at
        creation; calls never pack)."""
        return sum(getattr(r, "packings", 0) for r in self._runs)

    @property
    def sheds(self):
        """Calls (counted per layer and direction) that gave their extra threads
        back before their last step: another caller needed one, or a partner
        thread was not running (another process held its core)."""
        return sum(getattr(r, "sheds", 0) for r in self._runs)

    def __call__(self, x, state=None, sequence_length=None):
        """y (T, B, D*H) and the final state, as ``layer.forward(x, state,
        sequence_length)``'s first two results (see the layer's forward)."""
        packed = self._packed_single
        if (packed is not None and state is None and sequence_length is None
                and type(x) is np.ndarray and x.dtype == self.dtype and x.ndim == 3
                and x.shape[2] == self.input_size):
            # the most common call: one packed run from zeros
            y, *fin = packed.forward(x, max_threads=self.max_threads)
            return y, self._pack([f[None] for f in fin])
        where = type(self).__name__
        if not (type(x) is np.ndarray and x.dtype == self.dtype and x.ndim == 3
                and x.shape[2] == self.input_size):   # the common call skips _array
            x = blockrnn.layers._array(where, "x", x, self.dtype,
                                       (None, None, self.input_size))
        T, B = x.shape[:2]
        H, D = self.hidden_size, self._D
        shape = (self.num_layers * D, B, H)
        init = [None if part is None
                else blockrnn.layers._array(where, name, part, self.dtype, shape)
                for name, part in zip(self._part_names, self._unpack(where, state))]
        lengths = (None if sequence_length is None
                   else check_sequence_length(where, sequence_length, B, T))
        if len(self._runs) == 1:   # one layer, one direction: no copies
            y, *fin = self._run(self._runs[0], x, [None if p is None else p[0] for p in init],
                                lengths)
            return y, self._pack([f[None] for f in fin])
        final = [np.empty(shape, self.dtype) for _ in init]
        inp = x
        for k in range(self.num_layers):
            outs = []
            for d in range(D):
                xin = inp if d == 0 else reverse_sequence(inp, lengths)
                s0 = [None if p is None else p[k * D + d] for p in init]
                y, *fin = self._run(self._runs[k * D + d], xin, s0, lengths)
                for f, v in zip(final, fin):
                    f[k * D + d] = v
                outs.append(y if d == 0 else reverse_sequence_in_place(y, lengths))  # new y
            inp = outs[0] if D == 1 else np.concatenate(outs, axis=-1)
        return inp, self._pack(final)

    def __repr__(self):
        return f"{type(self).__name__}(packed copy of {self._layer_repr}, nbytes={self.nbytes})"


class LSTMInference(_Inference):
    """A frozen, packed copy of a ``blockrnn.LSTM`` for inference (see the module
    docstring). ``__call__(x, state=None, sequence_length=None) -> (y, (h_n, c_n))``."""

    _part_names = ("state[0] (h)", "state[1] (c)")

    def __init__(self, layer, max_threads=None, *, work_per_thread=None, idle_ns=None):
        self._layer_repr = repr(layer)
        self.use_peephole = layer.use_peephole
        self.cell_clip = layer.cell_clip
        super().__init__(layer, max_threads, work_per_thread, idle_ns)

    def _build(self, weights, I_k):
        w, wci, wcf, wco, b = (np.array(a) for a in weights)   # copies
        if self.dtype == np.float32:
            return _kernels.PackedLSTMWeights(
                w[:I_k], w[I_k:], b, wci, wcf, wco, layout=int(_kernels.GateLayout.IFCO),
                cell_clip=self.cell_clip, use_peephole=self.use_peephole, **self._work)
        return (w, wci, wcf, wco, b)

    def _run(self, run, x, s0, lengths):
        h0, c0 = s0
        if isinstance(run, _kernels.PackedLSTMWeights):
            return run.forward(x, h0, c0, lengths, self.max_threads)
        zeros = np.zeros((x.shape[1], self.hidden_size), self.dtype)
        h0 = zeros if h0 is None else h0
        c0 = zeros if c0 is None else c0
        out = blockrnn.block_lstm_v2(steps_to_run(x.shape[0], lengths), x, c0, h0, *run,
                                     cell_clip=self.cell_clip,
                                     use_peephole=self.use_peephole, sequence_length=lengths)
        last = blockrnn.layers._last
        return out.h, last(out.h, h0, lengths), last(out.cs, c0, lengths)

    @staticmethod
    def _unpack(where, state):
        return blockrnn.LSTM._unpack(where, "state", state)

    @staticmethod
    def _pack(parts):
        return tuple(parts)


class GRUInference(_Inference):
    """A frozen, packed copy of a ``blockrnn.GRU`` (either variant) for inference
    (see the module docstring). ``__call__(x, state=None, sequence_length=None)
    -> (y, h_n)``."""

    _part_names = ("state",)

    def __init__(self, layer, max_threads=None, *, work_per_thread=None, idle_ns=None):
        self._layer_repr = repr(layer)
        self.reset_after = layer.reset_after
        super().__init__(layer, max_threads, work_per_thread, idle_ns)

    def _build(self, weights, I_k):
        weights = tuple(np.array(a) for a in weights)   # copies
        if self.dtype != np.float32:
            return weights
        if self.reset_after:
            return _kernels.PackedGRUResetAfterWeights(*weights, **self._work)
        return _kernels.PackedGRUWeights(*weights, **self._work)

    def _run(self, run, x, s0, lengths):
        h0 = s0[0]
        if not isinstance(run, tuple):
            return run.forward(x, h0, lengths, self.max_threads)
        if h0 is None:
            h0 = np.zeros((x.shape[1], self.hidden_size), self.dtype)
        op = blockrnn.block_gru_reset_after if self.reset_after else blockrnn.block_gru
        out = op(steps_to_run(x.shape[0], lengths), x, h0, *run, sequence_length=lengths)
        return out.h, blockrnn.layers._last(out.h, h0, lengths)

    @staticmethod
    def _unpack(where, state):
        return (state,)

    @staticmethod
    def _pack(parts):
        return parts[0]
