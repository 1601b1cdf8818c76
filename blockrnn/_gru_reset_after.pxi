# Included by _kernels.pyx: the reset-after GRU (nn.GRU's, Keras 3's default,
# ONNX linear_before_reset=1; SPEC §13), forward and backward over a sequence,
# in nn.GRU's layout: w_ih [3H, I], w_hh [3H, H], b_ih, b_hh [3H], gate
# blocks r, z, n. The math and its order: include/brnn_gru_reset_after.h.
#
# Structure as the LSTM family (_lstm.pxi): every recurrent product depends on
# h[t-1] only, so one product h[t-1] @ w_hh^T of 3H columns per step.
# float32 forward: ONE OpenMP region per call, each
# thread owning whole 16-cell panels (unit_start), the input projection of all
# steps hoisted before the time loop (each thread its own cells: no barrier),
# one barrier per step, weights packed once per call straight
# from nn.GRU's layout (W(k, n) = w[n, k]); at batch 1 w_hh in the wide
# one-row layout (include/brnn_inference.h), as the LSTM's. The float32
# backward from PACKED_MIN_ROWS rows on likewise (batch 1 from
# PACKED_ROW1_MIN_CELLS cells).
# float64: the input projection and the backward's products in the GEMM driver,
# each step's product on w_hh packed once (dgemm_step), gate loops over rows.

cdef extern from "brnn_gru_reset_after.h" nogil:
    void brnn_gru_ra_forward_row_f32(
        Py_ssize_t H, const float* gr, const float* gz, const float* gn,
        const float* b_ir, const float* b_iz, const float* b_in, const float* b_hr,
        const float* b_hz, const float* b_hn, const float* h_prev,
        float* r, float* z, float* n, float* hn, float* h)
    void brnn_gru_ra_forward_row_f64(
        Py_ssize_t H, const double* gr, const double* gz, const double* gn,
        const double* b_ir, const double* b_iz, const double* b_in, const double* b_hr,
        const double* b_hz, const double* b_hn, const double* h_prev,
        double* r, double* z, double* n, double* hn, double* h)
    void brnn_gru_ra_backward_row_f32(
        Py_ssize_t H, const float* h_prev, const float* r, const float* z, const float* n,
        const float* hn, const float* h_grad, float* carry, float* dr, float* dz,
        float* dhn, float* dnx)
    void brnn_gru_ra_backward_row_f64(
        Py_ssize_t H, const double* h_prev, const double* r, const double* z,
        const double* n, const double* hn, const double* h_grad, double* carry,
        double* dr, double* dz, double* dhn, double* dnx)


# ---------------------------------------------------------------------------
# Gate passes over a block of rows (cells [u0, u0 + nu) of each)
# ---------------------------------------------------------------------------

cdef void gru_ra_forward_block(
        Py_ssize_t rows, Py_ssize_t H,
        const floating* g,         # IN  [rows, 3H] h_prev @ w_hh^T (no bias)
        const floating* b_ih, const floating* b_hh,  # IN [3H]
        const floating* h_prev,    # IN  [rows, H]
        const int64_t* lengths, Py_ssize_t t,  # IN [rows] or NULL; the step
        floating* r, floating* z, floating* n,  # IN/OUT [rows, H]: x @ w_i?^T in, gates out
        floating* hn, floating* h,  # OUT [rows, H]
        Py_ssize_t u0=0, Py_ssize_t nu=-1) noexcept nogil:
    """One step's gates (include/brnn_gru_reset_after.h) for a block of rows;
    rows past their length get zeros in all five outputs."""
    cdef Py_ssize_t row, k
    cdef const floating* gr
    cdef size_t nbytes
    if nu < 0:
        nu = H
    nbytes = nu * sizeof(floating)
    for row in range(rows):
        k = row * H + u0
        if finished(lengths, row, t):
            memset(r + k, 0, nbytes)
            memset(z + k, 0, nbytes)
            memset(n + k, 0, nbytes)
            memset(hn + k, 0, nbytes)
            memset(h + k, 0, nbytes)
            continue
        gr = g + row * 3 * H + u0
        if floating is float:
            brnn_gru_ra_forward_row_f32(
                nu, gr, gr + H, gr + 2 * H, b_ih + u0, b_ih + H + u0, b_ih + 2 * H + u0,
                b_hh + u0, b_hh + H + u0, b_hh + 2 * H + u0, h_prev + k,
                r + k, z + k, n + k, hn + k, h + k)
        else:
            brnn_gru_ra_forward_row_f64(
                nu, gr, gr + H, gr + 2 * H, b_ih + u0, b_ih + H + u0, b_ih + 2 * H + u0,
                b_hh + u0, b_hh + H + u0, b_hh + 2 * H + u0, h_prev + k,
                r + k, z + k, n + k, hn + k, h + k)


