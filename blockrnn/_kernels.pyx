# Compiled core of blockrnn: TensorFlow's block-RNN kernels for float and double.
#
# Two tiers (as in scikit-learn's k-means):
# - `def` entry points take C-contiguous memoryviews (`# IN` const, `# OUT`
#   preallocated by the caller), allocate one workspace per call and release
#   the GIL around all the work. They trust their caller (blockrnn/_ops.py)
#   to have validated every shape and dtype.
# - `cdef ... noexcept nogil` helpers take pointers and row strides.
#
# Equations cite ../shared/SPEC.md (section numbers as "SPEC §3").
# Names: B batch, I input size, H cell size, T time steps, L = seq_len_max.
# Gate blocks of H columns in the op's layout (ICFO or IFCO), see GateOffsets.
# Every matrix product goes through blockrnn/_blas.pxd (SciPy's BLAS); the
# per-timestep elementwise gate math runs in OpenMP prange loops over rows.
# Nothing is allocated inside the time loops and there is no global state.
from cython cimport floating
from cython.parallel cimport prange
from libc.string cimport memset

import numpy as np

from blockrnn._blas cimport gemm
from blockrnn._openmp cimport BRNN_OPENMP_ENABLED, brnn_omp_get_max_threads

cdef extern from "brnn_math.h" nogil:
    float brnn_sigmoidf(float z)
    double brnn_sigmoid(double z)
    float brnn_tanhf(float z)
    double brnn_tanh(double z)
    float brnn_clipf(float v, float limit)
    double brnn_clip(double v, double limit)

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


cdef inline floating sigmoid(floating z) noexcept nogil:
    if floating is float:
        return brnn_sigmoidf(z)
    else:
        return brnn_sigmoid(z)


cdef inline floating tanh_(floating z) noexcept nogil:
    if floating is float:
        return brnn_tanhf(z)
    else:
        return brnn_tanh(z)


cdef inline floating clip(floating v, floating limit) noexcept nogil:
    if floating is float:
        return brnn_clipf(v, limit)
    else:
        return brnn_clip(v, limit)


# ---------------------------------------------------------------------------
# LSTM elementwise kernels (one batch row each)
# ---------------------------------------------------------------------------

cdef inline void lstm_forward_row(
        Py_ssize_t H, GateOffsets off,
        const floating* g,        # IN  [4H] x@Wx + h_prev@Wh of this row (no bias yet)
        const floating* bias,     # IN  [4H]
        const floating* cs_prev,  # IN  [H]
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H], if peephole
        floating forget_bias, floating cell_clip, bint use_peephole,
        floating* i_, floating* cs, floating* f, floating* o,  # OUT [H] each
        floating* ci, floating* co, floating* h) noexcept nogil:
    """SPEC §3 for one row."""
    cdef Py_ssize_t j
    cdef floating pre_i, pre_f, pre_o, c_new
    for j in range(H):
        pre_i = g[off.i + j] + bias[off.i + j]
        pre_f = g[off.f + j] + bias[off.f + j] + forget_bias
        pre_o = g[off.o + j] + bias[off.o + j]
        if use_peephole:
            pre_i = pre_i + wci[j] * cs_prev[j]
            pre_f = pre_f + wcf[j] * cs_prev[j]
        i_[j] = sigmoid(pre_i)
        ci[j] = tanh_(g[off.c + j] + bias[off.c + j])
        f[j] = sigmoid(pre_f)
        c_new = i_[j] * ci[j] + f[j] * cs_prev[j]
        if cell_clip > 0:
            c_new = clip(c_new, cell_clip)
        cs[j] = c_new
        co[j] = tanh_(c_new)
        if use_peephole:
            pre_o = pre_o + wco[j] * c_new  # o's peephole sees the new, clipped cs
        o[j] = sigmoid(pre_o)
        h[j] = o[j] * co[j]


