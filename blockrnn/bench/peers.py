"""The benchmark problems and one callable per (workload, implementation).

Workloads (``WORKLOADS``):

* ``lstm_fwd``     -- LSTM over a sequence, forward. blockrnn ``block_lstm_v2`` and TF
  ``BlockLSTMV2`` with peepholes; torch ``nn.LSTM`` under ``no_grad`` (no peepholes: torch
  has none); ONNX Runtime ``LSTM`` with peepholes (input ``P``).
* ``lstm_fwdbwd``  -- forward + backward: blockrnn ``block_lstm_v2`` + ``block_lstm_grad_v2``,
  TF ``BlockLSTMV2`` + ``BlockLSTMGradV2`` (loss gradient: ones for every h, zeros for cs),
  torch forward + ``backward()`` of the sum of the outputs (gradients of x, h0, c0 and the
  weights).
* ``gru_fwd`` / ``gru_fwdbwd`` -- the GRU users have (nn.GRU's, Keras 3's default, ONNX's
  ``linear_before_reset=1``: reset gate after the recurrent product) over a sequence, the
  same function in every row: blockrnn ``block_gru_reset_after`` (+ its gradient), torch
  ``nn.GRU``, ORT ``GRU`` (forward only, ``linear_before_reset=1``), and a ``lax.scan``
  model of it in JAX. TensorFlow has no sequence GRU op, so there is no TF row (TF's
  GRUBlockCell is timed by ``gru_cell``).
* JAX (every sequence workload): ``blockrnn.jax.reference_lstm`` / ``reference_gru_reset_after``,
  the same math written in ``jax.numpy`` with ``lax.scan`` (no peepholes), under ``jax.jit``;
  fwd+bwd is ``jax.jit(jax.vjp)`` of it with the same ones-for-every-h loss gradient.
  XLA's own CPU thread pool runs it (``--num-threads`` does not reach it).
* ``lstm_infer`` / ``gru_infer`` -- the inference forward, the function ONNX Runtime's
  ``LSTM`` / ``GRU`` compute: y and the final states only (no gate outputs, no context for
  a backward). blockrnn's ``PackedLSTMWeights`` (peepholes) /
  ``PackedGRUResetAfterWeights``, weights packed once before timing as ONNX Runtime packs
  them when its session is created, against the same ORT sessions as ``lstm_fwd`` /
  ``gru_fwd``. ``lstm_fwd`` times ``block_lstm_v2``, which writes TensorFlow's seven
  (T, B, H) gate outputs for a backward: the ONNX Runtime targets compare these rows.
* ``lstm2bi_fwd`` / ``lstm2bi_fwdbwd`` -- a 2-layer bidirectional LSTM (nn.LSTM's
  ``num_layers=2, bidirectional=True``; layer 1 reads 2H): ``blockrnn.torch.LSTM`` against
  ``torch.nn.LSTM`` with the same configuration and weights (``LSTM.from_torch``), float32,
  no peepholes; forward under ``no_grad``, forward + ``backward()`` of the sum of the
  outputs (gradients of x, h0, c0 and the weights). Only these two modules have the
  workload (no TF, ORT or JAX rows); by default it runs at ``STACKED_SHAPES`` only.
* ``lstm_cell`` / ``gru_cell`` -- one step at B=1 (latency): blockrnn ``lstm_block_cell`` /
  ``gru_block_cell``, TF eager ``tf.raw_ops.LSTMBlockCell`` / ``GRUBlockCell``, torch
  ``nn.LSTMCell`` / ``nn.GRUCell`` under ``no_grad``.

Every implementation gets its inputs in its native form, converted before timing
(``tf.constant``, ``torch.from_numpy``, NumPy for ORT); the timed call returns the native
outputs (no conversion back to NumPy).

Parity (``Impl.check``, run once before timing; a failing implementation is not timed):
TF vs blockrnn with the timed configuration; torch ``nn.LSTM`` vs blockrnn *without*
peepholes (same weights: torch's gate order i,f,g,o is V2's IFCO; ``W_ih = w[:I].T``,
``W_hh = w[I:].T``, ``b_ih = b``, ``b_hh = 0``); ORT ``LSTM`` vs blockrnn with peepholes
(ONNX gate order i,o,f,c; ``P`` ordered i,o,f); every GRU row's h vs a float64 NumPy
reset-after GRU on the same weights, and the fwd+bwd rows' gradients vs blockrnn's
``block_gru_reset_after_grad``; the stacked ``nn.LSTM`` vs
``blockrnn.torch.LSTM`` (outputs, and the gradients of x, h0, c0 and every weight mapped
back to nn.LSTM's names). Forward: max |h - h_ref| <
``FWD_TOL``; gradients: max |g - g_ref| / max(1, max |g_ref|) < ``GRAD_TOL``.
"""
import dataclasses
import os
from typing import Callable, Optional

import numpy as np

import blockrnn

WORKLOADS = ("lstm_fwd", "lstm_fwdbwd", "gru_fwd", "gru_fwdbwd", "lstm_infer", "gru_infer",
             "lstm2bi_fwd", "lstm2bi_fwdbwd", "lstm_model", "lstm_cell", "gru_cell")
SEQUENCE_WORKLOADS = WORKLOADS[:9]
INFER_WORKLOADS = ("lstm_infer", "gru_infer")
STACKED_WORKLOADS = ("lstm2bi_fwd", "lstm2bi_fwdbwd")
MODEL_WORKLOADS = ("lstm_model",)
CELL_WORKLOADS = WORKLOADS[9:]
WORKLOAD_TITLES = {
    "lstm_fwd": "LSTM fwd", "lstm_fwdbwd": "LSTM fwd+bwd", "gru_fwd": "GRU fwd",
    "gru_fwdbwd": "GRU fwd+bwd", "lstm_infer": "LSTM inference fwd",
    "gru_infer": "GRU inference fwd", "lstm2bi_fwd": "LSTM 2-layer bidi fwd",
    "lstm2bi_fwdbwd": "LSTM 2-layer bidi fwd+bwd",
    "lstm_model": "LSTM in a torch model, train step", "lstm_cell": "LSTMCell B=1",
    "gru_cell": "GRUCell B=1",
}
STACKED_LAYERS = 2   # the stacked workloads: num_layers, both directions
MODEL_VOCAB = 1000   # the model workload: Embedding(V, I) -> LSTM(I, H) -> Linear(H, V)
MODEL_LR = 0.01
IMPLS = ("blockrnn", "tf", "torch", "ort", "jax")
IMPL_TITLES = {"blockrnn": "blockrnn", "tf": "TensorFlow", "torch": "PyTorch",
               "ort": "ONNX Runtime", "jax": "JAX"}

