# Compiled core of blockrnn: TensorFlow's block-RNN kernels for float and double.
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
# (lstm_forward_packed, the *_packed loops); the forwards fold their input
# projection into those steps too. At batch 1 the float32 forwards compute the
# input projection of all steps in the packed kernel (packed_inputs) and the
# steps by GEMV. Every other product (float64, batch 1's steps, the
# cells, and the backward's x_grad and weight gradients after the loop) goes
# through blockrnn/_blas.pxd (SciPy's BLAS), and the per-timestep gate math
# of those routes runs in OpenMP prange loops over rows.
# Nothing is allocated inside the time loops; the only global mutable state is
# the thread budget of include/brnn_packed.h (the packed-kernel variant is
# chosen once at import and never changes).
from cython cimport floating
from cython.parallel cimport parallel, prange
cimport numpy as cnp
from libc.stdint cimport int64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM

import numpy as np

cnp.import_array()

from blockrnn._blas cimport gemm, gemm_small_by_weights, gemm_small_by_weights_t, transpose
from blockrnn._openmp cimport (BRNN_OPENMP_ENABLED, brnn_omp_barrier, brnn_omp_get_max_threads,
                               brnn_omp_get_num_threads, brnn_omp_get_thread_num)

cdef extern from "brnn_packed.h" nogil:
    ctypedef void (*brnn_packed_fn)(Py_ssize_t rows, Py_ssize_t K, const float* A,
                                    Py_ssize_t lda, const float* P, Py_ssize_t n0,
                                    Py_ssize_t n1, int accumulate, float* C, Py_ssize_t ldc)
    enum:
        BRNN_NR
        BRNN_PACKED_PORTABLE
        BRNN_PACKED_AVX2
        BRNN_PACKED_AVX512
    Py_ssize_t brnn_packed_size(Py_ssize_t K, Py_ssize_t N)
    void brnn_pack_f32(Py_ssize_t K, Py_ssize_t N, const float* w, Py_ssize_t sk,
                       Py_ssize_t sn, float* P)
    int brnn_packed_path_supported(int path)
    int brnn_packed_best_path()
    brnn_packed_fn brnn_packed_kernel(int path)
    int brnn_budget_take(int want, int total)
    void brnn_budget_give(int n)
    int brnn_budget_in_use()
    ctypedef struct brnn_barrier:
        int count
        int gen
    void brnn_barrier_wait(brnn_barrier* b, int n)

cdef extern from "brnn_lstm.h" nogil:
    void brnn_lstm_forward_row_f32(
        Py_ssize_t H, const float* gi, const float* gc, const float* gf, const float* go,
        const float* bi, const float* bc, const float* bf, const float* bo,
        const float* wci, const float* wcf, const float* wco, float forget_bias,
        float cell_clip, int peep, int acc, const float* cs_prev,
        float* i_, float* cs, float* f, float* o, float* ci, float* co, float* h)
    void brnn_lstm_forward_row_f64(
        Py_ssize_t H, const double* gi, const double* gc, const double* gf, const double* go,
        const double* bi, const double* bc, const double* bf, const double* bo,
        const double* wci, const double* wcf, const double* wco, double forget_bias,
        double cell_clip, int peep, int acc, const double* cs_prev,
        double* i_, double* cs, double* f, double* o, double* ci, double* co, double* h)

    void brnn_lstm_backward_row_f32(
        Py_ssize_t H, const float* cs_prev, const float* i_, const float* f, const float* o,
        const float* ci, const float* co, const float* cs_grad, const float* h_grad,
        const float* dh_carry, const float* wci, const float* wcf, const float* wco,
        int peep, int carry, float* d_i, float* d_c, float* d_f, float* d_o,
        float* cs_prev_grad)
    void brnn_lstm_backward_row_f64(
        Py_ssize_t H, const double* cs_prev, const double* i_, const double* f,
        const double* o, const double* ci, const double* co, const double* cs_grad,
        const double* h_grad, const double* dh_carry, const double* wci, const double* wcf,
        const double* wco, int peep, int carry, double* d_i, double* d_c, double* d_f,
        double* d_o, double* cs_prev_grad)

cdef extern from "brnn_gru.h" nogil:
    void brnn_gru_gates_row_f32(Py_ssize_t H, const float* pre_r, const float* pre_u,
                                const float* b_r, const float* b_u, const float* h_prev,
                                int acc, float* r, float* u, float* rh)
    void brnn_gru_gates_row_f64(Py_ssize_t H, const double* pre_r, const double* pre_u,
                                const double* b_r, const double* b_u, const double* h_prev,
                                int acc, double* r, double* u, double* rh)
    void brnn_gru_output_row_f32(Py_ssize_t H, const float* b_c, const float* h_prev,
                                 const float* u, float* c, float* h)
    void brnn_gru_output_row_f64(Py_ssize_t H, const double* b_c, const double* h_prev,
                                 const double* u, double* c, double* h)

# Column offsets of the four gate blocks (SPEC §2).
ctypedef struct GateOffsets:
    Py_ssize_t i, c, f, o

cpdef enum GateLayout:
    ICFO = 0  # LSTMBlockCell, BlockLSTM
    IFCO = 1  # BlockLSTMV2


def openmp_enabled():
    """Whether the extension was built with OpenMP."""
    return bool(BRNN_OPENMP_ENABLED)


def openmp_max_threads():
    """omp_get_max_threads() (1 without OpenMP)."""
    return brnn_omp_get_max_threads()


# ---------------------------------------------------------------------------
# The packed recurrent kernel (include/brnn_packed.h): its variant is chosen
# once, at import, from the CPU's features or BLOCKRNN_KERNEL.
# ---------------------------------------------------------------------------

PACKED_PATHS = {"portable": BRNN_PACKED_PORTABLE, "avx2": BRNN_PACKED_AVX2,
                "avx512": BRNN_PACKED_AVX512}


def packed_paths_supported():
    """Names of the packed-kernel variants this CPU can run, fastest first."""
    return [name for name in ("avx512", "avx2", "portable")
            if brnn_packed_path_supported(PACKED_PATHS[name])]


cdef int choose_packed_path() except -1:
    """BLOCKRNN_KERNEL = auto (default) | avx512 | avx2 | portable. Forcing a
    variant this CPU lacks is refused here (it would die of SIGILL)."""
    import os
    name = os.environ.get("BLOCKRNN_KERNEL", "auto").strip().lower() or "auto"
    if name == "auto":
        return brnn_packed_best_path()
    if name not in PACKED_PATHS:
        raise ValueError(f"BLOCKRNN_KERNEL must be one of auto, avx512, avx2, portable; "
                         f"got {name!r}")
    if not brnn_packed_path_supported(PACKED_PATHS[name]):
        raise RuntimeError(f"BLOCKRNN_KERNEL={name}, but this CPU cannot run it (it can "
                           f"run: {', '.join(packed_paths_supported())}); unset it or "
                           f"choose one of those")
    return PACKED_PATHS[name]


# Set once at import, read-only afterwards (like an ifunc resolution).
cdef int packed_path = choose_packed_path()
cdef brnn_packed_fn packed_product = brnn_packed_kernel(packed_path)


def packed_kernel_name():
    """The packed-kernel variant this process runs (avx512, avx2 or portable)."""
    return {v: k for k, v in PACKED_PATHS.items()}[packed_path]


def packed_product_memview(const float[:, ::1] a, const float[:, :] w, bint accumulate,
                           float[:, ::1] c, str path=None, Py_ssize_t n0=0,
                           Py_ssize_t n1=-1, int repeat=1):
    """C[:, n0:n1] (+)= A @ W[:, n0:n1] through the packed kernel (for its tests):
    W [K, N] (any strides) packed, then one call of the variant `path` (this
    process's by default; one the CPU cannot run raises ValueError).
    A [rows, K], C [rows, N]; n0 a multiple of 16. `repeat` runs the
    product that many times on the one packing (to time the kernel alone)."""
    cdef Py_ssize_t rows = a.shape[0], K = a.shape[1], N = w.shape[1]
    cdef int p = packed_path if path is None else PACKED_PATHS.get(path, -1)
    if p < 0 or not brnn_packed_path_supported(p):
        raise ValueError(f"packed_product_memview: path {path!r} is not one of "
                         f"{packed_paths_supported()}")
    if n1 < 0:
        n1 = N
    if (w.shape[0] != K or c.shape[0] != rows or c.shape[1] != N or rows == 0
            or not 0 <= n0 <= n1 <= N or n0 % BRNN_NR):
        raise ValueError("packed_product_memview: inconsistent shapes or column range")
    cdef float[::1] packed = np.empty(brnn_packed_size(K, N) + 1, dtype=np.float32)
    cdef brnn_packed_fn fn = brnn_packed_kernel(p)
    cdef Py_ssize_t sk = w.strides[0] // 4, sn = w.strides[1] // 4
    with nogil:
        brnn_pack_f32(K, N, &w[0, 0] if K > 0 and N > 0 else NULL, sk, sn, &packed[0])
        for _ in range(repeat):
            fn(rows, K, &a[0, 0] if K > 0 else NULL, K, &packed[0], n0, n1, accumulate,
               &c[0, 0], N)


def packed_threads_for(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, Py_ssize_t H, int limit):
    """packed_threads: the threads a sequence call's per-step products
    [B, K] @ [K, N] over H cells ask of the budget (for the tests)."""
    return packed_threads(B, K, N, H, limit)


def packed_input_threads_for(Py_ssize_t rows, Py_ssize_t I, Py_ssize_t N, Py_ssize_t H,
                             int limit):
    """packed_input_threads: the threads a batch-1 forward's input projection
    [rows, I] @ [I, N] over H cells asks of the budget (for the tests)."""
    return packed_input_threads(rows, I, N, H, limit)


def thread_budget_take(int want, int total):
    """brnn_budget_take (for the thread-budget tests; give the grant back)."""
    return brnn_budget_take(want, total)


def thread_budget_give(int n):
    """brnn_budget_give (for the thread-budget tests)."""
    brnn_budget_give(n)


def thread_budget_in_use():
    """blockrnn's threads in use by running sequence calls in this process."""
    return brnn_budget_in_use()


def gemm_memview(bint trans_a, bint trans_b, double alpha, const floating[:, :] a,
                 const floating[:, :] b, double beta, floating[:, :] c):
    """C = alpha * op(A) @ op(B) + beta * C through _blas.pxd's gemm, the one
    routine every product of the kernels goes through (for its tests). The
    views may be column blocks of larger arrays: their row strides are passed
    as leading dimensions. C [m, n]; op(A) [m, k]; op(B) [k, n]."""
    cdef Py_ssize_t size = sizeof(floating)
    if a.strides[1] != size or b.strides[1] != size or c.strides[1] != size:
        raise ValueError("gemm_memview: rows must be contiguous")
    cdef Py_ssize_t m = c.shape[0], n = c.shape[1]
    cdef Py_ssize_t k = a.shape[0] if trans_a else a.shape[1]
    if ((a.shape[1] if trans_a else a.shape[0]) != m
            or (b.shape[1] if trans_b else b.shape[0]) != k
            or (b.shape[0] if trans_b else b.shape[1]) != n):
        raise ValueError(f"gemm_memview: op(A) {(a.shape[0], a.shape[1])} (trans "
                         f"{trans_a}) @ op(B) {(b.shape[0], b.shape[1])} (trans {trans_b}) "
                         f"does not give C {(m, n)}")
    if max(m, n, k) > 2**30 // 4 or min(m, n, k) == 0:
        raise ValueError("gemm_memview: every size must be in [1, 2**28]")
    with nogil:
        gemm(trans_a, trans_b, m, n, k, <floating>alpha, &a[0, 0], a.strides[0] // size,
             &b[0, 0], b.strides[0] // size, <floating>beta, &c[0, 0], c.strides[0] // size)


cdef GateOffsets gate_offsets(int layout, Py_ssize_t H) noexcept nogil:
    cdef GateOffsets off
    off.i = 0
    off.o = 3 * H
    if layout == IFCO:
        off.f = H
        off.c = 2 * H
    else:
        off.c = H
        off.f = 2 * H
    return off


cdef inline const int64_t* lengths_from(const int64_t* lengths,
                                        Py_ssize_t row) noexcept nogil:
    """The lengths of the rows from `row` on (NULL stays NULL: no lengths)."""
    if lengths == NULL:
        return NULL
    return lengths + row


cdef inline bint finished(const int64_t* lengths, Py_ssize_t row,
                          Py_ssize_t t) noexcept nogil:
    """Whether batch row `row` is past its sequence length at step t."""
    return lengths != NULL and t >= lengths[row]


cdef inline void zero_rows(Py_ssize_t rows, Py_ssize_t width, const int64_t* lengths,
                           Py_ssize_t t, floating* a) noexcept nogil:
    """a[r, :] = 0 for the rows (row stride `width`) past their length at step t."""
    cdef Py_ssize_t r
    if lengths == NULL:
        return
    for r in range(rows):
        if t >= lengths[r]:
            memset(a + r * width, 0, width * sizeof(floating))


cdef inline void zero_lstm_outputs(
        Py_ssize_t at, Py_ssize_t n, floating* i_, floating* cs, floating* f, floating* o,
        floating* ci, floating* co, floating* h) noexcept nogil:
    """The seven LSTM outputs' elements [at, at + n) = 0 (a finished row, or the
    steps past seq_len_max)."""
    cdef size_t nbytes = n * sizeof(floating)
    memset(i_ + at, 0, nbytes)
    memset(cs + at, 0, nbytes)
    memset(f + at, 0, nbytes)
    memset(o + at, 0, nbytes)
    memset(ci + at, 0, nbytes)
    memset(co + at, 0, nbytes)
    memset(h + at, 0, nbytes)


cdef inline void zero_gru_outputs(Py_ssize_t at, Py_ssize_t n, floating* r, floating* u,
                                  floating* c, floating* h) noexcept nogil:
    """The four GRU outputs' elements [at, at + n) = 0."""
    cdef size_t nbytes = n * sizeof(floating)
    memset(r + at, 0, nbytes)
    memset(u + at, 0, nbytes)
    memset(c + at, 0, nbytes)
    memset(h + at, 0, nbytes)


# ---------------------------------------------------------------------------
# LSTM elementwise kernels (one batch row each)
# ---------------------------------------------------------------------------

cdef void lstm_forward_block(
        Py_ssize_t rows, Py_ssize_t H, GateOffsets off,
        const floating* g,        # IN  [rows, 4H] x@Wx + h_prev@Wh (no bias yet)
        const floating* bias,     # IN  [4H]
        const floating* cs_prev,  # IN  [rows, H]
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H], if peephole
        floating forget_bias, floating cell_clip, bint use_peephole,
        const int64_t* lengths, Py_ssize_t t,  # IN [rows] or NULL; the step
        bint accumulate,          # IN: i, ci, f, o hold x @ Wx (g is h_prev @ Wh)
        floating* i_, floating* cs, floating* f, floating* o,  # OUT [rows, H] each
        floating* ci, floating* co, floating* h,
        Py_ssize_t u0=0, Py_ssize_t nu=-1) noexcept nogil:
    """SPEC §3 for a block of rows, one fused pass per row (include/brnn_lstm.h
    has the math and its order), over the cells [u0, u0 + nu) (default: all
    H). With `accumulate`, the pre-activation of each gate is (its output's
    value + g) + bias, else g + bias. Rows past their length (`lengths`, if
    given) get zeros."""
    cdef Py_ssize_t r, k
    cdef const floating* gr
    if nu < 0:
        nu = H
    for r in range(rows):
        k = r * H + u0
        if finished(lengths, r, t):
            zero_lstm_outputs(k, nu, i_, cs, f, o, ci, co, h)
            continue
        gr = g + r * 4 * H + u0
        if floating is float:
            brnn_lstm_forward_row_f32(
                nu, gr + off.i, gr + off.c, gr + off.f, gr + off.o, bias + off.i + u0,
                bias + off.c + u0, bias + off.f + u0, bias + off.o + u0, wci + u0, wcf + u0,
                wco + u0, forget_bias, cell_clip, use_peephole, accumulate, cs_prev + k,
                i_ + k, cs + k, f + k, o + k, ci + k, co + k, h + k)
        else:
            brnn_lstm_forward_row_f64(
                nu, gr + off.i, gr + off.c, gr + off.f, gr + off.o, bias + off.i + u0,
                bias + off.c + u0, bias + off.f + u0, bias + off.o + u0, wci + u0, wcf + u0,
                wco + u0, forget_bias, cell_clip, use_peephole, accumulate, cs_prev + k,
                i_ + k, cs + k, f + k, o + k, ci + k, co + k, h + k)