cdef void gru_ra_backward_block(
        Py_ssize_t rows, Py_ssize_t H,
        const floating* h_prev,    # IN  [rows, H]
        const floating* r, const floating* z, const floating* n,  # IN [rows, H] forward
        const floating* hn,
        const floating* h_grad,    # IN  [rows, H] upstream gradient of h
        const int64_t* lengths, Py_ssize_t t,
        floating* carry,           # IN/OUT [rows, H]: d h from step t+1 in, dh * z out
        floating* dg,              # OUT [rows, 4H]: dr, dz, dhn, dnx (see below)
        Py_ssize_t u0=0, Py_ssize_t nu=-1) noexcept nogil:
    """One step's gate gradients for a block of rows. A row of dg is
    [dr, dz, dhn, dnx]: its first 3H columns are dG_h (the gradient of
    h_prev @ w_hh^T + b_hh, gate order r, z, n), columns r, z and the last H
    are dG_x (that of x @ w_ih^T + b_ih). Rows past their length get zero
    gradients and a zero carry (their upstream gradients are not read)."""
    cdef Py_ssize_t row, k
    cdef floating* d
    cdef size_t nbytes
    if nu < 0:
        nu = H
    nbytes = nu * sizeof(floating)
    for row in range(rows):
        k = row * H + u0
        d = dg + row * 4 * H + u0
        if finished(lengths, row, t):
            memset(d, 0, nbytes)
            memset(d + H, 0, nbytes)
            memset(d + 2 * H, 0, nbytes)
            memset(d + 3 * H, 0, nbytes)
            memset(carry + k, 0, nbytes)
            continue
        if floating is float:
            brnn_gru_ra_backward_row_f32(nu, h_prev + k, r + k, z + k, n + k, hn + k,
                                         h_grad + k, carry + k, d, d + H, d + 2 * H,
                                         d + 3 * H)
        else:
            brnn_gru_ra_backward_row_f64(nu, h_prev + k, r + k, z + k, n + k, hn + k,
                                         h_grad + k, carry + k, d, d + H, d + 2 * H,
                                         d + 3 * H)


cdef void gru_ra_forward_rows(
        Py_ssize_t B, Py_ssize_t H, const floating* g, const floating* b_ih,
        const floating* b_hh, const floating* h_prev, const int64_t* lengths, Py_ssize_t t,
        floating* r, floating* z, floating* n, floating* hn, floating* h,
        int n_threads) noexcept nogil:
    """gru_ra_forward_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        gru_ra_forward_block(B, H, g, b_ih, b_hh, h_prev, lengths, t, r, z, n, hn, h)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        gru_ra_forward_block(r1 - r0, H, g + r0 * 3 * H, b_ih, b_hh, h_prev + r0 * H,
                             lengths_from(lengths, r0), t, r + r0 * H, z + r0 * H,
                             n + r0 * H, hn + r0 * H, h + r0 * H)


cdef void gru_ra_backward_rows(
        Py_ssize_t B, Py_ssize_t H, const floating* h_prev, const floating* r,
        const floating* z, const floating* n, const floating* hn, const floating* h_grad,
        const int64_t* lengths, Py_ssize_t t, floating* carry, floating* dg,
        int n_threads) noexcept nogil:
    """gru_ra_backward_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        gru_ra_backward_block(B, H, h_prev, r, z, n, hn, h_grad, lengths, t, carry, dg)
        return
    for k in prange(n_threads, num_threads=n_threads, schedule="static"):
        r0 = k * B // n_threads  # rows [r0, r1) of block k (assigned here:
        r1 = (k + 1) * B // n_threads  # prange makes them thread-private)
        gru_ra_backward_block(r1 - r0, H, h_prev + r0 * H, r + r0 * H, z + r0 * H,
                              n + r0 * H, hn + r0 * H, h_grad + r0 * H,
                              lengths_from(lengths, r0), t, carry + r0 * H,
                              dg + r0 * 4 * H)


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------

cdef inline Py_ssize_t gru_ra_forward_workspace(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I,
                                                Py_ssize_t H, bint packed,
                                                int max_threads) noexcept nogil:
    """Elements of block_gru_ra_forward_compute's workspace: one step's
    recurrent product g [B, 3H]; float32 then w_hh's three gate blocks packed
    [3, brnn_packed_size(H, H)] and w_ih's [3, brnn_packed_size(I, H)]; float64
    w_hh^T [H, 3H] packed for dgemm_step, then the GEMM driver's blocks of the
    input projection."""
    if packed:   # (+ PACKED_ALIGN_PAD: the packed weights start at align64)
        return (B * 3 * H + 3 * brnn_packed_size(H, H) + 3 * brnn_packed_size(I, H) + 1
                + PACKED_ALIGN_PAD)
    return (B * 3 * H + dpacked_size(H, 3 * H) + 1
            + projection_threads(L * B, I, 3 * H, max_threads) * brnn_dgemm_ws(L * B, H, I))


cdef void gru_ra_forward_packed_step(
        Py_ssize_t t, Py_ssize_t at, Py_ssize_t B, Py_ssize_t H,
        const float* packed, bint wide, const float* h_in, const float* b_ih,
        const float* b_hh, const int64_t* lengths, float* g,
        float* r, float* z, float* n, float* hn, float* h,
        Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t r0, Py_ssize_t r1,
        brnn_barrier* rows_bar, int nt) noexcept nogil:
    """Step t of the float32 forward, writing time index `at` (step_at) of the
    outputs: the three gate columns of the cells
    [u0, u1) of h_in @ w_hh^T into g by the packed kernel (recurrent_product:
    w_hh's blocks in the wide layout at batch 1, else panels), then the gates
    (r[t], z[t], n[t] hold x[t] @ w_ih^T already, see gru_ra_forward_packed),
    both for the rows [r0, r1) without rows_bar (every row in a split by
    cells, the thread's rows over every cell in a split by rows); with
    rows_bar, the product of every row, then the gates of the rows [r0, r1),
    every cell, after a barrier of the nt threads."""
    cdef Py_ssize_t q, ps = brnn_packed_size(H, H), k
    cdef Py_ssize_t p0 = 0 if rows_bar != NULL else r0, p1 = B if rows_bar != NULL else r1
    if u1 > u0:
        for q in range(3):
            recurrent_product(p1 - p0, H, h_in + p0 * H, packed + q * ps, wide, H, u0, u1,
                              False, g + p0 * 3 * H + q * H, 3 * H)
    gate_math_block(rows_bar, nt, NULL, H, &u0, &u1, &r0, &r1)
    if u1 <= u0 or r1 <= r0:
        return
    k = (at * B + r0) * H
    gru_ra_forward_block[float](r1 - r0, H, g + r0 * 3 * H, b_ih, b_hh, h_in + r0 * H,
                                lengths_from(lengths, r0), t, r + k, z + k, n + k, hn + k,
                                h + k, u0, u1 - u0)


