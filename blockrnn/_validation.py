"""Argument checking shared by every op, done before any compiled code runs.

Every error names the op and the argument, and gives the expected and the
actual shape or dtype: ``ValueError`` for shapes, ranks and values,
``TypeError`` for dtypes and wrongly typed attributes.
"""
import numbers

import numpy as np

from blockrnn import _kernels

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
NATIVE_FLOAT_DTYPES = frozenset(FLOAT_DTYPES)   # (native byte order: '>f4' is not among them)
# SciPy's cython_blas takes 32-bit integers (LP64): every GEMM size must fit.
BLAS_INT_MAX = 2**31 - 1


def native(array):
    """``array`` in native byte order: itself, or its native-order copy.

    The one place where byte order is decided, for every array blockrnn admits
    (float arguments, sequence_length, the layers' inputs): a big-endian
    ``>f4`` array from a file is computed as the ``float32`` array of the
    same values. (The compiled fast paths decline non-native arrays, so they
    reach this.)
    """
    if array.dtype.isnative:
        return array
    return array.astype(array.dtype.newbyteorder("="))


class Arrays:
    """The array arguments of one call, converted to NumPy and dtype-checked.

    Arguments that carry a dtype (NumPy arrays and scalars, TensorFlow and
    PyTorch tensors) must all share one float dtype: blockrnn never casts a
    mixed call. Arguments without a dtype of their own (Python lists and
    scalars) take the dtype of ``x`` (or of the first argument that has one;
    float32 if none does, as in TensorFlow).

    float16 is stored as float16 and computed in float32: ``kernel`` hands the
    kernels float32 copies and ``result`` rounds each output once.
    """

    def __init__(self, op, **values):
        self.op = op
        carried = {}
        for name, value in values.items():
            if value is None:
                raise TypeError(f"{op}: {name} is required, got None")
            if type(value) is np.ndarray and value.dtype in NATIVE_FLOAT_DTYPES:
                carried[name] = value     # (the common call: nothing to convert)
            elif hasattr(value, "dtype"):
                carried[name] = self._as_float_array(name, value)
        ref = "x" if "x" in carried else next(iter(carried), None)
        self.dtype = carried[ref].dtype if ref else np.dtype(np.float32)
        self.compute_dtype = np.dtype(np.float32) if self.dtype == np.float16 else self.dtype
        self._arrays = {}
        for name, value in values.items():
            if name in carried:
                array = carried[name]
                if array.dtype != self.dtype:
                    raise TypeError(
                        f"{op}: {name} has dtype {array.dtype} but {ref} has dtype "
                        f"{self.dtype}; all array arguments must share one dtype "
                        f"(blockrnn does not cast mixed dtypes)")
            else:
                try:
                    array = np.asarray(value, dtype=self.dtype)
                except (TypeError, ValueError) as exc:
                    raise TypeError(
                        f"{op}: {name} cannot be converted to a {self.dtype} array "
                        f"({exc})") from exc
            self._arrays[name] = array

    def _as_float_array(self, name, value):
        try:
            array = native(np.asarray(value))
        except Exception as exc:  # e.g. a torch tensor that requires grad
            raise TypeError(
                f"{self.op}: {name} ({type(value).__name__}) cannot be converted to a "
                f"NumPy array ({exc})") from exc
        if array.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{self.op}: {name} must have dtype float16, float32 or float64, "
                f"got {array.dtype}")
        return array

    def add(self, name, array):
        """Add an argument the caller made itself (e.g. zeros for an omitted gradient)."""
        self._arrays[name] = array

    def __getitem__(self, name):
        return self._arrays[name]

    def rank(self, name, symbolic):
        """Check the rank of ``name`` against ``symbolic`` (e.g. "[B, I]"); return its shape."""
        array = self._arrays[name]
        ndim = symbolic.count(",") + 1
        if array.ndim != ndim:
            raise ValueError(
                f"{self.op}: {name} must have rank {ndim} (shape {symbolic}), got rank "
                f"{array.ndim} with shape {array.shape}")
        return array.shape

    def shape(self, name, symbolic, expected):
        """Check that ``name`` has shape ``expected``, described as ``symbolic``."""
        actual = self._arrays[name].shape
        if actual == expected:   # (a tuple of ints: the common call, no conversion)
            return
        expected = tuple(int(d) for d in expected)
        if actual != expected:
            raise ValueError(
                f"{self.op}: {name} must have shape {symbolic} = {expected}, got {actual}")

    def kernel(self, *names, padded=(), steps=0, lengths=None):
        """C-contiguous arrays in the compute dtype, in the order of ``names``.

        The arrays named in ``padded`` (shape (T, B, ...)) have their padding
        zeroed (zero_padding).
        """
        out = []
        for n in names:
            array = self._arrays[n]
            if n in padded:
                array = zero_padding(array, steps, lengths, self.compute_dtype)
            # C order and aligned: an unaligned view (data offset by a byte)
            # is copied, since the kernels read whole floats from it.
            flags = array.flags
            if not (array.dtype == self.compute_dtype and flags.c_contiguous
                    and flags.aligned):   # (np.require is ~1 us even when it copies nothing)
                array = np.require(array, self.compute_dtype, ("C", "A"))
            out.append(array)
        return out

    def empty(self, *shape):
        """An output buffer in the compute dtype."""
        return np.empty(shape, dtype=self.compute_dtype)

    def output_buffers(self, count, *shape):
        """``count`` output buffers of ``shape`` in the compute dtype: the views
        ``block[k]`` of one (count, *shape) array, or separate arrays from 4 MB
        each on (_kernels.output_buffers; why: new_outputs in _kernels.pyx)."""
        return _kernels.output_buffers(count, shape, self.compute_dtype)

    def results(self, buffers):
        """The outputs in ``buffers`` (from output_buffers) in the storage dtype:
        float16 views of one block are converted as one block, so the results
        share a block as the buffers do."""
        if self.dtype == self.compute_dtype:
            return list(buffers)
        block = buffers[0].base   # separate arrays' (4 MB or more each): a capsule or None
        if isinstance(block, np.ndarray):
            return list(self.result(block))
        return [self.result(b) for b in buffers]

    def zeros(self, shape):
        """An all-zero result in the storage dtype."""
        return np.zeros(shape, dtype=self.dtype)

    def result(self, array):
        """A kernel output converted to the storage dtype (one rounding for float16)."""
        return array.astype(self.dtype, copy=False)