cdef void lstm_backward_block(
        Py_ssize_t rows, Py_ssize_t H, GateOffsets off,
        const floating* cs_prev,  # IN [rows, H]
        const floating* i_, const floating* f, const floating* o,  # IN [rows, H] forward
        const floating* ci, const floating* co,
        const floating* cs_grad, const floating* h_grad,  # IN [rows, H] upstream gradients
        const floating* dh_carry,  # IN [rows, H] gradient of h from step t+1 (if add_carry)
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H], if peephole
        bint use_peephole, bint add_carry,
        const int64_t* lengths, Py_ssize_t t,  # IN [rows] or NULL; the step
        floating* dg,              # OUT [rows, 4H] gradient of the pre-activation gates
        floating* cs_prev_grad,    # IN/OUT [rows, H], see below
        Py_ssize_t u0=0, Py_ssize_t nu=-1) noexcept nogil:
    """SPEC §4 for a block of rows (clipping ignored, as in TensorFlow).

    The sequence backward (SPEC §5) sets add_carry: the gradients of h and cs
    flowing back from step t+1 (dh_carry, and cs_prev_grad as it is on entry)
    are added to h_grad and cs_grad. cs_prev_grad is then overwritten, element
    by element after its read, with the gradient of cs_prev. Rows past their
    length get zero gradients (their upstream gradients are not used). One
    fused pass per row: include/brnn_lstm.h has the math and its order. Only
    the cells [u0, u0 + nu) (default: all H) are computed."""
    cdef Py_ssize_t r, k, size
    cdef floating* dgr
    if nu < 0:
        nu = H
    size = nu * sizeof(floating)
    for r in range(rows):
        dgr = dg + r * 4 * H + u0
        k = r * H + u0
        if finished(lengths, r, t):
            memset(dgr + off.i, 0, size)
            memset(dgr + off.c, 0, size)
            memset(dgr + off.f, 0, size)
            memset(dgr + off.o, 0, size)
            memset(cs_prev_grad + k, 0, size)
            continue
        if floating is float:
            brnn_lstm_backward_row_f32(
                nu, cs_prev + k, i_ + k, f + k, o + k, ci + k, co + k, cs_grad + k,
                h_grad + k, dh_carry + k if add_carry else NULL, wci + u0, wcf + u0,
                wco + u0, use_peephole, add_carry, dgr + off.i, dgr + off.c, dgr + off.f,
                dgr + off.o, cs_prev_grad + k)
        else:
            brnn_lstm_backward_row_f64(
                nu, cs_prev + k, i_ + k, f + k, o + k, ci + k, co + k, cs_grad + k,
                h_grad + k, dh_carry + k if add_carry else NULL, wci + u0, wcf + u0,
                wco + u0, use_peephole, add_carry, dgr + off.i, dgr + off.c, dgr + off.f,
                dgr + off.o, cs_prev_grad + k)


cdef void lstm_forward_rows(
        Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const floating* g, const floating* bias, const floating* cs_prev,
        const floating* wci, const floating* wcf, const floating* wco,
        floating forget_bias, floating cell_clip, bint use_peephole,
        const int64_t* lengths, Py_ssize_t t, bint accumulate,
        floating* i_, floating* cs, floating* f, floating* o,
        floating* ci, floating* co, floating* h, int n_threads) noexcept nogil:
    """lstm_forward_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        lstm_forward_block(B, H, off, g, bias, cs_prev, wci, wcf, wco, forget_bias,
                           cell_clip, use_peephole, lengths, t, accumulate,
                           i_, cs, f, o, ci, co, h)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        lstm_forward_block(r1 - r0, H, off, g + r0 * 4 * H, bias, cs_prev + r0 * H,
                           wci, wcf, wco, forget_bias, cell_clip, use_peephole,
                           lengths_from(lengths, r0), t, accumulate,
                           i_ + r0 * H, cs + r0 * H, f + r0 * H, o + r0 * H,
                           ci + r0 * H, co + r0 * H, h + r0 * H)


cdef void lstm_backward_rows(
        Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const floating* cs_prev,
        const floating* i_, const floating* f, const floating* o,
        const floating* ci, const floating* co,
        const floating* cs_grad, const floating* h_grad, const floating* dh_carry,
        const floating* wci, const floating* wcf, const floating* wco,
        bint use_peephole, bint add_carry, const int64_t* lengths, Py_ssize_t t,
        floating* dg, floating* cs_prev_grad, int n_threads) noexcept nogil:
    """lstm_backward_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        lstm_backward_block(B, H, off, cs_prev, i_, f, o, ci, co, cs_grad, h_grad, dh_carry,
                            wci, wcf, wco, use_peephole, add_carry, lengths, t, dg,
                            cs_prev_grad)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        lstm_backward_block(
            r1 - r0, H, off, cs_prev + r0 * H, i_ + r0 * H, f + r0 * H, o + r0 * H,
            ci + r0 * H, co + r0 * H, cs_grad + r0 * H, h_grad + r0 * H,
            dh_carry + r0 * H, wci, wcf, wco, use_peephole, add_carry,
            lengths_from(lengths, r0), t,
            dg + r0 * 4 * H, cs_prev_grad + r0 * H)


# ---------------------------------------------------------------------------
# Reductions (accumulated in double, as scikit-learn does for long sums)
# ---------------------------------------------------------------------------

cdef void column_sums(Py_ssize_t rows, Py_ssize_t cols, const floating* a,
                      double* acc) noexcept nogil:
    """acc[j] += sum over rows of a[r, j] (a row-major, row stride cols)."""
    cdef Py_ssize_t r, j
    for r in range(rows):
        for j in range(cols):
            acc[j] += a[r * cols + j]


cdef void peephole_sums(Py_ssize_t rows, Py_ssize_t H, GateOffsets off,
                        const floating* dg, const floating* cs_prev,
                        const floating* cs, double* acc_ci, double* acc_cf,
                        double* acc_co) noexcept nogil:
    """SPEC §4: wci_grad += sum_b di*cs_prev, wcf_grad += sum_b df*cs_prev,
    wco_grad += sum_b do*cs, over `rows` rows (dg row stride 4H, others H)."""
    cdef Py_ssize_t r, j
    for r in range(rows):
        for j in range(H):
            acc_ci[j] += dg[r * 4 * H + off.i + j] * cs_prev[r * H + j]
            acc_cf[j] += dg[r * 4 * H + off.f + j] * cs_prev[r * H + j]
            acc_co[j] += dg[r * 4 * H + off.o + j] * cs[r * H + j]


cdef inline void store(Py_ssize_t n, const double* src, floating* dst) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        dst[j] = <floating>src[j]


# ---------------------------------------------------------------------------
# LSTM entry points
# ---------------------------------------------------------------------------

cdef inline Py_ssize_t lstm_cell_workspace(Py_ssize_t B, Py_ssize_t I,
                                           Py_ssize_t H) noexcept nogil:
    """Elements of lstm_cell_compute's workspace: [x, h_prev] [B, I+H], g [B, 4H]."""
    return B * (I + H) + B * 4 * H + 1


cdef void lstm_cell_compute(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, GateOffsets off,
        const floating* x, const floating* cs_prev, const floating* h_prev,  # IN
        const floating* w, const floating* wci, const floating* wcf,       # IN
        const floating* wco, const floating* b,
        floating forget_bias, floating cell_clip, bint use_peephole,
        floating* ws,      # workspace [lstm_cell_workspace(B, I, H)]
        floating* i_, floating* cs, floating* f, floating* o,  # OUT [B, H]
        floating* ci, floating* co, floating* h, int n_threads) noexcept nogil:
    """LSTMBlockCell (SPEC §3): g = [x, h_prev] @ w (one GEMM), then the gates."""
    cdef Py_ssize_t r
    cdef floating* xh = ws
    cdef floating* g = ws + B * (I + H)
    for r in range(B):
        memcpy(xh + r * (I + H), x + r * I, I * sizeof(floating))
        memcpy(xh + r * (I + H) + I, h_prev + r * H, H * sizeof(floating))
    gemm(False, False, B, 4 * H, I + H, 1, xh, I + H, w, 4 * H, 0, g, 4 * H)
    lstm_forward_rows(B, H, off, g, b, cs_prev, wci, wcf, wco, forget_bias, cell_clip,
                      use_peephole, NULL, 0, False, i_, cs, f, o, ci, co, h, n_threads)


def lstm_cell_forward(
        const floating[:, ::1] x,        # IN  [B, I]
        const floating[:, ::1] cs_prev,  # IN  [B, H]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w,        # IN  [I+H, 4H]
        const floating[::1] wci, const floating[::1] wcf, const floating[::1] wco,  # IN
        const floating[::1] b,           # IN  [4H]
        double forget_bias, double cell_clip, bint use_peephole, int layout,
        int n_threads,
        floating[:, ::1] i_, floating[:, ::1] cs, floating[:, ::1] f,   # OUT [B, H]
        floating[:, ::1] o, floating[:, ::1] ci, floating[:, ::1] co,
        floating[:, ::1] h):
    """LSTMBlockCell (SPEC §3), see lstm_cell_compute."""
    cdef Py_ssize_t B = x.shape[0], I = x.shape[1], H = cs_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(lstm_cell_workspace(B, I, H), dtype=dtype)
    with nogil:
        lstm_cell_compute(B, I, H, gate_offsets(layout, H), &x[0, 0], &cs_prev[0, 0],
                          &h_prev[0, 0], &w[0, 0], &wci[0], &wcf[0], &wco[0], &b[0],
                          <floating>forget_bias, <floating>cell_clip, use_peephole,
                          &ws[0], &i_[0, 0], &cs[0, 0], &f[0, 0],
                          &o[0, 0], &ci[0, 0], &co[0, 0], &h[0, 0], n_threads)


# ---------------------------------------------------------------------------
# Fast paths of the cell ops and of the LSTM and GRU sequence forwards
# (lstm_cell_fast, gru_cell_fast, block_lstm_fast, block_gru_fast): for the
# common call (C-contiguous, aligned float32/float64 ndarrays of consistent
# shapes, plain attributes, no sequence_length, a block small enough for
# serial gate loops) the checks, the output allocation and
# the kernel all happen here, in C. Anything else returns None and the Python
# layer takes the general path, which validates everything and raises the
# documented errors. Both paths run the same compute functions, so they give
# the same bits.
# ---------------------------------------------------------------------------

cdef inline int plain_array(object a, int ndim, int typenum) noexcept:
    """Whether `a` is an exact ndarray of this rank and dtype, C-contiguous, aligned,
    in native byte order (the type number does not say the byte order: '>f4' is
    NPY_FLOAT32 too)."""
    if not cnp.PyArray_CheckExact(a):
        return 0
    cdef cnp.ndarray arr = <cnp.ndarray>a
    return (cnp.PyArray_NDIM(arr) == ndim and cnp.PyArray_TYPE(arr) == typenum
            and cnp.PyArray_IS_C_CONTIGUOUS(arr) and cnp.PyArray_ISALIGNED(arr)
            and cnp.PyArray_ISNOTSWAPPED(arr))


cdef inline cnp.npy_intp dim(object a, int k) noexcept:
    return cnp.PyArray_DIMS(<cnp.ndarray>a)[k]


cdef inline void* data(object a) noexcept:
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef inline bint plain_float(object v) noexcept:
    """A Python float, or an int (not bool) that converts to a double without
    overflow (a huge int takes the general path, which raises the documented error)."""
    return type(v) is float or (type(v) is int and -1e308 < v < 1e308)


cdef inline bint plain_int(object v) noexcept:
    """A Python int or a NumPy integer scalar (neither is a bool): TF-style
    code often passes seq_len_max as np.int64."""
    return type(v) is int or isinstance(v, cnp.integer)


cdef int lstm_plain_dtype(int x_rank, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                          void** ptr) noexcept:
    """NPY_FLOAT32 or NPY_FLOAT64 if the LSTM arguments are plain arrays of one
    float dtype (x of rank x_rank, the states and w of rank 2, the vectors of
    rank 1; the shapes are checked by the caller), with ptr[0:8] their data in
    this order; else -1. An empty x or cs_prev is declined: the Python layer
    returns such calls early."""
    if not cnp.PyArray_CheckExact(x) or cnp.PyArray_SIZE(<cnp.ndarray>x) == 0:
        return -1
    cdef int typenum = cnp.PyArray_TYPE(<cnp.ndarray>x)
    if typenum != cnp.NPY_FLOAT32 and typenum != cnp.NPY_FLOAT64:
        return -1
    if not (plain_array(x, x_rank, typenum) and plain_array(cs_prev, 2, typenum)
            and cnp.PyArray_SIZE(<cnp.ndarray>cs_prev) != 0
            and plain_array(h_prev, 2, typenum) and plain_array(w, 2, typenum)
            and plain_array(wci, 1, typenum) and plain_array(wcf, 1, typenum)
            and plain_array(wco, 1, typenum) and plain_array(b, 1, typenum)):
        return -1
    ptr[0], ptr[1], ptr[2], ptr[3] = data(x), data(cs_prev), data(h_prev), data(w)
    ptr[4], ptr[5], ptr[6], ptr[7] = data(wci), data(wcf), data(wco), data(b)
    return typenum


cdef extern from "numpy/arrayobject.h":
    # The call steals a reference to descr.
    object PyArray_NewFromDescr(type subtype, cnp.dtype descr, int nd,
                                cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                int flags, PyObject* obj)


cdef extern from "Python.h":
    ctypedef struct PyTypeObject:
        PyObject* (*tp_alloc)(PyTypeObject*, Py_ssize_t)
    bint PyType_FastSubclass(PyTypeObject*, unsigned long)
    unsigned long Py_TPFLAGS_TUPLE_SUBCLASS


# Outputs smaller than this (each) are the views of one block (see new_outputs).
cdef enum:
    SHARED_BLOCK_BYTES_C = 1 << 22
SHARED_BLOCK_BYTES = SHARED_BLOCK_BYTES_C


cdef inline bint shares_block(Py_ssize_t bytes_each) noexcept:
    """Whether outputs of bytes_each bytes each are the views of one block."""
    return bytes_each < SHARED_BLOCK_BYTES_C


def output_buffers(int count, tuple shape, dtype):
    """`count` new C-contiguous arrays of `shape` and `dtype` for a forward's
    outputs on the general path: the views block[k] of one array, or separate
    arrays, by the rule of new_outputs."""
    dtype = np.dtype(dtype)
    cdef Py_ssize_t bytes_each = dtype.itemsize
    for n in shape:
        bytes_each *= n
    if shares_block(bytes_each):
        return list(np.empty((count,) + shape, dtype=dtype))
    return [np.empty(shape, dtype=dtype) for _ in range(count)]