cdef void gru_ra_pack_cols(Py_ssize_t I, Py_ssize_t H, const float* w_ih, const float* w_hh,
                           bint wide, Py_ssize_t u0, Py_ssize_t u1, float* packed) noexcept nogil:
    """The columns of cells [u0, u1) of w_hh's then w_ih's three gate blocks
    packed (block q: W(k, j) = w[q*H + j, k]; w_hh's in the wide layout if
    `wide`), as gru_ra_forward_packed reads them."""
    cdef Py_ssize_t q, ps = brnn_packed_size(H, H), psx = brnn_packed_size(I, H)
    for q in range(3):
        pack_cols(H, H, w_hh + q * H * H, 1, H, wide, u0, u1, packed + q * ps)
        pack_cols(I, H, w_ih + q * H * I, 1, I, False, u0, u1, packed + 3 * ps + q * psx)


cdef int gru_ra_forward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* w_ih, const float* w_hh,  # IN [3H, I], [3H, H]
        float* packed,            # OUT w_hh's then w_ih's three gate blocks packed
        bint wide,                # w_hh's blocks in the wide layout (batch 1)
        const float* x, const float* h_prev, const float* b_ih, const float* b_hh,
        const int64_t* lengths,
        bint reverse,             # time read backwards (step_at; lengths NULL, L == T)
        float* g,                 # workspace [B, 3H]
        float* r, float* z, float* n, float* hn, float* h,  # OUT [T, B, H]
        int n_threads) noexcept nogil:
    """The time loop of the float32 forward: ONE parallel region of n_threads
    for all L steps, each thread owning a fixed slice of cells (unit_start).
    Before the loop a thread packs their columns of the weights
    (gru_ra_pack_cols) and computes their input projection of all L steps
    into r, z, n: x[:L] @ w_ih^T, one product of L*B rows per gate block
    (packed_inputs_part); then at every step their recurrent product, and
    the gates: with gates_by_rows those of its block of rows, every cell,
    after a barrier (as lstm_forward_packed), else those of its cells (it
    reads back only the columns it wrote); then the step's barrier (step t+1
    reads all of h[t]), which can shed as the LSTM's (step_barrier,
    sequence_patient: thread 0 then runs every cell and row of the steps
    left). From SPLIT_ROWS rows a thread (split_rows) each thread runs every
    step of its block of rows instead (gru_ra_forward_packed_step on those
    rows, every cell), after a barrier that ends the hoist, as
    lstm_forward_packed. Each product element is one packed-kernel sum, as
    when x[t] @ w_ih^T ran inside each step: the bits depend neither on
    n_threads nor on the hoist. Returns the threads the caller gives back to
    the budget (region_threads)."""
    cdef Py_ssize_t t = 0, k = 0, u0 = 0, u1 = 0, r0 = 0, r1 = 0, BH = B * H
    cdef Py_ssize_t psx = brnn_packed_size(I, H)
    cdef float* packed_x = packed + 3 * brnn_packed_size(H, H)
    cdef int tid = 0, nt = 1, cores = brnn_omp_get_num_procs()
    cdef float* dst[3]
    cdef bint by_rows = gates_by_rows(B, n_threads)
    cdef bint split = split_rows(B, n_threads)
    cdef bint patient = sequence_patient(B, H, 3 * H, n_threads)
    cdef brnn_barrier bar, rows_bar
    cdef RowSplit sp
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    if split:
        memset(&sp, 0, sizeof(sp))
    dst[0], dst[1], dst[2] = r, z, n
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        gru_ra_pack_cols(I, H, w_ih, w_hh, wide, 0, H, packed)
        packed_inputs_part(L * B, I, H, 3, x, packed_x, psx, dst, 0, H)
        for t in range(L):
            gru_ra_forward_packed_step(t, step_at(t, L, reverse), B, H, packed, wide,
                                       state_in(h_prev, h, t, L, reverse, BH), b_ih, b_hh,
                                       lengths, g, r, z, n, hn, h, 0, H, 0, B, NULL, 1)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        gru_ra_pack_cols(I, H, w_ih, w_hh, wide, u0, u1, packed)
        packed_inputs_part(L * B, I, H, 3, x, packed_x, psx, dst, u0, u1)
        if split:   # every step of the rows [r0, r1), once every column is projected
            brnn_barrier_wait(&bar, nt)
            t = 0
            while t < L:
                gru_ra_forward_packed_step(t, step_at(t, L, reverse), B, H, packed, wide,
                                           state_in(h_prev, h, t, L, reverse, BH), b_ih, b_hh,
                                           lengths, g, r, z, n, hn, h, 0, H, r0, r1, NULL, nt)
                t = t + 1
                if t < L and rows_leave(&sp, tid, cores):
                    break
            rows_done(&sp, tid, t)
        else:
            for t in range(L):
                gru_ra_forward_packed_step(t, step_at(t, L, reverse), B, H, packed, wide,
                                           state_in(h_prev, h, t, L, reverse, BH), b_ih, b_hh,
                                           lengths, g, r, z, n, hn, h, u0, u1, r0, r1,
                                           &rows_bar if nt > 1 and by_rows else NULL, nt)
                if nt > 1 and step_barrier(&bar, nt, cores, patient):
                    if tid != 0:   # shed: thread 0 runs every cell of the steps left
                        break
                    nt, u0, u1, r0, r1 = 1, 0, H, 0, B
    if split:   # the steps of the threads that left early, on the caller's thread
        for k in range(1, sp.nt):
            for t in range(sp.resume[k], L):
                gru_ra_forward_packed_step(t, step_at(t, L, reverse), B, H, packed, wide,
                                           state_in(h_prev, h, t, L, reverse, BH), b_ih, b_hh,
                                           lengths, g, r, z, n, hn, h, 0, H, k * B // sp.nt,
                                           (k + 1) * B // sp.nt, NULL, 1)
        return n_threads - sp.given
    return region_threads(&bar, n_threads)


cdef void block_gru_ra_forward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x,        # IN  [T, B, I]
        const floating* h_prev,   # IN  [B, H]
        const floating* w_ih,     # IN  [3H, I]
        const floating* w_hh,     # IN  [3H, H]
        const floating* b_ih, const floating* b_hh,  # IN [3H]
        const int64_t* lengths,   # IN  [B] or NULL
        bint reverse,             # time read backwards (step_at; lengths NULL, L == T)
        floating* ws,             # workspace [gru_ra_forward_workspace(L, B, I, H, float,
                                  #            max_threads)]
        floating* r, floating* z, floating* n, floating* hn, floating* h,  # OUT [T, B, H]
        int n_threads, int max_threads) noexcept nogil:
    """The reset-after GRU over L steps, zeros for t >= L (and in row b for
    t >= lengths[b]). With `reverse` (L == T, no lengths) step t reads x[T-1-t]
    and writes the outputs at T-1-t, its state from T-t (as the LSTM's).

    float32: every product in the packed kernel, in one parallel region on up
    to max_threads threads from the thread budget (gru_ra_forward_packed; the
    LSTM's thread rule, sequence_threads), the input projection of all steps
    first. At batch 1 a step's product is a GEMV, w_hh's blocks read in the
    wide layout (the inference forward's sums, so its bits), as the LSTM's.
    Batch 1 ran a loop of its own until stop 55 (the weights packed and the
    input projection done before its region, on one thread from H = 148):
    in one region, T=50, I=H, 2-core Zen 4 VM, 300-call medians, 2 threads
    against that loop's best: H=128 118-140 us vs 183-185 (1 thread), H=256
    368-418 vs 546-571 (2 threads); one thread the same either way.
    Measured as in block_lstm_forward_compute (hoisted vs x[t] @ w_ih^T in each
    step, median ms, 2 threads / 1 thread): 100,32,256,256 20.1 vs 21.7 /
    16.1 vs 17.3; 200,16,128,256 20.2 vs 20.5 / 13.4 vs 14.1; 100,64,512,512
    149.3 vs 157.1 / 141.0 vs 152.6. float64: the input projection of all L
    steps hoisted too (the GEMM driver, one job per gate, into r, z, n), then
    each step's g = h[t-1] @ w_hh^T on w_hh^T packed once (dgemm_step) and the
    gates, on n_threads."""
    cdef Py_ssize_t t, q, at, BH = B * H, H3 = 3 * H
    cdef floating* g = ws
    cdef const floating* h_in
    cdef floating* dst[3]
    cdef gemm_spec jobs[3]
    cdef int granted
    dst[0], dst[1], dst[2] = r, z, n
    if floating is float:
        if B > 0:
            granted = brnn_budget_take(loop_threads(sequence_threads(B, H, H3, H, max_threads),
                                                    L * B * (I + H) * H3, LOOP_MIN_WORK_FORWARD),
                                       max_threads)
            brnn_budget_give(gru_ra_forward_packed(
                L, B, I, H, w_ih, w_hh, align64(ws + B * H3), B == 1 and row1_wide, x, h_prev,
                b_ih, b_hh, lengths, reverse, g, r, z, n, hn, h, granted))
    else:
        for q in range(3):   # x[:L] @ w_ih[q-block]^T, through the GEMM driver
            jobs[q] = gspec(L * B, H, I, x, I, 1, w_ih + q * H * I, 1, I, False, dst[q], H)
        run_gemm_specs(3, jobs, ws + B * H3 + dpacked_size(H, H3),
                       projection_threads(L * B, I, H3, max_threads))
        brnn_pack_f64(H, H3, w_hh, 1, H, ws + B * H3)   # w_hh^T [H, 3H], once (dgemm_step)
        for t in range(L):
            h_in = state_in(h_prev, h, t, L, reverse, BH)
            at = step_at(t, L, reverse) * BH
            dgemm_step(B, H, h_in, H, ws + B * H3, H3, False, g, H3, n_threads)
            gru_ra_forward_rows(B, H, g, b_ih, b_hh, h_in, lengths, t, r + at, z + at, n + at,
                                hn + at, h + at, n_threads)
    for q in range(3):   # past L: zeros
        memset(dst[q] + L * BH, 0, (T - L) * BH * sizeof(floating))
    memset(hn + L * BH, 0, (T - L) * BH * sizeof(floating))
    memset(h + L * BH, 0, (T - L) * BH * sizeof(floating))


