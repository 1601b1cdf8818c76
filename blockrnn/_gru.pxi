# Included by _kernels.pyx: the GRU family (SPEC §6, §7): GRUBlockCell, its
# gradient, and blockrnn's sequence GRU (block_gru) with its gradient.

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


cdef inline void zero_gru_outputs(Py_ssize_t at, Py_ssize_t n, floating* r, floating* u,
                                  floating* c, floating* h) noexcept nogil:
    """The four GRU outputs' elements [at, at + n) = 0."""
    cdef size_t nbytes = n * sizeof(floating)
    memset(r + at, 0, nbytes)
    memset(u + at, 0, nbytes)
    memset(c + at, 0, nbytes)
    memset(h + at, 0, nbytes)



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
            column_sums_rows(B, 2 * H, &d_r_bar_u_bar[0, 0], 2 * H, &acc[0])
            store(2 * H, &acc[0], &d_b_ru[0])
            memset(&acc[0], 0, H * sizeof(double))
            column_sums_rows(B, H, &d_c_bar[0, 0], H, &acc[0])
            store(H, &acc[0], &d_b_c[0])


cdef inline Py_ssize_t block_gru_forward_workspace(Py_ssize_t L, Py_ssize_t B,
                                                   Py_ssize_t H, Py_ssize_t I,
                                                   bint packed, int max_threads) noexcept nogil:
    """Elements of block_gru_forward_compute's workspace: one step's recurrent
    product ru [B, 2H], then r * h[t-1] [B, H]; float32 (packed): then w_ru's
    two gate blocks and w_c packed, each as its x rows [I, H] then its h rows
    [H, H] (see gru_forward_packed); float64: w_ru[I:] and w_c[I:] packed for
    dgemm_step [dpacked_size(H, 2H) + dpacked_size(H, H)], then the GEMM
    driver's blocks of the input projection."""
    if packed:   # (+ PACKED_ALIGN_PAD: the packed weights start at align64)
        return (B * 3 * H + 3 * (brnn_packed_size(I, H) + brnn_packed_size(H, H)) + 1
                + PACKED_ALIGN_PAD)
    return (B * 3 * H + dpacked_size(H, 2 * H) + dpacked_size(H, H) + 1
            + projection_threads(L * B, I, 3 * H, max_threads) * brnn_dgemm_ws(L * B, H, I))


cdef void gru_pack_cols(Py_ssize_t I, Py_ssize_t H, const float* w_ru, const float* w_c,
                        bint wide, Py_ssize_t u0, Py_ssize_t u1, float* packed) noexcept nogil:
    """The columns of cells [u0, u1) of w_ru's r and u blocks and of w_c
    packed, as gru_forward_packed reads them: block q (r, u, c) at packed +
    q * ps, its x rows [I, H] then, at + psx, its h rows [H, H] (in the wide
    one-row layout if `wide`, include/brnn_inference.h)."""
    cdef Py_ssize_t q, psx = brnn_packed_size(I, H), ps = psx + brnn_packed_size(H, H)
    for q in range(2):
        pack_cols(I, H, w_ru + q * H, 2 * H, 1, False, u0, u1, packed + q * ps)
        pack_cols(H, H, w_ru + I * 2 * H + q * H, 2 * H, 1, wide, u0, u1,
                  packed + q * ps + psx)
    pack_cols(I, H, w_c, H, 1, False, u0, u1, packed + 2 * ps)
    pack_cols(H, H, w_c + I * H, H, 1, wide, u0, u1, packed + 2 * ps + psx)