cdef tuple new_outputs(type output_type, int count, int typenum, void** ptr,
                       cnp.npy_intp n0, cnp.npy_intp n1, cnp.npy_intp n2=-1):
    """output_type(*arrays), a tuple subclass (the op's namedtuple) of `count`
    new C-contiguous arrays of shape (n0, n1), or (n0, n1, n2) if n2 >= 0, with
    ptr[k] their data.

    Arrays of less than SHARED_BLOCK_BYTES (4 MB) each are the views block[k]
    of one array of shape (count, n0, n1[, n2]), as output_buffers makes them
    on the general path. A forward's outputs are fresh memory, zeroed by
    the OS on first touch. Seven arrays of 3.3 MB get 4 KB pages, and glibc
    returns them to the OS at every call; their 23 MB block gets NumPy's huge
    pages (it asks for them from 4 MB on) and stays in glibc's heap between
    calls (measured, block_lstm_v2 at 200,16,128,256 in a loop: 5076 page
    faults, 14.5 ms of system time and 36.4 ms per call, against 32 faults and
    24.3 ms). Arrays of 4 MB or more are separate: each gets huge pages by
    itself, and their block would be above 32 MB, which glibc always maps
    afresh (measured at 100,64,512,512 between the benchmark's peers, median
    of 7, six runs: 209-255 ms separate, 240-278 ms as one block).
    The tuple is built the way tuple.__new__ builds a subclass instance
    (tp_alloc, then the items), without its method call, argument list and
    temporary tuple."""
    if not PyType_FastSubclass(<PyTypeObject*>output_type, Py_TPFLAGS_TUPLE_SUBCLASS):
        raise TypeError(f"output_type must be a tuple subclass, not {output_type!r}")
    cdef cnp.npy_intp dims[4]
    dims[0] = count
    dims[1] = n0
    dims[2] = n1
    dims[3] = n2
    cdef int ndim = 3 if n2 >= 0 else 2
    cdef Py_ssize_t nbytes = (n0 * n1 * (n2 if n2 >= 0 else 1)
                              * (4 if typenum == cnp.NPY_FLOAT32 else 8))
    cdef cnp.ndarray block = None
    cdef cnp.dtype descr = None
    cdef int k
    if shares_block(nbytes):
        block = cnp.PyArray_EMPTY(ndim + 1, dims, typenum, 0)
        descr = block.dtype
    cdef PyObject* p = (<PyTypeObject*>output_type).tp_alloc(<PyTypeObject*>output_type,
                                                            count)
    if p == NULL:
        raise MemoryError()
    cdef tuple outs = <tuple>p   # a second reference; drop tp_alloc's
    Py_DECREF(outs)
    for k in range(count):   # a failure here frees outs and the arrays made so far
        if block is None:
            arr = cnp.PyArray_EMPTY(ndim, &dims[1], typenum, 0)
            ptr[k] = data(arr)
        else:
            ptr[k] = <char*>cnp.PyArray_DATA(block) + k * nbytes
            Py_INCREF(descr)     # PyArray_NewFromDescr steals it
            arr = PyArray_NewFromDescr(cnp.ndarray, descr, ndim, &dims[1], NULL, ptr[k],
                                       cnp.NPY_ARRAY_CARRAY, NULL)
            cnp.set_array_base(arr, block)
        Py_INCREF(arr)       # PyTuple_SET_ITEM steals it
        PyTuple_SET_ITEM(outs, k, arr)
    return outs


cdef void* new_workspace(Py_ssize_t elements, int typenum) except NULL:
    """Room for `elements` values of this dtype, from PyMem_RawMalloc (seen by
    tracemalloc); the caller frees it with PyMem_RawFree."""
    cdef void* ws = PyMem_RawMalloc(elements * (4 if typenum == cnp.NPY_FLOAT32 else 8))
    if ws == NULL:
        raise MemoryError()
    return ws


def lstm_cell_fast(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip,
                   use_peephole, Py_ssize_t max_serial_work, output_type):
    """LSTMBlockCell (ICFO) for the common call, or None (see above).

    Returns output_type(i, cs, f, o, ci, co, h) of (B, H) arrays."""
    cdef void* a[8]   # x, cs_prev, h_prev, w, wci, wcf, wco, b
    cdef void* o[7]   # i, cs, f, o, ci, co, h
    if not (plain_float(forget_bias) and plain_float(cell_clip)
            and type(use_peephole) is bool):
        return None
    cdef int typenum = lstm_plain_dtype(2, x, cs_prev, h_prev, w, wci, wcf, wco, b, a)
    if typenum < 0:
        return None
    cdef Py_ssize_t B = dim(x, 0), I = dim(x, 1), H = dim(cs_prev, 1)
    cdef bint peep = use_peephole
    if (B == 0 or H == 0 or B * H >= max_serial_work or I + H > 2**30 // 4
            or dim(cs_prev, 0) != B or dim(h_prev, 0) != B or dim(h_prev, 1) != H
            or dim(w, 0) != I + H or dim(w, 1) != 4 * H or dim(b, 0) != 4 * H
            or (peep and (dim(wci, 0) != H or dim(wcf, 0) != H or dim(wco, 0) != H))):
        return None
    outs = new_outputs(output_type, 7, typenum, o, B, H)
    cdef void* ws = new_workspace(lstm_cell_workspace(B, I, H), typenum)
    cdef double fb = forget_bias, clip_ = cell_clip
    cdef GateOffsets off = gate_offsets(ICFO, H)
    with nogil:
        if typenum == cnp.NPY_FLOAT32:
            lstm_cell_compute[float](
                B, I, H, off, <float*>a[0], <float*>a[1], <float*>a[2], <float*>a[3],
                <float*>a[4], <float*>a[5], <float*>a[6], <float*>a[7], <float>fb,
                <float>clip_, peep, <float*>ws, <float*>o[0],
                <float*>o[1], <float*>o[2], <float*>o[3], <float*>o[4], <float*>o[5],
                <float*>o[6], 1)
        else:
            lstm_cell_compute[double](
                B, I, H, off, <double*>a[0], <double*>a[1], <double*>a[2], <double*>a[3],
                <double*>a[4], <double*>a[5], <double*>a[6], <double*>a[7], fb, clip_, peep,
                <double*>ws, <double*>o[0], <double*>o[1],
                <double*>o[2], <double*>o[3], <double*>o[4], <double*>o[5], <double*>o[6], 1)
    PyMem_RawFree(ws)
    return outs


def block_lstm_fast(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias,
                    cell_clip, use_peephole, int layout, Py_ssize_t max_serial_work,
                    output_type, int max_threads=1):
    """BlockLSTM / BlockLSTMV2 for the common call (no sequence_length), or None.
    float32 runs on up to max_threads threads (see block_lstm_forward_compute).

    Returns output_type(i, cs, f, o, ci, co, h) of (T, B, H) arrays."""
    cdef void* a[8]   # x, cs_prev, h_prev, w, wci, wcf, wco, b
    cdef void* o[7]   # i, cs, f, o, ci, co, h
    if not (plain_int(seq_len_max) and plain_float(forget_bias)
            and plain_float(cell_clip) and type(use_peephole) is bool):
        return None
    cdef int typenum = lstm_plain_dtype(3, x, cs_prev, h_prev, w, wci, wcf, wco, b, a)
    if typenum < 0:
        return None
    cdef Py_ssize_t T = dim(x, 0), B = dim(x, 1), I = dim(x, 2), H = dim(cs_prev, 1)
    if not 0 <= seq_len_max <= T:
        return None
    cdef Py_ssize_t L = int(seq_len_max)
    if (B * H >= max_serial_work or T * B > 2**30 or I + H > 2**30 // 4
            or dim(cs_prev, 0) != B or dim(h_prev, 0) != B or dim(h_prev, 1) != H
            or dim(w, 0) != I + H or dim(w, 1) != 4 * H or dim(b, 0) != 4 * H
            or dim(wci, 0) != H or dim(wcf, 0) != H or dim(wco, 0) != H):
        return None
    outs = new_outputs(output_type, 7, typenum, o, T, B, H)
    cdef void* g = new_workspace(
        block_lstm_forward_workspace(L, B, H, I, typenum == cnp.NPY_FLOAT32), typenum)
    cdef double fb = forget_bias, clip_ = cell_clip
    cdef bint peep = use_peephole
    with nogil:
        if typenum == cnp.NPY_FLOAT32:
            block_lstm_forward_compute[float](
                L, T, B, I, H, layout, <float*>a[0], <float*>a[1], <float*>a[2],
                <float*>a[3], <float*>a[4], <float*>a[5], <float*>a[6], <float*>a[7],
                <float>fb, <float>clip_, peep, NULL, <float*>g, <float*>o[0], <float*>o[1],
                <float*>o[2], <float*>o[3], <float*>o[4], <float*>o[5], <float*>o[6], 1,
                max_threads)
        else:
            block_lstm_forward_compute[double](
                L, T, B, I, H, layout, <double*>a[0], <double*>a[1], <double*>a[2],
                <double*>a[3], <double*>a[4], <double*>a[5], <double*>a[6], <double*>a[7],
                fb, clip_, peep, NULL, <double*>g, <double*>o[0], <double*>o[1],
                <double*>o[2], <double*>o[3], <double*>o[4], <double*>o[5], <double*>o[6], 1,
                max_threads)
    PyMem_RawFree(g)
    return outs


def lstm_cell_backward(
        const floating[:, ::1] x,        # IN  [B, I] (used by the full gradient only)
        const floating[:, ::1] cs_prev,  # IN  [B, H]
        const floating[:, ::1] h_prev,   # IN  [B, H] (used by the full gradient only)
        const floating[:, ::1] w,        # IN  [I+H, 4H] (used by the full gradient only)
        const floating[::1] wci, const floating[::1] wcf, const floating[::1] wco,  # IN
        const floating[:, ::1] i_, const floating[:, ::1] cs,   # IN [B, H] forward outputs
        const floating[:, ::1] f, const floating[:, ::1] o,
        const floating[:, ::1] ci, const floating[:, ::1] co,
        const floating[:, ::1] cs_grad, const floating[:, ::1] h_grad,  # IN [B, H]
        bint use_peephole, int layout, int n_threads,
        floating[:, ::1] cs_prev_grad,   # OUT [B, H]
        floating[:, ::1] dgates,         # OUT [B, 4H] (dicfo)
        floating[::1] wci_grad, floating[::1] wcf_grad, floating[::1] wco_grad,  # OUT [H]
        bint full=False,
        floating[:, ::1] x_grad=None,       # OUT [B, I]      (full only)
        floating[:, ::1] h_prev_grad=None,  # OUT [B, H]      (full only)
        floating[:, ::1] w_grad=None,       # OUT [I+H, 4H]   (full only)
        floating[::1] b_grad=None):         # OUT [4H]        (full only)
    """LSTMBlockCellGrad (SPEC §4) and, with full=True, the parameter gradients
    TensorFlow 1.x completed in Python: xh_grad = dicfo @ w^T,
    w_grad = [x, h_prev]^T @ dicfo, b_grad = sum_b dicfo.
    Peephole gradients are written only when use_peephole."""
    cdef Py_ssize_t B = cs_prev.shape[0], H = cs_prev.shape[1], I = x.shape[1]
    cdef GateOffsets off = gate_offsets(layout, H)
    cdef double[:, ::1] acc = np.zeros((3, 4 * H), dtype=np.float64)  # workspace
    with nogil:
        # No carry (add_carry=False): h_grad only fills the unused dh_carry slot.
        lstm_backward_rows(B, H, off, &cs_prev[0, 0], &i_[0, 0], &f[0, 0], &o[0, 0],
                           &ci[0, 0], &co[0, 0], &cs_grad[0, 0], &h_grad[0, 0],
                           &h_grad[0, 0], &wci[0], &wcf[0], &wco[0], use_peephole, False,
                           NULL, 0, &dgates[0, 0], &cs_prev_grad[0, 0], n_threads)
        if use_peephole:
            peephole_sums(B, H, off, &dgates[0, 0], &cs_prev[0, 0], &cs[0, 0],
                          &acc[0, 0], &acc[1, 0], &acc[2, 0])
            store(H, &acc[0, 0], &wci_grad[0])
            store(H, &acc[1, 0], &wcf_grad[0])
            store(H, &acc[2, 0], &wco_grad[0])
        if full:
            gemm(False, True, B, I, 4 * H, 1, &dgates[0, 0], 4 * H, &w[0, 0], 4 * H,
                 0, &x_grad[0, 0], I)
            gemm(False, True, B, H, 4 * H, 1, &dgates[0, 0], 4 * H, &w[I, 0], 4 * H,
                 0, &h_prev_grad[0, 0], H)
            gemm(True, False, I, 4 * H, B, 1, &x[0, 0], I, &dgates[0, 0], 4 * H,
                 0, &w_grad[0, 0], 4 * H)
            gemm(True, False, H, 4 * H, B, 1, &h_prev[0, 0], H, &dgates[0, 0], 4 * H,
                 0, &w_grad[I, 0], 4 * H)
            memset(&acc[0, 0], 0, 4 * H * sizeof(double))
            column_sums(B, 4 * H, &dgates[0, 0], &acc[0, 0])
            store(4 * H, &acc[0, 0], &b_grad[0])


cdef inline bint recurrent_weights_transposed(Py_ssize_t L, Py_ssize_t B,
                                              Py_ssize_t H) noexcept nogil:
    """Whether a sequence forward multiplies by transposed copies of its
    recurrent weights (see block_lstm_forward_compute): from 4 rows on, and
    only while the copies ([4H, H] for the LSTM, [3H, H] for the GRU) are no
    larger than the T x B x 4H buffer a call may use (H <= L * B)."""
    return B >= 4 and H <= L * B


cdef inline Py_ssize_t block_lstm_forward_workspace(Py_ssize_t L, Py_ssize_t B,
                                                    Py_ssize_t H, Py_ssize_t I,
                                                    bint packed) noexcept nogil:
    """Elements of block_lstm_forward_compute's workspace: one step's gates
    [B, 4H], then for float32 (packed) W_h's four gate blocks packed
    [4, brnn_packed_size(H, H)]; for float64, if recurrent_weights_transposed,
    the copy W_h^T [4H, H] and the step's gates transposed [4H, B]."""
    if packed:
        return B * 4 * H + 4 * brnn_packed_size(H, H) + 4 * brnn_packed_size(I, H) + 1
    if recurrent_weights_transposed(L, B, H):
        return 2 * B * 4 * H + 4 * H * H + 1
    return B * 4 * H + 1


cdef enum:
    # Multiply-adds of one step's products per thread below which a further
    # thread costs more (its share of the step's barrier) than it saves
    # (measured on a loaded 2-core machine: LSTM forward 50,1,128,128 0.69 ms
    # on 1 thread, 15.6 ms on 2 with 2^17 multiply-adds per step and thread;
    # 50,4,128,128 1.06 ms on 1, 12.3 ms on 2 with 2^18).
    PACKED_WORK_PER_THREAD = 1 << 20
    # Sequence calls of fewer rows keep the BLAS route (at one row, a GEMV per
    # step: 0.60 vs 0.82 ms for the LSTM forward at 50,1,128,128, GRU 0.32 vs
    # 0.41, LSTM backward 0.54 vs 0.70; at two rows the packed kernel won,
    # LSTM forward 1.0 vs 11 ms, GRU 0.7 vs 10.8, on a loaded machine).
    PACKED_MIN_ROWS = 2