def block_gru_reset_after_forward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w_ih,     # IN  [3H, I]
        const floating[:, ::1] w_hh,     # IN  [3H, H]
        const floating[::1] b_ih,        # IN  [3H]
        const floating[::1] b_hh,        # IN  [3H]
        int n_threads, int max_threads,
        floating[:, :, ::1] r, floating[:, :, ::1] z,   # OUT [T, B, H]
        floating[:, :, ::1] n, floating[:, :, ::1] hn, floating[:, :, ::1] h,
        const int64_t[::1] lengths=None,  # IN [B] per-row lengths, or None
        bint reverse=False):              # time read backwards (L == T, no lengths)
    """See block_gru_ra_forward_compute."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(gru_ra_forward_workspace(L, B, I, H, floating is float,
                                                              max_threads),
                                     dtype=dtype)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    check_reverse(reverse, L, T, lengths is not None)
    with nogil:
        block_gru_ra_forward_compute(L, T, B, I, H, &x[0, 0, 0], &h_prev[0, 0], &w_ih[0, 0],
                                     &w_hh[0, 0], &b_ih[0], &b_hh[0], lens, reverse, &ws[0],
                                     &r[0, 0, 0], &z[0, 0, 0], &n[0, 0, 0], &hn[0, 0, 0],
                                     &h[0, 0, 0], n_threads, max_threads)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

cdef inline int gru_ra_backward_gemm_threads(Py_ssize_t S, Py_ssize_t B, Py_ssize_t I,
                                             Py_ssize_t H, int max_threads) noexcept nogil:
    """Threads of the products of a chunk of S steps (x_grad and the weight
    gradients: S*B * 3H * (2I + H) multiply-adds), see gru_ra_backward_products."""
    return packed_gemm_threads(S * B * 3 * H * (2 * I + H), max_threads)


cdef inline Py_ssize_t gru_ra_backward_gemm_ws(Py_ssize_t S, Py_ssize_t B, Py_ssize_t I,
                                               Py_ssize_t H, bint f32) noexcept nogil:
    """Elements of one thread's GEMM-driver block for gru_ra_backward_products
    on chunks of up to S steps (a bound over its jobs: the driver's ws grows
    with each size)."""
    return max(gemm_ws_of(f32, S * B, I, 2 * H), gemm_ws_of(f32, 2 * H, I, S * B),
               gemm_ws_of(f32, 3 * H, H, S * B))


cdef inline Py_ssize_t gru_ra_backward_workspace(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I,
                                                 Py_ssize_t H, bint packed,
                                                 int max_threads) noexcept nogil:
    """Elements of block_gru_ra_backward_compute's workspace: the gate
    gradients of one chunk of S = backward_chunk_steps(L, B * 4H) steps dG
    [S*B, 4H] (gru_ra_backward_block's rows), then for float32 w_hh packed as
    the [3H, H] matrix it is and x_grad's two B, w_ih's blocks, packed for the
    driver [gru_ra_x_grad_packed_size(I, H)], for float64 w_hh packed for
    dgemm_step [dpacked_size(3H, H)]; then the GEMM driver's
    blocks for the products of a chunk [gru_ra_backward_gemm_threads(S, ...) *
    gru_ra_backward_gemm_ws(S, ...)]. Its double accumulator has 4H + 1
    elements."""
    cdef Py_ssize_t S = max(1, backward_chunk_steps(L, B * 4 * H))
    cdef Py_ssize_t driver = (gru_ra_backward_gemm_threads(S, B, I, H, max_threads)
                              * gru_ra_backward_gemm_ws(S, B, I, H, packed))
    if packed:
        return (S * B * 4 * H + brnn_packed_size(3 * H, H) + gru_ra_x_grad_packed_size(I, H)
                + driver + 1)
    return S * B * 4 * H + dpacked_size(3 * H, H) + driver + 1


cdef void gru_ra_backward_rows_step(
        Py_ssize_t t, Py_ssize_t at, Py_ssize_t B, Py_ssize_t H, const float* packed,
        const float* h_in, const float* r, const float* z, const float* n, const float* hn,
        const float* h_grad, const int64_t* lengths, float* dgt, float* carry, Py_ssize_t r0,
        Py_ssize_t r1) noexcept nogil:
    """Step t (time index `at`, step_at; its input state h_in [B, H]) of the
    reverse loop for the rows [r0, r1), every cell, no barrier (every row on
    one thread, or a thread's rows in a loop split by rows, split_rows): their
    rows of the step's gate gradients dgt [B, 4H], then their carry +=
    dG_h[t] @ w_hh."""
    cdef Py_ssize_t BH = B * H, G4 = 4 * H, rk = r0 * H, k = at * BH + rk
    dgt += r0 * G4
    gru_ra_backward_block[float](
        r1 - r0, H, h_in + rk, r + k, z + k, n + k, hn + k, h_grad + k,
        lengths_from(lengths, r0), t, carry + rk, dgt, 0, H)
    packed_product(r1 - r0, 3 * H, dgt, G4, packed, 0, H, True, carry + rk, H)


cdef int gru_ra_backward_packed(
        Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t L, bint reverse,  # steps [t0, t1) of L
        Py_ssize_t B, Py_ssize_t H,
        const float* w_hh,        # IN  [3H, H]: packed into `packed` first if `pack`
        bint pack,
        float* packed,            # IN/OUT w_hh [3H, H] packed (pack_cols)
        const float* h_prev, const float* r, const float* z, const float* n,
        const float* hn, const float* h, const float* h_grad, const int64_t* lengths,
        float* dg,                # OUT [(t1-t0)*B, 4H]: step t at row chunk_block(t) * B
        float* carry,             # IN/OUT [B, H] d h[t-1]
        int n_threads) noexcept nogil:
    """The reverse time loop of the float32 backward over the steps [t0, t1):
    ONE parallel region of n_threads, each thread owning the cells [u0, u1)
    (and, if `pack`, packing their columns of w_hh first: the first chunk's
    region). At step t a thread computes dG[t] for its cells (all four blocks), or
    with gates_by_rows for its block of rows, and sets their carry to
    dh * z; after the step's barrier (the product needs every column of
    dG[t]), carry[:, u0:u1] += dG_h[t] @ w_hh[:, u0:u1] in the packed
    kernel. By cells its next step reads only its own cells' carry, and dG
    has one buffer per step, so one barrier per step is enough; by rows a
    second barrier follows the product. The step barrier can shed as the
    LSTM's (step_barrier, sequence_patient): thread 0 then computes every
    row's gates and every cell's carry from that step on. From SPLIT_ROWS rows
    a thread (split_rows) each thread runs every step of its block of rows
    instead (gru_ra_backward_rows_step), as lstm_backward_packed. The bits do
    not depend on n_threads. Returns the threads the caller gives back to the
    budget (region_threads)."""
    cdef Py_ssize_t t = 0, k = 0, u0 = 0, u1 = H, r0 = 0, r1 = B, rk = 0, BH = B * H, G4 = 4 * H
    cdef float* dgt = NULL
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
            pack_cols(3 * H, H, w_hh, H, 1, False, 0, H, packed)   # W(k, j) = w_hh[k, j]
        for t in range(t1 - 1, t0 - 1, -1):
            gru_ra_backward_rows_step(t, step_at(t, L, reverse), B, H, packed,
                                      state_in(h_prev, h, t, L, reverse, BH), r, z, n, hn,
                                      h_grad, lengths,
                                      dg + chunk_block(t, t0, t1, reverse) * B * G4, carry, 0,
                                      B)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        rk = r0 * H
        if pack:
            pack_cols(3 * H, H, w_hh, H, 1, False, u0, u1, packed)
        if split:   # every step of the rows [r0, r1), once w_hh is packed
            if pack:
                brnn_barrier_wait(&bar, nt)
            t = t1
            while t > t0:
                t = t - 1
                gru_ra_backward_rows_step(t, step_at(t, L, reverse), B, H, packed,
                                          state_in(h_prev, h, t, L, reverse, BH), r, z, n, hn,
                                          h_grad, lengths,
                                          dg + chunk_block(t, t0, t1, reverse) * B * G4, carry,
                                          r0, r1)
                if t > t0 and rows_leave(&sp, tid, cores):
                    break
            rows_done(&sp, tid, t)
        else:
            for t in range(t1 - 1, t0 - 1, -1):
                k = step_at(t, L, reverse) * BH + rk
                dgt = dg + chunk_block(t, t0, t1, reverse) * B * G4
                if r1 > r0 and (by_rows or u1 > u0):
                    gru_ra_backward_block[float](
                        r1 - r0, H, state_in(h_prev, h, t, L, reverse, BH) + rk, r + k, z + k,
                        n + k, hn + k, h_grad + k, lengths_from(lengths, r0), t, carry + rk,
                        dgt + r0 * G4, 0 if by_rows else u0, H if by_rows else u1 - u0)
                if nt > 1 and step_barrier(&bar, nt, cores, patient):
                    if tid != 0:   # shed: thread 0 computes every row and cell from here
                        break
                    nt, u0, u1, r0, r1, rk = 1, 0, H, 0, B, 0
                if u1 > u0:
                    packed_product(B, 3 * H, dgt, G4, packed, u0, u1, True, carry, H)
                if by_rows:   # the next step's gates read every cell of the carry
                    brnn_barrier_wait(&rows_bar, nt)
    if split:   # the steps of the threads that left early, on the caller's thread
        for k in range(1, sp.nt):
            for t in range(sp.resume[k] - 1, t0 - 1, -1):
                gru_ra_backward_rows_step(t, step_at(t, L, reverse), B, H, packed,
                                          state_in(h_prev, h, t, L, reverse, BH), r, z, n, hn,
                                          h_grad, lengths,
                                          dg + chunk_block(t, t0, t1, reverse) * B * G4, carry,
                                          k * B // sp.nt, (k + 1) * B // sp.nt)
        return n_threads - sp.given
    return region_threads(&bar, n_threads)


cdef inline void gru_ra_x_grad_jobs(
        Py_ssize_t rows, Py_ssize_t I, Py_ssize_t H, const floating* dg,
        const floating* w_ih, floating* x_grad, gemm_spec* jobs) noexcept nogil:
    """jobs[0:2]: x_grad [rows, I] = dG_x @ w_ih (gru_ra_backward_products) as
    dG[:, r|z] @ w_ih[:2H], then += dG[:, nx] @ w_ih[2H:] (dG [rows, 4H]; NULL
    with rows = 0 to pack the B). Their B, w_ih's blocks, are the same in
    every chunk (pack_bs)."""
    jobs[0] = gspec(rows, I, 2 * H, dg, 4 * H, 1, w_ih, I, 1, False, x_grad, I)
    jobs[1] = gspec(rows, I, H, dg + 3 * H if dg != NULL else NULL, 4 * H, 1,
                    w_ih + 2 * H * I, I, 1, True, x_grad, I)


cdef inline Py_ssize_t gru_ra_x_grad_packed_size(Py_ssize_t I, Py_ssize_t H) noexcept nogil:
    """Floats of gru_ra_x_grad_jobs' B packed by pack_bs."""
    cdef gemm_spec jobs[2]
    gru_ra_x_grad_jobs[float](0, I, H, NULL, NULL, NULL, jobs)
    return packed_bs_size(2, jobs)


cdef void gru_ra_backward_products(
        Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t L, bint reverse,  # steps [t0, t1) of L
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x, const floating* h_prev, const floating* h,
        const floating* w_ih, const floating* dg, bint accumulate,
        floating* x_grad, floating* w_ih_grad, floating* w_hh_grad,
        const floating* x_packed,  # x_grad's B packed (pack_bs of gru_ra_x_grad_jobs), or NULL
        floating* gws, int threads) noexcept nogil:
    """The products over the steps [t0, t1) of one chunk (x_grad and the
    weight gradients), all in this one place (dG's rows [dr, dz, dhn, dnx],
    see gru_ra_backward_block; the weight gradients added onto the later
    chunks' if `accumulate`):
      x_grad[t0:t1] = dG_x @ w_ih  = dG[:, r|z] @ w_ih[:2H] + dG[:, nx] @ w_ih[2H:]
      w_ih_grad (+)= dG_x^T @ x[t0:t1]  (rows r, z from dG[:, r|z], rows n from dG[:, nx])
      w_hh_grad (+)= dG_h^T @ h[t0-1:t1-1]   (dG_h = dG[:, :3H], h[-1] = h_prev)
    (with `reverse` the chunk's times are [m0, m1) = [L-t1, L-t0), dG's rows in
    time order: x_grad[m0:m1], x[m0:m1], and h[m0+1:m1+1] with h[L] = h_prev)
    through the GEMM driver of the precision (run_gemm_specs: blockrnn's
    packed float32 or float64 kernels, on `threads` threads from the budget,
    workspace gws [threads * gru_ra_backward_gemm_ws(...)]; dG^T read through
    strides, no copies), bits independent of any thread count. With t0 ==
    t1 == 0 (L == 0) the weight gradients are set to zero."""
    cdef Py_ssize_t H2 = 2 * H, H3 = 3 * H, G4 = 4 * H, rows = (t1 - t0) * B
    cdef Py_ssize_t m0 = L - t1 if reverse else t0   # the chunk's first time
    cdef floating* xg = x_grad + m0 * B * I
    cdef const floating* xs = x + m0 * B * I
    cdef gemm_spec jobs[6]
    cdef int njobs = 5
    gru_ra_x_grad_jobs(rows, I, H, dg, w_ih, xg, jobs)
    read_packed_bs(2, jobs, <const float*>x_packed)
    jobs[2] = gspec(H2, I, rows, dg, 1, G4, xs, I, 1, accumulate, w_ih_grad, I)
    jobs[3] = gspec(H, I, rows, dg + H3, 1, G4, xs, I, 1, accumulate, w_ih_grad + H2 * I, I)
    if t0 > 0:
        jobs[4] = gspec(H3, H, rows, dg, 1, G4, h + (m0 + (1 if reverse else -1)) * B * H, H,
                        1, accumulate, w_hh_grad, H)
    elif reverse:   # times m0.. read h[m0+1:L], time L-1 (step 0, dG's last rows) h_prev
        jobs[4] = gspec(H3, H, rows - B, dg, 1, G4, h + (m0 + 1) * B * H, H, 1, accumulate,
                        w_hh_grad, H)
        jobs[5] = gspec(H3, H, B, dg + (rows - B) * G4, 1, G4, h_prev, H, 1, True, w_hh_grad,
                        H)
        njobs = 6
    else:   # step 0 reads h_prev, steps 1.. read h[0:t1-1]
        jobs[4] = gspec(H3, H, B if t1 > 0 else 0, dg, 1, G4, h_prev, H, 1, accumulate,
                        w_hh_grad, H)
        jobs[5] = gspec(H3, H, (t1 - 1) * B if t1 > 1 else 0, dg + B * G4, 1, G4, h, H, 1,
                        True, w_hh_grad, H)
        njobs = 6
    run_gemm_specs(njobs, jobs, gws, threads)


cdef void block_gru_ra_backward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x,        # IN  [T, B, I]
        const floating* h_prev,   # IN  [B, H]
        const floating* w_ih,     # IN  [3H, I]
        const floating* w_hh,     # IN  [3H, H]
        const floating* r, const floating* z, const floating* n,  # IN [T, B, H] forward
        const floating* hn, const floating* h,
        const floating* h_grad,   # IN  [T, B, H]
        const int64_t* lengths,   # IN  [B] or NULL
        bint reverse,             # time read backwards (step_at; lengths NULL, L == T)
        floating* ws,             # workspace [gru_ra_backward_workspace(L, B, I, H, float,
                                  #            max_threads)]
        double* acc,              # workspace [sums_workspace(L, B, 4H, 4H)]
        floating* x_grad,         # OUT [T, B, I]
        floating* h_prev_grad,    # OUT [B, H]
        floating* w_ih_grad,      # OUT [3H, I]
        floating* w_hh_grad,      # OUT [3H, H]
        floating* b_ih_grad, floating* b_hh_grad,  # OUT [3H]
        int n_threads, int max_threads) noexcept nogil:
    """Backward of block_gru_ra_forward_compute, back in time in chunks of S =
    backward_chunk_steps(L, B * 4H) steps. Per chunk [t0, t1): the reverse
    loop computes the gate gradients dG[t] of each step (kept for the chunk)
    and carries d h[t-1] in h_prev_grad: dh[t-1] = dG_h[t] @ w_hh + dh[t] *
    z[t]. float32 from PACKED_MIN_ROWS rows (batch 1 too from PACKED_ROW1_MIN_CELLS
    cells) on runs it in the packed kernel on up to max_threads threads from the
    thread budget (gru_ra_backward_packed); float64 on w_hh packed once
    (dgemm_step), float32's other batch-1 calls by a gemm per step, gate loops on
    n_threads. Then gru_ra_backward_products on the chunk's rows,
    and the bias gradients as column sums of dG in double: b_hh_grad = sum
    dG_h, b_ih_grad = sum dG_x. `reverse`: as the forward's (step t at time
    T-1-t), see gru_ra_backward_products."""
    cdef Py_ssize_t t, t0, t1, at, BH = B * H, H3 = 3 * H, G4 = 4 * H
    cdef Py_ssize_t S = backward_chunk_steps(L, B * G4)
    cdef floating* dg = ws
    cdef floating* dgt
    cdef floating* packed = ws + max(1, S) * B * G4
    cdef floating* x_packed = NULL   # float32: x_grad's B packed (pack_bs)
    cdef floating* gws = packed
    cdef bint use_packed = False
    cdef int granted
    cdef gemm_spec x_grad_jobs[2]
    memset(h_prev_grad, 0, BH * sizeof(floating))
    memset(acc, 0, G4 * sizeof(double))
    if floating is float:
        # (w_hh packed by the first chunk's region)
        use_packed = gru_backward_packed_route(B, H)
        x_packed = packed + brnn_packed_size(H3, H)
        gru_ra_x_grad_jobs(0, I, H, <floating*>NULL, w_ih, <floating*>NULL, x_grad_jobs)
        gws = x_packed + packed_bs_size(2, x_grad_jobs)
        if L > 0:   # x_grad's B, packed once for every chunk and thread
            pack_bs(2, x_grad_jobs, <float*>x_packed)
    else:   # w_hh [3H, H] packed once for dgemm_step
        gws = packed + dpacked_size(H3, H)
        brnn_pack_f64(H3, H, w_hh, H, 1, packed)
    if L == 0:   # no step: zero weight gradients
        gru_ra_backward_products(0, 0, 0, False, B, I, H, x, h_prev, h, w_ih, dg, False,
                                 x_grad, w_ih_grad, w_hh_grad, NULL, gws, 1)
    t1 = L
    while t1 > 0:
        t0 = max(0, t1 - S)
        if floating is float and use_packed:
            granted = brnn_budget_take(
                loop_threads(gru_sequence_threads(B, H, max_threads), (t1 - t0) * B * H3 * H,
                             LOOP_MIN_WORK_BACKWARD), max_threads)
            brnn_budget_give(gru_ra_backward_packed(
                t0, t1, L, reverse, B, H, w_hh, t1 == L, packed, h_prev, r, z, n, hn, h, h_grad,
                lengths, dg, h_prev_grad, granted))
        else:
            for t in range(t1 - 1, t0 - 1, -1):
                at = step_at(t, L, reverse) * BH
                dgt = dg + chunk_block(t, t0, t1, reverse) * B * G4
                gru_ra_backward_rows(B, H, state_in(h_prev, h, t, L, reverse, BH), r + at,
                                     z + at, n + at, hn + at, h_grad + at, lengths, t,
                                     h_prev_grad, dgt, n_threads)
                if floating is double:
                    dgemm_step(B, H3, dgt, G4, packed, H, True, h_prev_grad, H, n_threads)
                else:
                    gemm(False, False, B, H, H3, 1, dgt, G4, w_hh, H, 1, h_prev_grad, H)
        gru_ra_backward_products(t0, t1, L, reverse, B, I, H, x, h_prev, h, w_ih, dg, t1 < L,
                                 x_grad, w_ih_grad, w_hh_grad, x_packed, gws,
                                 gru_ra_backward_gemm_threads(t1 - t0, B, I, H, max_threads))
        blocked_column_sums((t1 - t0) * B, G4, dg, G4, acc + G4, acc, max_threads)
        t1 = t0
    memset(x_grad + L * B * I, 0, (T - L) * B * I * sizeof(floating))
    store(H3, acc, b_hh_grad)                  # r, z, n (dhn)
    store(2 * H, acc, b_ih_grad)               # r, z
    store(H, acc + H3, b_ih_grad + 2 * H)      # n (dnx)