cdef int gru_forward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* w_ru, const float* w_c,  # IN [I + H, 2H], [I + H, H]
        float* packed,            # OUT w_ru's r and u blocks and w_c, each [I + H, H] as
                                  #     its rows [:I] then [I:] packed (gru_pack_cols)
        bint wide,                # the [I:] rows in the wide layout (batch 1)
        const float* x, const float* h_prev, const float* b_ru, const float* b_c,
        const int64_t* lengths,
        float* ru, float* rh,     # workspace [B, 2H], [B, H]
        float* r, float* u, float* c, float* h,  # OUT [T, B, H]
        int n_threads,
        int step_threads) noexcept nogil:   # of them, those that run the steps
    """The time loop of the float32 GRU forward: ONE parallel region of
    n_threads for all L steps, each thread owning a fixed slice of cells
    [u0, u1) of the products. Before the loop a thread packs its cells'
    columns of the weights (gru_pack_cols) and computes, for its cells, the
    input projection of all L steps into the outputs: x[:L] @ W_x
    (r, u, c blocks), one product of L*B rows per block (packed_inputs_part).
    Per step it computes h[t-1] @ w_ru[I:] into ru and applies the r, u gates
    (writing rh = r * h[t-1]); barrier (every cell's rh is needed next); c +=
    rh @ w_c[I:] and the output; barrier (step t+1 reads all of h[t]). The
    gate math of each half is that of the thread's block of rows, every cell,
    after a barrier that follows the product, whenever every thread gets a
    row (gates_by_rows); else that of its cells, reading back only the
    columns it wrote. Every product element is one packed-kernel sum, as when
    x[t] @ W_x ran inside each step: the bits depend neither on n_threads, nor
    on the hoist, nor on the split of the gates. The barrier that ends a step
    can shed (step_barrier, sequence_patient): thread 0 then runs every cell
    and row of the steps left. From SPLIT_ROWS rows a thread (split_rows)
    each thread runs every step of its block of rows instead (both halves
    on those rows, every cell), after a barrier that ends the hoist, as
    lstm_forward_packed. With step_threads < n_threads (batch 1, where two
    barriers a step cost more than a second thread saves below H = 148 but
    the packing and the projection still gain from it) every thread packs
    and projects its cells, then after a barrier only the first step_threads
    (at most n_threads) run the steps, the cells split among them. Returns
    the threads the caller gives back to the budget (region_threads)."""
    cdef Py_ssize_t psx = brnn_packed_size(I, H), ps = psx + brnn_packed_size(H, H)
    cdef Py_ssize_t t = 0, k = 0, u0 = 0, u1 = H, r0 = 0, r1 = B, BH = B * H
    cdef int tid = 0, nt = 1, half = 0, cores = brnn_omp_get_num_procs()
    cdef bint by_rows = gates_by_rows(B, step_threads)
    cdef bint split = split_rows(B, step_threads)
    cdef bint patient = sequence_patient(B, H, 3 * H, step_threads)
    cdef float* dst[3]
    cdef brnn_barrier bar, rows_bar, hoist_bar
    cdef RowSplit sp
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    memset(&hoist_bar, 0, sizeof(hoist_bar))
    if split:
        memset(&sp, 0, sizeof(sp))
    dst[0], dst[1], dst[2] = r, u, c
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        gru_pack_cols(I, H, w_ru, w_c, wide, 0, H, packed)
        packed_inputs_part(L * B, I, H, 3, x, packed, ps, dst, 0, H)
        for t in range(L):
            gru_forward_rows_step(t, B, H, packed, ps, psx, wide, h_prev, b_ru, b_c, lengths,
                                  ru, rh, r, u, c, h, 0, B)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        gru_pack_cols(I, H, w_ru, w_c, wide, u0, u1, packed)
        packed_inputs_part(L * B, I, H, 3, x, packed, ps, dst, u0, u1)
        if split:   # every step of the rows [r0, r1), once every column is projected
            brnn_barrier_wait(&bar, nt)
            t = 0
            while t < L:
                gru_forward_rows_step(t, B, H, packed, ps, psx, wide, h_prev, b_ru, b_c,
                                      lengths, ru, rh, r, u, c, h, r0, r1)
                t = t + 1
                if t < L and rows_leave(&sp, tid, cores):
                    break
            rows_done(&sp, tid, t)
        else:
            if step_threads < nt:   # the steps on fewer threads, once every cell is projected
                brnn_barrier_wait(&hoist_bar, nt)
                nt = step_threads
                u0 = unit_start(H, tid, nt)
                u1 = unit_start(H, tid + 1, nt)
                r0 = tid * B // nt if by_rows else 0
                r1 = (tid + 1) * B // nt if by_rows else B
            for t in range(L if tid < nt else 0):
                for half in range(2):
                    gru_forward_packed_half(half, t, B, H, packed, ps, psx, wide,
                                            h_prev if t == 0 else h + (t - 1) * BH, b_ru, b_c,
                                            lengths, ru, rh, r, u, c, h, u0, u1, r0, r1,
                                            &rows_bar if nt > 1 and by_rows else NULL, nt,
                                            &bar)
                    if half == 0 and nt > 1:   # a stall here counts at the step's end
                        brnn_barrier_wait_within(&bar, nt, &bar)
                if nt > 1 and step_barrier(&bar, nt, cores, patient):
                    if tid != 0:   # shed: thread 0 runs every cell and row of the steps left
                        break
                    nt, u0, u1, r0, r1 = 1, 0, H, 0, B
    if split:   # the steps of the threads that left early, on the caller's thread
        for k in range(1, sp.nt):
            for t in range(sp.resume[k], L):
                gru_forward_rows_step(t, B, H, packed, ps, psx, wide, h_prev, b_ru, b_c,
                                      lengths, ru, rh, r, u, c, h, k * B // sp.nt,
                                      (k + 1) * B // sp.nt)
        return n_threads - sp.given
    # a shed gives back the step threads but thread 0; those that only packed and
    # projected are given back here
    return region_threads(&bar, step_threads) + n_threads - step_threads


cdef void gru_forward_packed_half(
        int half, Py_ssize_t t, Py_ssize_t B, Py_ssize_t H,
        const float* packed, Py_ssize_t ps, Py_ssize_t psx, bint wide,
        const float* h_in, const float* b_ru, const float* b_c, const int64_t* lengths,
        float* ru, float* rh, float* r, float* u, float* c, float* h,
        Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t r0, Py_ssize_t r1,
        brnn_barrier* rows_bar, int nt, brnn_barrier* step_bar) noexcept nogil:
    """Half 0 or 1 of step t of gru_forward_packed (r[t], u[t], c[t] hold
    x[t] @ W_x already): the product's columns of the cells [u0, u1)
    (recurrent_product: the h rows in the wide layout at batch 1, else
    panels), then the gate math, both for the rows [r0, r1) without rows_bar (every row in
    a split by cells, the thread's rows over every cell in a split by rows);
    with rows_bar, the product of every row, then the gate math of the rows
    [r0, r1), every cell, after a barrier of the nt threads (within the
    step's shedding barrier step_bar). Packed block q (r, u, c) starts at
    packed + q * ps: its x rows, then at + psx its h rows."""
    cdef Py_ssize_t BH = B * H, row, k
    cdef Py_ssize_t p0 = 0 if rows_bar != NULL else r0, p1 = B if rows_bar != NULL else r1
    if u1 > u0:
        k = p0 * H
        if half == 0:
            recurrent_product(p1 - p0, H, h_in + k, packed + psx, wide, H, u0, u1, False,
                              ru + 2 * k, 2 * H)
            recurrent_product(p1 - p0, H, h_in + k, packed + ps + psx, wide, H, u0, u1, False,
                              ru + 2 * k + H, 2 * H)
        else:
            recurrent_product(p1 - p0, H, rh + k, packed + 2 * ps + psx, wide, H, u0, u1, True,
                              c + t * BH + k, H)
    gate_math_block(rows_bar, nt, step_bar, H, &u0, &u1, &r0, &r1)
    if u1 <= u0:
        return
    for row in range(r0, r1):
        k = row * H + u0
        if half == 0:
            brnn_gru_gates_row_f32(u1 - u0, ru + row * 2 * H + u0, ru + row * 2 * H + H + u0,
                                   b_ru + u0, b_ru + H + u0, h_in + k, True,
                                   r + t * BH + k, u + t * BH + k, rh + k)
        elif finished(lengths, row, t):
            zero_gru_outputs(t * BH + k, u1 - u0, r, u, c, h)
        else:
            brnn_gru_output_row_f32(u1 - u0, b_c + u0, h_in + k, u + t * BH + k,
                                    c + t * BH + k, h + t * BH + k)


cdef void gru_forward_rows_step(
        Py_ssize_t t, Py_ssize_t B, Py_ssize_t H, const float* packed, Py_ssize_t ps,
        Py_ssize_t psx, bint wide, const float* h_prev, const float* b_ru, const float* b_c,
        const int64_t* lengths, float* ru, float* rh, float* r, float* u, float* c, float* h,
        Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """Step t of gru_forward_packed for the rows [r0, r1), every cell, on the
    calling thread alone (no barrier): both halves (gru_forward_packed_half).
    The one-thread loop, the split by rows and its leftover steps run it."""
    cdef int half
    for half in range(2):
        gru_forward_packed_half(half, t, B, H, packed, ps, psx, wide,
                                h_prev if t == 0 else h + (t - 1) * B * H, b_ru, b_c, lengths,
                                ru, rh, r, u, c, h, 0, H, r0, r1, NULL, 1, NULL)


cdef void block_gru_forward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x,        # IN  [T, B, I]
        const floating* h_prev,   # IN  [B, H]
        const floating* w_ru,     # IN  [I+H, 2H]
        const floating* w_c,      # IN  [I+H, H]
        const floating* b_ru,     # IN  [2H]
        const floating* b_c,      # IN  [H]
        const int64_t* lengths,   # IN  [B] or NULL
        floating* ws,             # workspace [block_gru_forward_workspace(L, B, H, I, float,
                                  #            max_threads)]
        floating* r, floating* u, floating* c, floating* h,  # OUT [T, B, H]
        int n_threads, int max_threads) noexcept nogil:
    """GRUBlockCell (SPEC §6) over L steps, zeros for t >= L (and in row b for
    t >= lengths[b]). The input projections of all L steps are hoisted out of
    the loop as GEMMs into the outputs: r[:L], u[:L] and c[:L] hold x[:L] @
    w_ru[:I] (its two halves) and x[:L] @ w_c[:I] until step t overwrites
    them. Each step computes h[t-1] @ w_ru[I:] into the B x 2H workspace and
    adds (r * h[t-1]) @ w_c[I:] onto c[t]; memory beyond the outputs is
    O(B x H), plus w_ru[I:] and w_c[I:] packed once for the recurrent
    products (dgemm_step, as block_lstm_forward_compute's). That is the
    float64 route. float32 runs every product of the loop in the packed
    kernel on up to max_threads threads from the thread budget
    (gru_forward_packed), the input projection hoisted inside its region as
    in block_lstm_forward_compute. Measured as there (hoisted vs x[t] @ W_x in
    each step, median ms, 2 threads / 1 thread): 100,32,256,256 24.2 vs 24.6 /
    16.5 vs 17.4; 200,16,128,256 25.8 vs 26.6 / 12.5 vs 13.6; 100,64,512,512
    160.9 vs 166.0 / 144.2 vs 149.0. At batch 1 a step's products are GEMVs,
    the h rows read in the wide layout (the inference forward's sums, so its
    bits), and the steps run on one thread below H = 148 (gru_sequence_threads)
    while the packing and the projection may take two (packed_input_threads).
    Batch 1 ran a loop of its own until stop 56 (the weights packed on the
    calling thread and the projection in a region of its own before the
    steps' region): in one region, T=50, I=H, 2-core Intel Xeon (AVX-512) VM,
    300-call p25, 2 threads, three alternating rounds: H=128 148-156 us vs
    147-190, H=160 251-278 vs 274-278, H=256 423-506 vs 548-704."""
    cdef Py_ssize_t t, BH = B * H
    cdef const floating* h_in
    cdef Py_ssize_t tail = L * BH
    cdef floating* ru = ws
    cdef floating* rh = ws + B * 2 * H
    cdef floating* w_ru_h = rh + B * H   # float64: w_ru[I:] [H, 2H] packed (dgemm_step),
    cdef floating* w_c_h = NULL          # then w_c[I:] [H, H]
    cdef gemm_spec jobs[3]
    cdef int granted, steps, want
    if floating is float:
        if B > 0:
            steps = gru_sequence_threads(B, H, max_threads)
            if B == 1:   # the packing and the projection may take more (gru_forward_packed)
                want = max(steps, packed_input_threads(L, I, 3 * H, H, max_threads))
            else:
                want = steps
            granted = brnn_budget_take(loop_threads(want, L * B * (I + H) * 3 * H,
                                                    LOOP_MIN_WORK_FORWARD),
                                       max_threads)
            brnn_budget_give(gru_forward_packed(L, B, I, H, w_ru, w_c, align64(rh + B * H),
                                                B == 1 and row1_wide, x, h_prev, b_ru, b_c,
                                                lengths, ru, rh, r, u, c, h, granted,
                                                min(steps, granted)))
    else:
        w_c_h = w_ru_h + dpacked_size(H, 2 * H)
        brnn_pack_f64(H, 2 * H, w_ru + I * 2 * H, 2 * H, 1, w_ru_h)
        brnn_pack_f64(H, H, w_c + I * H, H, 1, w_c_h)
        # x[:L] @ w_ru[:I]'s halves and w_c[:I] through the GEMM driver
        jobs[0] = gspec(L * B, H, I, x, I, 1, w_ru, 2 * H, 1, False, r, H)
        jobs[1] = gspec(L * B, H, I, x, I, 1, w_ru + H, 2 * H, 1, False, u, H)
        jobs[2] = gspec(L * B, H, I, x, I, 1, w_c, H, 1, False, c, H)
        run_gemm_specs(3, jobs, w_c_h + dpacked_size(H, H),
                       projection_threads(L * B, I, 3 * H, max_threads))
        for t in range(L):
            h_in = h_prev if t == 0 else h + (t - 1) * BH
            dgemm_step(B, H, h_in, H, w_ru_h, 2 * H, False, ru, 2 * H, n_threads)
            gru_gates_rows(B, H, ru, b_ru, h_in, True, r + t * BH, u + t * BH, rh, n_threads)
            dgemm_step(B, H, rh, H, w_c_h, H, True, c + t * BH, H, n_threads)
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
        block_gru_forward_workspace(L, B, H, I, floating is float, max_threads), dtype=dtype)
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
        block_gru_forward_workspace(L, B, H, I, typenum == cnp.NPY_FLOAT32, max_threads),
        typenum)
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