cdef inline void lstm_backward_row(
        Py_ssize_t H, GateOffsets off,
        const floating* cs_prev,  # IN [H]
        const floating* i_, const floating* f, const floating* o,  # IN [H] forward outputs
        const floating* ci, const floating* co,
        const floating* cs_grad, const floating* h_grad,  # IN [H] upstream gradients
        const floating* dh_carry,  # IN [H] gradient of h from step t+1 (if add_carry)
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H], if peephole
        bint use_peephole, bint add_carry,
        floating* dg,              # OUT [4H] gradient of the pre-activation gates
        floating* cs_prev_grad) noexcept nogil:  # IN/OUT [H], see below
    """SPEC §4 for one row (clipping ignored, as in TensorFlow).

    The sequence backward (SPEC §5) sets add_carry: the gradients of h and cs
    flowing back from step t+1 (dh_carry, and cs_prev_grad as it is on entry)
    are added to h_grad and cs_grad. cs_prev_grad is then overwritten, element
    by element after its read, with the gradient of cs_prev."""
    cdef Py_ssize_t j
    cdef floating hg, csg, d_o, dcs, d_ci, d_f, d_i, grad
    for j in range(H):
        hg = h_grad[j]
        csg = cs_grad[j]
        if add_carry:
            hg = hg + dh_carry[j]
            csg = csg + cs_prev_grad[j]
        d_o = o[j] * (1 - o[j]) * co[j] * hg
        dcs = (1 - co[j] * co[j]) * o[j] * hg + csg
        if use_peephole:
            dcs = dcs + d_o * wco[j]
        d_ci = (1 - ci[j] * ci[j]) * i_[j] * dcs
        d_f = f[j] * (1 - f[j]) * cs_prev[j] * dcs
        d_i = i_[j] * (1 - i_[j]) * ci[j] * dcs
        dg[off.i + j] = d_i
        dg[off.c + j] = d_ci
        dg[off.f + j] = d_f
        dg[off.o + j] = d_o
        grad = f[j] * dcs
        if use_peephole:
            grad = grad + wci[j] * d_i + wcf[j] * d_f
        cs_prev_grad[j] = grad


cdef void lstm_forward_rows(
        Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const floating* g, const floating* bias, const floating* cs_prev,
        const floating* wci, const floating* wcf, const floating* wco,
        floating forget_bias, floating cell_clip, bint use_peephole,
        floating* i_, floating* cs, floating* f, floating* o,
        floating* ci, floating* co, floating* h, int n_threads) noexcept nogil:
    """lstm_forward_row over B rows; g has row stride 4H, the rest H."""
    cdef Py_ssize_t r
    for r in prange(B, num_threads=n_threads, schedule="static",
                    use_threads_if=n_threads > 1):
        lstm_forward_row(H, off, g + r * 4 * H, bias, cs_prev + r * H,
                         wci, wcf, wco, forget_bias, cell_clip, use_peephole,
                         i_ + r * H, cs + r * H, f + r * H, o + r * H,
                         ci + r * H, co + r * H, h + r * H)


cdef void lstm_backward_rows(
        Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const floating* cs_prev,
        const floating* i_, const floating* f, const floating* o,
        const floating* ci, const floating* co,
        const floating* cs_grad, const floating* h_grad, const floating* dh_carry,
        const floating* wci, const floating* wcf, const floating* wco,
        bint use_peephole, bint add_carry, floating* dg, floating* cs_prev_grad,
        int n_threads) noexcept nogil:
    """lstm_backward_row over B rows; dg has row stride 4H, the rest H."""
    cdef Py_ssize_t r
    for r in prange(B, num_threads=n_threads, schedule="static",
                    use_threads_if=n_threads > 1):
        lstm_backward_row(
            H, off, cs_prev + r * H, i_ + r * H, f + r * H, o + r * H,
            ci + r * H, co + r * H, cs_grad + r * H, h_grad + r * H,
            dh_carry + r * H, wci, wcf, wco, use_peephole, add_carry, dg + r * 4 * H,
            cs_prev_grad + r * H)


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
    """LSTMBlockCell (SPEC §3): g = x @ w[:I] + h_prev @ w[I:], then the gates."""
    cdef Py_ssize_t B = x.shape[0], I = x.shape[1], H = cs_prev.shape[1]
    cdef GateOffsets off = gate_offsets(layout, H)
    dtype = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] g = np.empty((B, 4 * H), dtype=dtype)  # workspace
    with nogil:
        gemm(False, False, B, 4 * H, I, 1, &x[0, 0], I, &w[0, 0], 4 * H, 0, &g[0, 0], 4 * H)
        gemm(False, False, B, 4 * H, H, 1, &h_prev[0, 0], H, &w[I, 0], 4 * H,
             1, &g[0, 0], 4 * H)
        lstm_forward_rows(B, H, off, &g[0, 0], &b[0], &cs_prev[0, 0],
                          &wci[0], &wcf[0], &wco[0],
                          <floating>forget_bias, <floating>cell_clip, use_peephole,
                          &i_[0, 0], &cs[0, 0], &f[0, 0], &o[0, 0], &ci[0, 0],
                          &co[0, 0], &h[0, 0], n_threads)


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
                           &dgates[0, 0], &cs_prev_grad[0, 0], n_threads)
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


