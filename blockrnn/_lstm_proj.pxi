# Included by _kernels.pyx: the projected LSTM (nn.LSTM with proj_size = P > 0,
# SPEC §13), forward and backward over a sequence, in nn.LSTM's layout:
# w_ih [4H, I], w_hh [4H, P], b_ih, b_hh [4H], w_hr [P, H], gate rows i, f, g, o
# (IFCO, as BlockLSTMV2's columns). Per step, per row:
#   pre = x[t] @ w_ih^T + h[t-1] @ w_hh^T + (b_ih + b_hh)
#   i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of pre's blocks
#   c[t] = f * c[t-1] + i * g;  m[t] = o * tanh(c[t])   [B, H]
#   h[t] = m[t] @ w_hr^T                                 [B, P]
# The gate math is brnn_lstm.h's (lstm_forward_block / lstm_backward_block of
# _lstm.pxi, no peepholes, no clipping, no forget bias): its "h" is m here.
#
# Products: the input projection of all L steps is hoisted (GEMM driver,
# run_gemm_specs, straight into the gate outputs). float32: the per-step
# products run in blockrnn's packed kernel (weights packed once per call from
# nn.LSTM's layout through strides), in ONE OpenMP parallel region per call on up
# to the thread budget's threads, each thread owning whole 16-column panels of
# the H cells (unit_start(H)) and of the P projected features (unit_start(P));
# two barriers per step (the projection needs all of m[t], the next product all of
# h[t]; in the backward dm needs all of dH[t], dh_rec all of dG[t]), the second
# of which can shed (step_barrier, as the LSTM's loops). float64: BLAS
# per step on the calling thread. The products after the backward's loop use the
# GEMM driver's threads. Threads split rows or panels, never a sum: no thread
# count changes a bit.


cdef inline int lstm_proj_step_threads(Py_ssize_t B, Py_ssize_t H, Py_ssize_t P,
                                       int limit) noexcept nogil:
    """Threads of the float32 time loops by their steps (loop_threads then
    keeps a short call on one, LOOP_MIN_WORK_PROJ): one per
    SEQUENCE_WORK_PER_THREAD multiply-adds of a step's products (B * P * 5H)
    at every batch size (two barriers a step, as the GRUs' loops,
    gru_sequence_threads), at most one per 16-feature panel of P (< H), at
    most limit."""
    return step_threads(B * P * 5 * H, SEQUENCE_WORK_PER_THREAD, P, limit)


def lstm_proj_step_threads_for(Py_ssize_t B, Py_ssize_t H, Py_ssize_t P, int limit):
    """lstm_proj_step_threads (for the tests)."""
    return lstm_proj_step_threads(B, H, P, limit)


cdef inline int lstm_proj_loop_threads(Py_ssize_t L, Py_ssize_t B, Py_ssize_t H,
                                       Py_ssize_t P, int limit) noexcept nogil:
    """Threads asked for by either float32 time loop of L steps: the steps'
    rule (lstm_proj_step_threads), or one thread when the loop's products
    (L * B * 5HP multiply-adds) fall below LOOP_MIN_WORK_PROJ."""
    return loop_threads(lstm_proj_step_threads(B, H, P, limit), L * B * 5 * H * P,
                        LOOP_MIN_WORK_PROJ)


def lstm_proj_loop_threads_for(Py_ssize_t L, Py_ssize_t B, Py_ssize_t H, Py_ssize_t P,
                               int limit):
    """lstm_proj_loop_threads (for the tests)."""
    return lstm_proj_loop_threads(L, B, H, P, limit)


cdef inline int lstm_proj_gemm_threads(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I,
                                       Py_ssize_t H, Py_ssize_t P,
                                       int max_threads) noexcept nogil:
    """Threads of the hoisted products (forward: the input projection; backward:
    x_grad and the weight gradients, L*B * (4H*(2I + P) + P*H) multiply-adds)."""
    return packed_gemm_threads(L * B * (4 * H * (2 * I + P) + P * H), max_threads)