cdef inline int gru_backward_gemm_threads(Py_ssize_t S, Py_ssize_t B, Py_ssize_t I,
                                          Py_ssize_t H, int max_threads) noexcept nogil:
    """Threads of the products of a chunk of S steps (x_grad and the weight
    gradients: S*B * 3H * (2I + H) multiply-adds), see gru_backward_gemms."""
    return packed_gemm_threads(S * B * 3 * H * (2 * I + H), max_threads)


cdef inline Py_ssize_t gru_backward_gemm_ws(Py_ssize_t S, Py_ssize_t B, Py_ssize_t I,
                                            Py_ssize_t H, bint f32) noexcept nogil:
    """Elements of one thread's GEMM-driver block for gru_backward_gemms on
    chunks of up to S steps (a bound over its jobs: the driver's ws grows
    with each size)."""
    return max(gemm_ws_of(f32, S * B, I, 2 * H), gemm_ws_of(f32, I, 2 * H, S * B),
               gemm_ws_of(f32, H, 2 * H, S * B))


cdef inline Py_ssize_t block_gru_backward_workspace(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t H, Py_ssize_t I, bint packed,
        int max_threads) noexcept nogil:
    """Elements of block_gru_backward_compute's workspace: [S*B, 4H] for a
    chunk of S = backward_chunk_steps(L, B * 4H) steps (see there), then d(r
    * h[t-1]) [B, H], then for float32 (packed) w_c[I:]^T and w_ru[I:]^T
    packed, and x_grad's two B, w_ru[:I]^T and w_c[:I]^T, packed for the
    driver [gru_x_grad_packed_size(I, H)], for float64 w_c[I:]^T and
    w_ru[I:]^T packed for dgemm_step; then the GEMM
    driver's blocks for the products of a chunk [gru_backward_gemm_threads(S,
    ...) * gru_backward_gemm_ws(S, ...)]. Its double accumulator `acc` has
    sums_workspace(L, B, 4H, 3H) + 1 elements."""
    cdef Py_ssize_t S = max(1, backward_chunk_steps(L, B * 4 * H))
    cdef Py_ssize_t driver = (gru_backward_gemm_threads(S, B, I, H, max_threads)
                              * gru_backward_gemm_ws(S, B, I, H, packed))
    if packed:
        return (S * B * 4 * H + B * H + brnn_packed_size(H, H) + brnn_packed_size(2 * H, H)
                + gru_x_grad_packed_size(I, H) + driver + 1)
    return (S * B * 4 * H + B * H + dpacked_size(H, H) + dpacked_size(2 * H, H) + driver
            + 1)