def block_gru_reset_after_backward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, ::1] w_ih,     # IN  [3H, I]
        const floating[:, ::1] w_hh,     # IN  [3H, H]
        const floating[:, :, ::1] r, const floating[:, :, ::1] z,  # IN [T, B, H] forward
        const floating[:, :, ::1] n, const floating[:, :, ::1] hn,
        const floating[:, :, ::1] h,
        const floating[:, :, ::1] h_grad,  # IN [T, B, H]
        int n_threads, int max_threads,
        floating[:, :, ::1] x_grad,      # OUT [T, B, I]
        floating[:, ::1] h_prev_grad,    # OUT [B, H]
        floating[:, ::1] w_ih_grad,      # OUT [3H, I]
        floating[:, ::1] w_hh_grad,      # OUT [3H, H]
        floating[::1] b_ih_grad,         # OUT [3H]
        floating[::1] b_hh_grad,         # OUT [3H]
        const int64_t[::1] lengths=None,  # IN [B] per-row lengths, or None
        bint reverse=False):              # time read backwards (L == T, no lengths)
    """See block_gru_ra_backward_compute."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(gru_ra_backward_workspace(L, B, I, H, floating is float,
                                                               max_threads),
                                     dtype=dtype)
    cdef double[::1] acc = np.empty(sums_workspace(L, B, 4 * H, 4 * H) + 1, dtype=np.float64)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    check_reverse(reverse, L, T, lengths is not None)
    with nogil:
        block_gru_ra_backward_compute(
            L, T, B, I, H, &x[0, 0, 0], &h_prev[0, 0], &w_ih[0, 0], &w_hh[0, 0],
            &r[0, 0, 0], &z[0, 0, 0], &n[0, 0, 0], &hn[0, 0, 0], &h[0, 0, 0],
            &h_grad[0, 0, 0], lens, reverse, &ws[0], &acc[0], &x_grad[0, 0, 0],
            &h_prev_grad[0, 0],
            &w_ih_grad[0, 0], &w_hh_grad[0, 0], &b_ih_grad[0], &b_hh_grad[0], n_threads,
            max_threads)