cdef inline Py_ssize_t lstm_proj_gemm_ws(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I,
                                         Py_ssize_t H, Py_ssize_t P, bint f32) noexcept nogil:
    """Elements of one thread's GEMM-driver block, a bound over the jobs of the
    forward's input projection and of lstm_proj_backward_products."""
    cdef Py_ssize_t LB = L * B
    return max(max(gemm_ws_of(f32, LB, H, I), gemm_ws_of(f32, LB, I, 4 * H)),
               max(max(gemm_ws_of(f32, 4 * H, I, LB), gemm_ws_of(f32, 4 * H, P, LB)),
                   gemm_ws_of(f32, P, H, LB)))


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------

cdef inline Py_ssize_t lstm_proj_forward_workspace(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I,
                                                   Py_ssize_t H, Py_ssize_t P, bint f32,
                                                   int max_threads) noexcept nogil:
    """Elements of block_lstm_proj_forward_compute's workspace: the folded bias
    [4H], one step's recurrent product g [B, 4H]; float32 then w_hh's four gate
    blocks transposed and packed [4, brnn_packed_size(P, H)] and w_hr^T packed
    [H, P], float64 w_hh^T [P, 4H] and w_hr^T [H, P] packed for dgemm_step; then
    the GEMM driver's blocks."""
    cdef Py_ssize_t n = 4 * H + B * 4 * H + 1
    if f32:
        n += 4 * brnn_packed_size(P, H) + brnn_packed_size(H, P)
    else:
        n += dpacked_size(P, 4 * H) + dpacked_size(H, P)
    return n + (lstm_proj_gemm_threads(L, B, I, H, P, max_threads)
                * lstm_proj_gemm_ws(L, B, I, H, P, f32))


cdef void lstm_proj_forward_cells(
        Py_ssize_t t, Py_ssize_t B, Py_ssize_t H, Py_ssize_t P, const float* pw_hh,
        const float* h_in, const float* c_in, const float* b, const int64_t* lengths,
        float* g, float* i_, float* f, float* o, float* ci, float* cs, float* co, float* m,
        Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t r0, Py_ssize_t r1, brnn_barrier* rows_bar,
        int nt, brnn_barrier* step_bar) noexcept nogil:
    """Step t of the float32 forward: the cells [u0, u1)'s columns of the four
    gate blocks of g = h_in @ w_hh^T (packed kernel), then the gates, c and m
    (the gate outputs hold x[t] @ w_ih^T on entry): with rows_bar those of
    the rows [r0, r1), every cell, after a barrier of the nt threads (within
    the step's shedding barrier step_bar); without, those of the cells
    [u0, u1), every row (r0, r1 = 0, B)."""
    cdef Py_ssize_t q, BH = B * H, ps = brnn_packed_size(P, H)
    if u1 > u0:
        for q in range(4):
            packed_product(B, P, h_in, P, pw_hh + q * ps, u0, u1, False, g + q * H, 4 * H)
    gate_math_block(rows_bar, nt, step_bar, H, &u0, &u1, &r0, &r1)
    if u1 <= u0 or r1 <= r0:
        return
    BH = t * BH + r0 * H
    lstm_forward_block[float](r1 - r0, H, gate_offsets(IFCO, H), g + r0 * 4 * H, b,
                              c_in + r0 * H, NULL, NULL, NULL, 0, 0, False,
                              lengths_from(lengths, r0), t, True, i_ + BH, cs + BH, f + BH,
                              o + BH, ci + BH, co + BH, m + BH, u0, u1 - u0)


