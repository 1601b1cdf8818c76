"""Sequence utilities shared by the layers and adapters."""
import numpy as np

from blockrnn import _kernels
from blockrnn._validation import check_sequence_length, native

__all__ = ["reverse_sequence"]


def reverse_sequence(x, sequence_length=None):
    """Reverse the first ``sequence_length[b]`` steps of every row b of a time-major array.

    ``tf.reverse_sequence(x, sequence_length, seq_axis=0, batch_axis=1)``:
    for row b of length n_b, ``out[t, b] = x[n_b - 1 - t, b]`` for t < n_b and
    ``out[t, b] = x[t, b]`` (the padding, unchanged) for t >= n_b. With
    ``sequence_length=None`` every row has length T (``x[::-1]``). The map is
    its own inverse, so it also carries a gradient back.

    This is how the reverse direction of a bidirectional layer reads a padded
    batch: each row's valid prefix backwards, as PyTorch runs packed and padded
    sequences.

    Parameters
    ----------
    x : array (T, B, ...) of any numeric dtype
    sequence_length : None or integer array (B,), 0 <= n_b <= T

    Returns
    -------
    out : new C-contiguous array, same shape and dtype as x (native byte order)
    """
    where = "blockrnn.reverse_sequence"
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"{where}: x must have shape (T, B, ...) (at least 2 dimensions), "
                         f"got shape {x.shape}")
    if x.dtype.kind not in "biufc":
        raise TypeError(f"{where}: x must have a numeric or bool dtype, got {x.dtype}")
    T, B = x.shape[:2]
    lengths = check_sequence_length(where, sequence_length, B, T)
    x = native(x)
    if lengths is None:   # one copy from any layout (a strided gradient, a memmap)
        return np.array(x[::-1], order="C")   # a copy even where x[::-1] is contiguous
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    row = x.dtype.itemsize * (x.size // (T * B) if T * B else 0)
    if out.size:
        _kernels.reverse_prefixes(x.view(np.uint8).reshape(T, B, row), lengths,
                                  out.view(np.uint8).reshape(T, B, row))
    return out


def reverse_sequence_in_place(a, lengths):
    """``reverse_sequence(a, lengths)`` written over ``a`` itself, returned.

    For arrays the caller owns and nobody else sees (a kernel's new output):
    the reversal then allocates nothing, where ``reverse_sequence`` writes a
    second (T, B, ...) array, whose pages are new to the process at large T*B
    (page faults, docs/performance.md). a: C-contiguous, writeable, native
    byte order, (T, B, ...); lengths: None or as ``check_sequence_length``
    returns it (int64 (B,) in [0, T]).
    """
    if not (isinstance(a, np.ndarray) and a.ndim >= 2 and a.flags.c_contiguous
            and a.flags.writeable and a.dtype.isnative):
        raise ValueError("blockrnn.sequence.reverse_sequence_in_place: a must be a "
                         "writeable C-contiguous native (T, B, ...) array")
    T, B = a.shape[:2]
    if lengths is None:
        lengths = np.full(B, T, np.int64)
    row = a.dtype.itemsize * (a.size // (T * B) if T * B else 0)
    if a.size:
        _kernels.reverse_prefixes_in_place(a.view(np.uint8).reshape(T, B, row), lengths)
    return a
