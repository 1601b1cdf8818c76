# Compiled core of blockrnn: TensorFlow's block-RNN kernels for float and double.
# One extension module; each family is a file of its own, included below:
#   _packed.pxi   the packed-weight product, its thread budget and thread split
#   _common.pxi   row lengths, zeroing, column sums, gemm_memview
#   _outputs.pxi  the C fast paths' argument checks and output allocation
#   _lstm.pxi     LSTMBlockCell, BlockLSTM(V2), forward and backward
#   _gru.pxi      GRUBlockCell, block_gru, forward and backward
#   _gru_reset_after.pxi  the reset-after GRU (nn.GRU's), forward and backward
#   _lstm_proj.pxi the projected LSTM (nn.LSTM with proj_size), forward and backward
#   _inference.pxi weights packed once; the inference forwards (y and final states only)
#   _capi.pxi     the C-level API (declared in _kernels.pxd)
#   _sequence.pxi reverse_prefixes, reverse_prefixes_in_place (the reverse direction's
#                 reversal)
#
# Two tiers (as in scikit-learn's k-means):
# - `def` entry points take C-contiguous memoryviews (`# IN` const, `# OUT`
#   preallocated by the caller), allocate one workspace per call and release
#   the GIL around all the work. They trust their callers (blockrnn/lstm.py
#   and blockrnn/gru.py, through blockrnn/_validation.py) to have validated
#   every shape and dtype; the `*_fast` entry points check their own.
# - `cdef ... noexcept nogil` helpers take pointers and row strides.
#
# Equations cite ../shared/SPEC.md (section numbers as "SPEC §3").
# Names: B batch, I input size, H cell size, T time steps, L = seq_len_max.
# Gate blocks of H columns in the op's layout (ICFO or IFCO), see GateOffsets.
# Where products run: from 2 rows on, the float32 sequence ops (LSTM v1/v2 and
# GRU, forward and backward) run their per-step products in blockrnn's packed
# kernel (include/brnn_packed.h), in one OpenMP parallel region per call
# (lstm_forward_packed, the *_packed loops); the forwards compute their input
# projection of all steps in the same region before the loop. At batch 1 the
# float32 forwards compute the input projection of all steps in the packed kernel
# (packed_inputs) and each step's recurrent product by the one-row kernel of
# include/brnn_inference.h (step_product, the inference forward's: the same
# bits). The float32 backwards (every batch) compute x_grad and the
# weight gradients after their loop in the same kernel through the GEMM driver
# of include/brnn_gemm.h (packed_gemm_jobs). All of those take their threads
# from the thread budget and split rows or column panels, never a sum, so no
# thread count changes a bit. Every other product (float64, batch 1's backward
# steps and the cells) goes through blockrnn/_blas.pxd (SciPy's BLAS), and the
# per-timestep gate math of those routes runs in OpenMP prange loops over rows.
# Nothing is allocated inside the time loops; the only global mutable state is
# the thread budget of include/brnn_packed.h (the packed-kernel variant is
# chosen once at import and never changes).
from cython cimport floating
from cython.parallel cimport parallel, prange
cimport numpy as cnp
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc
from cpython.pycapsule cimport (PyCapsule_GetContext, PyCapsule_GetPointer, PyCapsule_New,
                                 PyCapsule_SetContext, PyCapsule_SetDestructor)
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM

import numbers

import numpy as np

cnp.import_array()

from blockrnn._blas cimport gemm, gemm_small_by_weights_t, transpose
from blockrnn._openmp cimport (BRNN_OPENMP_ENABLED, brnn_omp_barrier, brnn_omp_get_max_threads,
                               brnn_omp_get_num_procs, brnn_omp_get_num_threads,
                               brnn_omp_get_thread_num)

# The families, one file each (textually included: one extension module).
include "_packed.pxi"
include "_common.pxi"
include "_outputs.pxi"
include "_lstm.pxi"
include "_gru.pxi"
include "_gru_reset_after.pxi"
include "_lstm_proj.pxi"
include "_inference.pxi"
include "_capi.pxi"
include "_sequence.pxi"


def openmp_enabled():
    """Whether the extension was built with OpenMP."""
    return bool(BRNN_OPENMP_ENABLED)


def openmp_max_threads():
    """omp_get_max_threads() (1 without OpenMP)."""
    return brnn_omp_get_max_threads()