cdef int lstm_proj_forward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t H, Py_ssize_t P,
        const float* pw_hh,       # IN  w_hh's gate blocks, transposed and packed
        const float* pw_hr,       # IN  w_hr^T packed [H, P]
        const float* h0, const float* c0, const float* b, const int64_t* lengths,
        float* g,                 # workspace [B, 4H]
        float* i_, float* f, float* o, float* ci, float* cs, float* co, float* m,
        float* h, int n_threads) noexcept nogil:
    """The time loop of the float32 forward on n_threads threads (one parallel
    region): per step, each thread computes its cells' gate columns and the
    gates (lstm_proj_forward_cells: by rows, after a barrier, whenever every
    thread gets a row, gates_by_rows), barrier, its features [p0, p1) of
    h[t] = m[t] @ w_hr^T, barrier. The last barrier of a step can shed
    (step_barrier, sequence_patient; a stall at the others counts for it):
    thread 0 then runs every cell, feature and row of the steps left. Returns
    the threads the caller gives back to the budget (region_threads)."""
    cdef Py_ssize_t t = 0, u0 = 0, u1 = H, p0 = 0, p1 = P, r0 = 0, r1 = B, BH = B * H, BP = B * P
    cdef int tid = 0, nt = 1, cores = brnn_omp_get_num_procs()
    cdef bint by_rows = gates_by_rows(B, n_threads)
    cdef bint patient = sequence_patient(B, P, 5 * H, n_threads)
    cdef brnn_barrier bar, rows_bar
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        for t in range(L):
            lstm_proj_forward_cells(t, B, H, P, pw_hh, h0 if t == 0 else h + (t - 1) * BP,
                                    c0 if t == 0 else cs + (t - 1) * BH, b, lengths, g,
                                    i_, f, o, ci, cs, co, m, 0, H, 0, B, NULL, 1, NULL)
            packed_product(B, H, m + t * BH, H, pw_hr, 0, P, False, h + t * BP, P)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        p0 = unit_start(P, tid, nt)
        p1 = unit_start(P, tid + 1, nt)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        for t in range(L):
            lstm_proj_forward_cells(t, B, H, P, pw_hh, h0 if t == 0 else h + (t - 1) * BP,
                                    c0 if t == 0 else cs + (t - 1) * BH, b, lengths, g,
                                    i_, f, o, ci, cs, co, m, u0, u1, r0, r1,
                                    &rows_bar if nt > 1 and by_rows else NULL, nt, &bar)
            if nt > 1:   # a stall here counts at the step's end
                brnn_barrier_wait_within(&bar, nt, &bar)
            if p1 > p0:
                packed_product(B, H, m + t * BH, H, pw_hr, p0, p1, False, h + t * BP, P)
            if nt > 1 and step_barrier(&bar, nt, cores, patient):
                if tid != 0:   # shed: thread 0 runs every cell, feature and row from here
                    break
                nt, u0, u1, p0, p1, r0, r1 = 1, 0, H, 0, P, 0, B
    return region_threads(&bar, n_threads)