# The benchmark shapes (T, B, I, H), and the batch-1 cell shape (B, I, H).
DEFAULT_SHAPES = ((100, 32, 256, 256), (100, 64, 512, 512), (50, 1, 128, 128),
                  (200, 16, 128, 256))
CELL_SHAPE = (1, 32, 32)
# The default shapes of the stacked and model workloads (every --shapes shape when given).
STACKED_SHAPES = ((100, 32, 256, 256),)
MODEL_SHAPES = ((100, 32, 256, 256),)

FWD_TOL = 1e-4
GRAD_TOL = 1e-3


def flops(workload, T, B, I, H):
    """Matmul flops of one call: 2*T*B*(I+H)*G*H, G = 4 (LSTM) or 3 (GRU); x3 with backward.
    The stacked workloads: the sum over layers and both directions, layer k > 0 reading 2H."""
    gates = 4 if workload.startswith("lstm") else 3
    steps = 1 if workload.endswith("_cell") else T
    rows = I + H
    if workload in MODEL_WORKLOADS:   # the LSTM and the Linear(H, V) head, x3 (training)
        return 3 * (2.0 * T * B * rows * gates * H + 2.0 * T * B * H * MODEL_VOCAB)
    if workload in STACKED_WORKLOADS:
        rows = 2 * ((I + H) + (STACKED_LAYERS - 1) * (2 * H + H))
    fwd = 2.0 * steps * B * rows * gates * H
    return 3 * fwd if workload.endswith("fwdbwd") else fwd


def memory_bound(workload, T, B, I, H, itemsize=4):
    """blockrnn's memory bound in bytes: its outputs plus the workspace the issue
    allows, one T x B x 4H buffer plus B x H for a sequence op (the backward uses
    it; the forward ops need O(B x H) plus, from 4 rows on, transposed copies of
    the recurrent weights no larger than it), and [x, h] plus the gate block for a
    cell op. The inference forward: y, the final states, the hoisted input
    projection (at most T x B x 4H) and its [2, B, H] state pair. None for the stacked workloads (a torch module: its torch tensors are not
    seen by tracemalloc, so no bound is compared)."""
    if workload in STACKED_WORKLOADS or workload in MODEL_WORKLOADS:
        return None
    if workload == "lstm_cell":
        return itemsize * (7 * B * H + B * (I + H) + B * 4 * H)
    if workload == "gru_cell":
        return itemsize * (4 * B * H + B * (I + H) + B * 3 * H)
    lstm = workload.startswith("lstm")
    if workload in INFER_WORKLOADS:
        states = 2 if lstm else 1
        return itemsize * (T * B * H + states * B * H + T * B * 4 * H + 2 * B * H)
    outputs = (7 if lstm else 4) * T * B * H
    if workload.endswith("fwdbwd"):
        if lstm:   # x, cs_prev, h_prev, w, wci, wcf, wco, b gradients
            outputs += T * B * I + 2 * B * H + (I + H) * 4 * H + 3 * H + 4 * H
        else:      # x, h_prev, w_ru, w_c, b_ru, b_c gradients
            outputs += T * B * I + B * H + (I + H) * 3 * H + 3 * H
    return itemsize * (outputs + T * B * 4 * H + B * H)


@dataclasses.dataclass
class Impl:
    """One implementation of one workload: ``run()`` is what is timed."""
    impl: str                      # one of IMPLS
    label: str                     # what exactly is called
    run: Callable[[], object]
    check: Optional[Callable[[], "Parity"]] = None
    note: str = ""


@dataclasses.dataclass
class Parity:
    ok: bool
    text: str                      # e.g. "max|h - h_blockrnn| = 3.1e-07 (< 1e-04)"


def _fwd_parity(got, want, what):
    diff = float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)),
                        initial=0.0))
    ok = diff < FWD_TOL   # NaN fails too
    return ok, f"max|{what}| = {diff:.1e} (tol {FWD_TOL:.0e})"


def _grad_parity(pairs):
    """pairs: (name, got, want); relative error max|g - r| / max(1, max|r|)."""
    worst, worst_name = 0.0, ""
    for name, got, want in pairs:
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        err = float(np.max(np.abs(got - want), initial=0.0) / max(1.0, np.max(np.abs(want),
                                                                               initial=0.0)))
        if not err <= worst:
            worst, worst_name = err, name
    ok = worst < GRAD_TOL
    return ok, f"grads: worst rel. error {worst:.1e} in {worst_name} (tol {GRAD_TOL:.0e})"


def _combine(*results):
    return Parity(all(ok for ok, _ in results), "; ".join(text for _, text in results))