cdef inline int packed_threads(Py_ssize_t B, Py_ssize_t K, Py_ssize_t N, Py_ssize_t H,
                               int limit) noexcept nogil:
    """Threads a sequence call's per-step products [B, K] @ [K, N] over H
    cells can use: one per PACKED_WORK_PER_THREAD multiply-adds, at most one
    per 16-cell panel, at most `limit`, at least 1."""
    cdef Py_ssize_t n = min(B * K * N // PACKED_WORK_PER_THREAD, (H + BRNN_NR - 1) // BRNN_NR)
    return <int>max(1, min(n, limit))


cdef inline Py_ssize_t unit_start(Py_ssize_t H, int tid, int nt) noexcept nogil:
    """First cell of thread tid of nt (thread nt ends at H): whole 16-column
    panels, split evenly. (A function of the arguments only: values assigned
    inside a Cython parallel block are what makes them thread-private.)"""
    cdef Py_ssize_t panels = (H + BRNN_NR - 1) // BRNN_NR
    return min(H, tid * panels // nt * BRNN_NR)


cdef enum:
    # Multiply-adds per thread of a sequence's whole input projection below
    # which packed_inputs stays on one thread (it is one region, no barrier).
    PACKED_INPUT_WORK_PER_THREAD = 1 << 22


cdef inline int packed_input_threads(Py_ssize_t rows, Py_ssize_t I, Py_ssize_t N, Py_ssize_t H,
                                     int limit) noexcept nogil:
    """Threads packed_inputs asks of the budget for [rows, I] @ [I, N] over H
    cells: one per PACKED_INPUT_WORK_PER_THREAD multiply-adds, at most one per
    16-cell panel, at most `limit`, at least 1."""
    cdef Py_ssize_t n = min(rows * I * N // PACKED_INPUT_WORK_PER_THREAD,
                            (H + BRNN_NR - 1) // BRNN_NR)
    return <int>max(1, min(n, limit))


cdef void packed_inputs(
        Py_ssize_t rows, Py_ssize_t I, Py_ssize_t H, int nq,
        const float* x,           # IN  [rows, I]
        const float* packed,      # IN  nq gate blocks [I, H], block q packed at q * brnn_packed_size(I, H)
        float** dst,              # OUT nq arrays [rows, H]: dst[q] = x @ block q
        int max_threads) noexcept nogil:
    """The input projection of all steps of a batch-1 forward in the packed
    kernel (OpenBLAS's sgemm ran it at ~24 GFLOP/s at 50x128x512 on the
    caller's thread, this at ~80), on up to max_threads threads from the
    thread budget, each owning whole panels (unit_start). Each element is one
    packed-kernel sum: the bits do not depend on the thread count."""
    cdef Py_ssize_t u0 = 0, u1 = 0, psx = brnn_packed_size(I, H)
    cdef int q, tid, nt, granted
    if rows == 0 or H == 0:
        return
    granted = brnn_budget_take(packed_input_threads(rows, I, nq * H, H, max_threads),
                               max_threads)
    if granted == 1:  # no OpenMP region at all: cheaper, and safe after fork
        for q in range(nq):
            packed_product(rows, I, x, I, packed + q * psx, 0, H, False, dst[q], H)
    else:
        with parallel(num_threads=granted):
            tid = brnn_omp_get_thread_num()
            nt = brnn_omp_get_num_threads()
            u0 = unit_start(H, tid, nt)
            u1 = unit_start(H, tid + 1, nt)
            if u1 > u0:
                for q in range(nq):
                    packed_product(rows, I, x, I, packed + q * psx, u0, u1, False, dst[q], H)
    brnn_budget_give(granted)


cdef void lstm_forward_packed_step(
        Py_ssize_t t, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, GateOffsets off,
        const float* packed, const float* x, const float* cs_in, const float* h_in,
        const float* b, const float* wci, const float* wcf, const float* wco,
        float forget_bias, float cell_clip, bint use_peephole, const int64_t* lengths,
        float* g, float* i_, float* cs, float* f, float* o, float* ci, float* co, float* h,
        Py_ssize_t u0, Py_ssize_t u1) noexcept nogil:
    """Step t of the float32 forward for the cells [u0, u1): their four gate
    columns of x[t] @ W_x into the gate outputs and of g = h_in @ W_h, both by
    the packed kernel, then their gates."""
    cdef Py_ssize_t q, ps = brnn_packed_size(H, H), psx = brnn_packed_size(I, H), BH = B * H
    cdef float* dst
    if u1 <= u0:
        return
    for q in range(4):
        dst = (i_ if q * H == off.i else ci if q * H == off.c else f if q * H == off.f
               else o) + t * BH
        packed_product(B, I, x + t * B * I, I, packed + 4 * ps + q * psx, u0, u1, False,
                       dst, H)
        packed_product(B, H, h_in, H, packed + q * ps, u0, u1, False, g + q * H, 4 * H)
    lstm_forward_block[float](B, H, off, g, b, cs_in, wci, wcf, wco, forget_bias, cell_clip,
                              use_peephole, lengths, t, True, i_ + t * BH, cs + t * BH,
                              f + t * BH, o + t * BH, ci + t * BH, co + t * BH, h + t * BH,
                              u0, u1 - u0)


cdef void lstm_forward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, GateOffsets off,
        const float* packed,      # IN  W_h's then W_x's four gate blocks packed
        const float* x, const float* cs_prev, const float* h_prev, const float* b,
        const float* wci, const float* wcf, const float* wco,
        float forget_bias, float cell_clip, bint use_peephole, const int64_t* lengths,
        float* g,                 # workspace [B, 4H]
        float* i_, float* cs, float* f, float* o, float* ci, float* co, float* h,
        int n_threads) noexcept nogil:
    """The time loop of the float32 forward: ONE parallel region of n_threads
    for all L steps. Each thread owns a fixed slice of cells (unit_start: every
    gate column of those cells) and computes their input projection,
    recurrent product and gates at every step; one barrier per step, since
    step t+1 reads all of h[t]. No BLAS call inside. Each product element is
    one packed-kernel sum: the bits do not depend on n_threads."""
    cdef Py_ssize_t t, u0 = 0, u1 = 0, BH = B * H
    cdef int tid, nt
    cdef brnn_barrier bar
    bar.count = 0
    bar.gen = 0
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        for t in range(L):
            lstm_forward_packed_step(
                t, B, I, H, off, packed, x, cs_prev if t == 0 else cs + (t - 1) * BH,
                h_prev if t == 0 else h + (t - 1) * BH, b, wci, wcf, wco, forget_bias,
                cell_clip, use_peephole, lengths, g, i_, cs, f, o, ci, co, h, 0, H)
        return
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        for t in range(L):
            lstm_forward_packed_step(
                t, B, I, H, off, packed, x, cs_prev if t == 0 else cs + (t - 1) * BH,
                h_prev if t == 0 else h + (t - 1) * BH, b, wci, wcf, wco, forget_bias,
                cell_clip, use_peephole, lengths, g, i_, cs, f, o, ci, co, h, u0, u1)
            brnn_barrier_wait(&bar, nt)


cdef void block_lstm_forward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x,        # IN  [T, B, I]
        const floating* cs_prev, const floating* h_prev,  # IN [B, H]
        const floating* w,        # IN  [I+H, 4H]
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H]
        const floating* b,        # IN  [4H]
        floating forget_bias, floating cell_clip, bint use_peephole,
        const int64_t* lengths,   # IN  [B] or NULL
        floating* ws,             # workspace [block_lstm_forward_workspace(L, B, H, I, float)]
        floating* i_, floating* cs, floating* f, floating* o,  # OUT [T, B, H]
        floating* ci, floating* co, floating* h, int n_threads,
        int max_threads) noexcept nogil:
    """BlockLSTM / BlockLSTMV2 (SPEC §3, sequence): L steps, zeros for t >= L
    (and, with `lengths`, zeros in row b for t >= lengths[b]).

    The input projection of all L steps is hoisted out of the time loop as one
    GEMM per gate, written straight into that gate's output: i[:L] holds
    x[:L] @ w[:I, i-columns] until step t's gate pass overwrites i[t] (same for
    ci, f, o). Each step then computes only its recurrent product
    g = h[t-1] @ w[I:] into the B x 4H workspace, so the call needs no
    T x B x 4H buffer: its memory beyond the outputs is O(B x H), plus the
    4H x H copy below when that is no larger than T x B x 4H.

    From 4 rows on, OpenBLAS computes the recurrent product faster with the
    weights as its second column-major operand, unpacked as stored: that is
    g^T = W_h^T @ h^T with a copy W_h^T made once per call, transposed back
    into g in tiles (gemm_small_by_weights_t). Measured on the whole forward,
    float32, 2 threads, 40-60 alternated calls each, median (best): 185.6
    (169.9) vs 197.2 (177.9) ms at 100,64,512,512; 36.0 (32.5) vs 39.4 (34.3)
    ms at 100,32,256,256; 37.0 (34.8) vs 38.2 (36.0) ms at 200,16,128,256.
    Each g[r, j] is still one dot product over H.

    That is the float64 route (gate loops on n_threads), and float32's for
    B < PACKED_MIN_ROWS, whose hoisted input projection runs in the packed
    kernel instead (packed_inputs). float32 from PACKED_MIN_ROWS rows on runs every
    product in blockrnn's packed kernel instead (lstm_forward_packed): W_x's
    and W_h's four gate blocks are packed once per call, and each step
    computes x[t] @ W_x into the gate outputs and h[t-1] @ W_h into g, on up to
    max_threads threads taken from the process's thread budget
    (brnn_budget_take) and given back after the loop. Folding the input
    projection into the steps keeps OpenBLAS out of the forward: its workers
    spin (sched_yield) for about 0.1 s after each GEMM, on the cores the
    region's threads need (measured: 101 ms of CPU burnt in the 200 ms after
    a call whose only BLAS call was the hoisted input GEMM)."""
    cdef Py_ssize_t t, BH = B * H, G4 = 4 * H
    cdef floating* g = ws
    cdef const floating* w_h = w + I * G4   # [H, 4H]
    cdef floating* w_h_t = NULL  # if recurrent_weights_transposed: W_h^T [4H, H]
    cdef floating* g_t = NULL    # and g^T [4H, B]
    cdef GateOffsets off = gate_offsets(layout, H)
    cdef const floating* cs_in
    cdef const floating* h_in
    cdef Py_ssize_t tail = L * BH
    cdef int q, granted
    cdef Py_ssize_t ps = brnn_packed_size(H, H)
    cdef float* dst[4]
    if floating is float and B >= PACKED_MIN_ROWS:
        for q in range(4):
            brnn_pack_f32(H, H, w_h + q * H, G4, 1, ws + B * G4 + q * ps)
            brnn_pack_f32(I, H, w + q * H, G4, 1, ws + B * G4 + 4 * ps + q * brnn_packed_size(I, H))
        granted = brnn_budget_take(packed_threads(B, I + H, G4, H, max_threads), max_threads)
        lstm_forward_packed(L, B, I, H, off, ws + B * G4, x, cs_prev, h_prev, b, wci, wcf,
                            wco, forget_bias, cell_clip, use_peephole, lengths, g,
                            i_, cs, f, o, ci, co, h, granted)
        brnn_budget_give(granted)
    else:
        if floating is float:   # batch 1: W_x packed after g (B < 4: no W_h^T copy)
            for q in range(4):
                brnn_pack_f32(I, H, w + q * H, G4, 1, ws + B * G4 + q * brnn_packed_size(I, H))
                dst[q] = i_ if q * H == off.i else ci if q * H == off.c else f if q * H == off.f else o
            packed_inputs(L * B, I, H, 4, x, ws + B * G4, dst, max_threads)
        else:
            gemm(False, False, L * B, H, I, 1, x, I, w + off.i, G4, 0, i_, H)
            gemm(False, False, L * B, H, I, 1, x, I, w + off.c, G4, 0, ci, H)
            gemm(False, False, L * B, H, I, 1, x, I, w + off.f, G4, 0, f, H)
            gemm(False, False, L * B, H, I, 1, x, I, w + off.o, G4, 0, o, H)
        if recurrent_weights_transposed(L, B, H):
            w_h_t = ws + B * G4
            g_t = w_h_t + G4 * H
            transpose(H, G4, w_h, G4, False, w_h_t, H)
        for t in range(L):
            cs_in = cs_prev if t == 0 else cs + (t - 1) * BH
            h_in = h_prev if t == 0 else h + (t - 1) * BH
            gemm_small_by_weights(B, G4, H, h_in, H, w_h, G4, w_h_t, False, g, G4, g_t)
            lstm_forward_rows(B, H, off, g, b, cs_in, wci, wcf, wco,
                              forget_bias, cell_clip, use_peephole, lengths, t, True,
                              i_ + t * BH, cs + t * BH, f + t * BH, o + t * BH,
                              ci + t * BH, co + t * BH, h + t * BH, n_threads)
    # TF leaves the gates past L uninitialised; blockrnn writes zeros.
    zero_lstm_outputs(tail, (T - L) * BH, i_, cs, f, o, ci, co, h)


