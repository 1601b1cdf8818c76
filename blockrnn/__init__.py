"""blockrnn: TensorFlow's fused block-RNN kernels for NumPy, without TensorFlow.

The eight ops of ``tf.raw_ops`` (LSTMBlockCell, LSTMBlockCellGrad, BlockLSTM,
BlockLSTMGrad, BlockLSTMV2, BlockLSTMGradV2, GRUBlockCell, GRUBlockCellGrad)
with TensorFlow 2.21's exact semantics, as snake_case functions here and under
their TensorFlow names in ``blockrnn.raw_ops``, plus a sequence GRU
(``block_gru``, ``block_gru_grad``), nn.GRU's reset-after GRU
(``block_gru_reset_after`` and its gradient, ``gru_cell_reset_after``) and
per-row ``sequence_length``.
``LSTM`` and ``GRU`` are trainable NumPy layers over the sequence ops,
``blockrnn.convert`` imports Keras / PyTorch / ONNX weights. Imported on their
own, each needing its framework: ``blockrnn.torch`` wraps the ops as autograd
Functions and ``nn.Module``s, ``blockrnn.jax`` as differentiable JAX functions,
``blockrnn.onnx`` exports the layers as ONNX models, and ``blockrnn.bench`` is
the benchmark harness (``python -m blockrnn bench``). Every call releases the GIL
around its compiled work and keeps no global state but a count of its threads
in use (README, Threads), so threads may call blockrnn concurrently.
"""
import os as _os

# GNU OpenMP reads its wait policy once, when it is loaded (by the import of
# _kernels below, unless another module loaded it first). Its default keeps
# the workers of a finished parallel region spinning for ~0.3 s, on the cores
# the OpenBLAS GEMM that follows needs (measured: an sgemm of 1600x256x1024
# took 24.0 ms right after a 2-thread region, 14.3 ms after a serial call).
# A worker that sleeps at once instead (OMP_WAIT_POLICY=PASSIVE, the former
# choice) is woken at every call, and Linux sometimes wakes it onto the
# caller's CPU with the other one idle: on a 2-core KVM guest, 2-thread
# batch-1 inference calls then ran at 1 thread's speed or 4x slower for tens
# of ms (docs/performance.md). So its workers spin GOMP_SPINCOUNT=1000 times
# (~30 us) after a region, then sleep: back-to-back calls find them awake,
# and nothing is left spinning after them. Set only for the load, and only if
# the user set neither variable: other libraries and child processes see the
# environment as it was.
_SPIN = "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ
if _SPIN:
    _os.environ["GOMP_SPINCOUNT"] = "1000"
try:
    from blockrnn import _kernels  # noqa: F401
except ImportError as exc:  # pragma: no cover - only when run from an unbuilt tree
    raise ImportError(
        "blockrnn's compiled core (blockrnn._kernels) is not built. Install the package "
        "with `pip install .` (or `pip install -e .` for development), or build it in "
        f"place with `python setup.py build_ext --inplace`. Original error: {exc}") from exc
finally:
    if _SPIN:
        del _os.environ["GOMP_SPINCOUNT"]

from blockrnn import raw_ops
from blockrnn._config import build_config, show_config
from blockrnn._version import __version__
from blockrnn.gru import (
    block_gru, block_gru_grad, gru_block_cell, gru_block_cell_grad, gru_block_cell_grad_full)
from blockrnn.gru_reset_after import (
    block_gru_reset_after, block_gru_reset_after_grad, gru_cell_reset_after,
    gru_cell_reset_after_grad)
from blockrnn.lstm import (
    block_lstm, block_lstm_grad, block_lstm_grad_v2, block_lstm_v2, lstm_block_cell,
    lstm_block_cell_grad, lstm_block_cell_grad_full)
from blockrnn.sequence import reverse_sequence
from blockrnn import convert  # noqa: E402  (after the ops: the layers call them)
from blockrnn.layers import GRU, LSTM  # noqa: E402
from blockrnn.inference import GRUInference, LSTMInference  # noqa: E402

__all__ = [
    "__version__", "raw_ops", "show_config", "build_config",
    "lstm_block_cell", "lstm_block_cell_grad", "lstm_block_cell_grad_full",
    "block_lstm", "block_lstm_v2", "block_lstm_grad", "block_lstm_grad_v2",
    "gru_block_cell", "gru_block_cell_grad", "gru_block_cell_grad_full",
    "block_gru", "block_gru_grad", "reverse_sequence",
    "block_gru_reset_after", "block_gru_reset_after_grad", "gru_cell_reset_after",
    "gru_cell_reset_after_grad",
    "LSTM", "GRU", "LSTMInference", "GRUInference", "convert",
]