class Problem:
    """Random float32 inputs of one shape; blockrnn's reference outputs are computed lazily."""

    def __init__(self, T, B, I, H, seed=0):
        self.T, self.B, self.I, self.H, self.seed = T, B, I, H, seed
        rng = np.random.default_rng(seed)
        scale = 1.0 / np.sqrt(I + H)

        def rand(*shape, s=1.0):
            return (s * rng.uniform(-1, 1, shape)).astype(np.float32)

        self.x = rand(T, B, I)
        self.cs0, self.h0 = rand(B, H, s=0.5), rand(B, H, s=0.5)
        self.w = rand(I + H, 4 * H, s=scale)          # IFCO (V2) columns
        self.wci, self.wcf, self.wco = rand(H, s=0.5), rand(H, s=0.5), rand(H, s=0.5)
        self.b = rand(4 * H, s=0.5)
        self.w_ru = rand(I + H, 2 * H, s=scale)
        self.w_c = rand(I + H, H, s=scale)
        self.b_ru, self.b_c = rand(2 * H, s=0.5), rand(H, s=0.5)
        # nn.GRU's reset-after GRU (weight rows r, z, n): the GRU of the sequence rows
        self.w_ih, self.w_hh = rand(3 * H, I, s=scale), rand(3 * H, H, s=scale)
        self.b_ih, self.b_hh = rand(3 * H, s=0.5), rand(3 * H, s=0.5)
        self.cs_grad = np.zeros((T, B, H), np.float32)
        self.h_grad = np.ones((T, B, H), np.float32)   # d(sum of all h) / dh
        self._cache = {}

    @property
    def shape(self):
        return (self.T, self.B, self.I, self.H)

    def lstm_args(self):
        return (self.T, self.x, self.cs0, self.h0, self.w, self.wci, self.wcf, self.wco, self.b)

    def gru_args(self):
        return (self.T, self.x, self.h0, self.w_ru, self.w_c, self.b_ru, self.b_c)

    def _cached(self, key, compute):
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def lstm_fwd(self, peephole=True):
        return self._cached(("lstm_fwd", peephole), lambda: blockrnn.block_lstm_v2(
            *self.lstm_args(), use_peephole=peephole))

    def lstm_grad(self, peephole=True):
        return self._cached(("lstm_grad", peephole), lambda: blockrnn.block_lstm_grad_v2(
            *self.lstm_args(), *self.lstm_fwd(peephole), self.cs_grad, self.h_grad,
            use_peephole=peephole))

    def gru_ra_args(self):
        return (self.T, self.x, self.h0, self.w_ih, self.w_hh, self.b_ih, self.b_hh)

    def gru_h(self):
        """The reset-after GRU's h (T, B, H) from the float64 NumPy reference."""
        return self._cached("gru_h", lambda: numpy_gru_reset_after(
            self.x, self.h0, self.w_ih, self.w_hh, self.b_ih, self.b_hh))

    def gru_grad(self):
        """blockrnn's reset-after GRU gradients for the all-ones loss gradient of h."""
        args = self.gru_ra_args()
        return self._cached("gru_grad", lambda: blockrnn.block_gru_reset_after_grad(
            *args, *blockrnn.block_gru_reset_after(*args), self.h_grad))


# --------------------------------------------------------------------------
# Peer discovery
# --------------------------------------------------------------------------