cdef inline void gru_x_grad_jobs(
        Py_ssize_t rows, Py_ssize_t I, Py_ssize_t H, const floating* d_ru,
        const floating* d_c, const floating* w_ru, const floating* w_c, floating* x_grad,
        gemm_spec* jobs) noexcept nogil:
    """jobs[0:2]: x_grad [rows, I] = dRU @ w_ru[:I]^T, then += dC @ w_c[:I]^T
    (gru_backward_gemms; dRU [rows, 2H], dC [rows, H], NULL with rows = 0 to
    pack the B). Their B, w_ru[:I]^T and w_c[:I]^T, are the same in every
    chunk (pack_bs)."""
    jobs[0] = gspec(rows, I, 2 * H, d_ru, 2 * H, 1, w_ru, 1, 2 * H, False, x_grad, I)
    jobs[1] = gspec(rows, I, H, d_c, H, 1, w_c, 1, H, True, x_grad, I)


cdef inline Py_ssize_t gru_x_grad_packed_size(Py_ssize_t I, Py_ssize_t H) noexcept nogil:
    """Floats of gru_x_grad_jobs' B packed by pack_bs."""
    cdef gemm_spec jobs[2]
    gru_x_grad_jobs[float](0, I, H, NULL, NULL, NULL, NULL, NULL, jobs)
    return packed_bs_size(2, jobs)