cdef void block_lstm_proj_forward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, Py_ssize_t P,
        const floating* x,        # IN  [T, B, I]
        const floating* h0,       # IN  [B, P]
        const floating* c0,       # IN  [B, H]
        const floating* w_ih,     # IN  [4H, I]
        const floating* w_hh,     # IN  [4H, P]
        const floating* b_ih, const floating* b_hh,  # IN [4H]
        const floating* w_hr,     # IN  [P, H]
        const int64_t* lengths,   # IN  [B] or NULL
        floating* ws,             # workspace [lstm_proj_forward_workspace(...)]
        floating* i_, floating* f, floating* o, floating* ci,  # OUT [T, B, H] gates
        floating* cs, floating* co, floating* m,  # OUT [T, B, H] c, tanh(c), o * tanh(c)
        floating* h,              # OUT [T, B, P]
        int max_threads) noexcept nogil:
    """The projected LSTM over L steps, zeros for t >= L (and in row b for
    t >= lengths[b]: the gate pass zeros m there, so h is zero too)."""
    cdef Py_ssize_t t, j, q, BH = B * H, BP = B * P, H4 = 4 * H
    cdef GateOffsets off = gate_offsets(IFCO, H)
    cdef floating* b = ws
    cdef floating* g = ws + H4
    cdef floating* pw_hh = g + B * H4
    cdef floating* pw_hr = pw_hh
    cdef floating* gws = pw_hh
    cdef floating* dst[4]
    cdef gemm_spec jobs[4]
    cdef const floating* h_in
    cdef const floating* c_in
    cdef Py_ssize_t ps = brnn_packed_size(P, H)
    cdef int granted
    if floating is float:
        pw_hr = pw_hh + 4 * ps
        gws = pw_hr + brnn_packed_size(H, P)
        for q in range(4):   # block q: W(k, n) = w_hh[q*H + n, k]
            brnn_pack_f32(P, H, w_hh + q * H * P, 1, P, pw_hh + q * ps)
        brnn_pack_f32(H, P, w_hr, 1, H, pw_hr)    # W(k, n) = w_hr[n, k]
    else:   # for dgemm_step: w_hh^T [P, 4H], w_hr^T [H, P]
        pw_hr = pw_hh + dpacked_size(P, H4)
        gws = pw_hr + dpacked_size(H, P)
        brnn_pack_f64(P, H4, w_hh, 1, P, pw_hh)   # W(k, n) = w_hh[n, k]
        brnn_pack_f64(H, P, w_hr, 1, H, pw_hr)    # W(k, n) = w_hr[n, k]
    for j in range(H4):
        b[j] = b_ih[j] + b_hh[j]
    # x[:L] @ w_ih[q-block]^T into the gate outputs (the row pass adds g and b)
    dst[0], dst[1], dst[2], dst[3] = i_, f, ci, o    # nn.LSTM's row blocks i, f, g, o
    for q in range(4):
        jobs[q] = gspec(L * B, H, I, x, I, 1, w_ih + q * H * I, 1, I, False, dst[q], H)
    run_gemm_specs(4, jobs, gws, lstm_proj_gemm_threads(L, B, I, H, P, max_threads))
    if floating is float:
        granted = brnn_budget_take(lstm_proj_loop_threads(L, B, H, P, max_threads),
                                   max_threads)
        brnn_budget_give(lstm_proj_forward_packed(L, B, H, P, pw_hh, pw_hr, h0, c0, b, lengths,
                                                  g, i_, f, o, ci, cs, co, m, h, granted))
    else:
        for t in range(L):
            h_in = h0 if t == 0 else h + (t - 1) * BP
            c_in = c0 if t == 0 else cs + (t - 1) * BH
            dgemm_step(B, P, h_in, P, pw_hh, H4, False, g, H4, 1)
            lstm_forward_block(B, H, off, g, b, c_in, <floating*>NULL, <floating*>NULL,
                               <floating*>NULL, 0, 0, False, lengths, t, True,
                               i_ + t * BH, cs + t * BH, f + t * BH, o + t * BH, ci + t * BH,
                               co + t * BH, m + t * BH)
            dgemm_step(B, H, m + t * BH, H, pw_hr, P, False, h + t * BP, P, 1)
    zero_lstm_outputs(L * BH, (T - L) * BH, i_, cs, f, o, ci, co, m)
    memset(h + L * BP, 0, (T - L) * BP * sizeof(floating))


def block_lstm_proj_forward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] h0,       # IN  [B, P]
        const floating[:, ::1] c0,       # IN  [B, H]
        const floating[:, ::1] w_ih,     # IN  [4H, I]
        const floating[:, ::1] w_hh,     # IN  [4H, P]
        const floating[::1] b_ih,        # IN  [4H]
        const floating[::1] b_hh,        # IN  [4H]
        const floating[:, ::1] w_hr,     # IN  [P, H]
        int max_threads,
        floating[:, :, ::1] i, floating[:, :, ::1] f,    # OUT [T, B, H]
        floating[:, :, ::1] o, floating[:, :, ::1] ci,
        floating[:, :, ::1] cs, floating[:, :, ::1] co, floating[:, :, ::1] m,
        floating[:, :, ::1] h,           # OUT [T, B, P]
        const int64_t[::1] lengths=None):  # IN [B] per-row lengths, or None
    """See block_lstm_proj_forward_compute (shapes checked by blockrnn/lstm_proj.py;
    B, H, P > 0)."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2]
    cdef Py_ssize_t H = c0.shape[1], P = h0.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(
        lstm_proj_forward_workspace(L, B, I, H, P, floating is float, max_threads), dtype=dtype)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    with nogil:
        block_lstm_proj_forward_compute(
            L, T, B, I, H, P, &x[0, 0, 0], &h0[0, 0], &c0[0, 0], &w_ih[0, 0], &w_hh[0, 0],
            &b_ih[0], &b_hh[0], &w_hr[0, 0], lens, &ws[0], &i[0, 0, 0], &f[0, 0, 0],
            &o[0, 0, 0], &ci[0, 0, 0], &cs[0, 0, 0], &co[0, 0, 0], &m[0, 0, 0], &h[0, 0, 0],
            max_threads)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

cdef inline Py_ssize_t lstm_proj_backward_workspace(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I,
                                                    Py_ssize_t H, Py_ssize_t P, bint f32,
                                                    int max_threads) noexcept nogil:
    """Elements of block_lstm_proj_backward_compute's workspace: the gate
    gradients of every step dG [L*B, 4H], the gradients of h of every step
    dH [L*B, P], one step's dm [B, H] and a zero row block [B, H]; then w_hr
    packed [P, H] and w_hh packed [4H, P] (float32 for the packed kernel, float64
    for dgemm_step); then the GEMM driver's blocks."""
    cdef Py_ssize_t n = L * B * (4 * H + P) + 2 * B * H + 1
    if f32:
        n += brnn_packed_size(P, H) + brnn_packed_size(4 * H, P)
    else:
        n += dpacked_size(P, H) + dpacked_size(4 * H, P)
    return n + (lstm_proj_gemm_threads(L, B, I, H, P, max_threads)
                * lstm_proj_gemm_ws(L, B, I, H, P, f32))