def block_lstm_forward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] cs_prev,  # IN  [B, H]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w,        # IN  [I+H, 4H]
        const floating[::1] wci, const floating[::1] wcf, const floating[::1] wco,  # IN
        const floating[::1] b,           # IN  [4H]
        double forget_bias, double cell_clip, bint use_peephole, int layout,
        int n_threads, int max_threads,
        floating[:, :, ::1] i_, floating[:, :, ::1] cs, floating[:, :, ::1] f,  # OUT
        floating[:, :, ::1] o, floating[:, :, ::1] ci, floating[:, :, ::1] co,  # [T, B, H]
        floating[:, :, ::1] h,
        const int64_t[::1] lengths=None):  # IN [B] per-row lengths, or None
    """See block_lstm_forward_compute."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = cs_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] g = np.empty(block_lstm_forward_workspace(L, B, H, I, floating is float),
                                    dtype=dtype)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    with nogil:
        block_lstm_forward_compute(
            L, T, B, I, H, layout, &x[0, 0, 0], &cs_prev[0, 0], &h_prev[0, 0], &w[0, 0],
            &wci[0], &wcf[0], &wco[0], &b[0], <floating>forget_bias, <floating>cell_clip,
            use_peephole, lens, &g[0], &i_[0, 0, 0], &cs[0, 0, 0], &f[0, 0, 0],
            &o[0, 0, 0], &ci[0, 0, 0], &co[0, 0, 0], &h[0, 0, 0], n_threads, max_threads)


cdef inline Py_ssize_t block_lstm_backward_workspace(Py_ssize_t L, Py_ssize_t B,
                                                     Py_ssize_t H, bint packed) noexcept nogil:
    """Elements of block_lstm_backward_compute's workspace: the gate gradients of
    every step dG [L*B, 4H], then one step's recurrent product dh^T [H, B]
    (float64) or W_h^T packed [brnn_packed_size(4H, H)] (float32). Its
    double accumulator `acc` has 3 * 4H + 1 elements."""
    if packed:
        return L * B * 4 * H + brnn_packed_size(4 * H, H) + 1
    return L * B * 4 * H + B * H + 1


cdef void lstm_backward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const float* packed_t,    # IN  W_h^T [4H, H] packed
        const float* cs_prev, const float* i_, const float* cs, const float* f,
        const float* o, const float* ci, const float* co, const float* cs_grad,
        const float* h_grad, const float* wci, const float* wcf, const float* wco,
        bint use_peephole, const int64_t* lengths,
        float* dg,                # OUT [L*B, 4H]
        float* cs_prev_grad, float* h_prev_grad,  # IN/OUT [B, H] the carries
        int n_threads) noexcept nogil:
    """The reverse time loop of the float32 backward: ONE parallel region of
    n_threads for all L steps, each thread owning a fixed slice of cells
    [u0, u1). At step t a thread computes dG[t] for its cells (all four gate
    columns), then, after the step's one barrier (dh needs every column of
    dG[t]), dh[:, u0:u1] = dG[t] @ W_h^T[:, u0:u1] in the packed kernel. Its
    next step reads only its own cells' carries, and dG has one buffer per
    step, so one barrier per step is enough. The bits do not depend on
    n_threads."""
    cdef Py_ssize_t t, u0 = 0, u1 = H, BH = B * H, G4 = 4 * H
    cdef int tid = 0, nt = 1
    cdef brnn_barrier bar
    bar.count = 0
    bar.gen = 0
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        for t in range(L - 1, -1, -1):
            lstm_backward_block[float](
                B, H, off, cs_prev if t == 0 else cs + (t - 1) * BH, i_ + t * BH,
                f + t * BH, o + t * BH, ci + t * BH, co + t * BH, cs_grad + t * BH,
                h_grad + t * BH, h_prev_grad, wci, wcf, wco, use_peephole, True, lengths, t,
                dg + t * B * G4, cs_prev_grad)
            packed_product(B, G4, dg + t * B * G4, G4, packed_t, 0, H, False, h_prev_grad, H)
        return
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        for t in range(L - 1, -1, -1):
            if u1 > u0:
                lstm_backward_block[float](
                    B, H, off, cs_prev if t == 0 else cs + (t - 1) * BH, i_ + t * BH,
                    f + t * BH, o + t * BH, ci + t * BH, co + t * BH, cs_grad + t * BH,
                    h_grad + t * BH, h_prev_grad, wci, wcf, wco, use_peephole, True, lengths,
                    t, dg + t * B * G4, cs_prev_grad, u0, u1 - u0)
            brnn_barrier_wait(&bar, nt)
            if u1 > u0:
                packed_product(B, G4, dg + t * B * G4, G4, packed_t, u0, u1, False,
                               h_prev_grad, H)


cdef void block_lstm_backward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x,        # IN  [T, B, I]
        const floating* cs_prev, const floating* h_prev,  # IN [B, H]
        const floating* w,        # IN  [I+H, 4H]
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H]
        const floating* i_, const floating* cs, const floating* f,     # IN [T, B, H]
        const floating* o, const floating* ci, const floating* co, const floating* h,
        const floating* cs_grad, const floating* h_grad,  # IN [T, B, H]
        bint use_peephole,
        const int64_t* lengths,   # IN  [B] or NULL
        floating* ws,             # workspace [block_lstm_backward_workspace(L, B, H, float)]
        double* acc,              # workspace [3, 4H]
        floating* x_grad,         # OUT [T, B, I]
        floating* cs_prev_grad, floating* h_prev_grad,  # OUT [B, H]
        floating* w_grad,         # OUT [I+H, 4H]
        floating* wci_grad, floating* wcf_grad, floating* wco_grad,  # OUT [H] (if peephole)
        floating* b_grad,         # OUT [4H]
        int n_threads, int max_threads) noexcept nogil:
    """BlockLSTMGrad / BlockLSTMGradV2 (SPEC §5); with `lengths`, row b's
    gradients at t >= lengths[b] are zero (its upstream gradients there unused).

    The reverse time loop does only the gate gradients of step t (kept in the
    workspace dG[t]) and the recurrent product dh = dG[t] @ w[I:]^T. The
    carries live in the outputs: cs_prev_grad holds d cs[t-1] and h_prev_grad
    holds d h[t-1] while the loop runs. After the loop, x_grad, w_grad, b_grad
    and the peephole gradients are single GEMMs / reductions over all steps:
      x_grad[:L] = dG @ w[:I]^T,  w_grad[:I] = x[:L]^T @ dG,
      w_grad[I:] = h_prev^T @ dG[0] + h[:L-1]^T @ dG[1:],  b_grad = sum dG.
    float32 (B >= PACKED_MIN_ROWS) runs the reverse loop in the packed
    kernel, on up to max_threads
    threads from the thread budget (lstm_backward_packed); float64 keeps the
    per-step dgemm, with gate loops on n_threads."""
    cdef Py_ssize_t t, G4 = 4 * H, BH = B * H
    cdef GateOffsets off = gate_offsets(layout, H)
    cdef const floating* cs_in
    cdef floating* dg = ws
    cdef floating* dh_t = ws + L * B * G4   # float32: W_h^T packed instead
    memset(cs_prev_grad, 0, BH * sizeof(floating))
    memset(h_prev_grad, 0, BH * sizeof(floating))
    memset(acc, 0, 3 * G4 * sizeof(double))
    cdef int granted
    if floating is float and B >= PACKED_MIN_ROWS:
        brnn_pack_f32(G4, H, w + I * G4, 1, G4, dh_t)   # W_h^T packed
        granted = brnn_budget_take(packed_threads(B, G4, H, H, max_threads), max_threads)
        lstm_backward_packed(L, B, H, off, dh_t, cs_prev, i_, cs, f, o, ci, co, cs_grad,
                             h_grad, wci, wcf, wco, use_peephole, lengths, dg,
                             cs_prev_grad, h_prev_grad, granted)
        brnn_budget_give(granted)
    else:
        for t in range(L - 1, -1, -1):
            cs_in = cs_prev if t == 0 else cs + (t - 1) * BH
            lstm_backward_rows(B, H, off, cs_in, i_ + t * BH, f + t * BH, o + t * BH,
                               ci + t * BH, co + t * BH, cs_grad + t * BH, h_grad + t * BH,
                               h_prev_grad, wci, wcf, wco, use_peephole, True, lengths, t,
                               dg + t * B * G4, cs_prev_grad, n_threads)
            gemm_small_by_weights_t(B, H, G4, dg + t * B * G4, G4, w + I * G4, G4,
                                    False, h_prev_grad, H, dh_t)

    gemm(False, True, L * B, I, G4, 1, dg, G4, w, G4, 0, x_grad, I)
    memset(x_grad + L * B * I, 0, (T - L) * B * I * sizeof(floating))
    gemm(True, False, I, G4, L * B, 1, x, I, dg, G4, 0, w_grad, G4)
    gemm(True, False, H, G4, B if L > 0 else 0, 1, h_prev, H, dg, G4, 0, w_grad + I * G4, G4)
    if L > 1:
        gemm(True, False, H, G4, (L - 1) * B, 1, h, H, dg + B * G4, G4,
             1, w_grad + I * G4, G4)
    column_sums(L * B, G4, dg, acc)
    store(G4, acc, b_grad)
    if use_peephole:
        memset(acc, 0, G4 * sizeof(double))
        if L > 0:  # step 0 sees cs_prev, step t > 0 sees cs[t-1]
            peephole_sums(B, H, off, dg, cs_prev, cs, acc, acc + G4, acc + 2 * G4)
        if L > 1:
            peephole_sums((L - 1) * B, H, off, dg + B * G4, cs, cs + BH,
                          acc, acc + G4, acc + 2 * G4)
        store(H, acc, wci_grad)
        store(H, acc + G4, wcf_grad)
        store(H, acc + 2 * G4, wco_grad)


def block_lstm_backward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] cs_prev,  # IN  [B, H]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w,        # IN  [I+H, 4H]
        const floating[::1] wci, const floating[::1] wcf, const floating[::1] wco,  # IN
        const floating[:, :, ::1] i_, const floating[:, :, ::1] cs,   # IN [T, B, H]
        const floating[:, :, ::1] f, const floating[:, :, ::1] o,
        const floating[:, :, ::1] ci, const floating[:, :, ::1] co,
        const floating[:, :, ::1] h,
        const floating[:, :, ::1] cs_grad, const floating[:, :, ::1] h_grad,  # IN [T, B, H]
        bint use_peephole, int layout, int n_threads, int max_threads,
        floating[:, :, ::1] x_grad,      # OUT [T, B, I]
        floating[:, ::1] cs_prev_grad,   # OUT [B, H]
        floating[:, ::1] h_prev_grad,    # OUT [B, H]
        floating[:, ::1] w_grad,         # OUT [I+H, 4H]
        floating[::1] wci_grad, floating[::1] wcf_grad, floating[::1] wco_grad,  # OUT [H]
        floating[::1] b_grad,            # OUT [4H]
        const int64_t[::1] lengths=None):  # IN [B] per-row lengths, or None
    """See block_lstm_backward_compute."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = cs_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(block_lstm_backward_workspace(L, B, H, floating is float),
                                     dtype=dtype)
    cdef double[::1] acc = np.empty(3 * 4 * H + 1, dtype=np.float64)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    with nogil:
        block_lstm_backward_compute(
            L, T, B, I, H, layout, &x[0, 0, 0], &cs_prev[0, 0], &h_prev[0, 0], &w[0, 0],
            &wci[0], &wcf[0], &wco[0], &i_[0, 0, 0], &cs[0, 0, 0], &f[0, 0, 0],
            &o[0, 0, 0], &ci[0, 0, 0], &co[0, 0, 0], &h[0, 0, 0], &cs_grad[0, 0, 0],
            &h_grad[0, 0, 0], use_peephole, lens, &ws[0], &acc[0],
            &x_grad[0, 0, 0],
            &cs_prev_grad[0, 0], &h_prev_grad[0, 0], &w_grad[0, 0], &wci_grad[0],
            &wcf_grad[0], &wco_grad[0], &b_grad[0], n_threads, max_threads)


# ---------------------------------------------------------------------------
# GRU (SPEC §6, §7)
# ---------------------------------------------------------------------------

cdef void gru_gates_block(
        Py_ssize_t rows, Py_ssize_t H,
        const floating* ru_pre,    # IN  [rows, 2H] [x, h_prev] @ w_ru (no bias)
        const floating* b_ru,      # IN  [2H]
        const floating* h_prev,    # IN  [rows, H]
        bint accumulate,           # IN: r, u hold x @ w_ru[:I] (ru_pre is h_prev @ w_ru[I:])
        floating* r, floating* u,  # OUT [rows, H]
        floating* rh) noexcept nogil:  # OUT [rows, H] r * h_prev
    """SPEC §6, first half: r, u = sigmoid([x, h_prev] @ w_ru + b_ru), rh =
    r * h_prev. With `accumulate` the pre-activation is (r or u's value +
    ru_pre) + b_ru. One fused pass per row (include/brnn_gru.h)."""
    cdef Py_ssize_t row, k
    cdef const floating* pre
    for row in range(rows):
        pre = ru_pre + row * 2 * H
        k = row * H
        if floating is float:
            brnn_gru_gates_row_f32(H, pre, pre + H, b_ru, b_ru + H, h_prev + k, accumulate,
                                   r + k, u + k, rh + k)
        else:
            brnn_gru_gates_row_f64(H, pre, pre + H, b_ru, b_ru + H, h_prev + k, accumulate,
                                   r + k, u + k, rh + k)


cdef void gru_output_block(
        Py_ssize_t rows, Py_ssize_t H,
        const floating* b_c,       # IN  [H]
        const floating* h_prev,    # IN  [rows, H]
        const floating* u,         # IN  [rows, H]
        floating* c,               # IN/OUT [rows, H]: [x, r*h_prev] @ w_c in, tanh(. + b_c) out
        floating* h) noexcept nogil:  # OUT [rows, H]
    """SPEC §6, second half: c = tanh(. + b_c), h = u * (h_prev - c) + c. One
    fused pass per row (include/brnn_gru.h)."""
    cdef Py_ssize_t row, k
    for row in range(rows):
        k = row * H
        if floating is float:
            brnn_gru_output_row_f32(H, b_c, h_prev + k, u + k, c + k, h + k)
        else:
            brnn_gru_output_row_f64(H, b_c, h_prev + k, u + k, c + k, h + k)


cdef void gru_gates_rows(Py_ssize_t B, Py_ssize_t H, const floating* ru_pre,
                         const floating* b_ru, const floating* h_prev, bint accumulate,
                         floating* r, floating* u, floating* rh,
                         int n_threads) noexcept nogil:
    """gru_gates_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        gru_gates_block(B, H, ru_pre, b_ru, h_prev, accumulate, r, u, rh)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        gru_gates_block(r1 - r0, H, ru_pre + r0 * 2 * H, b_ru, h_prev + r0 * H, accumulate,
                        r + r0 * H, u + r0 * H, rh + r0 * H)


cdef void gru_output_rows(Py_ssize_t B, Py_ssize_t H, const floating* b_c,
                          const floating* h_prev, const floating* u,
                          floating* c, floating* h, int n_threads) noexcept nogil:
    """gru_output_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        gru_output_block(B, H, b_c, h_prev, u, c, h)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        gru_output_block(r1 - r0, H, b_c, h_prev + r0 * H, u + r0 * H,
                         c + r0 * H, h + r0 * H)


cdef void gru_backward_output_block(
        Py_ssize_t rows, Py_ssize_t H,
        const floating* h_prev, const floating* u, const floating* c,  # IN [rows, H]
        const floating* d_h,       # IN [rows, H] upstream gradient of h
        bint add_carry,
        floating* carry,           # IN/OUT [rows, H]: d h from step t+1 (if add_carry) in,
                                   #   d_h_total * u out (first part of d h_prev)
        floating* d_c_bar,         # OUT [rows, H]
        floating* d_ru,            # OUT [rows, 2H]: the u half (columns H:2H)
        const int64_t* lengths, Py_ssize_t t,
        Py_ssize_t u0=0, Py_ssize_t nu=-1) noexcept nogil:
    """SPEC §7: d_c_bar = dh (1-u)(1-c^2), d_u_bar = dh (h_prev-c) u (1-u),
    with dh = d_h (+ carry). Rows past their length get zeros (written, as
    0 * NaN would not be 0). Cells [u0, u0 + nu) only (default: all H)."""
    cdef Py_ssize_t row, j, k, u1 = H if nu < 0 else u0 + nu
    cdef floating dh
    for row in range(rows):
        if finished(lengths, row, t):
            for j in range(u0, u1):
                d_c_bar[row * H + j] = 0
                d_ru[row * 2 * H + H + j] = 0
                carry[row * H + j] = 0
            continue
        for j in range(u0, u1):
            k = row * H + j
            dh = d_h[k] + carry[k] if add_carry else d_h[k]
            d_c_bar[k] = dh * (1 - u[k]) * (1 - c[k] * c[k])
            d_ru[row * 2 * H + H + j] = dh * (h_prev[k] - c[k]) * u[k] * (1 - u[k])
            carry[k] = dh * u[k]


cdef void gru_backward_reset_block(
        Py_ssize_t rows, Py_ssize_t H,
        const floating* h_prev, const floating* r,  # IN [rows, H]
        const floating* d_hr,      # IN [rows, H] d(r * h_prev) = d_c_bar @ w_c[I:]^T
        floating* d_ru,            # OUT [rows, 2H]: the r half (columns 0:H)
        floating* carry,           # IN/OUT [rows, H]: += d_hr * r
        const int64_t* lengths, Py_ssize_t t,
        Py_ssize_t u0=0, Py_ssize_t nu=-1) noexcept nogil:
    """SPEC §7: d_r_bar = d_hr h_prev r (1-r); d h_prev gets d_hr r. Cells
    [u0, u0 + nu) only (default: all H)."""
    cdef Py_ssize_t row, j, k, u1 = H if nu < 0 else u0 + nu
    for row in range(rows):
        if finished(lengths, row, t):
            for j in range(u0, u1):
                d_ru[row * 2 * H + j] = 0
            continue
        for j in range(u0, u1):
            k = row * H + j
            d_ru[row * 2 * H + j] = d_hr[k] * h_prev[k] * r[k] * (1 - r[k])
            carry[k] = carry[k] + d_hr[k] * r[k]


cdef void gru_backward_output_rows(
        Py_ssize_t B, Py_ssize_t H, const floating* h_prev, const floating* u,
        const floating* c, const floating* d_h, bint add_carry, floating* carry,
        floating* d_c_bar, floating* d_ru, const int64_t* lengths, Py_ssize_t t,
        int n_threads) noexcept nogil:
    """gru_backward_output_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        gru_backward_output_block(B, H, h_prev, u, c, d_h, add_carry, carry, d_c_bar, d_ru,
                                  lengths, t)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        gru_backward_output_block(r1 - r0, H, h_prev + r0 * H, u + r0 * H, c + r0 * H,
                                  d_h + r0 * H, add_carry, carry + r0 * H,
                                  d_c_bar + r0 * H, d_ru + r0 * 2 * H,
                                  lengths_from(lengths, r0), t)


cdef void gru_backward_reset_rows(
        Py_ssize_t B, Py_ssize_t H, const floating* h_prev, const floating* r,
        const floating* d_hr, floating* d_ru, floating* carry,
        const int64_t* lengths, Py_ssize_t t, int n_threads) noexcept nogil:
    """gru_backward_reset_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        gru_backward_reset_block(B, H, h_prev, r, d_hr, d_ru, carry, lengths, t)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        gru_backward_reset_block(r1 - r0, H, h_prev + r0 * H, r + r0 * H, d_hr + r0 * H,
                                 d_ru + r0 * 2 * H, carry + r0 * H,
                                 lengths_from(lengths, r0), t)