cdef void gru_backward_gemms(
        Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x,        # IN  [L*B, I]
        const floating* h_prev,   # IN  [B, H]
        const floating* h,        # IN  [L*B, H]
        const floating* rh,       # IN  [(t1-t0)*B, H] r[t] * h[t-1] of the chunk
        const floating* w_ru, const floating* w_c,  # IN [I+H, 2H], [I+H, H]
        const floating* d_ru, const floating* d_c,  # IN [(t1-t0)*B, 2H], [(t1-t0)*B, H]
        bint accumulate,          # add the weight gradients onto the later chunks'
        floating* x_grad,         # OUT [L*B, I] (rows of steps [t0, t1) written)
        floating* w_ru_grad, floating* w_c_grad,    # IN/OUT [I+H, 2H], [I+H, H]
        const floating* x_packed,  # x_grad's B packed (pack_bs of gru_x_grad_jobs), or NULL
        floating* ws,             # workspace [threads * gru_backward_gemm_ws(S, B, I, H, f32)]
        int threads) noexcept nogil:
    """The GRU backward's products over the steps [t0, t1) of one chunk,
    through the GEMM driver of its precision (run_gemm_specs: blockrnn's
    packed float32 or float64 kernels, on blockrnn's threads, bits
    independent of their count):
      x_grad[t0:t1] = dRU @ w_ru[:I]^T + dC @ w_c[:I]^T,
      w_ru_grad (+)= [x; h[t0-1:t1-1]]^T @ dRU  (h[-1] = h_prev),
      w_c_grad (+)= [x; r*h[t-1]]^T @ dC.
    With t0 == t1 == 0 (L == 0) the weight gradients are set to zero."""
    cdef Py_ssize_t H2 = 2 * H, n = (t1 - t0) * B
    cdef const floating* xs = x + t0 * B * I
    cdef gemm_spec jobs[7]
    cdef int njobs = 6
    gru_x_grad_jobs(n, I, H, d_ru, d_c, w_ru, w_c, x_grad + t0 * B * I, jobs)
    read_packed_bs(2, jobs, <const float*>x_packed)
    jobs[2] = gspec(I, H2, n, xs, 1, I, d_ru, H2, 1, accumulate, w_ru_grad, H2)
    jobs[3] = gspec(I, H, n, xs, 1, I, d_c, H, 1, accumulate, w_c_grad, H)
    jobs[4] = gspec(H, H, n, rh, 1, H, d_c, H, 1, accumulate, w_c_grad + I * H, H)
    if t0 > 0:
        jobs[5] = gspec(H, H2, n, h + (t0 - 1) * B * H, 1, H, d_ru, H2, 1, accumulate,
                        w_ru_grad + I * H2, H2)
    else:   # step 0 reads h_prev, steps 1.. read h[0:t1-1]
        jobs[5] = gspec(H, H2, B if t1 > 0 else 0, h_prev, 1, H, d_ru, H2, 1, accumulate,
                        w_ru_grad + I * H2, H2)
        jobs[6] = gspec(H, H2, (t1 - 1) * B if t1 > 1 else 0, h, 1, H, d_ru + B * H2, H2, 1,
                        True, w_ru_grad + I * H2, H2)
        njobs = 7
    run_gemm_specs(njobs, jobs, ws, threads)


cdef void gru_pack_t_cols(Py_ssize_t I, Py_ssize_t H, const float* w_ru, const float* w_c,
                          Py_ssize_t u0, Py_ssize_t u1, float* w_c_t,
                          float* w_ru_t) noexcept nogil:
    """The columns of cells [u0, u1) of w_c[I:]^T [H, H] and w_ru[I:]^T [2H, H]
    packed, as gru_backward_packed reads them."""
    pack_cols(H, H, w_c + I * H, 1, H, False, u0, u1, w_c_t)
    pack_cols(2 * H, H, w_ru + I * 2 * H, 1, 2 * H, False, u0, u1, w_ru_t)