def zero_padding(array, steps, lengths, dtype):
    """``array`` (T, B, ...) as a C-contiguous copy in ``dtype`` whose padding, the
    steps t in [lengths[b], steps) of each row b, is zero; ``array`` itself when no
    row has padding before ``steps`` (lengths None: none). A gradient kernel that
    multiplies such an array by a zero gradient at the padding then gets zeros
    whatever the caller's padding holds (NaN * 0 is NaN)."""
    if lengths is None or not lengths.size or lengths.min() >= steps:
        return array
    out = np.array(array, dtype=dtype, order="C")
    out[:steps][np.arange(steps)[:, None] >= lengths[None, :]] = 0
    return out


def check_bool(op, name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_reverse(op, reverse, L, T, lengths):
    """``reverse`` (the reverse direction read by the sequence kernels themselves) as a
    bool, where it can run: every row at full length (no lengths, L = T)."""
    reverse = check_bool(op, "reverse", reverse)
    if reverse and (lengths is not None or L != T):
        raise ValueError(f"{op}: reverse=True needs every row at full length (no "
                         f"sequence_length, seq_len_max = T = {T}); got seq_len_max {L}"
                         + ("" if lengths is None else " and a sequence_length"))
    return reverse


def check_float(op, name, value):
    """A real number (not a bool) as a Python float; ValueError if it does not fit one."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{op}: {name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        return float(value)
    except OverflowError as exc:  # e.g. 10**400
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(
            f"{op}: {name} must fit a float (magnitude at most {np.finfo(float).max:.4g}), "
            f"got {shown}") from exc


def check_seq_len_max(op, value, time_len):
    """seq_len_max: an integer scalar (Python int or any integer dtype) in [0, T]."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: seq_len_max must be an integer scalar, got bool {value!r}")
    if isinstance(value, numbers.Integral):
        length = int(value)
    else:
        try:
            array = np.asarray(value)
        except Exception as exc:
            raise TypeError(
                f"{op}: seq_len_max must be an integer scalar, got "
                f"{type(value).__name__} ({exc})") from exc
        if array.dtype.kind not in "iu":
            raise TypeError(
                f"{op}: seq_len_max must be an integer scalar, got dtype {array.dtype}")
        if array.ndim != 0:
            raise ValueError(
                f"{op}: seq_len_max must be a scalar (rank 0), got rank {array.ndim} "
                f"with shape {array.shape}")
        length = int(array)
    if not 0 <= length <= time_len:
        raise ValueError(
            f"{op}: seq_len_max must be in [0, T] = [0, {time_len}] (T = x.shape[0]), "
            f"got {length}")
    return length


def check_blas_sizes(op, **sizes):
    """Every size handed to a GEMM must fit SciPy's 32-bit BLAS integers."""
    for what, size in sizes.items():
        if size > BLAS_INT_MAX:
            raise ValueError(
                f"{op}: {what} = {size} exceeds {BLAS_INT_MAX}, the largest size "
                f"SciPy's 32-bit BLAS accepts; split the call into smaller batches")


def check_sequence_length(op, value, batch, time_len):
    """sequence_length: None, or one integer length per batch row in [0, T].

    Returns None or a C-contiguous int64 array of shape (B,).
    """
    if value is None:
        return None
    try:
        array = native(np.asarray(value))
    except Exception as exc:
        raise TypeError(
            f"{op}: sequence_length must be an integer array of shape (B,), got "
            f"{type(value).__name__} ({exc})") from exc
    if array.dtype.kind not in "iu" or array.dtype == np.bool_:
        if not (array.size == 0 and array.dtype == np.float64):  # e.g. np.asarray([])
            raise TypeError(
                f"{op}: sequence_length must have an integer dtype, got {array.dtype}")
    if array.shape != (batch,):
        raise ValueError(
            f"{op}: sequence_length must have shape (B,) = ({batch},), got {array.shape}")
    if array.size and (array.min() < 0 or array.max() > time_len):
        raise ValueError(
            f"{op}: sequence_length entries must be in [0, T] = [0, {time_len}], got "
            f"values in [{array.min()}, {array.max()}]")
    return np.require(array, np.int64, ("C", "A"))


def steps_to_run(seq_len_max, lengths):
    """Steps the time loop must run: seq_len_max, or fewer if every row ends earlier."""
    if lengths is None or lengths.size == 0:
        return seq_len_max
    return min(seq_len_max, int(lengths.max()))


# Why reset-after GRUs (Keras 3's default, torch.nn.GRU) cannot be converted; used by
# blockrnn.convert and blockrnn.torch.
RESET_AFTER = (
    "{what} applies the reset gate AFTER the recurrent matmul "
    "(n = tanh(x @ W_n + b_n + r * (h @ U_n + b_hn))), while blockrnn's GRU (TensorFlow's "
    "GRUBlockCell) applies it BEFORE (c = tanh([x, r * h] @ w_c + b_c)); these are "
    "different functions, so the weights cannot be converted.{hint}")