cdef void lstm_proj_backward_products(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, Py_ssize_t P,
        const floating* x, const floating* h0, const floating* h, const floating* m,
        const floating* w_ih, const floating* dg, const floating* dh,
        floating* x_grad, floating* w_ih_grad, floating* w_hh_grad, floating* w_hr_grad,
        floating* gws, int threads) noexcept nogil:
    """The products after the reverse loop, over all steps at once (dG [L*B, 4H],
    dH [L*B, P]; transposes read through strides, no copies):
      x_grad[:L] = dG @ w_ih
      w_ih_grad  = dG^T @ x[:L]
      w_hh_grad  = dG^T @ [h0; h[:L-1]]
      w_hr_grad  = dH^T @ m[:L]
    through the GEMM driver of the precision (run_gemm_specs), bits independent
    of the thread count."""
    cdef Py_ssize_t H4 = 4 * H, LB = L * B
    cdef gemm_spec jobs[5]
    jobs[0] = gspec(LB, I, H4, dg, H4, 1, w_ih, I, 1, False, x_grad, I)
    jobs[1] = gspec(H4, I, LB, dg, 1, H4, x, I, 1, False, w_ih_grad, I)
    jobs[2] = gspec(H4, P, B if L > 0 else 0, dg, 1, H4, h0, P, 1, False, w_hh_grad, P)
    jobs[3] = gspec(H4, P, (L - 1) * B if L > 1 else 0, dg + B * H4, 1, H4, h, P, 1, True,
                    w_hh_grad, P)
    jobs[4] = gspec(P, H, LB, dh, 1, P, m, H, 1, False, w_hr_grad, H)
    run_gemm_specs(5, jobs, gws, threads)
    memset(x_grad + LB * I, 0, (T - L) * B * I * sizeof(floating))