def block_lstm_forward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] cs_prev,  # IN  [B, H]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w,        # IN  [I+H, 4H]
        const floating[::1] wci, const floating[::1] wcf, const floating[::1] wco,  # IN
        const floating[::1] b,           # IN  [4H]
        double forget_bias, double cell_clip, bint use_peephole, int layout,
        int n_threads,
        floating[:, :, ::1] i_, floating[:, :, ::1] cs, floating[:, :, ::1] f,  # OUT
        floating[:, :, ::1] o, floating[:, :, ::1] ci, floating[:, :, ::1] co,  # [T, B, H]
        floating[:, :, ::1] h):
    """BlockLSTM / BlockLSTMV2 (SPEC §3, sequence): L steps, zeros for t >= L.

    The input projection of all L steps is one GEMM, G = x[:L] @ w[:I]; each
    step then adds only its recurrent product h[t-1] @ w[I:] before the gates."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = cs_prev.shape[1]
    cdef Py_ssize_t t, BH = B * H, G4 = 4 * H
    cdef GateOffsets off = gate_offsets(layout, H)
    dtype = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] g = np.empty((L * B, G4), dtype=dtype)  # workspace [L*B, 4H]
    cdef const floating* cs_in
    cdef const floating* h_in
    cdef Py_ssize_t tail = L * BH, tail_size = (T - L) * BH * sizeof(floating)
    with nogil:
        gemm(False, False, L * B, G4, I, 1, &x[0, 0, 0], I, &w[0, 0], G4, 0, &g[0, 0], G4)
        for t in range(L):
            cs_in = &cs_prev[0, 0] if t == 0 else &cs[t - 1, 0, 0]
            h_in = &h_prev[0, 0] if t == 0 else &h[t - 1, 0, 0]
            gemm(False, False, B, G4, H, 1, h_in, H, &w[I, 0], G4,
                 1, &g[t * B, 0], G4)
            lstm_forward_rows(B, H, off, &g[t * B, 0], &b[0], cs_in,
                              &wci[0], &wcf[0], &wco[0],
                              <floating>forget_bias, <floating>cell_clip, use_peephole,
                              &i_[t, 0, 0], &cs[t, 0, 0], &f[t, 0, 0], &o[t, 0, 0],
                              &ci[t, 0, 0], &co[t, 0, 0], &h[t, 0, 0], n_threads)
        # TF leaves the gates past L uninitialised; blockrnn writes zeros.
        memset(&i_[0, 0, 0] + tail, 0, tail_size)
        memset(&cs[0, 0, 0] + tail, 0, tail_size)
        memset(&f[0, 0, 0] + tail, 0, tail_size)
        memset(&o[0, 0, 0] + tail, 0, tail_size)
        memset(&ci[0, 0, 0] + tail, 0, tail_size)
        memset(&co[0, 0, 0] + tail, 0, tail_size)
        memset(&h[0, 0, 0] + tail, 0, tail_size)


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
        bint use_peephole, int layout, int n_threads,
        floating[:, :, ::1] x_grad,      # OUT [T, B, I]
        floating[:, ::1] cs_prev_grad,   # OUT [B, H]
        floating[:, ::1] h_prev_grad,    # OUT [B, H]
        floating[:, ::1] w_grad,         # OUT [I+H, 4H]
        floating[::1] wci_grad, floating[::1] wcf_grad, floating[::1] wco_grad,  # OUT [H]
        floating[::1] b_grad):           # OUT [4H]
    """BlockLSTMGrad / BlockLSTMGradV2 (SPEC §5).

    The reverse time loop does only the gate gradients of step t (kept in the
    workspace dG[t]) and the recurrent product dh = dG[t] @ w[I:]^T. The
    carries live in the outputs: cs_prev_grad holds d cs[t-1] and h_prev_grad
    holds d h[t-1] while the loop runs. After the loop, x_grad, w_grad, b_grad
    and the peephole gradients are single GEMMs / reductions over all steps:
      x_grad[:L] = dG @ w[:I]^T,  w_grad[:I] = x[:L]^T @ dG,
      w_grad[I:] = h_prev^T @ dG[0] + h[:L-1]^T @ dG[1:],  b_grad = sum dG."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = cs_prev.shape[1]
    cdef Py_ssize_t t, G4 = 4 * H, BH = B * H
    cdef GateOffsets off = gate_offsets(layout, H)
    dtype = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] dg = np.empty((L * B, G4), dtype=dtype)       # workspace
    cdef double[:, ::1] acc = np.zeros((3, G4), dtype=np.float64)       # workspace
    cdef const floating* cs_in
    with nogil:
        memset(&cs_prev_grad[0, 0], 0, BH * sizeof(floating))
        memset(&h_prev_grad[0, 0], 0, BH * sizeof(floating))
        for t in range(L - 1, -1, -1):
            cs_in = &cs_prev[0, 0] if t == 0 else &cs[t - 1, 0, 0]
            lstm_backward_rows(B, H, off, cs_in, &i_[t, 0, 0], &f[t, 0, 0], &o[t, 0, 0],
                               &ci[t, 0, 0], &co[t, 0, 0],
                               &cs_grad[t, 0, 0], &h_grad[t, 0, 0], &h_prev_grad[0, 0],
                               &wci[0], &wcf[0], &wco[0], use_peephole, True,
                               &dg[t * B, 0], &cs_prev_grad[0, 0], n_threads)
            gemm(False, True, B, H, G4, 1, &dg[t * B, 0], G4, &w[I, 0], G4,
                 0, &h_prev_grad[0, 0], H)

        gemm(False, True, L * B, I, G4, 1, &dg[0, 0], G4, &w[0, 0], G4,
             0, &x_grad[0, 0, 0], I)
        memset(&x_grad[0, 0, 0] + L * B * I, 0, (T - L) * B * I * sizeof(floating))
        gemm(True, False, I, G4, L * B, 1, &x[0, 0, 0], I, &dg[0, 0], G4,
             0, &w_grad[0, 0], G4)
        gemm(True, False, H, G4, B if L > 0 else 0, 1, &h_prev[0, 0], H, &dg[0, 0], G4,
             0, &w_grad[I, 0], G4)
        if L > 1:
            gemm(True, False, H, G4, (L - 1) * B, 1, &h[0, 0, 0], H, &dg[B, 0], G4,
                 1, &w_grad[I, 0], G4)
        column_sums(L * B, G4, &dg[0, 0], &acc[0, 0])
        store(G4, &acc[0, 0], &b_grad[0])
        if use_peephole:
            memset(&acc[0, 0], 0, G4 * sizeof(double))
            if L > 0:  # step 0 sees cs_prev, step t > 0 sees cs[t-1]
                peephole_sums(B, H, off, &dg[0, 0], &cs_prev[0, 0], &cs[0, 0, 0],
                              &acc[0, 0], &acc[1, 0], &acc[2, 0])
            if L > 1:
                peephole_sums((L - 1) * B, H, off, &dg[B, 0], &cs[0, 0, 0], &cs[1, 0, 0],
                              &acc[0, 0], &acc[1, 0], &acc[2, 0])
            store(H, &acc[0, 0], &wci_grad[0])
            store(H, &acc[1, 0], &wcf_grad[0])
            store(H, &acc[2, 0], &wco_grad[0])