cdef inline Py_ssize_t gru_cell_workspace(Py_ssize_t B, Py_ssize_t I,
                                          Py_ssize_t H) noexcept nogil:
    """Elements of gru_cell_compute's workspace: [B, I+H] ([x, h_prev], then
    [x, r * h_prev]), ru [B, 2H], r * h_prev [B, H]."""
    return B * (I + H) + B * 3 * H + 1


cdef void gru_cell_compute(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x, const floating* h_prev,          # IN [B, I], [B, H]
        const floating* w_ru, const floating* w_c,          # IN [I+H, 2H], [I+H, H]
        const floating* b_ru, const floating* b_c,          # IN [2H], [H]
        floating* ws,      # workspace [gru_cell_workspace(B, I, H)]
        floating* r, floating* u, floating* c, floating* h,  # OUT [B, H]
        int n_threads) noexcept nogil:
    """GRUBlockCell (SPEC §6), each product one GEMM over [x, .]."""
    cdef Py_ssize_t row
    cdef floating* xh = ws
    cdef floating* ru = ws + B * (I + H)
    cdef floating* rh = ru + B * 2 * H
    for row in range(B):
        memcpy(xh + row * (I + H), x + row * I, I * sizeof(floating))
        memcpy(xh + row * (I + H) + I, h_prev + row * H, H * sizeof(floating))
    gemm(False, False, B, 2 * H, I + H, 1, xh, I + H, w_ru, 2 * H, 0, ru, 2 * H)
    gru_gates_rows(B, H, ru, b_ru, h_prev, False, r, u, rh, n_threads)
    for row in range(B):
        memcpy(xh + row * (I + H) + I, rh + row * H, H * sizeof(floating))
    gemm(False, False, B, H, I + H, 1, xh, I + H, w_c, H, 0, c, H)
    gru_output_rows(B, H, b_c, h_prev, u, c, h, n_threads)


def gru_cell_forward(
        const floating[:, ::1] x,        # IN  [B, I]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w_ru,     # IN  [I+H, 2H]
        const floating[:, ::1] w_c,      # IN  [I+H, H]
        const floating[::1] b_ru,        # IN  [2H]
        const floating[::1] b_c,         # IN  [H]
        int n_threads,
        floating[:, ::1] r, floating[:, ::1] u,   # OUT [B, H]
        floating[:, ::1] c, floating[:, ::1] h):
    """GRUBlockCell (SPEC §6), see gru_cell_compute."""
    cdef Py_ssize_t B = x.shape[0], I = x.shape[1], H = h_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(gru_cell_workspace(B, I, H), dtype=dtype)
    with nogil:
        gru_cell_compute(B, I, H, &x[0, 0], &h_prev[0, 0], &w_ru[0, 0], &w_c[0, 0],
                         &b_ru[0], &b_c[0], &ws[0], &r[0, 0], &u[0, 0], &c[0, 0], &h[0, 0],
                         n_threads)


cdef int gru_plain_dtype(int x_rank, x, h_prev, w_ru, w_c, b_ru, b_c,
                         void** ptr) noexcept:
    """NPY_FLOAT32 or NPY_FLOAT64 if the GRU arguments are plain arrays of one
    float dtype (x of rank x_rank, h_prev and the weights of rank 2, the biases
    of rank 1) of consistent shapes, with ptr[0:6] their data in this order;
    else -1. The caller checks x's batch size against h_prev's. An empty x or
    h_prev is declined: the Python layer returns such calls early."""
    if not cnp.PyArray_CheckExact(x) or cnp.PyArray_SIZE(<cnp.ndarray>x) == 0:
        return -1
    cdef int typenum = cnp.PyArray_TYPE(<cnp.ndarray>x)
    if typenum != cnp.NPY_FLOAT32 and typenum != cnp.NPY_FLOAT64:
        return -1
    if not (plain_array(x, x_rank, typenum) and plain_array(h_prev, 2, typenum)
            and cnp.PyArray_SIZE(<cnp.ndarray>h_prev) != 0
            and plain_array(w_ru, 2, typenum) and plain_array(w_c, 2, typenum)
            and plain_array(b_ru, 1, typenum) and plain_array(b_c, 1, typenum)):
        return -1
    cdef Py_ssize_t I = dim(x, x_rank - 1), H = dim(h_prev, 1)
    if (I + H > 2**30 // 4 or dim(w_ru, 0) != I + H or dim(w_ru, 1) != 2 * H
            or dim(w_c, 0) != I + H or dim(w_c, 1) != H or dim(b_ru, 0) != 2 * H
            or dim(b_c, 0) != H):
        return -1
    ptr[0], ptr[1], ptr[2] = data(x), data(h_prev), data(w_ru)
    ptr[3], ptr[4], ptr[5] = data(w_c), data(b_ru), data(b_c)
    return typenum


def gru_cell_fast(x, h_prev, w_ru, w_c, b_ru, b_c, Py_ssize_t max_serial_work, output_type):
    """GRUBlockCell for the common call, or None (see lstm_cell_fast).

    Returns output_type(r, u, c, h) of (B, H) arrays."""
    cdef void* a[6]   # x, h_prev, w_ru, w_c, b_ru, b_c
    cdef void* o[4]   # r, u, c, h
    cdef int typenum = gru_plain_dtype(2, x, h_prev, w_ru, w_c, b_ru, b_c, a)
    if typenum < 0:
        return None
    cdef Py_ssize_t B = dim(x, 0), I = dim(x, 1), H = dim(h_prev, 1)
    if B == 0 or H == 0 or B * H >= max_serial_work or dim(h_prev, 0) != B:
        return None
    outs = new_outputs(output_type, 4, typenum, o, B, H)
    cdef void* ws = new_workspace(gru_cell_workspace(B, I, H), typenum)
    with nogil:
        if typenum == cnp.NPY_FLOAT32:
            gru_cell_compute[float](
                B, I, H, <float*>a[0], <float*>a[1], <float*>a[2], <float*>a[3], <float*>a[4],
                <float*>a[5], <float*>ws, <float*>o[0], <float*>o[1], <float*>o[2],
                <float*>o[3], 1)
        else:
            gru_cell_compute[double](
                B, I, H, <double*>a[0], <double*>a[1], <double*>a[2], <double*>a[3],
                <double*>a[4], <double*>a[5], <double*>ws, <double*>o[0], <double*>o[1],
                <double*>o[2], <double*>o[3], 1)
    PyMem_RawFree(ws)
    return outs


def gru_cell_backward(
        const floating[:, ::1] x,        # IN  [B, I] (used by the full gradient only)
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w_ru,     # IN  [I+H, 2H]
        const floating[:, ::1] w_c,      # IN  [I+H, H]
        const floating[:, ::1] r, const floating[:, ::1] u,  # IN [B, H]
        const floating[:, ::1] c, const floating[:, ::1] d_h,
        int n_threads,
        floating[:, ::1] d_x,            # OUT [B, I]
        floating[:, ::1] d_h_prev,       # OUT [B, H]
        floating[:, ::1] d_c_bar,        # OUT [B, H]
        floating[:, ::1] d_r_bar_u_bar,  # OUT [B, 2H]
        bint full=False,
        floating[:, ::1] d_w_ru=None,    # OUT [I+H, 2H] (full only)
        floating[:, ::1] d_w_c=None,     # OUT [I+H, H]  (full only)
        floating[::1] d_b_ru=None,       # OUT [2H]      (full only)
        floating[::1] d_b_c=None):       # OUT [H]       (full only)
    """GRUBlockCellGrad (SPEC §7) and, with full=True, the parameter gradients
    d_w_ru = [x, h_prev]^T @ d_r_bar_u_bar, d_w_c = [x, r*h_prev]^T @ d_c_bar,
    d_b_ru, d_b_c = batch sums."""
    cdef Py_ssize_t B = x.shape[0], I = x.shape[1], H = h_prev.shape[1]
    cdef Py_ssize_t k
    dtype = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] d_hr = np.empty((B, H), dtype=dtype)  # workspace: d(r*h_prev)
    cdef double[::1] acc = np.zeros(2 * H, dtype=np.float64)   # workspace
    with nogil:
        # d_h_prev collects d_h * u, then d_hr * r, then d_r_bar_u_bar @ w_ru[I:]^T.
        gru_backward_output_rows(B, H, &h_prev[0, 0], &u[0, 0], &c[0, 0], &d_h[0, 0],
                                 False, &d_h_prev[0, 0], &d_c_bar[0, 0],
                                 &d_r_bar_u_bar[0, 0], NULL, 0, n_threads)
        # [dx2 | d_hr] = d_c_bar @ w_c^T
        gemm(False, True, B, I, H, 1, &d_c_bar[0, 0], H, &w_c[0, 0], H, 0, &d_x[0, 0], I)
        gemm(False, True, B, H, H, 1, &d_c_bar[0, 0], H, &w_c[I, 0], H, 0, &d_hr[0, 0], H)
        gru_backward_reset_rows(B, H, &h_prev[0, 0], &r[0, 0], &d_hr[0, 0],
                                &d_r_bar_u_bar[0, 0], &d_h_prev[0, 0], NULL, 0, n_threads)
        # [dx1 | dh1] = d_r_bar_u_bar @ w_ru^T; d_x = dx1 + dx2
        gemm(False, True, B, I, 2 * H, 1, &d_r_bar_u_bar[0, 0], 2 * H, &w_ru[0, 0], 2 * H,
             1, &d_x[0, 0], I)
        gemm(False, True, B, H, 2 * H, 1, &d_r_bar_u_bar[0, 0], 2 * H, &w_ru[I, 0], 2 * H,
             1, &d_h_prev[0, 0], H)
        if full:
            gemm(True, False, I, 2 * H, B, 1, &x[0, 0], I, &d_r_bar_u_bar[0, 0], 2 * H,
                 0, &d_w_ru[0, 0], 2 * H)
            gemm(True, False, H, 2 * H, B, 1, &h_prev[0, 0], H, &d_r_bar_u_bar[0, 0], 2 * H,
                 0, &d_w_ru[I, 0], 2 * H)
            gemm(True, False, I, H, B, 1, &x[0, 0], I, &d_c_bar[0, 0], H,
                 0, &d_w_c[0, 0], H)
            for k in range(B * H):  # d_hr is free again: reuse it for r * h_prev
                (&d_hr[0, 0])[k] = (&r[0, 0])[k] * (&h_prev[0, 0])[k]
            gemm(True, False, H, H, B, 1, &d_hr[0, 0], H, &d_c_bar[0, 0], H,
                 0, &d_w_c[I, 0], H)
            column_sums(B, 2 * H, &d_r_bar_u_bar[0, 0], &acc[0])
            store(2 * H, &acc[0], &d_b_ru[0])
            memset(&acc[0], 0, H * sizeof(double))
            column_sums(B, H, &d_c_bar[0, 0], &acc[0])
            store(H, &acc[0], &d_b_c[0])


cdef inline Py_ssize_t block_gru_forward_workspace(Py_ssize_t L, Py_ssize_t B,
                                                   Py_ssize_t H, Py_ssize_t I,
                                                   bint packed) noexcept nogil:
    """Elements of block_gru_forward_compute's workspace: one step's recurrent
    product ru [B, 2H], then r * h[t-1] [B, H]; float32 (packed): then w_ru's
    two gate blocks and w_c packed, each as its x rows [I, H] then its h rows
    [H, H] (see gru_forward_packed); float64, if recurrent_weights_transposed:
    w_ru[I:]^T [2H, H], w_c[I:]^T [H, H] and a product transposed [2H, B]."""
    if packed:
        return B * 3 * H + 3 * (brnn_packed_size(I, H) + brnn_packed_size(H, H)) + 1
    if recurrent_weights_transposed(L, B, H):
        return B * 3 * H + 3 * H * H + 2 * H * B + 1
    return B * 3 * H + 1


cdef void gru_forward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* packed,      # IN  w_ru's r and u blocks and w_c, each [I + H, H] as
                                  #     its rows [:I] then [I:] packed
        const float* x, const float* h_prev, const float* b_ru, const float* b_c,
        const int64_t* lengths,
        float* ru, float* rh,     # workspace [B, 2H], [B, H]
        float* r, float* u, float* c, float* h,  # OUT [T, B, H]
        int n_threads) noexcept nogil:
    """The time loop of the float32 GRU forward: ONE parallel region of
    n_threads for all L steps, each thread owning a fixed slice of cells
    [u0, u1). Per step a thread computes, for its cells, x[t] @ W_x (r, u, c
    blocks) into the outputs and h[t-1] @ w_ru[I:] into ru, applies the r, u
    gates (writing its part of rh = r * h[t-1]); barrier (every cell's rh is
    needed next); c += rh @ w_c[I:] and the output; barrier (step t+1 reads
    all of h[t]). Every product is the packed kernel's: the bits do not
    depend on n_threads."""
    cdef Py_ssize_t psx = brnn_packed_size(I, H), ps = psx + brnn_packed_size(H, H)
    cdef Py_ssize_t t, u0 = 0, u1 = H, BH = B * H
    cdef int tid = 0, nt = 1
    cdef brnn_barrier bar
    bar.count = 0
    bar.gen = 0
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        for t in range(L):
            gru_forward_packed_half(0, t, B, I, H, packed, ps, psx, x,
                                    h_prev if t == 0 else h + (t - 1) * BH, b_ru, b_c,
                                    lengths, ru, rh, r, u, c, h, 0, H)
            gru_forward_packed_half(1, t, B, I, H, packed, ps, psx, x,
                                    h_prev if t == 0 else h + (t - 1) * BH, b_ru, b_c,
                                    lengths, ru, rh, r, u, c, h, 0, H)
        return
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        for t in range(L):
            gru_forward_packed_half(0, t, B, I, H, packed, ps, psx, x,
                                    h_prev if t == 0 else h + (t - 1) * BH, b_ru, b_c,
                                    lengths, ru, rh, r, u, c, h, u0, u1)
            brnn_barrier_wait(&bar, nt)
            gru_forward_packed_half(1, t, B, I, H, packed, ps, psx, x,
                                    h_prev if t == 0 else h + (t - 1) * BH, b_ru, b_c,
                                    lengths, ru, rh, r, u, c, h, u0, u1)
            brnn_barrier_wait(&bar, nt)


cdef void gru_forward_packed_half(
        int half, Py_ssize_t t, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* packed, Py_ssize_t ps, Py_ssize_t psx, const float* x,
        const float* h_in, const float* b_ru, const float* b_c, const int64_t* lengths,
        float* ru, float* rh, float* r, float* u, float* c, float* h,
        Py_ssize_t u0, Py_ssize_t u1) noexcept nogil:
    """Half 0 or 1 of step t of gru_forward_packed for the cells [u0, u1).
    Packed block q (r, u, c) starts at packed + q * ps: its x rows, then at
    + psx its h rows."""
    cdef Py_ssize_t BH = B * H, row, k, nu = u1 - u0
    cdef const float* xt = x + t * B * I
    if nu <= 0:
        return
    if half == 0:
        packed_product(B, I, xt, I, packed, u0, u1, False, r + t * BH, H)
        packed_product(B, I, xt, I, packed + ps, u0, u1, False, u + t * BH, H)
        packed_product(B, I, xt, I, packed + 2 * ps, u0, u1, False, c + t * BH, H)
        packed_product(B, H, h_in, H, packed + psx, u0, u1, False, ru, 2 * H)
        packed_product(B, H, h_in, H, packed + ps + psx, u0, u1, False, ru + H, 2 * H)
        for row in range(B):
            k = row * H + u0
            brnn_gru_gates_row_f32(nu, ru + row * 2 * H + u0, ru + row * 2 * H + H + u0,
                                   b_ru + u0, b_ru + H + u0, h_in + k, True,
                                   r + t * BH + k, u + t * BH + k, rh + k)
        return
    packed_product(B, H, rh, H, packed + 2 * ps + psx, u0, u1, True, c + t * BH, H)
    for row in range(B):
        k = row * H + u0
        if finished(lengths, row, t):
            zero_gru_outputs(t * BH + k, nu, r, u, c, h)
        else:
            brnn_gru_output_row_f32(nu, b_c + u0, h_in + k, u + t * BH + k, c + t * BH + k,
                                    h + t * BH + k)