cdef int lstm_proj_backward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t H, Py_ssize_t P,
        const float* pw_hr,       # IN  w_hr packed [P, H]
        const float* pw_hh,       # IN  w_hh packed [4H, P]
        const float* c0, const float* i_, const float* f, const float* o, const float* ci,
        const float* cs, const float* co, const float* cs_grad, const float* h_grad,
        const int64_t* lengths, const float* zero,
        float* dg, float* dh, float* dm,  # workspace: dG [L*B, 4H], dH [L*B, P], [B, H]
        float* dh_rec,            # OUT [B, P] (h0_grad)
        float* carry,             # OUT [B, H] (c0_grad)
        int n_threads) noexcept nogil:
    """The reverse loop of the float32 backward on n_threads threads (one parallel
    region), each owning the features [p0, p1) and the cells [u0, u1): per step,
    its features of dH[t] = h_grad[t] + dh_rec, barrier, its cells' dm = dH[t] @ w_hr
    and the gate gradients dG[t] (and c carry): those of its block of rows,
    every cell, after a barrier, whenever every thread gets a row
    (gates_by_rows), else those of its cells; barrier, its features of
    dh_rec = dG[t] @ w_hh (only it reads them next). The barrier before that
    product can shed (step_barrier, sequence_patient; a stall at the others
    counts for it): thread 0 then computes every feature, cell and row from
    there on. Returns the threads the caller gives back to the budget
    (region_threads)."""
    cdef Py_ssize_t t = 0, u0 = 0, u1 = H, p0 = 0, p1 = P, r0 = 0, r1 = B
    cdef int tid = 0, nt = 1, cores = brnn_omp_get_num_procs()
    cdef bint by_rows = gates_by_rows(B, n_threads)
    cdef bint patient = sequence_patient(B, P, 5 * H, n_threads)
    cdef brnn_barrier bar, rows_bar
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        for t in range(L - 1, -1, -1):
            lstm_proj_backward_features(t, B, P, h_grad, lengths, dh, dh_rec, 0, P)
            lstm_proj_backward_cells(t, B, H, P, pw_hr, c0, i_, f, o, ci, cs, co, cs_grad,
                                     lengths, zero, dg, dh, dm, carry, 0, H, 0, B, NULL, 1,
                                     NULL)
            packed_product(B, 4 * H, dg + t * B * 4 * H, 4 * H, pw_hh, 0, P, False, dh_rec, P)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        p0 = unit_start(P, tid, nt)
        p1 = unit_start(P, tid + 1, nt)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        for t in range(L - 1, -1, -1):
            lstm_proj_backward_features(t, B, P, h_grad, lengths, dh, dh_rec, p0, p1)
            if nt > 1:   # a stall here counts at the step's shedding barrier
                brnn_barrier_wait_within(&bar, nt, &bar)
            lstm_proj_backward_cells(t, B, H, P, pw_hr, c0, i_, f, o, ci, cs, co, cs_grad,
                                     lengths, zero, dg, dh, dm, carry, u0, u1, r0, r1,
                                     &rows_bar if nt > 1 and by_rows else NULL, nt, &bar)
            if nt > 1 and step_barrier(&bar, nt, cores, patient):
                if tid != 0:   # shed: thread 0 computes every feature, cell and row from here
                    break
                nt, u0, u1, p0, p1, r0, r1 = 1, 0, H, 0, P, 0, B
            if p1 > p0:
                packed_product(B, 4 * H, dg + t * B * 4 * H, 4 * H, pw_hh, p0, p1, False,
                               dh_rec, P)
    return region_threads(&bar, n_threads)


cdef void lstm_proj_backward_features(
        Py_ssize_t t, Py_ssize_t B, Py_ssize_t P, const float* h_grad,
        const int64_t* lengths, float* dh, const float* dh_rec, Py_ssize_t p0,
        Py_ssize_t p1) noexcept nogil:
    """dH[t][:, p0:p1] = h_grad[t] + dh_rec, zero in rows past their length."""
    cdef Py_ssize_t r, j
    cdef float* d = dh + t * B * P
    cdef const float* hg = h_grad + t * B * P
    for r in range(B):
        if finished(lengths, r, t):
            for j in range(p0, p1):
                d[r * P + j] = 0
        else:
            for j in range(p0, p1):
                d[r * P + j] = hg[r * P + j] + dh_rec[r * P + j]


cdef void lstm_proj_backward_cells(
        Py_ssize_t t, Py_ssize_t B, Py_ssize_t H, Py_ssize_t P, const float* pw_hr,
        const float* c0, const float* i_, const float* f, const float* o, const float* ci,
        const float* cs, const float* co, const float* cs_grad, const int64_t* lengths,
        const float* zero, float* dg, const float* dh, float* dm, float* carry,
        Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t r0, Py_ssize_t r1, brnn_barrier* rows_bar,
        int nt, brnn_barrier* step_bar) noexcept nogil:
    """Step t of the float32 backward: the cells [u0, u1)'s columns of dm =
    dH[t] @ w_hr (packed kernel), then the cell backward into dG[t] and the c
    carry: with rows_bar that of the rows [r0, r1), every cell, after a
    barrier of the nt threads (within the shedding barrier step_bar);
    without, that of the cells [u0, u1), every row (r0, r1 = 0, B)."""
    cdef Py_ssize_t BH = B * H, rk
    if u1 > u0:
        packed_product(B, P, dh + t * B * P, P, pw_hr, u0, u1, False, dm, H)
    gate_math_block(rows_bar, nt, step_bar, H, &u0, &u1, &r0, &r1)
    if u1 <= u0 or r1 <= r0:
        return
    rk = r0 * H
    lstm_backward_block[float](r1 - r0, H, gate_offsets(IFCO, H),
                               (c0 if t == 0 else cs + (t - 1) * BH) + rk, i_ + t * BH + rk,
                               f + t * BH + rk, o + t * BH + rk, ci + t * BH + rk,
                               co + t * BH + rk, cs_grad + t * BH + rk, dm + rk, zero + rk,
                               NULL, NULL, NULL, False, True, lengths_from(lengths, r0), t,
                               dg + t * B * 4 * H + r0 * 4 * H, 4 * H, carry + rk, u0,
                               u1 - u0)