cdef int gru_backward_packed(
        Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* w_ru, const float* w_c,  # IN [I + H, 2H], [I + H, H]: packed first if
        bint pack,                            #    `pack`
        float* w_c_t, float* w_ru_t,  # IN/OUT w_c[I:]^T [H, H], w_ru[I:]^T [2H, H] packed
        const float* h_prev, const float* r, const float* u, const float* c,
        const float* h, const float* h_grad, const int64_t* lengths,
        float* d_ru, float* d_c,  # OUT [(t1-t0)*B, 2H], [(t1-t0)*B, H]: step t at row (t-t0)*B
        float* d_hr,              # workspace [B, H]
        float* h_prev_grad,       # IN/OUT [B, H] the carry
        int n_threads) noexcept nogil:
    """The reverse loop of the float32 GRU backward over the steps [t0, t1):
    ONE parallel region of n_threads, each thread owning the cells [u0, u1)
    of the products (and, if `pack`, packing their columns of w_c[I:]^T and
    w_ru[I:]^T first: the first chunk's region). Per step: the output part
    of SPEC §7; barrier (d_hr needs all of dC[t]); d_hr = dC[t] @ w_c[I:]^T
    and the reset part; barrier (the carry needs all of dRU[t]); carry +=
    dRU[t] @ w_ru[I:]^T.
    The gate math (the output and reset parts) is that of the thread's block
    of rows, every cell, whenever every thread gets a row (gates_by_rows):
    then a barrier follows each product (the rows read every cell of d_hr,
    and of the carry); else that of its cells. The second barrier of a step
    can shed (step_barrier, sequence_patient): thread 0 then computes every
    cell and row from there on. From SPLIT_ROWS rows a thread (split_rows)
    each thread runs every step of its block of rows instead (the three
    parts on those rows, every cell), with no barrier, as
    lstm_backward_packed (after one barrier if it packs). The bits do not
    depend on n_threads. Returns the threads the caller gives back to the
    budget (region_threads)."""
    cdef Py_ssize_t t = 0, k, u0 = 0, u1 = H, r0 = 0, r1 = B
    cdef int tid = 0, nt = 1, cores = brnn_omp_get_num_procs()
    cdef bint by_rows = gates_by_rows(B, n_threads)
    cdef bint split = split_rows(B, n_threads)
    cdef bint patient = sequence_patient(B, 3 * H, H, n_threads)
    cdef brnn_barrier bar, rows_bar
    cdef RowSplit sp
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    if split:
        memset(&sp, 0, sizeof(sp))
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        if pack:
            gru_pack_t_cols(I, H, w_ru, w_c, 0, H, w_c_t, w_ru_t)
        for t in range(t1 - 1, t0 - 1, -1):
            gru_backward_rows_step(t, t0, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                   lengths, d_ru, d_c, d_hr, h_prev_grad, 0, B)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        if pack:
            gru_pack_t_cols(I, H, w_ru, w_c, u0, u1, w_c_t, w_ru_t)
        if split:   # every step of the rows [r0, r1), once the weights are packed
            if pack:
                brnn_barrier_wait(&bar, nt)
            t = t1
            while t > t0:
                t = t - 1
                gru_backward_rows_step(t, t0, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                       lengths, d_ru, d_c, d_hr, h_prev_grad, r0, r1)
                if t > t0 and rows_leave(&sp, tid, cores):
                    break
            rows_done(&sp, tid, t)
        else:
            for t in range(t1 - 1, t0 - 1, -1):
                gru_backward_packed_part(0, t, t0, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h,
                                         h_grad, lengths, d_ru, d_c, d_hr, h_prev_grad, u0, u1,
                                         r0, r1, &rows_bar if nt > 1 and by_rows else NULL, nt,
                                         &bar)
                if nt > 1:   # a stall here counts at the step's end
                    brnn_barrier_wait_within(&bar, nt, &bar)
                gru_backward_packed_part(1, t, t0, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h,
                                         h_grad, lengths, d_ru, d_c, d_hr, h_prev_grad, u0, u1,
                                         r0, r1, &rows_bar if nt > 1 and by_rows else NULL, nt,
                                         &bar)
                if nt > 1 and step_barrier(&bar, nt, cores, patient):
                    if tid != 0:   # shed: thread 0 computes every cell and row from here
                        break
                    nt, u0, u1, r0, r1 = 1, 0, H, 0, B
                gru_backward_packed_part(2, t, t0, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h,
                                         h_grad, lengths, d_ru, d_c, d_hr, h_prev_grad, u0, u1,
                                         0, B, NULL, nt, NULL)   # every row of its cells
    if split:   # the steps of the threads that left early, on the caller's thread
        for k in range(1, sp.nt):
            for t in range(sp.resume[k] - 1, t0 - 1, -1):
                gru_backward_rows_step(t, t0, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                       lengths, d_ru, d_c, d_hr, h_prev_grad, k * B // sp.nt,
                                       (k + 1) * B // sp.nt)
        return n_threads - sp.given
    return region_threads(&bar, n_threads)


cdef void gru_backward_packed_part(
        int part, Py_ssize_t t, Py_ssize_t t0, Py_ssize_t B, Py_ssize_t H, const float* w_c_t,
        const float* w_ru_t, const float* h_prev, const float* r, const float* u,
        const float* c, const float* h, const float* h_grad, const int64_t* lengths,
        float* d_ru, float* d_c, float* d_hr, float* h_prev_grad,
        Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t r0, Py_ssize_t r1,
        brnn_barrier* rows_bar, int nt, brnn_barrier* step_bar) noexcept nogil:
    """Part 0, 1 or 2 of step t of gru_backward_packed (d_ru and d_c: the
    chunk from step t0 on): its product's columns of the cells [u0, u1)
    (parts 1 and 2), then the gate math of parts 0 and 1, both for the rows
    [r0, r1) without rows_bar (every row in a split by cells, the thread's
    rows over every cell in a split by rows); with rows_bar, the product of
    every row, then the gate math of the rows [r0, r1), every cell, after a
    barrier of the nt threads within the shedding barrier step_bar
    (gate_math_block; part 0's follows the product of part 2 of the step
    before, which wrote the carry)."""
    cdef Py_ssize_t BH = B * H, k, nu
    cdef Py_ssize_t p0 = 0 if rows_bar != NULL else r0, p1 = B if rows_bar != NULL else r1
    cdef const float* h_in = h_prev if t == 0 else h + (t - 1) * BH
    cdef float* dct = d_c + (t - t0) * BH
    cdef float* drt = d_ru + (t - t0) * 2 * BH
    if part == 2:
        if u1 > u0:
            packed_product(p1 - p0, 2 * H, drt + 2 * p0 * H, 2 * H, w_ru_t, u0, u1, True,
                           h_prev_grad + p0 * H, H)
        return
    if u1 > u0 and part == 1:
        packed_product(p1 - p0, H, dct + p0 * H, H, w_c_t, u0, u1, False, d_hr + p0 * H, H)
    gate_math_block(rows_bar, nt, step_bar, H, &u0, &u1, &r0, &r1)
    if u1 <= u0 or r1 <= r0:
        return
    k, nu = r0 * H, u1 - u0
    if part == 0:
        gru_backward_output_block[float](r1 - r0, H, h_in + k, u + t * BH + k, c + t * BH + k,
                                         h_grad + t * BH + k, True, h_prev_grad + k, dct + k,
                                         drt + 2 * k, lengths_from(lengths, r0), t, u0, nu)
    else:
        gru_backward_reset_block[float](r1 - r0, H, h_in + k, r + t * BH + k, d_hr + k,
                                        drt + 2 * k, h_prev_grad + k,
                                        lengths_from(lengths, r0), t, u0, nu)


cdef void gru_backward_rows_step(
        Py_ssize_t t, Py_ssize_t t0, Py_ssize_t B, Py_ssize_t H, const float* w_c_t,
        const float* w_ru_t, const float* h_prev, const float* r, const float* u,
        const float* c, const float* h, const float* h_grad, const int64_t* lengths,
        float* d_ru, float* d_c, float* d_hr, float* h_prev_grad,
        Py_ssize_t r0, Py_ssize_t r1) noexcept nogil:
    """Step t of gru_backward_packed for the rows [r0, r1), every cell, on the
    calling thread alone (no barrier): its three parts
    (gru_backward_packed_part). The one-thread loop, the split by rows and
    its leftover steps run it."""
    cdef int part
    for part in range(3):
        gru_backward_packed_part(part, t, t0, B, H, w_c_t, w_ru_t, h_prev, r, u, c, h, h_grad,
                                 lengths, d_ru, d_c, d_hr, h_prev_grad, 0, H, r0, r1, NULL, 1,
                                 NULL)


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
        floating* ws,             # workspace [block_gru_backward_workspace(L, B, H, I, float,
                                  #            max_threads)]
        double* acc,              # workspace [sums_workspace(L, B, 4H, 3H)]: b_ru's 2H
                                  #   and b_c's H sums, then a chunk's row blocks'
        floating* x_grad,         # OUT [T, B, I]
        floating* h_prev_grad,    # OUT [B, H]
        floating* w_ru_grad,      # OUT [I+H, 2H]
        floating* w_c_grad,       # OUT [I+H, H]
        floating* b_ru_grad,      # OUT [2H]
        floating* b_c_grad,       # OUT [H]
        int n_threads, int max_threads) noexcept nogil:
    """Backward of block_gru_forward_compute: SPEC §7 at every step, in reverse,
    in chunks of S = backward_chunk_steps(L, B * 4H) steps.

    For a chunk [t0, t1) the loop keeps the gate gradients of its steps in
    the workspace: dRU (d_r_bar_u_bar, [S*B, 2H]), dC (d_c_bar, [S*B, H]), and
    [S*B, H] that hold r[t] * h[t-1] once the chunk's loop is done (their
    first B*H are the scratch of the recurrent products while it runs).
    h_prev_grad carries d h[t-1] while the loop runs. After each chunk, its
    x_grad rows and its part of the weight gradients are single products
    over its steps (added onto the later chunks'):
      x_grad[t0:t1] = dRU @ w_ru[:I]^T + dC @ w_c[:I]^T,
      w_ru_grad += [x; h[t-1]]^T @ dRU,  w_c_grad += [x; r*h[t-1]]^T @ dC.
    float32 from PACKED_MIN_ROWS rows (batch 1 too from PACKED_ROW1_MIN_CELLS
    cells) on runs the loop's two products in the
    packed kernel, on up to max_threads threads from the thread budget
    (gru_backward_packed); float64 runs them on the weights packed once
    (dgemm_step), float32's other batch-1 calls on OpenBLAS. Both precisions
    compute the products of a chunk through blockrnn's GEMM driver
    (gru_backward_gemms: float32 or float64 packed kernels), bits independent
    of any thread count (S depends on the shape only)."""
    cdef Py_ssize_t t, t0, t1, k, k0, BH = B * H, H2 = 2 * H
    cdef Py_ssize_t S = max(1, backward_chunk_steps(L, B * 4 * H))
    cdef floating* d_ru = ws                    # [S*B, 2H]
    cdef floating* d_c = ws + S * B * H2        # [S*B, H]
    cdef floating* rh = d_c + S * BH            # [S*B, H]
    cdef floating* d_hr = rh + S * BH           # [B, H]
    cdef const floating* h_in
    cdef floating* w_c_t = d_hr + BH            # w_c[I:]^T packed,
    cdef floating* w_ru_t = w_c_t + brnn_packed_size(H, H)   # w_ru[I:]^T packed
    cdef floating* x_packed = NULL              # float32: x_grad's B packed (pack_bs)
    cdef floating* gws = w_c_t
    cdef bint use_packed = False
    cdef int granted
    cdef gemm_spec x_grad_jobs[2]
    memset(h_prev_grad, 0, BH * sizeof(floating))
    memset(acc, 0, 3 * H * sizeof(double))     # [2H] b_ru's sums, [H] b_c's
    if floating is float:
        # (packed by the first chunk's region)
        use_packed = gru_backward_packed_route(B, H)
        x_packed = w_ru_t + brnn_packed_size(H2, H)
        gru_x_grad_jobs(0, I, H, <floating*>NULL, <floating*>NULL, w_ru, w_c, <floating*>NULL,
                        x_grad_jobs)
        gws = x_packed + packed_bs_size(2, x_grad_jobs)
        if L > 0:   # x_grad's B, packed once for every chunk and thread
            pack_bs(2, x_grad_jobs, <float*>x_packed)
    else:   # the recurrent weights transposed, packed once for dgemm_step
        w_ru_t = w_c_t + dpacked_size(H, H)
        gws = w_ru_t + dpacked_size(H2, H)
        brnn_pack_f64(H, H, w_c + I * H, 1, H, w_c_t)        # w_c[I:]^T [H, H]
        brnn_pack_f64(H2, H, w_ru + I * H2, 1, H2, w_ru_t)   # w_ru[I:]^T [2H, H]
    if L == 0:   # no step: zero weight gradients
        gru_backward_gemms(0, 0, B, I, H, x, h_prev, h, rh, w_ru, w_c, d_ru, d_c, False,
                           x_grad, w_ru_grad, w_c_grad, NULL, gws, 1)
    t1 = L
    while t1 > 0:
        t0 = max(0, t1 - S)
        if floating is float and use_packed:
            granted = brnn_budget_take(
                loop_threads(gru_sequence_threads(B, H, max_threads),
                             (t1 - t0) * B * 3 * H * H, LOOP_MIN_WORK_BACKWARD), max_threads)
            brnn_budget_give(gru_backward_packed(t0, t1, B, I, H, w_ru, w_c, t1 == L, w_c_t,
                                                 w_ru_t, h_prev, r, u, c, h, h_grad, lengths,
                                                 d_ru, d_c, d_hr, h_prev_grad, granted))
        else:
            for t in range(t1 - 1, t0 - 1, -1):
                h_in = h_prev if t == 0 else h + (t - 1) * BH
                gru_backward_output_rows(B, H, h_in, u + t * BH, c + t * BH, h_grad + t * BH,
                                         True, h_prev_grad, d_c + (t - t0) * BH,
                                         d_ru + (t - t0) * B * H2, lengths, t, n_threads)
                if floating is double:
                    dgemm_step(B, H, d_c + (t - t0) * BH, H, w_c_t, H, False, d_hr, H,
                               n_threads)
                else:
                    gemm_small_by_weights_t(B, H, H, d_c + (t - t0) * BH, H, w_c + I * H, H,
                                            False, d_hr, H, rh)
                gru_backward_reset_rows(B, H, h_in, r + t * BH, d_hr, d_ru + (t - t0) * B * H2,
                                        h_prev_grad, lengths, t, n_threads)
                if floating is double:
                    dgemm_step(B, H2, d_ru + (t - t0) * B * H2, H2, w_ru_t, H, True,
                               h_prev_grad, H, n_threads)
                else:
                    gemm_small_by_weights_t(B, H, H2, d_ru + (t - t0) * B * H2, H2,
                                            w_ru + I * H2, H2, True, h_prev_grad, H, rh)
        # r[t] * h[t-1] of the chunk's steps; step 0 sees h_prev
        k0 = 0
        if t0 == 0:
            for k in range(BH):
                rh[k] = r[k] * h_prev[k]
            k0 = BH
        for k in range(k0, (t1 - t0) * BH):
            rh[k] = r[t0 * BH + k] * h[(t0 - 1) * BH + k]
        gru_backward_gemms(t0, t1, B, I, H, x, h_prev, h, rh, w_ru, w_c, d_ru, d_c, t1 < L,
                           x_grad, w_ru_grad, w_c_grad, x_packed, gws,
                           gru_backward_gemm_threads(t1 - t0, B, I, H, max_threads))
        blocked_column_sums((t1 - t0) * B, H2, d_ru, H2, acc + 3 * H, acc, max_threads)
        blocked_column_sums((t1 - t0) * B, H, d_c, H, acc + 3 * H, acc + H2, max_threads)
        t1 = t0
    memset(x_grad + L * B * I, 0, (T - L) * B * I * sizeof(floating))
    store(H2, acc, b_ru_grad)
    store(H, acc + H2, b_c_grad)


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
    cdef floating[::1] ws = np.empty(
        block_gru_backward_workspace(L, B, H, I, floating is float, max_threads), dtype=dtype)
    cdef double[::1] acc = np.empty(sums_workspace(L, B, 4 * H, 3 * H) + 1, dtype=np.float64)
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