cdef void block_gru_forward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x,        # IN  [T, B, I]
        const floating* h_prev,   # IN  [B, H]
        const floating* w_ru,     # IN  [I+H, 2H]
        const floating* w_c,      # IN  [I+H, H]
        const floating* b_ru,     # IN  [2H]
        const floating* b_c,      # IN  [H]
        const int64_t* lengths,   # IN  [B] or NULL
        floating* ws,             # workspace [block_gru_forward_workspace(L, B, H, I, float)]
        floating* r, floating* u, floating* c, floating* h,  # OUT [T, B, H]
        int n_threads, int max_threads) noexcept nogil:
    """GRUBlockCell (SPEC §6) over L steps, zeros for t >= L (and in row b for
    t >= lengths[b]). The input projections of all L steps are hoisted out of
    the loop as GEMMs into the outputs: r[:L], u[:L] and c[:L] hold x[:L] @
    w_ru[:I] (its two halves) and x[:L] @ w_c[:I] until step t overwrites
    them. Each step computes h[t-1] @ w_ru[I:] into the B x 2H workspace and
    adds (r * h[t-1]) @ w_c[I:] onto c[t]; memory beyond the outputs is
    O(B x H), plus transposed copies of w_ru[I:] and w_c[I:] when
    recurrent_weights_transposed: the recurrent products then go through
    gemm_small_by_weights_t, as in block_lstm_forward_compute. That is the
    float64 route (and float32's for B < PACKED_MIN_ROWS, with the input
    projection in the packed kernel: packed_inputs); float32 from
    PACKED_MIN_ROWS rows on runs every product of the loop in the packed
    kernel on up to max_threads threads from the thread budget
    (gru_forward_packed), the input projection folded into the steps as in
    block_lstm_forward_compute."""
    cdef Py_ssize_t t, BH = B * H
    cdef const floating* h_in
    cdef Py_ssize_t tail = L * BH
    cdef floating* ru = ws
    cdef floating* rh = ws + B * 2 * H
    cdef floating* w_ru_t = NULL  # if recurrent_weights_transposed: w_ru[I:]^T [2H, H],
    cdef floating* w_c_t = NULL   # w_c[I:]^T [H, H]
    cdef floating* tmp = NULL     # and a product transposed [2H, B]
    cdef Py_ssize_t psx = brnn_packed_size(I, H), ps = psx + brnn_packed_size(H, H)
    cdef floating* packed = rh + B * H
    cdef int q, granted
    cdef float* dst[3]
    if floating is float and B >= PACKED_MIN_ROWS:
        for q in range(2):
            brnn_pack_f32(I, H, w_ru + q * H, 2 * H, 1, packed + q * ps)
            brnn_pack_f32(H, H, w_ru + I * 2 * H + q * H, 2 * H, 1, packed + q * ps + psx)
        brnn_pack_f32(I, H, w_c, H, 1, packed + 2 * ps)
        brnn_pack_f32(H, H, w_c + I * H, H, 1, packed + 2 * ps + psx)
        granted = brnn_budget_take(packed_threads(B, I + H, 3 * H, H, max_threads),
                                   max_threads)
        gru_forward_packed(L, B, I, H, packed, x, h_prev, b_ru, b_c, lengths, ru, rh,
                           r, u, c, h, granted)
        brnn_budget_give(granted)
    else:
        if recurrent_weights_transposed(L, B, H):
            w_ru_t = rh + B * H
            w_c_t = w_ru_t + 2 * H * H
            tmp = w_c_t + H * H
            transpose(H, 2 * H, w_ru + I * 2 * H, 2 * H, False, w_ru_t, H)
            transpose(H, H, w_c + I * H, H, False, w_c_t, H)
        if floating is float:   # batch 1: w_ru[:I]'s halves and w_c[:I] packed (B < 4)
            brnn_pack_f32(I, H, w_ru, 2 * H, 1, packed)
            brnn_pack_f32(I, H, w_ru + H, 2 * H, 1, packed + psx)
            brnn_pack_f32(I, H, w_c, H, 1, packed + 2 * psx)
            dst[0], dst[1], dst[2] = r, u, c
            packed_inputs(L * B, I, H, 3, x, packed, dst, max_threads)
        else:
            gemm(False, False, L * B, H, I, 1, x, I, w_ru, 2 * H, 0, r, H)
            gemm(False, False, L * B, H, I, 1, x, I, w_ru + H, 2 * H, 0, u, H)
            gemm(False, False, L * B, H, I, 1, x, I, w_c, H, 0, c, H)
        for t in range(L):
            h_in = h_prev if t == 0 else h + (t - 1) * BH
            gemm_small_by_weights(B, 2 * H, H, h_in, H, w_ru + I * 2 * H, 2 * H, w_ru_t, False,
                                  ru, 2 * H, tmp)
            gru_gates_rows(B, H, ru, b_ru, h_in, True, r + t * BH, u + t * BH, rh, n_threads)
            gemm_small_by_weights(B, H, H, rh, H, w_c + I * H, H, w_c_t, True, c + t * BH, H, tmp)
            gru_output_rows(B, H, b_c, h_in, u + t * BH, c + t * BH, h + t * BH, n_threads)
            zero_rows(B, H, lengths, t, r + t * BH)
            zero_rows(B, H, lengths, t, u + t * BH)
            zero_rows(B, H, lengths, t, c + t * BH)
            zero_rows(B, H, lengths, t, h + t * BH)
    zero_gru_outputs(tail, (T - L) * BH, r, u, c, h)


def block_gru_forward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w_ru,     # IN  [I+H, 2H]
        const floating[:, ::1] w_c,      # IN  [I+H, H]
        const floating[::1] b_ru,        # IN  [2H]
        const floating[::1] b_c,         # IN  [H]
        int n_threads, int max_threads,
        floating[:, :, ::1] r, floating[:, :, ::1] u,   # OUT [T, B, H]
        floating[:, :, ::1] c, floating[:, :, ::1] h,
        const int64_t[::1] lengths=None):  # IN [B] per-row lengths, or None
    """See block_gru_forward_compute."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(
        block_gru_forward_workspace(L, B, H, I, floating is float), dtype=dtype)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    with nogil:
        block_gru_forward_compute(L, T, B, I, H, &x[0, 0, 0], &h_prev[0, 0], &w_ru[0, 0],
                                  &w_c[0, 0], &b_ru[0], &b_c[0], lens, &ws[0],
                                  &r[0, 0, 0], &u[0, 0, 0], &c[0, 0, 0], &h[0, 0, 0],
                                  n_threads, max_threads)


def block_gru_fast(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, Py_ssize_t max_serial_work,
                   output_type, int max_threads=1):
    """block_gru for the common call (no sequence_length), or None (see
    block_lstm_fast).

    Returns output_type(r, u, c, h) of (T, B, H) arrays."""
    cdef void* a[6]   # x, h_prev, w_ru, w_c, b_ru, b_c
    cdef void* o[4]   # r, u, c, h
    if not plain_int(seq_len_max):
        return None
    cdef int typenum = gru_plain_dtype(3, x, h_prev, w_ru, w_c, b_ru, b_c, a)
    if typenum < 0:
        return None
    cdef Py_ssize_t T = dim(x, 0), B = dim(x, 1), I = dim(x, 2), H = dim(h_prev, 1)
    if (not 0 <= seq_len_max <= T or B * H >= max_serial_work or T * B > 2**30
            or dim(h_prev, 0) != B):
        return None
    cdef Py_ssize_t L = int(seq_len_max)
    outs = new_outputs(output_type, 4, typenum, o, T, B, H)
    cdef void* ws = new_workspace(
        block_gru_forward_workspace(L, B, H, I, typenum == cnp.NPY_FLOAT32), typenum)
    with nogil:
        if typenum == cnp.NPY_FLOAT32:
            block_gru_forward_compute[float](
                L, T, B, I, H, <float*>a[0], <float*>a[1], <float*>a[2], <float*>a[3],
                <float*>a[4], <float*>a[5], NULL, <float*>ws, <float*>o[0], <float*>o[1],
                <float*>o[2], <float*>o[3], 1, max_threads)
        else:
            block_gru_forward_compute[double](
                L, T, B, I, H, <double*>a[0], <double*>a[1], <double*>a[2], <double*>a[3],
                <double*>a[4], <double*>a[5], NULL, <double*>ws, <double*>o[0],
                <double*>o[1], <double*>o[2], <double*>o[3], 1, max_threads)
    PyMem_RawFree(ws)
    return outs


cdef inline Py_ssize_t block_gru_backward_workspace(Py_ssize_t L, Py_ssize_t B,
                                                    Py_ssize_t H, bint packed) noexcept nogil:
    """Elements of block_gru_backward_compute's workspace: [L*B, 4H] (see there),
    then d(r * h[t-1]) [B, H], then for float32 (packed) w_c[I:]^T and
    w_ru[I:]^T packed. Its double accumulator `acc` has 2H + 1 elements."""
    if packed:
        return (L * B * 4 * H + B * H + brnn_packed_size(H, H) + brnn_packed_size(2 * H, H)
                + 1)
    return L * B * 4 * H + B * H + 1


cdef void gru_backward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t H,
        const float* w_c_t, const float* w_ru_t,  # IN w_c[I:]^T [H, H], w_ru[I:]^T [2H, H]
                                                  #    packed
        const float* h_prev, const float* r, const float* u, const float* c,
        const float* h, const float* h_grad, const int64_t* lengths,
        float* d_ru, float* d_c,  # OUT [L*B, 2H], [L*B, H]
        float* d_hr,              # workspace [B, H]
        float* h_prev_grad,       # IN/OUT [B, H] the carry
        int n_threads) noexcept nogil:
    """The reverse loop of the float32 GRU backward: ONE parallel region of
    n_threads for all L steps, each thread owning the cells [u0, u1). Per step:
    the output part of SPEC §7 for its cells; barrier (d_hr needs all of
    dC[t]); d_hr = dC[t] @ w_c[I:]^T and the reset part for its cells; barrier
    (the carry needs all of dRU[t]); carry += dRU[t] @ w_ru[I:]^T for its
    cells. The bits do not depend on n_threads."""
    cdef Py_ssize_t t, u0 = 0, u1 = H, BH = B * H
    cdef int tid = 0, nt = 1
    cdef brnn_barrier bar
    bar.count = 0
    bar.gen = 0
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        for t in range(L - 1, -1, -1):
            gru_backward_packed_part(0, t, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                     lengths, d_ru, d_c, d_hr, h_prev_grad, 0, H)
            gru_backward_packed_part(1, t, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                     lengths, d_ru, d_c, d_hr, h_prev_grad, 0, H)
            gru_backward_packed_part(2, t, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                     lengths, d_ru, d_c, d_hr, h_prev_grad, 0, H)
        return
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        for t in range(L - 1, -1, -1):
            gru_backward_packed_part(0, t, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                     lengths, d_ru, d_c, d_hr, h_prev_grad, u0, u1)
            brnn_barrier_wait(&bar, nt)
            gru_backward_packed_part(1, t, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                     lengths, d_ru, d_c, d_hr, h_prev_grad, u0, u1)
            brnn_barrier_wait(&bar, nt)
            gru_backward_packed_part(2, t, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                     lengths, d_ru, d_c, d_hr, h_prev_grad, u0, u1)


cdef void gru_backward_packed_part(
        int part, Py_ssize_t t, Py_ssize_t B, Py_ssize_t H, const float* w_c_t,
        const float* w_ru_t, const float* h_prev, const float* r, const float* u,
        const float* c, const float* h, const float* h_grad, const int64_t* lengths,
        float* d_ru, float* d_c, float* d_hr, float* h_prev_grad,
        Py_ssize_t u0, Py_ssize_t u1) noexcept nogil:
    """Part 0, 1 or 2 of step t of gru_backward_packed for the cells [u0, u1)."""
    cdef Py_ssize_t BH = B * H
    cdef const float* h_in = h_prev if t == 0 else h + (t - 1) * BH
    if u1 <= u0:
        return
    if part == 0:
        gru_backward_output_block[float](B, H, h_in, u + t * BH, c + t * BH, h_grad + t * BH,
                                         True, h_prev_grad, d_c + t * BH, d_ru + t * 2 * BH,
                                         lengths, t, u0, u1 - u0)
    elif part == 1:
        packed_product(B, H, d_c + t * BH, H, w_c_t, u0, u1, False, d_hr, H)
        gru_backward_reset_block[float](B, H, h_in, r + t * BH, d_hr, d_ru + t * 2 * BH,
                                        h_prev_grad, lengths, t, u0, u1 - u0)
    else:
        packed_product(B, 2 * H, d_ru + t * 2 * BH, 2 * H, w_ru_t, u0, u1, True,
                       h_prev_grad, H)


cdef void block_gru_backward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x,        # IN  [T, B, I]
        const floating* h_prev,   # IN  [B, H]
        const floating* w_ru,     # IN  [I+H, 2H]
        const floating* w_c,      # IN  [I+H, H]
        const floating* r, const floating* u,  # IN [T, B, H] forward outputs
        const floating* c, const floating* h,
        const floating* h_grad,   # IN  [T, B, H]
        const int64_t* lengths,   # IN  [B] or NULL
        floating* ws,             # workspace [block_gru_backward_workspace(L, B, H, float)]
        double* acc,              # workspace [2H]
        floating* x_grad,         # OUT [T, B, I]
        floating* h_prev_grad,    # OUT [B, H]
        floating* w_ru_grad,      # OUT [I+H, 2H]
        floating* w_c_grad,       # OUT [I+H, H]
        floating* b_ru_grad,      # OUT [2H]
        floating* b_c_grad,       # OUT [H]
        int n_threads, int max_threads) noexcept nogil:
    """Backward of block_gru_forward_compute: SPEC §7 at every step, in reverse.

    The loop keeps the gate gradients of every step in the workspace: dRU
    (d_r_bar_u_bar, [L*B, 2H]), dC (d_c_bar, [L*B, H]), and [L*B, H] that hold
    r[t] * h[t-1] once the loop is done (their first B*H are the scratch of the
    recurrent products while it runs). h_prev_grad carries d h[t-1] while
    the loop runs. After it, x_grad and the weight gradients are single GEMMs
    over all steps:
      x_grad[:L] = dRU @ w_ru[:I]^T + dC @ w_c[:I]^T,
      w_ru_grad = [x; h[-1:L-1]]^T @ dRU,  w_c_grad = [x; r*h[-1:L-1]]^T @ dC.
    float32 from PACKED_MIN_ROWS rows on runs the loop's two products in the
    packed kernel, on up to max_threads threads from the thread budget
    (gru_backward_packed); float64 keeps a per-step dgemm."""
    cdef Py_ssize_t t, k, BH = B * H, H2 = 2 * H
    cdef floating* d_ru = ws                    # [L*B, 2H]
    cdef floating* d_c = ws + L * B * H2        # [L*B, H]
    cdef floating* rh = d_c + L * BH            # [L*B, H]
    cdef floating* d_hr = rh + L * BH           # [B, H]
    cdef const floating* h_in
    cdef floating* w_c_t = d_hr + BH            # float32: w_c[I:]^T packed,
    cdef floating* w_ru_t = w_c_t + brnn_packed_size(H, H)   # w_ru[I:]^T packed
    cdef int granted
    memset(h_prev_grad, 0, BH * sizeof(floating))
    if floating is float and B >= PACKED_MIN_ROWS:
        brnn_pack_f32(H, H, w_c + I * H, 1, H, w_c_t)
        brnn_pack_f32(H2, H, w_ru + I * H2, 1, H2, w_ru_t)
        granted = brnn_budget_take(packed_threads(B, 3 * H, H, H, max_threads), max_threads)
        gru_backward_packed(L, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad, lengths,
                            d_ru, d_c, d_hr, h_prev_grad, granted)
        brnn_budget_give(granted)
    else:
        for t in range(L - 1, -1, -1):
            h_in = h_prev if t == 0 else h + (t - 1) * BH
            gru_backward_output_rows(B, H, h_in, u + t * BH, c + t * BH, h_grad + t * BH,
                                     True, h_prev_grad, d_c + t * BH, d_ru + t * B * H2,
                                     lengths, t, n_threads)
            gemm_small_by_weights_t(B, H, H, d_c + t * BH, H, w_c + I * H, H, False, d_hr,
                                    H, rh)
            gru_backward_reset_rows(B, H, h_in, r + t * BH, d_hr, d_ru + t * B * H2,
                                    h_prev_grad, lengths, t, n_threads)
            gemm_small_by_weights_t(B, H, H2, d_ru + t * B * H2, H2, w_ru + I * H2, H2,
                                    True, h_prev_grad, H, rh)

    gemm(False, True, L * B, I, H2, 1, d_ru, H2, w_ru, H2, 0, x_grad, I)
    gemm(False, True, L * B, I, H, 1, d_c, H, w_c, H, 1, x_grad, I)
    memset(x_grad + L * B * I, 0, (T - L) * B * I * sizeof(floating))
    gemm(True, False, I, H2, L * B, 1, x, I, d_ru, H2, 0, w_ru_grad, H2)
    gemm(True, False, H, H2, B if L > 0 else 0, 1, h_prev, H, d_ru, H2,
         0, w_ru_grad + I * H2, H2)
    if L > 1:
        gemm(True, False, H, H2, (L - 1) * B, 1, h, H, d_ru + B * H2, H2,
             1, w_ru_grad + I * H2, H2)
    gemm(True, False, I, H, L * B, 1, x, I, d_c, H, 0, w_c_grad, H)
    if L > 0:  # r[t] * h[t-1], step 0 sees h_prev
        for k in range(BH):
            rh[k] = r[k] * h_prev[k]
        for k in range(BH, L * BH):
            rh[k] = r[k] * h[k - BH]
    gemm(True, False, H, H, L * B, 1, rh, H, d_c, H, 0, w_c_grad + I * H, H)
    memset(acc, 0, H2 * sizeof(double))
    column_sums(L * B, H2, d_ru, acc)
    store(H2, acc, b_ru_grad)
    memset(acc, 0, H * sizeof(double))
    column_sums(L * B, H, d_c, acc)
    store(H, acc, b_c_grad)


def block_gru_backward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w_ru,     # IN  [I+H, 2H]
        const floating[:, ::1] w_c,      # IN  [I+H, H]
        const floating[:, :, ::1] r, const floating[:, :, ::1] u,  # IN [T, B, H] forward
        const floating[:, :, ::1] c, const floating[:, :, ::1] h,
        const floating[:, :, ::1] h_grad,  # IN [T, B, H]
        int n_threads, int max_threads,
        floating[:, :, ::1] x_grad,      # OUT [T, B, I]
        floating[:, ::1] h_prev_grad,    # OUT [B, H]
        floating[:, ::1] w_ru_grad,      # OUT [I+H, 2H]
        floating[:, ::1] w_c_grad,       # OUT [I+H, H]
        floating[::1] b_ru_grad,         # OUT [2H]
        floating[::1] b_c_grad,          # OUT [H]
        const int64_t[::1] lengths=None):  # IN [B] per-row lengths, or None
    """See block_gru_backward_compute."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(block_gru_backward_workspace(L, B, H, floating is float),
                                     dtype=dtype)
    cdef double[::1] acc = np.empty(2 * H + 1, dtype=np.float64)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    with nogil:
        block_gru_backward_compute(
            L, T, B, I, H, &x[0, 0, 0], &h_prev[0, 0], &w_ru[0, 0], &w_c[0, 0],
            &r[0, 0, 0], &u[0, 0, 0], &c[0, 0, 0], &h[0, 0, 0], &h_grad[0, 0, 0], lens,
            &ws[0], &acc[0], &x_grad[0, 0, 0], &h_prev_grad[0, 0],
            &w_ru_grad[0, 0], &w_c_grad[0, 0], &b_ru_grad[0], &b_c_grad[0], n_threads,
            max_threads)