cdef void block_lstm_proj_backward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, Py_ssize_t P,
        const floating* x,        # IN  [T, B, I]
        const floating* h0,       # IN  [B, P]
        const floating* c0,       # IN  [B, H]
        const floating* w_ih,     # IN  [4H, I]
        const floating* w_hh,     # IN  [4H, P]
        const floating* w_hr,     # IN  [P, H]
        const floating* i_, const floating* f, const floating* o,  # IN [T, B, H] forward
        const floating* ci, const floating* cs, const floating* co, const floating* m,
        const floating* h,        # IN  [T, B, P] forward
        const floating* cs_grad,  # IN  [T, B, H]
        const floating* h_grad,   # IN  [T, B, P]
        const int64_t* lengths,   # IN  [B] or NULL
        floating* ws,             # workspace [lstm_proj_backward_workspace(...)]
        double* acc,              # workspace [4H * (1 + sum_blocks(L * B))]: b_grad's sums,
                                  #   then its row blocks' (blocked_column_sums)
        floating* x_grad,         # OUT [T, B, I]
        floating* h0_grad,        # OUT [B, P]
        floating* c0_grad,        # OUT [B, H]
        floating* w_ih_grad,      # OUT [4H, I]
        floating* w_hh_grad,      # OUT [4H, P]
        floating* b_grad,         # OUT [4H] (that of b_ih and of b_hh alike)
        floating* w_hr_grad,      # OUT [P, H]
        int max_threads) noexcept nogil:
    """Backward of block_lstm_proj_forward_compute. The reverse loop, per step t:
      dH[t] = h_grad[t] + dh_rec            (zero in rows past their length)
      dm    = dH[t] @ w_hr                  [B, H]
      dG[t], dc carry: the LSTM cell backward (lstm_backward_block) with dm as the
            gradient of its output and c0_grad as the carry of dc
      dh_rec = dG[t] @ w_hh                 [B, P]  (kept in h0_grad)
    then lstm_proj_backward_products and b_grad = column sums of dG in double."""
    cdef Py_ssize_t t, j, BH = B * H, BP = B * P, H4 = 4 * H
    cdef GateOffsets off = gate_offsets(IFCO, H)
    cdef floating* dg = ws
    cdef floating* dh = ws + L * B * H4
    cdef floating* dm = dh + L * BP
    cdef floating* zero = dm + BH
    cdef floating* pw_hr = zero + BH
    cdef floating* pw_hh = pw_hr
    cdef floating* gws = pw_hr
    cdef floating* dht
    cdef const floating* hg
    cdef int granted
    if floating is float:
        pw_hh = pw_hr + brnn_packed_size(P, H)
        gws = pw_hh + brnn_packed_size(H4, P)
        brnn_pack_f32(P, H, w_hr, H, 1, pw_hr)    # W(k, n) = w_hr[k, n]
        brnn_pack_f32(H4, P, w_hh, P, 1, pw_hh)   # W(k, n) = w_hh[k, n]
    else:   # the same for dgemm_step
        pw_hh = pw_hr + dpacked_size(P, H)
        gws = pw_hh + dpacked_size(H4, P)
        brnn_pack_f64(P, H, w_hr, H, 1, pw_hr)
        brnn_pack_f64(H4, P, w_hh, P, 1, pw_hh)
    memset(h0_grad, 0, BP * sizeof(floating))
    memset(c0_grad, 0, BH * sizeof(floating))
    memset(zero, 0, BH * sizeof(floating))
    if floating is float:
        granted = brnn_budget_take(lstm_proj_loop_threads(L, B, H, P, max_threads),
                                   max_threads)
        brnn_budget_give(lstm_proj_backward_packed(L, B, H, P, pw_hr, pw_hh, c0, i_, f, o, ci,
                                                   cs, co, cs_grad, h_grad, lengths, zero, dg,
                                                   dh, dm, h0_grad, c0_grad, granted))
    else:
        for t in range(L - 1, -1, -1):
            dht = dh + t * BP
            hg = h_grad + t * BP
            for j in range(BP):
                dht[j] = hg[j] + h0_grad[j]
            zero_rows(B, P, lengths, t, dht)
            dgemm_step(B, P, dht, P, pw_hr, H, False, dm, H, 1)
            lstm_backward_block(B, H, off, c0 if t == 0 else cs + (t - 1) * BH, i_ + t * BH,
                                f + t * BH, o + t * BH, ci + t * BH, co + t * BH,
                                cs_grad + t * BH, dm, zero, <floating*>NULL, <floating*>NULL,
                                <floating*>NULL, False, True, lengths, t, dg + t * B * H4,
                                H4, c0_grad)
            dgemm_step(B, H4, dg + t * B * H4, H4, pw_hh, P, False, h0_grad, P, 1)
    lstm_proj_backward_products(L, T, B, I, H, P, x, h0, h, m, w_ih, dg, dh, x_grad,
                                w_ih_grad, w_hh_grad, w_hr_grad, gws,
                                lstm_proj_gemm_threads(L, B, I, H, P, max_threads))
    memset(acc, 0, H4 * sizeof(double))
    blocked_column_sums(L * B, H4, dg, H4, acc + H4, acc, max_threads)
    store(H4, acc, b_grad)