class Peers:
    """The importable peers among ``wanted`` (only those are imported). ``skipped`` holds
    one line per missing peer.

    ``threads``: None leaves every runtime at its defaults (the all-cores mode); a number
    sets TF's intra-op threads, ``torch.set_num_threads`` and ORT's
    ``intra_op_num_threads`` to it. ``one_core`` also sets the inter-op pools to 1 (TF,
    ``torch.set_num_interop_threads``; ORT's is 1 always); the one-core worker sets the
    environment of the other pools (OMP_NUM_THREADS, XLA_FLAGS, ...) before it starts.
    """

    def __init__(self, wanted=IMPLS, threads=None, one_core=False):
        self.threads = 1 if one_core else threads
        self.one_core = one_core
        self.tf = self.torch = self.ort = self.onnx = self.jax = None
        self.skipped = []
        self.notes = []
        if "tf" in wanted:
            try:
                os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
                import tensorflow as tf
                try:
                    if self.threads:
                        tf.config.threading.set_intra_op_parallelism_threads(self.threads)
                    if one_core:
                        tf.config.threading.set_inter_op_parallelism_threads(1)
                except RuntimeError as exc:  # TF already initialised in this process
                    self.notes.append(f"TensorFlow threads not set: {exc}")
                self.tf = tf
            except Exception as exc:  # noqa: BLE001 - any import failure means "missing"
                self.skipped.append(
                    f"tensorflow not importable ({type(exc).__name__}: {exc}): "
                    "TensorFlow columns skipped")
        if "torch" in wanted:
            try:
                import torch
                if self.threads:
                    torch.set_num_threads(self.threads)
                if one_core:
                    torch.set_num_interop_threads(1)
                self.torch = torch
            except Exception as exc:  # noqa: BLE001
                self.skipped.append(
                    f"torch not importable ({type(exc).__name__}: {exc}): "
                    "PyTorch columns skipped")
        if "ort" in wanted:
            try:
                import onnx
                import onnxruntime
                self.ort, self.onnx = onnxruntime, onnx
            except Exception as exc:  # noqa: BLE001
                self.skipped.append(
                    f"onnxruntime/onnx not importable ({type(exc).__name__}: {exc}): "
                    "ONNX Runtime columns skipped")

        if "jax" in wanted:
            try:
                import jax
                import blockrnn.jax  # noqa: F401  (the lax.scan models)
                self.jax = jax
            except Exception as exc:  # noqa: BLE001
                self.skipped.append(
                    f"jax not importable ({type(exc).__name__}: {exc}): JAX columns skipped")

    def versions(self):
        out = {}
        for name, mod in (("tensorflow", self.tf), ("torch", self.torch),
                          ("onnxruntime", self.ort), ("onnx", self.onnx), ("jax", self.jax)):
            out[name] = getattr(mod, "__version__", "?") if mod is not None else None
        return out

    def thread_settings(self):
        """Each runtime's thread setting as it reports it (0 = the runtime's default)."""
        out = {}
        if self.tf is not None:
            out["tensorflow intra_op"] = \
                self.tf.config.threading.get_intra_op_parallelism_threads()
            out["tensorflow inter_op"] = \
                self.tf.config.threading.get_inter_op_parallelism_threads()
        if self.torch is not None:
            out["torch num_threads"] = self.torch.get_num_threads()
            out["torch num_interop_threads"] = self.torch.get_num_interop_threads()
        if self.ort is not None:
            out["onnxruntime intra_op_num_threads"] = self.threads or 0
        if self.jax is not None:
            out["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
        return out


# --------------------------------------------------------------------------
# blockrnn
# --------------------------------------------------------------------------

def _blockrnn(workload, p):
    if workload in STACKED_WORKLOADS:
        try:
            import torch
        except ImportError as exc:
            raise Skip(f"blockrnn {WORKLOAD_TITLES[workload]} runs blockrnn.torch.LSTM, which "
                       f"needs PyTorch ({exc}): row skipped") from exc
        return _stacked_impl(torch, "blockrnn", workload, p)
    if workload in MODEL_WORKLOADS:
        try:
            import torch
        except ImportError as exc:
            raise Skip(f"the blockrnn model row runs blockrnn.torch.LSTM, which needs "
                       f"PyTorch ({exc}): row skipped") from exc
        return _model_impl(torch, "blockrnn", p)
    if workload == "lstm_fwd":
        args = p.lstm_args()
        return Impl("blockrnn", "block_lstm_v2 (peepholes)",
                    lambda: blockrnn.block_lstm_v2(*args, use_peephole=True))
    if workload == "lstm_infer":
        from blockrnn.inference import PackedLSTMWeights
        I = p.I
        packed = PackedLSTMWeights(p.w[:I], p.w[I:], p.b, p.wci, p.wcf, p.wco,
                                   use_peephole=True)   # V2's IFCO gate columns
        run = lambda: packed.forward(p.x, p.h0, p.cs0)  # noqa: E731
        return Impl("blockrnn", "PackedLSTMWeights.forward (peepholes; packed once)", run,
                    lambda: _combine(_fwd_parity(run()[0], p.lstm_fwd().h,
                                                 "y - h_block_lstm_v2")))
    if workload == "gru_infer":
        from blockrnn.inference import PackedGRUResetAfterWeights
        packed = PackedGRUResetAfterWeights(p.w_ih, p.w_hh, p.b_ih, p.b_hh)
        run = lambda: packed.forward(p.x, p.h0)  # noqa: E731
        return Impl("blockrnn", "PackedGRUResetAfterWeights.forward (packed once)", run,
                    lambda: _combine(_fwd_parity(run()[0], p.gru_h(), "y - h_numpy")))
    if workload == "lstm_fwdbwd":
        args = p.lstm_args()

        def run():
            fwd = blockrnn.block_lstm_v2(*args, use_peephole=True)
            return blockrnn.block_lstm_grad_v2(*args, *fwd, p.cs_grad, p.h_grad,
                                               use_peephole=True)
        return Impl("blockrnn", "block_lstm_v2 + block_lstm_grad_v2 (peepholes)", run)
    if workload in ("gru_fwd", "gru_fwdbwd"):
        args = p.gru_ra_args()

        def check():
            h = blockrnn.block_gru_reset_after(*args).h
            return _combine(_fwd_parity(h, p.gru_h(), "h - h_numpy"))
        if workload == "gru_fwd":
            return Impl("blockrnn", "block_gru_reset_after",
                        lambda: blockrnn.block_gru_reset_after(*args), check)

        def run():
            fwd = blockrnn.block_gru_reset_after(*args)
            return blockrnn.block_gru_reset_after_grad(*args, *fwd, p.h_grad)
        return Impl("blockrnn", "block_gru_reset_after + block_gru_reset_after_grad", run,
                    check)
    if workload == "lstm_cell":
        args = p.cell_lstm_args
        return Impl("blockrnn", "lstm_block_cell (peepholes)",
                    lambda: blockrnn.lstm_block_cell(*args, use_peephole=True))
    if workload == "gru_cell":
        args = p.cell_gru_args
        return Impl("blockrnn", "gru_block_cell", lambda: blockrnn.gru_block_cell(*args))
    raise ValueError(workload)


class Skip(Exception):
    """This implementation does not exist for this workload; the message says why."""


# --------------------------------------------------------------------------
# TensorFlow raw ops
# --------------------------------------------------------------------------

def _tf(tf, workload, p):
    if workload in STACKED_WORKLOADS or workload in MODEL_WORKLOADS:
        raise Skip(None)   # the stacked workloads compare the two torch modules only
    c = tf.constant
    raw = tf.raw_ops
    if workload in INFER_WORKLOADS:
        raise Skip(None)   # TF's ops write the gate outputs: its row is lstm_fwd's
    if workload in ("gru_fwd", "gru_fwdbwd"):
        raise Skip("TensorFlow has no sequence GRU op (a Python loop of GRUBlockCell is not "
                   "a fair peer): no TF row")
    if workload in ("lstm_fwd", "lstm_fwdbwd"):
        kw = dict(seq_len_max=c(p.T, tf.int64), x=c(p.x), cs_prev=c(p.cs0), h_prev=c(p.h0),
                  w=c(p.w), wci=c(p.wci), wcf=c(p.wcf), wco=c(p.wco), b=c(p.b))
        fwd = lambda: raw.BlockLSTMV2(**kw, cell_clip=0.0, use_peephole=True)  # noqa: E731
        fwd_check = lambda: _fwd_parity(fwd()[6], p.lstm_fwd().h, "h - h_blockrnn")  # noqa
        if workload == "lstm_fwd":
            return Impl("tf", "tf.raw_ops.BlockLSTMV2 (peepholes)", fwd,
                        lambda: _combine(fwd_check()))
        cs_grad, h_grad = c(p.cs_grad), c(p.h_grad)

        def run():
            i, cs, f, o, ci, co, h = fwd()
            return raw.BlockLSTMGradV2(**kw, i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h,
                                       cs_grad=cs_grad, h_grad=h_grad, use_peephole=True)

        def check():
            got, want = run(), p.lstm_grad()
            return _combine(fwd_check(), _grad_parity(
                (name, g.numpy(), getattr(want, name)) for name, g in
                zip(want._fields, got)))
        return Impl("tf", "tf.raw_ops.BlockLSTMV2 + BlockLSTMGradV2 (peepholes)", run, check)
    if workload == "lstm_cell":
        names = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
        kw = {n: c(a) for n, a in zip(names, p.cell_lstm_args)}
        run = lambda: raw.LSTMBlockCell(**kw, forget_bias=1.0, cell_clip=3.0,  # noqa: E731
                                        use_peephole=True)
        want = lambda: blockrnn.lstm_block_cell(  # noqa: E731  (parity only)
            *p.cell_lstm_args, use_peephole=True).h
        return Impl("tf", "tf.raw_ops.LSTMBlockCell (eager, peepholes)", run,
                    lambda: _combine(_fwd_parity(run()[6], want(), "h - h_blockrnn")))
    if workload == "gru_cell":
        names = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
        kw = {n: c(a) for n, a in zip(names, p.cell_gru_args)}
        run = lambda: raw.GRUBlockCell(**kw)  # noqa: E731
        want = lambda: blockrnn.gru_block_cell(*p.cell_gru_args).h  # noqa: E731
        return Impl("tf", "tf.raw_ops.GRUBlockCell (eager)", run,
                    lambda: _combine(_fwd_parity(run()[3], want(), "h - h_blockrnn")))
    raise ValueError(workload)


# --------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------

def _reorder(w, H, blocks):
    """Columns of w (..., n*H) reordered by gate block indices."""
    return np.concatenate([w[..., k * H:(k + 1) * H] for k in blocks], axis=-1)


def _torch_gru_weights(p, I, H, w_ru, w_c, b_ru, b_c):
    """torch GRU parameters (gate order r, z, n) from TF's w_ru [r, u], w_c, b_ru, b_c."""
    w_all = np.concatenate([w_ru, w_c], axis=1)       # columns r, u(=z), c(=n)
    return (np.ascontiguousarray(w_all[:I].T), np.ascontiguousarray(w_all[I:].T),
            np.concatenate([b_ru, b_c]), np.zeros(3 * H, np.float32))


def numpy_gru_reset_after(x, h0, w_ih, w_hh, b_ih, b_hh):
    """float64 reference of torch's nn.GRU (reset-after), time-major x (T, B, I)."""
    x, h = x.astype(np.float64), h0.astype(np.float64)
    w_ih, w_hh, b_ih, b_hh = (a.astype(np.float64) for a in (w_ih, w_hh, b_ih, b_hh))
    H = h.shape[1]
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    hs = []
    for t in range(x.shape[0]):
        gi, gh = x[t] @ w_ih.T + b_ih, h @ w_hh.T + b_hh
        r, z = sig(gi[:, :H] + gh[:, :H]), sig(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        h = (1 - z) * n + z * h
        hs.append(h)
    return np.stack(hs)


def _torch(torch, workload, p):
    if workload in INFER_WORKLOADS:
        raise Skip(None)   # nn.LSTM / nn.GRU under no_grad: the lstm_fwd / gru_fwd rows
    if workload in STACKED_WORKLOADS:
        return _stacked_impl(torch, "torch", workload, p)
    if workload in MODEL_WORKLOADS:
        return _model_impl(torch, "torch", p)
    nn = torch.nn
    T, B, I, H = p.shape
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    if workload in ("lstm_fwd", "lstm_fwdbwd"):
        model = nn.LSTM(I, H)
        with torch.no_grad():
            model.weight_ih_l0.copy_(t(p.w[:I].T))   # torch i,f,g,o == V2's IFCO
            model.weight_hh_l0.copy_(t(p.w[I:].T))
            model.bias_ih_l0.copy_(t(p.b))
            model.bias_hh_l0.zero_()
        x, h0, c0 = t(p.x), t(p.h0[None]), t(p.cs0[None])
        note = "no peepholes (torch has none)"
        if workload == "lstm_fwd":
            def run():
                with torch.no_grad():
                    return model(x, (h0, c0))[0]
            return Impl("torch", "nn.LSTM forward, no_grad", run, lambda: _combine(
                _fwd_parity(run().numpy(), p.lstm_fwd(False).h, "h - h_blockrnn(no peep.)")),
                note)
        xg, h0g, c0g = (a.clone().requires_grad_(True) for a in (x, h0, c0))
        params = list(model.parameters())

        def run():
            for a in [xg, h0g, c0g, *params]:
                a.grad = None
            out = model(xg, (h0g, c0g))[0]
            out.sum().backward()
            return out

        def check():
            out = run()
            want = p.lstm_grad(False)
            return _combine(
                _fwd_parity(out.detach().numpy(), p.lstm_fwd(False).h,
                            "h - h_blockrnn(no peep.)"),
                _grad_parity([
                    ("x_grad", xg.grad.numpy(), want.x_grad),
                    ("h_prev_grad", h0g.grad[0].numpy(), want.h_prev_grad),
                    ("cs_prev_grad", c0g.grad[0].numpy(), want.cs_prev_grad),
                    ("w_grad[:I]", model.weight_ih_l0.grad.numpy().T, want.w_grad[:I]),
                    ("w_grad[I:]", model.weight_hh_l0.grad.numpy().T, want.w_grad[I:]),
                    ("b_grad", model.bias_ih_l0.grad.numpy(), want.b_grad)]))
        return Impl("torch", "nn.LSTM forward + backward(sum of outputs)", run, check, note)
    if workload in ("gru_fwd", "gru_fwdbwd"):
        model = nn.GRU(I, H)
        with torch.no_grad():
            for param, value in zip(model.parameters(), (p.w_ih, p.w_hh, p.b_ih, p.b_hh)):
                param.copy_(t(value))
        x, h0 = t(p.x), t(p.h0[None])

        def fwd_check(h):
            return _fwd_parity(h, p.gru_h(), "h - h_numpy")
        if workload == "gru_fwd":
            def run():
                with torch.no_grad():
                    return model(x, h0)[0]
            return Impl("torch", "nn.GRU forward, no_grad", run,
                        lambda: _combine(fwd_check(run().numpy())))
        xg, h0g = (a.clone().requires_grad_(True) for a in (x, h0))
        params = list(model.parameters())

        def run():
            for a in [xg, h0g, *params]:
                a.grad = None
            out = model(xg, h0g)[0]
            out.sum().backward()
            return out

        def check():
            out = run().detach().numpy()
            want = p.gru_grad()
            return _combine(fwd_check(out), _grad_parity([
                ("x_grad", xg.grad.numpy(), want.x_grad),
                ("h_prev_grad", h0g.grad.numpy()[0], want.h_prev_grad),
                ("w_ih_grad", model.weight_ih_l0.grad.numpy(), want.w_ih_grad),
                ("w_hh_grad", model.weight_hh_l0.grad.numpy(), want.w_hh_grad),
                ("b_ih_grad", model.bias_ih_l0.grad.numpy(), want.b_ih_grad),
                ("b_hh_grad", model.bias_hh_l0.grad.numpy(), want.b_hh_grad)]))
        return Impl("torch", "nn.GRU forward + backward(sum of outputs)", run, check)
    if workload == "lstm_cell":
        x, cs, h, w, wci, wcf, wco, b = p.cell_lstm_args
        Bc, Ic, Hc = p.cell_shape
        cell = nn.LSTMCell(Ic, Hc)
        icfo_to_ifgo = (0, 2, 1, 3)
        with torch.no_grad():
            cell.weight_ih.copy_(t(_reorder(w[:Ic], Hc, icfo_to_ifgo).T))
            cell.weight_hh.copy_(t(_reorder(w[Ic:], Hc, icfo_to_ifgo).T))
            cell.bias_ih.copy_(t(_reorder(b, Hc, icfo_to_ifgo)))
            cell.bias_hh.zero_()
        xt, ht, ct = t(x), t(h), t(cs)

        def run():
            with torch.no_grad():
                return cell(xt, (ht, ct))
        want = lambda: blockrnn.lstm_block_cell(  # noqa: E731  (parity only)
            x, cs, h, w, wci, wcf, wco, b, forget_bias=0.0, cell_clip=0.0,
            use_peephole=False).h
        return Impl("torch", "nn.LSTMCell, no_grad", run, lambda: _combine(_fwd_parity(
            run()[0].numpy(), want(), "h - h_blockrnn(no peep., forget_bias 0, no clip)")),
            "no peepholes, forget bias or cell clip")
    if workload == "gru_cell":
        x, h, w_ru, w_c, b_ru, b_c = p.cell_gru_args
        Bc, Ic, Hc = p.cell_shape
        w_ih, w_hh, b_ih, b_hh = _torch_gru_weights(p, Ic, Hc, w_ru, w_c, b_ru, b_c)
        cell = nn.GRUCell(Ic, Hc)
        with torch.no_grad():
            for param, value in zip(cell.parameters(), (w_ih, w_hh, b_ih, b_hh)):
                param.copy_(t(value))
        xt, ht = t(x), t(h)

        def run():
            with torch.no_grad():
                return cell(xt, ht)
        want = numpy_gru_reset_after(x[None], h, w_ih, w_hh, b_ih, b_hh)[0]
        return Impl("torch", "nn.GRUCell, no_grad", run, lambda: _combine(_fwd_parity(
            run().numpy(), want, "h - h_numpy")), "reset-after GRU")
    raise ValueError(workload)


# --------------------------------------------------------------------------
# The stacked bidirectional LSTM: blockrnn.torch.LSTM vs torch.nn.LSTM
# --------------------------------------------------------------------------

def _stacked_models(torch, p):
    """(nn.LSTM, blockrnn.torch.LSTM, x, h0, c0) of the stacked workloads: an
    ``nn.LSTM(I, H, STACKED_LAYERS, bidirectional=True)`` (float32) with weights
    uniform in [-1/sqrt(H), 1/sqrt(H)] from the problem's seed, its copy by
    ``blockrnn.torch.LSTM.from_torch``, x (T, B, I) and h0, c0 (2L, B, H)."""
    def build():
        import blockrnn.torch as bt
        rng = np.random.default_rng(p.seed + 1)
        k = 1.0 / np.sqrt(p.H)
        ref = torch.nn.LSTM(p.I, p.H, STACKED_LAYERS, bidirectional=True)
        with torch.no_grad():
            for param in ref.parameters():
                param.copy_(torch.from_numpy(
                    rng.uniform(-k, k, tuple(param.shape)).astype(np.float32)))
        states = [torch.from_numpy(rng.uniform(-0.5, 0.5, (2 * STACKED_LAYERS, p.B, p.H))
                                   .astype(np.float32)) for _ in range(2)]
        return ref, bt.LSTM.from_torch(ref), torch.from_numpy(p.x), *states
    return p._cached("stacked", build)


def _stacked_grads(torch, model, x, h0, c0):
    """The gradients of one fwd+bwd run of ``model`` (nn.LSTM or blockrnn.torch.LSTM,
    which holds the same parameters since 0.2) as NumPy, keyed by nn.LSTM's names."""
    out = {"x": x.grad, "h0": h0.grad, "c0": c0.grad}
    out.update({n: q.grad for n, q in model.named_parameters()})
    return {n: g.detach().numpy() for n, g in out.items()}


def _stacked_impl(torch, impl, workload, p):
    """The timed call of one of the two modules (``impl`` "blockrnn" or "torch"); the
    torch row's check compares nn.LSTM's output and gradients with blockrnn.torch.LSTM's."""
    ref, ours, x, h0, c0 = _stacked_models(torch, p)
    model = ours if impl == "blockrnn" else ref
    label = (f"{'blockrnn.torch.LSTM' if impl == 'blockrnn' else 'nn.LSTM'}"
             f"(num_layers={STACKED_LAYERS}, bidirectional=True)")
    if workload == "lstm2bi_fwd":
        def run():
            with torch.no_grad():
                return model(x, (h0, c0))[0]

        def check():
            with torch.no_grad():
                want = ours(x, (h0, c0))[0]
            return _combine(_fwd_parity(run().numpy(), want.numpy(), "y - y_blockrnn"))
        return Impl(impl, f"{label} forward, no_grad", run,
                    None if impl == "blockrnn" else check, "no peepholes")

    def fwdbwd(model):
        """run() of one fwd+bwd of ``model`` on its own copies of x, h0, c0 (inputs too)."""
        inputs = [a.clone().requires_grad_(True) for a in (x, h0, c0)]
        params = list(model.parameters())

        def run():
            for a in [*inputs, *params]:
                a.grad = None
            out = model(inputs[0], tuple(inputs[1:]))[0]
            out.sum().backward()
            return out
        return run, inputs

    run, inputs = fwdbwd(model)
    if impl == "blockrnn":
        return Impl(impl, f"{label} forward + backward(sum of outputs)", run, None,
                    "no peepholes")

    def check():
        out = run()
        run_ours, ours_inputs = fwdbwd(ours)
        want = run_ours().detach().numpy()
        got, g_want = (_stacked_grads(torch, m, *i) for m, i in ((model, inputs),
                                                                  (ours, ours_inputs)))
        return _combine(_fwd_parity(out.detach().numpy(), want, "y - y_blockrnn"),
                        _grad_parity([(n, got[n], g_want[n]) for n in g_want]))
    return Impl(impl, f"{label} forward + backward(sum of outputs)", run, check,
                "no peepholes")


# --------------------------------------------------------------------------
# Inside a PyTorch model: Embedding -> LSTM -> Linear -> cross-entropy, one SGD step
# --------------------------------------------------------------------------

def _model_parts(torch, p):
    """(Embedding(V, I), nn.LSTM(I, H), Linear(H, V), tokens, targets) of the model
    workload, float32, from the problem's seed; tokens and targets are (T, B) int64."""
    def build():
        torch.manual_seed(p.seed)
        rng = np.random.default_rng(p.seed + 2)
        parts = (torch.nn.Embedding(MODEL_VOCAB, p.I), torch.nn.LSTM(p.I, p.H),
                 torch.nn.Linear(p.H, MODEL_VOCAB))
        tokens, targets = (torch.from_numpy(rng.integers(0, MODEL_VOCAB, (p.T, p.B)))
                           for _ in range(2))
        return (*parts, tokens, targets)
    return p._cached("model", build)


def _model_step(torch, impl, p):
    """A training step of a fresh copy of the model (the LSTM: ``nn.LSTM`` for "torch",
    ``blockrnn.torch.LSTM.from_torch(nn_lstm)`` for "blockrnn"): ``step()`` runs forward,
    cross-entropy, backward and an SGD step and returns (loss, the module list)."""
    import copy
    emb, lstm, head, tokens, targets = _model_parts(torch, p)
    emb, lstm, head = (copy.deepcopy(m) for m in (emb, lstm, head))
    if impl == "blockrnn":
        import blockrnn.torch as bt
        lstm = bt.LSTM.from_torch(lstm)
    modules = (emb, lstm, head)
    params = [q for m in modules for q in m.parameters()]
    opt = torch.optim.SGD(params, lr=MODEL_LR)
    loss_fn = torch.nn.functional.cross_entropy

    def step():
        opt.zero_grad(set_to_none=True)
        y = lstm(emb(tokens))[0]                                  # (T, B, H)
        loss = loss_fn(head(y).reshape(-1, MODEL_VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss, modules
    return step


def _model_impl(torch, impl, p):
    step = _model_step(torch, impl, p)
    label = (f"Embedding({MODEL_VOCAB},{p.I}) -> "
             f"{'blockrnn.torch.LSTM.from_torch' if impl == 'blockrnn' else 'nn.LSTM'}"
             f"({p.I},{p.H}) -> Linear({p.H},{MODEL_VOCAB}) -> cross_entropy; "
             "backward, SGD step")
    run = lambda: step()[0]  # noqa: E731

    def check():
        """One step of this model and of the blockrnn one, each from the same weights:
        the loss and the gradients of the embedding and the head agree."""
        got_loss, (g_emb, _, g_head) = _model_step(torch, impl, p)()
        want_loss, (w_emb, _, w_head) = _model_step(torch, "blockrnn", p)()
        return _combine(
            _fwd_parity(got_loss.item(), want_loss.item(), "loss - loss_blockrnn"),
            _grad_parity([("embedding.weight", g_emb.weight.grad, w_emb.weight.grad),
                          ("linear.weight", g_head.weight.grad, w_head.weight.grad),
                          ("linear.bias", g_head.bias.grad, w_head.bias.grad)]))
    return Impl(impl, label, run, None if impl == "blockrnn" else check, "no peepholes")


# --------------------------------------------------------------------------
# ONNX Runtime
# --------------------------------------------------------------------------

ONNX_OPSET = 17


def _ort_session(peers, node, inputs, outputs, initializers):
    onnx, ort = peers.onnx, peers.ort
    h = onnx.helper
    f32 = onnx.TensorProto.FLOAT
    graph = h.make_graph(
        [node], "blockrnn_bench",
        [h.make_tensor_value_info(name, f32, list(a.shape)) for name, a in inputs.items()],
        [h.make_tensor_value_info(name, f32, shape) for name, shape in outputs.items()],
        [onnx.numpy_helper.from_array(np.ascontiguousarray(a, np.float32), name)
         for name, a in initializers.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", ONNX_OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = peers.threads or 0    # 0: ORT's default (physical cores)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess


def _ort(peers, workload, p):
    if workload in STACKED_WORKLOADS or workload in MODEL_WORKLOADS:
        raise Skip(None)
    T, B, I, H = p.shape
    if workload in ("lstm_fwd", "lstm_infer"):
        ifco_to_iofc = (0, 3, 1, 2)
        w = _reorder(p.w, H, ifco_to_iofc)
        init = {"W": w[:I].T[None], "R": w[I:].T[None],
                "B": np.concatenate([_reorder(p.b, H, ifco_to_iofc),
                                     np.zeros(4 * H, np.float32)])[None],
                "P": np.concatenate([p.wci, p.wco, p.wcf])[None]}    # i, o, f
        node = peers.onnx.helper.make_node(
            "LSTM", ["X", "W", "R", "B", "", "initial_h", "initial_c", "P"], ["Y", "Y_h"],
            hidden_size=H)
        feeds = {"X": p.x, "initial_h": p.h0[None], "initial_c": p.cs0[None]}
        sess = _ort_session(peers, node, feeds, {"Y": [T, 1, B, H], "Y_h": [1, B, H]}, init)
        run = lambda: sess.run(["Y"], feeds)  # noqa: E731
        return Impl("ort", "onnxruntime LSTM (peepholes P)", run, lambda: _combine(
            _fwd_parity(run()[0][:, 0], p.lstm_fwd().h, "h - h_blockrnn")))
    if workload in ("gru_fwd", "gru_infer"):
        zrn = np.r_[H:2 * H, 0:H, 2 * H:3 * H]     # ONNX's gate order z, r, h from r, z, n
        init = {"W": p.w_ih[zrn][None], "R": p.w_hh[zrn][None],
                "B": np.concatenate([p.b_ih[zrn], p.b_hh[zrn]])[None]}
        node = peers.onnx.helper.make_node(
            "GRU", ["X", "W", "R", "B", "", "initial_h"], ["Y", "Y_h"], hidden_size=H,
            linear_before_reset=1)
        feeds = {"X": p.x, "initial_h": p.h0[None]}
        sess = _ort_session(peers, node, feeds, {"Y": [T, 1, B, H], "Y_h": [1, B, H]}, init)
        run = lambda: sess.run(["Y"], feeds)  # noqa: E731
        return Impl("ort", "onnxruntime GRU (linear_before_reset=1)", run,
                    lambda: _combine(_fwd_parity(run()[0][:, 0], p.gru_h(), "h - h_numpy")))
    if workload in ("lstm_fwdbwd", "gru_fwdbwd"):
        raise Skip("ONNX Runtime is inference only: no fwd+bwd row")
    if workload in ("lstm_cell", "gru_cell"):
        raise Skip(None)   # not a requested peer of the cell latency
    raise ValueError(workload)


# --------------------------------------------------------------------------
# JAX: the lax.scan models of blockrnn.jax, jitted
# --------------------------------------------------------------------------

def _jax(jax, workload, p):
    if workload in CELL_WORKLOADS or workload in STACKED_WORKLOADS \
            or workload in MODEL_WORKLOADS or workload in INFER_WORKLOADS:
        raise Skip("")   # no cell rows: a jitted single step measures dispatch only
    from blockrnn import jax as bj
    jnp = jax.numpy
    lstm = workload.startswith("lstm")
    if lstm:
        params = {"w": jnp.asarray(p.w), "b": jnp.asarray(p.b)}
        state = (jnp.asarray(p.h0), jnp.asarray(p.cs0))
        model = bj.reference_lstm
    else:
        params = {name: jnp.asarray(getattr(p, k)) for name, k in (
            ("weight_ih", "w_ih"), ("weight_hh", "w_hh"), ("bias_ih", "b_ih"),
            ("bias_hh", "b_hh"))}
        state = jnp.asarray(p.h0)
        model = bj.reference_gru_reset_after
    x = jnp.asarray(p.x)
    want_h = lambda: p.lstm_fwd(False).h if lstm else p.gru_h()  # noqa: E731 (parity only)
    what = "h - h_blockrnn(no peep.)" if lstm else "h - h_numpy"
    note = "lax.scan model, no peepholes" if lstm else "lax.scan model"
    if workload.endswith("_fwd"):
        fwd = jax.jit(lambda params, x, state: model(params, x, state)[0])

        def run():
            return fwd(params, x, state).block_until_ready()
        return Impl("jax", f"jit({model.__name__})", run,
                    lambda: _combine(_fwd_parity(run(), want_h(), what)), note)
    h_grad = jnp.asarray(p.h_grad)

    @jax.jit
    def fwdbwd(params, x, state):
        y, vjp = jax.vjp(lambda params, x, state: model(params, x, state)[0], params, x, state)
        return y, vjp(h_grad)

    def run():
        return jax.block_until_ready(fwdbwd(params, x, state))

    def check():
        y, (dparams, dx, dstate) = run()
        if lstm:
            want = p.lstm_grad(False)
            pairs = [("x_grad", dx, want.x_grad), ("h_prev_grad", dstate[0], want.h_prev_grad),
                     ("cs_prev_grad", dstate[1], want.cs_prev_grad),
                     ("w_grad", dparams["w"], want.w_grad), ("b_grad", dparams["b"], want.b_grad)]
        else:
            want = p.gru_grad()
            pairs = [("x_grad", dx, want.x_grad), ("h_prev_grad", dstate, want.h_prev_grad)] + [
                (f"{k}_grad", dparams[name], getattr(want, f"{k}_grad"))
                for name, k in (("weight_ih", "w_ih"), ("weight_hh", "w_hh"),
                                ("bias_ih", "b_ih"), ("bias_hh", "b_hh"))]
        return _combine(_fwd_parity(y, want_h(), what), _grad_parity(pairs))
    return Impl("jax", f"jit(vjp({model.__name__}))", run, check, note)


class CellProblem(Problem):
    """The batch-1 cell latency problem: one step, ICFO LSTM weights (LSTMBlockCell)."""

    def __init__(self, B, I, H, seed=0):
        super().__init__(1, B, I, H, seed)
        self.cell_shape = (B, I, H)
        w_icfo = _reorder(self.w, H, (0, 2, 1, 3))   # IFCO -> ICFO (a permutation is its own)
        self.cell_lstm_args = (self.x[0], self.cs0, self.h0, w_icfo, self.wci, self.wcf,
                               self.wco, self.b)
        self.cell_gru_args = (self.x[0], self.h0, self.w_ru, self.w_c, self.b_ru, self.b_c)


def build(workload, problem, peers, wanted=IMPLS):
    """The implementations of ``workload`` on ``problem``: (list of Impl, list of messages)."""
    impls, messages = [], []
    makers = {"blockrnn": lambda: _blockrnn(workload, problem),
              "tf": lambda: _tf(peers.tf, workload, problem) if peers.tf else None,
              "torch": lambda: _torch(peers.torch, workload, problem) if peers.torch else None,
              "ort": lambda: _ort(peers, workload, problem) if peers.ort else None,
              "jax": lambda: _jax(peers.jax, workload, problem) if peers.jax else None}
    for name in IMPLS:
        if name not in wanted:
            continue
        try:
            impl = makers[name]()
        except Skip as exc:
            if exc.args and exc.args[0]:
                messages.append(str(exc))
            continue
        except Exception as exc:  # noqa: BLE001 - a broken peer must not stop the run
            messages.append(f"{IMPL_TITLES[name]} {WORKLOAD_TITLES[workload]}: setup failed "
                            f"({type(exc).__name__}: {exc}); row skipped")
            continue
        if impl is not None:
            impls.append(impl)
    return impls, messages