# ---------------------------------------------------------------------------
# GRU (SPEC §6, §7)
# ---------------------------------------------------------------------------

cdef void gru_reset_update_rows(
        Py_ssize_t B, Py_ssize_t H,
        const floating* ru_pre,   # IN  [B, 2H] [x, h_prev] @ w_ru (no bias)
        const floating* b_ru,     # IN  [2H]
        const floating* h_prev,   # IN  [B, H]
        floating* r, floating* u,  # OUT [B, H]
        floating* rh,              # OUT [B, H] r * h_prev
        int n_threads) noexcept nogil:
    cdef Py_ssize_t row, j, k
    for row in prange(B, num_threads=n_threads, schedule="static",
                      use_threads_if=n_threads > 1):
        for j in range(H):
            k = row * H + j
            r[k] = sigmoid(ru_pre[row * 2 * H + j] + b_ru[j])
            u[k] = sigmoid(ru_pre[row * 2 * H + H + j] + b_ru[H + j])
            rh[k] = r[k] * h_prev[k]


cdef void gru_output_rows(
        Py_ssize_t B, Py_ssize_t H,
        const floating* b_c,       # IN  [H]
        const floating* h_prev,    # IN  [B, H]
        const floating* u,         # IN  [B, H]
        floating* c,               # IN/OUT [B, H]: [x, r*h_prev] @ w_c in, tanh(. + b_c) out
        floating* h,               # OUT [B, H]
        int n_threads) noexcept nogil:
    cdef Py_ssize_t row, j, k
    for row in prange(B, num_threads=n_threads, schedule="static",
                      use_threads_if=n_threads > 1):
        for j in range(H):
            k = row * H + j
            c[k] = tanh_(c[k] + b_c[j])
            h[k] = u[k] * (h_prev[k] - c[k]) + c[k]


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
    """GRUBlockCell (SPEC §6)."""
    cdef Py_ssize_t B = x.shape[0], I = x.shape[1], H = h_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] ru = np.empty((B, 2 * H), dtype=dtype)  # workspace
    cdef floating[:, ::1] rh = np.empty((B, H), dtype=dtype)      # workspace
    with nogil:
        gemm(False, False, B, 2 * H, I, 1, &x[0, 0], I, &w_ru[0, 0], 2 * H,
             0, &ru[0, 0], 2 * H)
        gemm(False, False, B, 2 * H, H, 1, &h_prev[0, 0], H, &w_ru[I, 0], 2 * H,
             1, &ru[0, 0], 2 * H)
        gru_reset_update_rows(B, H, &ru[0, 0], &b_ru[0], &h_prev[0, 0],
                              &r[0, 0], &u[0, 0], &rh[0, 0], n_threads)
        gemm(False, False, B, H, I, 1, &x[0, 0], I, &w_c[0, 0], H, 0, &c[0, 0], H)
        gemm(False, False, B, H, H, 1, &rh[0, 0], H, &w_c[I, 0], H, 1, &c[0, 0], H)
        gru_output_rows(B, H, &b_c[0], &h_prev[0, 0], &u[0, 0], &c[0, 0], &h[0, 0],
                        n_threads)


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
    cdef Py_ssize_t row, j
    dtype = np.float32 if floating is float else np.float64
    cdef floating[:, ::1] d_hr = np.empty((B, H), dtype=dtype)  # workspace: d(r*h_prev)
    cdef double[::1] acc = np.zeros(2 * H, dtype=np.float64)   # workspace
    with nogil:
        for row in prange(B, num_threads=n_threads, schedule="static",
                          use_threads_if=n_threads > 1):
            for j in range(H):
                d_c_bar[row, j] = d_h[row, j] * (1 - u[row, j]) * (1 - c[row, j] * c[row, j])
                d_r_bar_u_bar[row, H + j] = (d_h[row, j] * (h_prev[row, j] - c[row, j])
                                             * u[row, j] * (1 - u[row, j]))
        # [dx2 | d_hr] = d_c_bar @ w_c^T
        gemm(False, True, B, I, H, 1, &d_c_bar[0, 0], H, &w_c[0, 0], H, 0, &d_x[0, 0], I)
        gemm(False, True, B, H, H, 1, &d_c_bar[0, 0], H, &w_c[I, 0], H, 0, &d_hr[0, 0], H)
        for row in prange(B, num_threads=n_threads, schedule="static",
                          use_threads_if=n_threads > 1):
            for j in range(H):
                d_r_bar_u_bar[row, j] = (d_hr[row, j] * h_prev[row, j]
                                         * r[row, j] * (1 - r[row, j]))
        # [dx1 | dh1] = d_r_bar_u_bar @ w_ru^T; d_x = dx1 + dx2
        gemm(False, True, B, I, 2 * H, 1, &d_r_bar_u_bar[0, 0], 2 * H, &w_ru[0, 0], 2 * H,
             1, &d_x[0, 0], I)
        gemm(False, True, B, H, 2 * H, 1, &d_r_bar_u_bar[0, 0], 2 * H, &w_ru[I, 0], 2 * H,
             0, &d_h_prev[0, 0], H)
        for row in prange(B, num_threads=n_threads, schedule="static",
                          use_threads_if=n_threads > 1):
            for j in range(H):
                d_h_prev[row, j] = (d_h_prev[row, j] + d_hr[row, j] * r[row, j]
                                    + d_h[row, j] * u[row, j])
        if full:
            gemm(True, False, I, 2 * H, B, 1, &x[0, 0], I, &d_r_bar_u_bar[0, 0], 2 * H,
                 0, &d_w_ru[0, 0], 2 * H)
            gemm(True, False, H, 2 * H, B, 1, &h_prev[0, 0], H, &d_r_bar_u_bar[0, 0], 2 * H,
                 0, &d_w_ru[I, 0], 2 * H)
            gemm(True, False, I, H, B, 1, &x[0, 0], I, &d_c_bar[0, 0], H,
                 0, &d_w_c[0, 0], H)
            for row in range(B):  # d_hr is free again: reuse it for r * h_prev
                for j in range(H):
                    d_hr[row, j] = r[row, j] * h_prev[row, j]
            gemm(True, False, H, H, B, 1, &d_hr[0, 0], H, &d_c_bar[0, 0], H,
                 0, &d_w_c[I, 0], H)
            column_sums(B, 2 * H, &d_r_bar_u_bar[0, 0], &acc[0])
            store(2 * H, &acc[0], &d_b_ru[0])
            memset(&acc[0], 0, H * sizeof(double))
            column_sums(B, H, &d_c_bar[0, 0], &acc[0])
            store(H, &acc[0], &d_b_c[0])