def block_lstm_proj_backward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] h0,       # IN  [B, P]
        const floating[:, ::1] c0,       # IN  [B, H]
        const floating[:, ::1] w_ih,     # IN  [4H, I]
        const floating[:, ::1] w_hh,     # IN  [4H, P]
        const floating[:, ::1] w_hr,     # IN  [P, H]
        const floating[:, :, ::1] i, const floating[:, :, ::1] f,  # IN [T, B, H] forward
        const floating[:, :, ::1] o, const floating[:, :, ::1] ci,
        const floating[:, :, ::1] cs, const floating[:, :, ::1] co,
        const floating[:, :, ::1] m,
        const floating[:, :, ::1] h,     # IN  [T, B, P] forward
        const floating[:, :, ::1] cs_grad,  # IN [T, B, H]
        const floating[:, :, ::1] h_grad,   # IN [T, B, P]
        int max_threads,
        floating[:, :, ::1] x_grad,      # OUT [T, B, I]
        floating[:, ::1] h0_grad,        # OUT [B, P]
        floating[:, ::1] c0_grad,        # OUT [B, H]
        floating[:, ::1] w_ih_grad,      # OUT [4H, I]
        floating[:, ::1] w_hh_grad,      # OUT [4H, P]
        floating[::1] b_grad,            # OUT [4H]
        floating[:, ::1] w_hr_grad,      # OUT [P, H]
        const int64_t[::1] lengths=None):  # IN [B] per-row lengths, or None
    """See block_lstm_proj_backward_compute (shapes checked by blockrnn/lstm_proj.py;
    B, H, P > 0)."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2]
    cdef Py_ssize_t H = c0.shape[1], P = h0.shape[1]
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(
        lstm_proj_backward_workspace(L, B, I, H, P, floating is float, max_threads),
        dtype=dtype)
    cdef double[::1] acc = np.empty(4 * H * (1 + sum_blocks(L * B)) + 1, dtype=np.float64)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    with nogil:
        block_lstm_proj_backward_compute(
            L, T, B, I, H, P, &x[0, 0, 0], &h0[0, 0], &c0[0, 0], &w_ih[0, 0], &w_hh[0, 0],
            &w_hr[0, 0], &i[0, 0, 0], &f[0, 0, 0], &o[0, 0, 0], &ci[0, 0, 0], &cs[0, 0, 0],
            &co[0, 0, 0], &m[0, 0, 0], &h[0, 0, 0], &cs_grad[0, 0, 0], &h_grad[0, 0, 0],
            lens, &ws[0], &acc[0], &x_grad[0, 0, 0], &h0_grad[0, 0], &c0_grad[0, 0],
            &w_ih_grad[0, 0], &w_hh_grad[0, 0], &b_grad[0], &w_hr_grad[0, 0], max_threads)