# ---------------------------------------------------------------------------
# C-level API (declared, with its contract, in _kernels.pxd; cimported from
# blockrnn.capi). Each function allocates its workspace, runs the compute
# function with serial gate loops and returns 0, or -1 without memory.
# ---------------------------------------------------------------------------

cdef int api_lstm_cell(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const floating* x,
        const floating* cs_prev, const floating* h_prev, const floating* w,
        const floating* wci, const floating* wcf, const floating* wco, const floating* b,
        floating forget_bias, floating cell_clip, int use_peephole, floating* i_,
        floating* cs, floating* f, floating* o, floating* ci, floating* co,
        floating* h) noexcept nogil:
    cdef floating* ws = <floating*>malloc(lstm_cell_workspace(B, I, H) * sizeof(floating))
    if ws == NULL:
        return -1
    lstm_cell_compute(B, I, H, gate_offsets(layout, H), x, cs_prev, h_prev, w, wci, wcf,
                      wco, b, forget_bias, cell_clip, use_peephole != 0, ws,
                      i_, cs, f, o, ci, co, h, 1)
    free(ws)
    return 0


cdef int api_block_lstm(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x, const floating* cs_prev, const floating* h_prev,
        const floating* w, const floating* wci, const floating* wcf, const floating* wco,
        const floating* b, floating forget_bias, floating cell_clip, int use_peephole,
        const int64_t* lengths, floating* i_, floating* cs, floating* f, floating* o,
        floating* ci, floating* co, floating* h) noexcept nogil:
    cdef floating* g = <floating*>malloc(
        block_lstm_forward_workspace(L, B, H, I, floating is float) * sizeof(floating))
    if g == NULL:
        return -1
    block_lstm_forward_compute(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco,
                               b, forget_bias, cell_clip, use_peephole != 0, lengths, g,
                               i_, cs, f, o, ci, co, h, 1, 1)
    free(g)
    return 0


cdef int api_block_lstm_grad(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x, const floating* cs_prev, const floating* h_prev,
        const floating* w, const floating* wci, const floating* wcf, const floating* wco,
        const floating* i_, const floating* cs, const floating* f, const floating* o,
        const floating* ci, const floating* co, const floating* h,
        const floating* cs_grad, const floating* h_grad, int use_peephole,
        const int64_t* lengths, floating* x_grad, floating* cs_prev_grad,
        floating* h_prev_grad, floating* w_grad, floating* wci_grad, floating* wcf_grad,
        floating* wco_grad, floating* b_grad) noexcept nogil:
    cdef floating* ws = <floating*>malloc(
        block_lstm_backward_workspace(L, B, H, floating is float) * sizeof(floating))
    cdef double* acc = <double*>malloc((3 * 4 * H + 1) * sizeof(double))
    if ws == NULL or acc == NULL:
        free(ws)
        free(acc)
        return -1
    block_lstm_backward_compute(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco,
                                i_, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole != 0,
                                lengths, ws, acc, x_grad, cs_prev_grad, h_prev_grad, w_grad,
                                wci_grad, wcf_grad, wco_grad, b_grad, 1, 1)
    free(ws)
    free(acc)
    return 0


cdef int api_gru_cell(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const floating* x, const floating* h_prev,
        const floating* w_ru, const floating* w_c, const floating* b_ru,
        const floating* b_c, floating* r, floating* u, floating* c,
        floating* h) noexcept nogil:
    cdef floating* ws = <floating*>malloc(gru_cell_workspace(B, I, H) * sizeof(floating))
    if ws == NULL:
        return -1
    gru_cell_compute(B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, ws, r, u, c, h, 1)
    free(ws)
    return 0


cdef int api_block_gru(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x, const floating* h_prev, const floating* w_ru,
        const floating* w_c, const floating* b_ru, const floating* b_c,
        const int64_t* lengths, floating* r, floating* u, floating* c,
        floating* h) noexcept nogil:
    cdef floating* ws = <floating*>malloc(
        block_gru_forward_workspace(L, B, H, I, floating is float) * sizeof(floating))
    if ws == NULL:
        return -1
    block_gru_forward_compute(L, T, B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, lengths, ws,
                              r, u, c, h, 1, 1)
    free(ws)
    return 0


cdef int api_block_gru_grad(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x, const floating* h_prev, const floating* w_ru,
        const floating* w_c, const floating* r, const floating* u, const floating* c,
        const floating* h, const floating* h_grad, const int64_t* lengths,
        floating* x_grad, floating* h_prev_grad, floating* w_ru_grad, floating* w_c_grad,
        floating* b_ru_grad, floating* b_c_grad) noexcept nogil:
    cdef floating* ws = <floating*>malloc(
        block_gru_backward_workspace(L, B, H, floating is float) * sizeof(floating))
    cdef double* acc = <double*>malloc((2 * H + 1) * sizeof(double))
    if ws == NULL or acc == NULL:
        free(ws)
        free(acc)
        return -1
    block_gru_backward_compute(L, T, B, I, H, x, h_prev, w_ru, w_c, r, u, c, h, h_grad,
                               lengths, ws, acc, x_grad, h_prev_grad,
                               w_ru_grad, w_c_grad, b_ru_grad, b_c_grad, 1, 1)
    free(ws)
    free(acc)
    return 0



cdef int brnn_lstm_cell_f32(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const float* x,
        const float* cs_prev, const float* h_prev, const float* w, const float* wci,
        const float* wcf, const float* wco, const float* b, float forget_bias,
        float cell_clip, int use_peephole, float* i, float* cs, float* f, float* o,
        float* ci, float* co, float* h) noexcept nogil:
    return api_lstm_cell(B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, i, cs, f, o, ci, co, h)


cdef int brnn_lstm_cell_f64(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const double* x,
        const double* cs_prev, const double* h_prev, const double* w, const double* wci,
        const double* wcf, const double* wco, const double* b, double forget_bias,
        double cell_clip, int use_peephole, double* i, double* cs, double* f, double* o,
        double* ci, double* co, double* h) noexcept nogil:
    return api_lstm_cell(B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, i, cs, f, o, ci, co, h)


cdef int brnn_block_lstm_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const float* x, const float* cs_prev, const float* h_prev, const float* w,
        const float* wci, const float* wcf, const float* wco, const float* b,
        float forget_bias, float cell_clip, int use_peephole, const int64_t* lengths,
        float* i, float* cs, float* f, float* o, float* ci, float* co, float* h) noexcept nogil:
    return api_block_lstm(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, lengths, i, cs, f, o, ci, co, h)


cdef int brnn_block_lstm_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const double* x, const double* cs_prev, const double* h_prev, const double* w,
        const double* wci, const double* wcf, const double* wco, const double* b,
        double forget_bias, double cell_clip, int use_peephole, const int64_t* lengths,
        double* i, double* cs, double* f, double* o, double* ci, double* co, double* h) noexcept nogil:
    return api_block_lstm(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, lengths, i, cs, f, o, ci, co, h)


cdef int brnn_block_lstm_grad_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const float* x, const float* cs_prev, const float* h_prev, const float* w,
        const float* wci, const float* wcf, const float* wco, const float* i,
        const float* cs, const float* f, const float* o, const float* ci, const float* co,
        const float* h, const float* cs_grad, const float* h_grad, int use_peephole,
        const int64_t* lengths, float* x_grad, float* cs_prev_grad, float* h_prev_grad,
        float* w_grad, float* wci_grad, float* wcf_grad, float* wco_grad, float* b_grad) noexcept nogil:
    return api_block_lstm_grad(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco,
        i, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole, lengths, x_grad, cs_prev_grad,
        h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)


cdef int brnn_block_lstm_grad_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const double* x, const double* cs_prev, const double* h_prev, const double* w,
        const double* wci, const double* wcf, const double* wco, const double* i,
        const double* cs, const double* f, const double* o, const double* ci,
        const double* co, const double* h, const double* cs_grad, const double* h_grad,
        int use_peephole, const int64_t* lengths, double* x_grad, double* cs_prev_grad,
        double* h_prev_grad, double* w_grad, double* wci_grad, double* wcf_grad,
        double* wco_grad, double* b_grad) noexcept nogil:
    return api_block_lstm_grad(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco,
        i, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole, lengths, x_grad, cs_prev_grad,
        h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)


cdef int brnn_gru_cell_f32(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const float* x, const float* h_prev,
        const float* w_ru, const float* w_c, const float* b_ru, const float* b_c, float* r,
        float* u, float* c, float* h) noexcept nogil:
    return api_gru_cell(B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h)


cdef int brnn_gru_cell_f64(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const double* x, const double* h_prev,
        const double* w_ru, const double* w_c, const double* b_ru, const double* b_c,
        double* r, double* u, double* c, double* h) noexcept nogil:
    return api_gru_cell(B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h)


cdef int brnn_block_gru_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* x, const float* h_prev, const float* w_ru, const float* w_c,
        const float* b_ru, const float* b_c, const int64_t* lengths, float* r, float* u,
        float* c, float* h) noexcept nogil:
    return api_block_gru(L, T, B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, lengths, r, u, c,
                  h)


cdef int brnn_block_gru_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const double* x, const double* h_prev, const double* w_ru, const double* w_c,
        const double* b_ru, const double* b_c, const int64_t* lengths, double* r, double* u,
        double* c, double* h) noexcept nogil:
    return api_block_gru(L, T, B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, lengths, r, u, c,
                  h)


cdef int brnn_block_gru_grad_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* x, const float* h_prev, const float* w_ru, const float* w_c,
        const float* r, const float* u, const float* c, const float* h, const float* h_grad,
        const int64_t* lengths, float* x_grad, float* h_prev_grad, float* w_ru_grad,
        float* w_c_grad, float* b_ru_grad, float* b_c_grad) noexcept nogil:
    return api_block_gru_grad(L, T, B, I, H, x, h_prev, w_ru, w_c, r, u, c, h, h_grad,
        lengths, x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad, b_c_grad)


cdef int brnn_block_gru_grad_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const double* x, const double* h_prev, const double* w_ru, const double* w_c,
        const double* r, const double* u, const double* c, const double* h,
        const double* h_grad, const int64_t* lengths, double* x_grad, double* h_prev_grad,
        double* w_ru_grad, double* w_c_grad, double* b_ru_grad, double* b_c_grad) noexcept nogil:
    return api_block_gru_grad(L, T, B, I, H, x, h_prev, w_ru, w_c, r, u, c, h, h_grad,
        lengths, x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad, b_c_grad)


# --------------------------------------------------------------------------
# Row-wise reversal of valid prefixes (the reverse direction of bidirectional
# layers; tf.reverse_sequence with seq_axis=0, batch_axis=1)
# --------------------------------------------------------------------------

def reverse_prefixes(const unsigned char[:, :, ::1] src, const int64_t[::1] lengths,
                     unsigned char[:, :, ::1] dst):
    """dst[t, b] = src[n_b - 1 - t, b] for t < n_b = lengths[b], and src[t, b]
    for t >= n_b: a permutation of the steps of each row, its own inverse.

    src and dst (T, B, row_bytes) are the bytes of two distinct C-contiguous
    arrays (T, B, ...) of any dtype; lengths (B,) int64 in [0, T], validated by
    the caller (blockrnn/sequence.py). One memcpy per (t, b) row, serial: the
    copy is bound by memory bandwidth, not by a core."""
    cdef Py_ssize_t T = src.shape[0], B = src.shape[1], row = src.shape[2]
    cdef Py_ssize_t t, b, n, s
    if T == 0 or B == 0 or row == 0:
        return
    with nogil:
        for t in range(T):
            for b in range(B):
                n = lengths[b]
                s = n - 1 - t if t < n else t
                memcpy(&dst[t, b, 0], &src[s, b, 0], row)
