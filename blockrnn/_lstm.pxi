# Included by _kernels.pyx: the LSTM family (SPEC §3-§5): LSTMBlockCell,
# its gradient, BlockLSTM/BlockLSTMV2 and their gradients.

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
    void brnn_lstm_infer_row_f32(
        Py_ssize_t H, const float* gi, const float* gc, const float* gf, const float* go,
        const float* xi, const float* xc, const float* xf, const float* xo,
        const float* bi, const float* bc, const float* bf, const float* bo,
        const float* wci, const float* wcf, const float* wco, float forget_bias,
        float cell_clip, int peep, const float* cs_prev, float* cs, float* h)

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

# Column offsets of the four gate blocks (SPEC §2).
ctypedef struct GateOffsets:
    Py_ssize_t i, c, f, o

cpdef enum GateLayout:
    ICFO = 0  # LSTMBlockCell, BlockLSTM
    IFCO = 1  # BlockLSTMV2


# Where the sequence ops read their weights: the input weights W_x [I, 4H] and
# the recurrent weights W_h [H, 4H] (gate columns as GateOffsets) through
# pointers and element strides, W_x(k, n) = w_x[k*xk + n*xn] and
# W_h(k, n) = w_h[k*hk + n*hn], each matrix stored row-major (n stride 1) or
# transposed (k stride 1). TensorFlow's w [I+H, 4H] is w_x = w, w_h = w + I*4H,
# strides (4H, 1); nn.LSTM's weight_ih [4H, I] and weight_hh [4H, H] are W_x^T
# and W_h^T as stored, strides (1, I) and (1, H). The products read either in
# place: packed (brnn_pack_f32 and brnn_pack_f64 take strides) or by the GEMM
# driver (gspec takes strides). The same strides
# describe where the backward writes the weight gradients.
ctypedef struct WeightStrides:
    Py_ssize_t xk, xn, hk, hn


cdef inline WeightStrides tf_weight_strides(Py_ssize_t H) noexcept nogil:
    """The strides of TensorFlow's w [I+H, 4H] (w_x = w, w_h = w + I*4H)."""
    cdef WeightStrides s
    s.xk, s.xn, s.hk, s.hn = 4 * H, 1, 4 * H, 1
    return s


cdef WeightStrides weight_strides(const floating[:, :] w_x, const floating[:, :] w_h,
                                 Py_ssize_t I, Py_ssize_t H) except *:
    """The element strides of the views W_x [I, 4H] and W_h [H, 4H] (the
    backward's gradient views too); ValueError unless each has shape and
    contiguous rows or columns (a kernel entry's caller's bug)."""
    cdef WeightStrides s
    cdef Py_ssize_t size = sizeof(floating)
    s.xk, s.xn = w_x.strides[0] // size, w_x.strides[1] // size
    s.hk, s.hn = w_h.strides[0] // size, w_h.strides[1] // size
    if (w_x.shape[0] != I or w_x.shape[1] != 4 * H or w_h.shape[0] != H
            or w_h.shape[1] != 4 * H
            or not (s.xn == 1 and s.xk >= 4 * H or s.xk == 1 and s.xn >= I)
            or not (s.hn == 1 and s.hk >= 4 * H or s.hk == 1 and s.hn >= H)
            or w_x.strides[0] % size or w_x.strides[1] % size
            or w_h.strides[0] % size or w_h.strides[1] % size):
        raise ValueError(
            f"LSTM weights: W_x {(w_x.shape[0], w_x.shape[1])} strides "
            f"{(w_x.strides[0], w_x.strides[1])} and W_h {(w_h.shape[0], w_h.shape[1])} "
            f"strides {(w_h.strides[0], w_h.strides[1])} are not [I, 4H] = {(I, 4 * H)} and "
            f"[H, 4H] = {(H, 4 * H)} views with contiguous rows or columns")
    return s


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
        floating* dg,              # OUT [rows, 4H] gradient of the pre-activation gates,
        Py_ssize_t ldg,            #     row r at dg + r * ldg (ldg >= 4H)
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
        dgr = dg + r * ldg + u0
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
        floating* dg, Py_ssize_t ldg, floating* cs_prev_grad, int n_threads) noexcept nogil:
    """lstm_backward_block over B rows split in n_threads blocks of rows."""
    cdef Py_ssize_t k, r0 = 0, r1 = 0
    if n_threads == 1:  # no OpenMP region at all
        lstm_backward_block(B, H, off, cs_prev, i_, f, o, ci, co, cs_grad, h_grad, dh_carry,
                            wci, wcf, wco, use_peephole, add_carry, lengths, t, dg, ldg,
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
            dg + r0 * ldg, ldg, cs_prev_grad + r0 * H)




cdef inline Py_ssize_t lstm_sums_workspace(Py_ssize_t L, Py_ssize_t B,
                                           Py_ssize_t H) noexcept nogil:
    """Doubles of block_lstm_backward_compute's `acc`: the sums [7H] (b_grad's
    4H, then wci's, wcf's, wco's H each), then the partial sums of a chunk's
    row blocks [sum_blocks(S * B), 7H]."""
    cdef Py_ssize_t S = max(1, backward_chunk_steps(L, B * 4 * H))
    return 7 * H * (1 + sum_blocks(S * B)) + 1


cdef void lstm_sums_block(
        Py_ssize_t k, Py_ssize_t rows, Py_ssize_t B, Py_ssize_t H, GateOffsets off, bint peep,
        const floating* dg, Py_ssize_t ldg, const floating* cs_edge, bint edge_last,
        const floating* cs_in, const floating* cs, double* part) noexcept nogil:
    """Row block k's partial sums part[k] [7H] (see lstm_param_sums)."""
    cdef Py_ssize_t R0 = k * SUM_BLOCK_ROWS, R1 = min(rows, R0 + SUM_BLOCK_ROWS)
    cdef Py_ssize_t G4 = 4 * H, a, n
    cdef Py_ssize_t e0 = rows - B if edge_last else 0   # cs_edge's rows [e0, e0 + B)
    cdef Py_ssize_t shift = B if cs_edge != NULL and not edge_last else 0
    cdef const floating* src
    cdef double* p = part + k * 7 * H
    memset(p, 0, 7 * H * sizeof(double))
    column_sums_rows(R1 - R0, G4, dg + R0 * ldg, ldg, p)
    if not peep:
        return
    a = R0
    while a < R1:   # di * cs_in, df * cs_in: the step's incoming cell state
        if cs_edge != NULL and e0 <= a < e0 + B:
            n, src = min(R1, e0 + B) - a, cs_edge + (a - e0) * H
        elif cs_edge != NULL and a < e0:
            n, src = min(R1, e0) - a, cs_in + (a - shift) * H
        else:
            n, src = R1 - a, cs_in + (a - shift) * H
        product_sums_rows(n, H, dg + a * ldg + off.i, ldg, src, H, p + G4)
        product_sums_rows(n, H, dg + a * ldg + off.f, ldg, src, H, p + G4 + H)
        a += n
    product_sums_rows(R1 - R0, H, dg + R0 * ldg + off.o, ldg, cs + R0 * H, H, p + G4 + 2 * H)


cdef void lstm_param_sums(
        Py_ssize_t rows, Py_ssize_t B, Py_ssize_t H, GateOffsets off, bint peep,
        const floating* dg,        # IN [rows, 4H] a chunk's gate gradients, B rows a step
        Py_ssize_t ldg,            #    (row stride ldg), in time order
        const floating* cs_edge,   # IN [B, H] cs_prev if the chunk holds step 0, or NULL:
        bint edge_last,            #    the state of its first B rows, or with edge_last
                                   #    (reverse) of its last B rows
        const floating* cs_in,     # IN the cell state the other rows' steps read, in
                                   #    their order (rows from B on, or from 0)
        const floating* cs,        # IN [rows, H] the cell state each row's step wrote
        double* part,              # workspace [sum_blocks(rows), 7H]
        double* acc,               # IN/OUT [7H]
        int max_threads) noexcept nogil:
    """SPEC sections 4-5's parameter sums over a chunk's rows, added to acc:
    b_grad's acc[:4H] += sum dG, and if peep wci's, wcf's, wco's acc[4H:] +=
    sum di * cs_in, sum df * cs_in, sum do * cs. In row blocks of
    SUM_BLOCK_ROWS (lstm_sums_block) on up to max_threads threads from the
    budget, the blocks' sums then added in block order: the bits do not
    depend on the threads."""
    cdef Py_ssize_t k, nb = sum_blocks(rows)
    cdef int threads = brnn_budget_take(sum_threads(rows, max_threads), max_threads)
    if threads == 1:
        for k in range(nb):
            lstm_sums_block(k, rows, B, H, off, peep, dg, ldg, cs_edge, edge_last, cs_in, cs,
                            part)
    else:
        for k in prange(nb, num_threads=threads, schedule="static"):
            lstm_sums_block(k, rows, B, H, off, peep, dg, ldg, cs_edge, edge_last, cs_in, cs,
                            part)
    brnn_budget_give(threads)
    add_blocks(nb, 7 * H, part, acc)


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
        block_lstm_forward_workspace(L, B, H, I, typenum == cnp.NPY_FLOAT32, max_threads),
        typenum)
    cdef double fb = forget_bias, clip_ = cell_clip
    cdef bint peep = use_peephole
    with nogil:
        if typenum == cnp.NPY_FLOAT32:
            block_lstm_forward_compute[float](
                L, T, B, I, H, layout, <float*>a[0], <float*>a[1], <float*>a[2],
                <float*>a[3], <float*>a[3] + I * 4 * H, tf_weight_strides(H),
                <float*>a[4], <float*>a[5], <float*>a[6], <float*>a[7], <float>fb,
                <float>clip_, peep, NULL, False, <float*>g, <float*>o[0], <float*>o[1],
                <float*>o[2], <float*>o[3], <float*>o[4], <float*>o[5], <float*>o[6], 1,
                max_threads)
        else:
            block_lstm_forward_compute[double](
                L, T, B, I, H, layout, <double*>a[0], <double*>a[1], <double*>a[2],
                <double*>a[3], <double*>a[3] + I * 4 * H, tf_weight_strides(H),
                <double*>a[4], <double*>a[5], <double*>a[6], <double*>a[7], fb, clip_, peep,
                NULL, False, <double*>g, <double*>o[0], <double*>o[1], <double*>o[2],
                <double*>o[3], <double*>o[4], <double*>o[5], <double*>o[6], 1, max_threads)
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
                           NULL, 0, &dgates[0, 0], 4 * H, &cs_prev_grad[0, 0], n_threads)
        if use_peephole:
            # SPEC §4: wci_grad = sum_b di * cs_prev, wcf_grad = sum_b df * cs_prev,
            # wco_grad = sum_b do * cs
            product_sums_rows(B, H, &dgates[0, 0] + off.i, 4 * H, &cs_prev[0, 0], H,
                              &acc[0, 0])
            product_sums_rows(B, H, &dgates[0, 0] + off.f, 4 * H, &cs_prev[0, 0], H,
                              &acc[1, 0])
            product_sums_rows(B, H, &dgates[0, 0] + off.o, 4 * H, &cs[0, 0], H, &acc[2, 0])
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
            column_sums_rows(B, 4 * H, &dgates[0, 0], 4 * H, &acc[0, 0])
            store(4 * H, &acc[0, 0], &b_grad[0])


cdef inline Py_ssize_t block_lstm_forward_workspace(Py_ssize_t L, Py_ssize_t B,
                                                    Py_ssize_t H, Py_ssize_t I,
                                                    bint packed, int max_threads) noexcept nogil:
    """Elements of block_lstm_forward_compute's workspace: one step's gates
    [B, 4H], then for float32 (packed) W_h's and W_x's four gate blocks packed
    [4, brnn_packed_size(H, H) + brnn_packed_size(I, H)]; for float64 W_h packed
    for dgemm_step [dpacked_size(H, 4H)], then the GEMM driver's blocks of the
    input projection."""
    if packed:   # (+ PACKED_ALIGN_PAD: the packed weights start on 64 bytes, align64)
        return (B * 4 * H + 4 * brnn_packed_size(H, H) + 4 * brnn_packed_size(I, H) + 1
                + PACKED_ALIGN_PAD)
    return (B * 4 * H + dpacked_size(H, 4 * H) + 1
            + projection_threads(L * B, I, 4 * H, max_threads) * brnn_dgemm_ws(L * B, H, I))


cdef void lstm_forward_packed_step(
        Py_ssize_t t, Py_ssize_t at, Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const float* packed, bint wide, const float* cs_in, const float* h_in,
        const float* b, const float* wci, const float* wcf, const float* wco,
        float forget_bias, float cell_clip, bint use_peephole, const int64_t* lengths,
        float* g, float* i_, float* cs, float* f, float* o, float* ci, float* co, float* h,
        Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t r0, Py_ssize_t r1,
        brnn_barrier* rows_bar, int nt) noexcept nogil:
    """Step t of the float32 forward, writing time index `at` (step_at) of the
    outputs: the four gate columns of the cells
    [u0, u1) of g = h_in @ W_h (recurrent_product: W_h's blocks in the wide
    layout at batch 1, else panels), then the gates (the gate outputs at t
    hold x[t] @ W_x already, see lstm_forward_packed). Without rows_bar, both
    for the rows [r0, r1): every row in a split by cells, the thread's rows
    over every cell in a split by rows. With rows_bar, the product of every
    row, then the gates of the rows [r0, r1), every cell, after a barrier of
    the nt threads (each thread computed only its cells' columns of g)."""
    cdef Py_ssize_t q, ps = brnn_packed_size(H, H), BH = B * H
    cdef Py_ssize_t p0 = 0 if rows_bar != NULL else r0, p1 = B if rows_bar != NULL else r1
    if u1 > u0:
        for q in range(4):
            recurrent_product(p1 - p0, H, h_in + p0 * H, packed + q * ps, wide, H, u0, u1,
                              False, g + p0 * 4 * H + q * H, 4 * H)
    gate_math_block(rows_bar, nt, NULL, H, &u0, &u1, &r0, &r1)
    if u1 <= u0 or r1 <= r0:
        return
    BH = at * BH + r0 * H
    lstm_forward_block[float](r1 - r0, H, off, g + r0 * 4 * H, b, cs_in + r0 * H, wci, wcf,
                              wco, forget_bias, cell_clip, use_peephole,
                              lengths_from(lengths, r0), t, True, i_ + BH, cs + BH, f + BH,
                              o + BH, ci + BH, co + BH, h + BH, u0, u1 - u0)


cdef void lstm_pack_cols(Py_ssize_t I, Py_ssize_t H, const float* w_x, const float* w_h,
                         WeightStrides s, bint wide, Py_ssize_t u0, Py_ssize_t u1,
                         float* packed) noexcept nogil:
    """The columns of cells [u0, u1) of W_h's then W_x's four gate blocks
    packed (block q: columns [qH, (q+1)H) of W; W_h's in the wide layout if
    `wide`), as lstm_forward_packed reads them."""
    cdef Py_ssize_t q, ps = brnn_packed_size(H, H), psx = brnn_packed_size(I, H)
    for q in range(4):
        pack_cols(H, H, w_h + q * H * s.hn, s.hk, s.hn, wide, u0, u1, packed + q * ps)
        pack_cols(I, H, w_x + q * H * s.xn, s.xk, s.xn, False, u0, u1,
                  packed + 4 * ps + q * psx)


cdef int lstm_forward_packed(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, GateOffsets off,
        const float* w_x, const float* w_h, WeightStrides s,  # IN W_x [I, 4H], W_h [H, 4H]
        float* packed,            # OUT W_h's then W_x's four gate blocks packed
        bint wide,                # W_h's blocks in the wide layout (batch 1)
        const float* x, const float* cs_prev, const float* h_prev, const float* b,
        const float* wci, const float* wcf, const float* wco,
        float forget_bias, float cell_clip, bint use_peephole, const int64_t* lengths,
        bint reverse,             # time read backwards (step_at; lengths NULL, L == T)
        float* g,                 # workspace [B, 4H]
        float* i_, float* cs, float* f, float* o, float* ci, float* co, float* h,
        int n_threads) noexcept nogil:
    """The time loop of the float32 forward: ONE parallel region of n_threads
    for all L steps. Each thread owns a fixed slice of cells (unit_start: every
    gate column of those cells). Before the loop it packs those columns of
    W_h and W_x (pack_cols) and computes their input projection of all L
    steps into the gate outputs, x[:L] @ W_x as one
    product of L*B rows per gate (packed_inputs_part), then at each step their
    recurrent product, and the gates: with gates_by_rows (every thread gets a
    row), those of its block of rows, every cell, after a barrier (the rows'
    other columns of g, and at step 0 of the hoist, are other threads'); else
    those of its cells, reading back only the columns it wrote. Then the
    step's barrier, since step t+1 reads all of h[t]. No BLAS call inside.
    Each product element is one packed-kernel sum, the same as when x[t] @
    W_x ran inside each step: the bits depend neither on n_threads nor on
    the hoist (nor on the split of the gates). The step barrier can shed
    (step_barrier, sequence_patient): thread 0 then runs every cell and row
    of the steps left. From SPLIT_ROWS rows a thread (split_rows) the steps
    are split by rows instead, after a barrier that ends the packing and the
    hoist: each thread runs every step of its block of rows, every cell
    (lstm_forward_packed_step on those rows), with no barrier; a thread that
    leaves early (rows_leave) gives its thread back, and the caller runs the
    rest of its rows after the region. Returns the threads the caller gives
    back to the budget (region_threads)."""
    cdef Py_ssize_t t = 0, k = 0, u0 = 0, u1 = 0, r0 = 0, r1 = 0, BH = B * H
    cdef Py_ssize_t psx = brnn_packed_size(I, H)
    cdef float* packed_x = packed + 4 * brnn_packed_size(H, H)
    cdef bint by_rows = gates_by_rows(B, n_threads)
    cdef bint split = split_rows(B, n_threads)
    cdef bint patient = sequence_patient(B, H, 4 * H, n_threads)
    cdef int q, tid = 0, nt = 1, cores = brnn_omp_get_num_procs()
    cdef float* dst[4]    # the gate output of W's column block q
    cdef brnn_barrier bar, rows_bar
    cdef RowSplit sp
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    if split:
        memset(&sp, 0, sizeof(sp))
    for q in range(4):
        dst[q] = (i_ if q * H == off.i else ci if q * H == off.c else f if q * H == off.f
                  else o)
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        lstm_pack_cols(I, H, w_x, w_h, s, wide, 0, H, packed)
        packed_inputs_part(L * B, I, H, 4, x, packed_x, psx, dst, 0, H)
        for t in range(L):
            lstm_forward_packed_step(
                t, step_at(t, L, reverse), B, H, off, packed, wide,
                state_in(cs_prev, cs, t, L, reverse, BH),
                state_in(h_prev, h, t, L, reverse, BH), b, wci, wcf, wco, forget_bias, cell_clip,
                use_peephole, lengths, g, i_, cs, f, o, ci, co, h, 0, H, 0, B, NULL, 1)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        lstm_pack_cols(I, H, w_x, w_h, s, wide, u0, u1, packed)
        packed_inputs_part(L * B, I, H, 4, x, packed_x, psx, dst, u0, u1)
        if split:   # every step of the rows [r0, r1), once all columns are in
            brnn_barrier_wait(&bar, nt)
            t = 0
            while t < L:
                lstm_forward_packed_step(
                    t, step_at(t, L, reverse), B, H, off, packed, wide,
                    state_in(cs_prev, cs, t, L, reverse, BH),
                    state_in(h_prev, h, t, L, reverse, BH), b, wci, wcf, wco, forget_bias,
                    cell_clip, use_peephole, lengths, g, i_, cs, f, o, ci, co, h, 0, H, r0, r1,
                    NULL, nt)
                t = t + 1
                if t < L and rows_leave(&sp, tid, cores):
                    break
            rows_done(&sp, tid, t)
        else:
            for t in range(L):
                lstm_forward_packed_step(
                    t, step_at(t, L, reverse), B, H, off, packed, wide,
                    state_in(cs_prev, cs, t, L, reverse, BH),
                    state_in(h_prev, h, t, L, reverse, BH), b, wci, wcf, wco, forget_bias,
                    cell_clip, use_peephole, lengths, g, i_, cs, f, o, ci, co, h, u0, u1, r0,
                    r1, &rows_bar if nt > 1 and by_rows else NULL, nt)
                if nt > 1 and step_barrier(&bar, nt, cores, patient):
                    if tid != 0:   # shed: thread 0 runs every cell of the steps left
                        break
                    nt, u0, u1, r0, r1 = 1, 0, H, 0, B
    if split:   # the steps of the threads that left early, on the caller's thread
        for k in range(1, sp.nt):
            for t in range(sp.resume[k], L):
                lstm_forward_packed_step(
                    t, step_at(t, L, reverse), B, H, off, packed, wide,
                    state_in(cs_prev, cs, t, L, reverse, BH),
                    state_in(h_prev, h, t, L, reverse, BH), b, wci, wcf, wco, forget_bias,
                    cell_clip, use_peephole, lengths, g, i_, cs, f, o, ci, co, h, 0, H,
                    k * B // sp.nt, (k + 1) * B // sp.nt, NULL, 1)
        return n_threads - sp.given
    return region_threads(&bar, n_threads)


cdef void block_lstm_forward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x,        # IN  [T, B, I]
        const floating* cs_prev, const floating* h_prev,  # IN [B, H]
        const floating* w_x,      # IN  W_x [I, 4H] (strides s.xk, s.xn)
        const floating* w_h,      # IN  W_h [H, 4H] (strides s.hk, s.hn)
        WeightStrides s,
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H]
        const floating* b,        # IN  [4H]
        floating forget_bias, floating cell_clip, bint use_peephole,
        const int64_t* lengths,   # IN  [B] or NULL
        bint reverse,             # time read backwards (step_at; lengths NULL, L == T)
        floating* ws,             # workspace [block_lstm_forward_workspace(L, B, H, I, float,
                                  #            max_threads)]
        floating* i_, floating* cs, floating* f, floating* o,  # OUT [T, B, H]
        floating* ci, floating* co, floating* h, int n_threads,
        int max_threads) noexcept nogil:
    """BlockLSTM / BlockLSTMV2 (SPEC §3, sequence): L steps, zeros for t >= L
    (and, with `lengths`, zeros in row b for t >= lengths[b]). With `reverse`
    (L == T, no lengths) step t reads x[T-1-t] and writes the outputs at T-1-t,
    its state coming from T-t: the reverse direction of a bidirectional layer
    in the input's time order, with no reversed copies.

    The input projection of all L steps is hoisted out of the time loop as one
    GEMM per gate, written straight into that gate's output: i[:L] holds
    x[:L] @ W_x[:, i-columns] until step t's gate pass overwrites i[t] (same for
    ci, f, o). Each step then computes only its recurrent product
    g = h[t-1] @ W_h into the B x 4H workspace, so the call needs no
    T x B x 4H buffer: its memory beyond the outputs is O(B x H), plus the
    packed weights (below). The weights are
    read where they are, through their strides (WeightStrides): TensorFlow's
    w, or nn.LSTM's weight_ih and weight_hh as stored.

    float64 computes the recurrent product on W_h packed once per call
    (dgemm_step: blockrnn's float64 kernel, its columns split over up to
    n_threads threads from the budget), and the input projection in the GEMM
    driver: OpenBLAS's GEMM, used until stop 62, repacked W_h at every step and
    changed bits with its thread count (docs/performance.md, stop 62: forward
    at 35,20,200,200 0.67-0.96x the time it took). That is the float64 route
    (gate loops on n_threads). float32 runs every
    product in blockrnn's packed kernel instead (lstm_forward_packed): in one
    region on up to max_threads threads taken from the process's thread
    budget (sequence_threads; brnn_budget_take, given back after the loop)
    each thread packs its cells' columns of W_x's and W_h's four gate blocks
    (once per call, from a 64-byte boundary), computes their x[:L] @ W_x into
    the gate outputs, then at each step h[t-1] @ W_h into g. At batch 1 a step's
    product is a GEMV, W_h's blocks read in the wide layout of
    include/brnn_inference.h (the inference forward's sums, so its bits). At
    every batch size the step barrier sheds a partner thread that stalls, or
    one that another caller needs (step_barrier).
    Against the GEMV per step the one-row kernel replaced (fresh processes,
    alternated, median, one thread): 50,1,128,128 forward 0.236 -> 0.178 ms,
    TF GRU 0.144 -> 0.116, reset-after GRU 0.212 -> 0.151; at 100,1,256,600
    (W_h beyond L2: both bound by the cache's bandwidth) the per-call
    packing costs 4-8%. Hoisting x @ W_x out of the steps (full 12-row
    tiles over L*B rows, W_h alone in cache during the loop) against
    computing x[t] @ W_x in each step: fresh processes alternated, 8 pairs,
    9 calls each (5 at 100,64,512,512), median of the medians, loaded 2-core
    Sapphire Rapids (AVX-512), forward only, 2 threads / 1 thread:
    100,32,256,256 24.3 vs 26.9 / 22.7 vs 24.7 ms; 200,16,128,256 35.3 vs
    36.4 / 18.5 vs 20.1; 100,64,512,512 211.5 vs 214.0 / 198.5 vs 210.9 (the
    GRUs gain 1-8%, see their forwards); in one process, 1 thread, CPU time:
    0.65x at 50,2,128,128, 0.83x at 100,8,256,256. No OpenBLAS call: its
    workers spin (sched_yield) for about 0.1 s after each GEMM, on the cores
    the region's threads need (measured: 101 ms of CPU burnt in the 200 ms
    after a call whose only BLAS call was the hoisted input GEMM)."""
    cdef Py_ssize_t t, at, BH = B * H, G4 = 4 * H
    cdef floating* g = ws
    cdef GateOffsets off = gate_offsets(layout, H)
    cdef const floating* cs_in
    cdef const floating* h_in
    cdef Py_ssize_t tail = L * BH
    cdef int granted
    cdef bint wide = B == 1 and row1_wide
    cdef gemm_spec jobs[4]
    if floating is float:
        granted = brnn_budget_take(loop_threads(sequence_threads(B, H, G4, H, max_threads),
                                                L * B * (I + H) * G4, LOOP_MIN_WORK_FORWARD),
                                   max_threads)
        brnn_budget_give(lstm_forward_packed(
            L, B, I, H, off, w_x, w_h, s, align64(ws + B * G4), wide, x, cs_prev, h_prev, b,
            wci, wcf, wco, forget_bias, cell_clip, use_peephole, lengths, reverse, g, i_, cs, f,
            o, ci, co, h, granted))
    else:
        # x[:L] @ W_x's gate blocks into the gate outputs, through the GEMM driver
        # (OpenBLAS's threaded GEMM changed bits with its thread count)
        jobs[0] = gspec(L * B, H, I, x, I, 1, w_x + off.i * s.xn, s.xk, s.xn, False, i_, H)
        jobs[1] = gspec(L * B, H, I, x, I, 1, w_x + off.c * s.xn, s.xk, s.xn, False, ci, H)
        jobs[2] = gspec(L * B, H, I, x, I, 1, w_x + off.f * s.xn, s.xk, s.xn, False, f, H)
        jobs[3] = gspec(L * B, H, I, x, I, 1, w_x + off.o * s.xn, s.xk, s.xn, False, o, H)
        run_gemm_specs(4, jobs, ws + B * G4 + dpacked_size(H, G4),
                       projection_threads(L * B, I, G4, max_threads))
        brnn_pack_f64(H, G4, w_h, s.hk, s.hn, ws + B * G4)   # W_h, once (dgemm_step)
        for t in range(L):
            cs_in = state_in(cs_prev, cs, t, L, reverse, BH)
            h_in = state_in(h_prev, h, t, L, reverse, BH)
            at = step_at(t, L, reverse) * BH
            dgemm_step(B, H, h_in, H, ws + B * G4, G4, False, g, G4, n_threads)
            lstm_forward_rows(B, H, off, g, b, cs_in, wci, wcf, wco,
                              forget_bias, cell_clip, use_peephole, lengths, t, True,
                              i_ + at, cs + at, f + at, o + at, ci + at, co + at, h + at,
                              n_threads)
    # TF leaves the gates past L uninitialised; blockrnn writes zeros.
    zero_lstm_outputs(tail, (T - L) * BH, i_, cs, f, o, ci, co, h)


def block_lstm_forward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] cs_prev,  # IN  [B, H]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, :] w_x,        # IN  W_x [I, 4H]: TF's w[:I], or weight_ih.T
        const floating[:, :] w_h,        # IN  W_h [H, 4H]: TF's w[I:], or weight_hh.T
        const floating[::1] wci, const floating[::1] wcf, const floating[::1] wco,  # IN
        const floating[::1] b,           # IN  [4H]
        double forget_bias, double cell_clip, bint use_peephole, int layout,
        int n_threads, int max_threads,
        floating[:, :, ::1] i_, floating[:, :, ::1] cs, floating[:, :, ::1] f,  # OUT
        floating[:, :, ::1] o, floating[:, :, ::1] ci, floating[:, :, ::1] co,  # [T, B, H]
        floating[:, :, ::1] h,
        const int64_t[::1] lengths=None,  # IN [B] per-row lengths, or None
        bint reverse=False):              # time read backwards (L == T, no lengths)
    """See block_lstm_forward_compute. w_x and w_h: any views whose rows or
    columns are contiguous (see WeightStrides), e.g. nn.LSTM's weights
    transposed, read in place."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = cs_prev.shape[1]
    cdef WeightStrides s = weight_strides(w_x, w_h, I, H)
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] g = np.empty(
        block_lstm_forward_workspace(L, B, H, I, floating is float, max_threads), dtype=dtype)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    check_reverse(reverse, L, T, lengths is not None)
    with nogil:
        block_lstm_forward_compute(
            L, T, B, I, H, layout, &x[0, 0, 0], &cs_prev[0, 0], &h_prev[0, 0], &w_x[0, 0],
            &w_h[0, 0], s, &wci[0], &wcf[0], &wco[0], &b[0], <floating>forget_bias,
            <floating>cell_clip, use_peephole, lens, reverse, &g[0], &i_[0, 0, 0], &cs[0, 0, 0],
            &f[0, 0, 0], &o[0, 0, 0], &ci[0, 0, 0], &co[0, 0, 0], &h[0, 0, 0], n_threads,
            max_threads)


cdef inline int lstm_backward_gemm_threads(Py_ssize_t S, Py_ssize_t B, Py_ssize_t I,
                                           Py_ssize_t H, int max_threads) noexcept nogil:
    """Threads of the products of a chunk of S steps (x_grad and w_grad:
    S*B * 4H * (2I + H) multiply-adds), see lstm_backward_gemms."""
    return packed_gemm_threads(S * B * 4 * H * (2 * I + H), max_threads)


cdef inline Py_ssize_t lstm_backward_gemm_ws(Py_ssize_t S, Py_ssize_t B, Py_ssize_t I,
                                             Py_ssize_t H, bint f32) noexcept nogil:
    """Elements of one thread's GEMM-driver block for lstm_backward_gemms on
    chunks of up to S steps (a bound over its jobs: the driver's ws grows
    with each size)."""
    return max(gemm_ws_of(f32, S * B, I, 4 * H), gemm_ws_of(f32, I, 4 * H, S * B),
               gemm_ws_of(f32, H, 4 * H, S * B), gemm_ws_of(f32, 4 * H, I, S * B),
               gemm_ws_of(f32, 4 * H, H, S * B))   # weight gradients either way round


cdef inline Py_ssize_t lstm_dg_stride(Py_ssize_t H, Py_ssize_t itemsize) noexcept nogil:
    """The row stride (elements) of the sequence backward's dG [rows, 4H]:
    4H, or 64 bytes more where 4H elements are a multiple of 4 KB (float32:
    H a multiple of 256; float64: of 128). A step's product dh = dG[t] @ W_h^T reads a
    tile's 12 rows of dG a row stride apart, and rows 4 KB apart share one
    L1 set of 8 ways (the AVX-512 kernel on one Zen 4 core, 32 x 1024 x 256:
    107.6 GFLOP/s; rows 4H + 16 floats apart: 116.3; strides of 1-3 KB and
    6 KB ran at 114-116 either way)."""
    if (4 * H * itemsize) % 4096 == 0:
        return 4 * H + 64 // itemsize
    return 4 * H


cdef inline Py_ssize_t block_lstm_backward_workspace(
        Py_ssize_t L, Py_ssize_t B, Py_ssize_t H, Py_ssize_t I, bint packed,
        int max_threads) noexcept nogil:
    """Elements of block_lstm_backward_compute's workspace: the gate
    gradients of one chunk of S = backward_chunk_steps(L, B * 4 * H) steps
    dG [S*B, 4H] (row stride lstm_dg_stride); float32 (packed) then W_h^T packed
    [brnn_packed_size(4H, H)] and x_grad's B, W_x^T, packed for the driver
    [lstm_x_grad_packed_size(I, H)], float64 W_h^T packed for dgemm_step
    [dpacked_size(4H, H)]; then the GEMM
    driver's blocks for the products of a chunk
    [lstm_backward_gemm_threads(S, ...) * lstm_backward_gemm_ws(S, ...)]. Its
    double accumulator `acc` has 3 * 4H + 1 elements."""
    cdef Py_ssize_t S = max(1, backward_chunk_steps(L, B * 4 * H))
    cdef Py_ssize_t driver = (lstm_backward_gemm_threads(S, B, I, H, max_threads)
                              * lstm_backward_gemm_ws(S, B, I, H, packed))
    if packed:   # (+ PACKED_ALIGN_PAD: the packed weights start on 64 bytes, align64)
        return (S * B * lstm_dg_stride(H, 4) + brnn_packed_size(4 * H, H)
                + lstm_x_grad_packed_size(I, H) + PACKED_ALIGN_PAD + driver + 1)
    return S * B * lstm_dg_stride(H, 8) + dpacked_size(4 * H, H) + driver + 1


cdef inline gemm_spec lstm_x_grad_job(
        Py_ssize_t rows, Py_ssize_t I, Py_ssize_t H, const void* dg, Py_ssize_t ldg,
        const void* w_x, WeightStrides s, void* x_grad) noexcept nogil:
    """The job x_grad [rows, I] = dG [rows, 4H] @ W_x^T (W_x [I, 4H] of strides
    s.xk, s.xn): its B, W_x^T, is the same in every chunk (pack_bs)."""
    return gspec(rows, I, 4 * H, dg, ldg, 1, w_x, s.xn, s.xk, False, x_grad, I)


cdef inline Py_ssize_t lstm_x_grad_packed_size(Py_ssize_t I, Py_ssize_t H) noexcept nogil:
    """Floats of lstm_x_grad_job's B packed by pack_bs."""
    cdef WeightStrides s0
    s0.xk = s0.xn = s0.hk = s0.hn = 0
    cdef gemm_spec job = lstm_x_grad_job(0, I, H, NULL, 0, NULL, s0, NULL)
    return packed_bs_size(1, &job)


cdef inline void zero_strided(Py_ssize_t rows, Py_ssize_t cols, floating* a, Py_ssize_t sr,
                              Py_ssize_t sc) noexcept nogil:
    """a[r * sr + c * sc] = 0 for r < rows, c < cols (a weight gradient in its layout)."""
    cdef Py_ssize_t r, c
    for r in range(rows):
        for c in range(cols):
            a[r * sr + c * sc] = 0


cdef void lstm_backward_gemms(
        Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t L, bint reverse,  # steps [t0, t1) of L
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x,        # IN  [L*B, I]
        const floating* h_prev,   # IN  [B, H]
        const floating* h,        # IN  [L*B, H]
        const floating* w_x,      # IN  W_x [I, 4H] (strides s.xk, s.xn)
        WeightStrides s,
        const floating* dg,       # IN  [(t1-t0)*B, 4H] the gate gradients of steps [t0, t1),
        Py_ssize_t ldg,           #     in time order (chunk_block; row stride ldg)
        bint accumulate,          # add the weight gradients onto the earlier chunks'
        floating* x_grad,         # OUT [L*B, I] (rows of steps [t0, t1) written)
        floating* w_x_grad,       # IN/OUT dW_x [I, 4H] (strides gs.xk, gs.xn)
        floating* w_h_grad,       # IN/OUT dW_h [H, 4H] (strides gs.hk, gs.hn)
        WeightStrides gs,
        const floating* w_x_packed,  # IN  x_grad's B packed (pack_bs of lstm_x_grad_job), or NULL
        floating* ws,             # workspace [threads * lstm_backward_gemm_ws(S, B, I, H, f32)]
        int threads) noexcept nogil:
    """The backward's products over the steps [t0, t1) of one chunk, through
    the GEMM driver of its precision (run_gemm_specs: blockrnn's packed
    float32 or float64 kernels, on blockrnn's threads, bits independent of
    their count). The chunk's steps take the times [m0, m1) (m0 = t0, or
    L - t1 with `reverse`), and each reads the state h of the time before
    (after, with `reverse`), h_prev at step 0:
      x_grad[m0:m1] = dG @ W_x^T,  dW_x (+)= x[m0:m1]^T @ dG,
      dW_h (+)= h[m0-1:m1-1]^T @ dG   (h[-1] = h_prev),
      with `reverse`: dW_h (+)= h[m0+1:m1+1]^T @ dG   (h[L] = h_prev),
    the weights read and the gradients written in place in their layouts
    (gspec_c: a gradient stored transposed, nn.LSTM's, is the job
    dW^T = dG^T @ x)."""
    cdef Py_ssize_t G4 = 4 * H, n = (t1 - t0) * B, m0 = L - t1 if reverse else t0
    cdef gemm_spec jobs[4]
    cdef int njobs = 3
    jobs[0] = lstm_x_grad_job(n, I, H, dg, ldg, w_x, s, x_grad + m0 * B * I)
    read_packed_bs(1, jobs, <const float*>w_x_packed)
    jobs[1] = gspec_c(I, G4, n, x + m0 * B * I, 1, I, dg, ldg, 1, accumulate, w_x_grad,
                      gs.xk, gs.xn)
    if t0 > 0:
        jobs[2] = gspec_c(H, G4, n, h + (m0 + (1 if reverse else -1)) * B * H, 1, H, dg, ldg,
                          1, accumulate, w_h_grad, gs.hk, gs.hn)
    elif not reverse:   # step 0 reads h_prev, steps 1.. read h[0:t1-1]
        jobs[2] = gspec_c(H, G4, B if t1 > 0 else 0, h_prev, 1, H, dg, ldg, 1, accumulate,
                          w_h_grad, gs.hk, gs.hn)
        jobs[3] = gspec_c(H, G4, (t1 - 1) * B if t1 > 1 else 0, h, 1, H, dg + B * ldg, ldg, 1,
                          True, w_h_grad, gs.hk, gs.hn)
        njobs = 4
    else:   # times m0.. read h[m0+1:L], time L-1 (step 0, dG's last rows) h_prev
        jobs[2] = gspec_c(H, G4, n - B, h + (m0 + 1) * B * H, 1, H, dg, ldg, 1, accumulate,
                          w_h_grad, gs.hk, gs.hn)
        jobs[3] = gspec_c(H, G4, B, h_prev, 1, H, dg + (n - B) * ldg, ldg, 1, True, w_h_grad,
                          gs.hk, gs.hn)
        njobs = 4
    run_gemm_specs(njobs, jobs, ws, threads)


cdef void lstm_backward_rows_step(
        Py_ssize_t t, Py_ssize_t at, Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const float* packed_t, bint wide, const float* cs_in, const float* i_,
        const float* f, const float* o, const float* ci, const float* co,
        const float* cs_grad, const float* h_grad, const float* wci, const float* wcf,
        const float* wco, bint use_peephole, const int64_t* lengths, float* dgt,
        Py_ssize_t ldg, float* cs_prev_grad, float* h_prev_grad, Py_ssize_t r0,
        Py_ssize_t r1) noexcept nogil:
    """Step t (time index `at`, step_at; its input cell state cs_in [B, H]) of the
    reverse loop for the rows [r0, r1), every cell, no barrier (every row on one
    thread, or a thread's rows in a loop split by rows, split_rows): their rows of
    the step's gate gradients dgt [B, 4H] (row stride ldg), then their carry
    dh = dG[t] @ W_h^T (`wide`: W_h^T in the wide layout, batch 1)."""
    cdef Py_ssize_t BH = B * H, G4 = 4 * H, rk = r0 * H, k = at * BH + rk
    dgt += r0 * ldg
    lstm_backward_block[float](
        r1 - r0, H, off, cs_in + rk, i_ + k, f + k, o + k, ci + k, co + k, cs_grad + k,
        h_grad + k, h_prev_grad + rk, wci, wcf, wco, use_peephole, True,
        lengths_from(lengths, r0), t, dgt, ldg, cs_prev_grad + rk, 0, H)
    recurrent_product_ld(r1 - r0, G4, dgt, ldg, packed_t, wide, H, 0, H, False,
                         h_prev_grad + rk, H)


cdef int lstm_backward_packed(
        Py_ssize_t t0, Py_ssize_t t1, Py_ssize_t L, bint reverse,  # steps [t0, t1) of L
        Py_ssize_t B, Py_ssize_t H, GateOffsets off,
        const float* w_h, WeightStrides s,  # IN W_h [H, 4H]: packed here if `pack`
        float* packed_t,          # IN/OUT W_h^T [4H, H] packed (pack_cols)
        bint wide, bint pack,     # ... in the wide layout (batch 1); pack it first
        const float* cs_prev, const float* i_, const float* cs, const float* f,
        const float* o, const float* ci, const float* co, const float* cs_grad,
        const float* h_grad, const float* wci, const float* wcf, const float* wco,
        bint use_peephole, const int64_t* lengths,
        float* dg,                # OUT [(t1-t0)*B, 4H]: step t at row chunk_block(t) * B,
        Py_ssize_t ldg,           #     row stride ldg
        float* cs_prev_grad, float* h_prev_grad,  # IN/OUT [B, H] the carries
        int n_threads) noexcept nogil:
    """The reverse time loop of the float32 backward over the steps [t0, t1):
    ONE parallel region of n_threads, each thread owning a fixed slice of
    cells [u0, u1) (and, if `pack`, packing their columns of W_h^T first:
    the first chunk's region). At step t a thread computes dG[t] for its
    cells (all four gate columns), or with gates_by_rows for its block of
    rows (every cell), then, after the step's barrier (dh needs every column
    of dG[t]), dh[:, u0:u1] = dG[t] @ W_h^T[:, u0:u1] (recurrent_product).
    By cells, its next step reads only its own cells' carries, and dG has
    one buffer per step, so one barrier per step is enough; by rows, a
    second barrier follows the product (the next step's rows read every
    column of dh). The step barrier can shed (step_barrier,
    sequence_patient): thread 0 then computes every row's gates and every
    cell's dh, from this step on. From SPLIT_ROWS rows a thread (split_rows)
    each thread instead runs every step of its block of rows
    (lstm_backward_rows_step), with no barrier (one after the packing), as
    lstm_forward_packed. The bits do not depend on n_threads. Returns the
    threads the caller gives back to the budget (region_threads)."""
    cdef Py_ssize_t t = 0, k = 0, u0 = 0, u1 = H, r0 = 0, r1 = B, rk = 0, BH = B * H, G4 = 4 * H
    cdef float* dgt = NULL
    cdef int tid = 0, nt = 1, cores = brnn_omp_get_num_procs()
    cdef brnn_barrier bar, rows_bar
    cdef RowSplit sp
    cdef bint by_rows = gates_by_rows(B, n_threads)
    cdef bint split = split_rows(B, n_threads)
    cdef bint patient = sequence_patient(B, H, 4 * H, n_threads)
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    if split:
        memset(&sp, 0, sizeof(sp))
    if n_threads == 1:  # no OpenMP region at all: cheaper, and safe after fork
        if pack:
            pack_cols(G4, H, w_h, s.hn, s.hk, wide, 0, H, packed_t)
        for t in range(t1 - 1, t0 - 1, -1):
            lstm_backward_rows_step(
                t, step_at(t, L, reverse), B, H, off, packed_t, wide,
                state_in(cs_prev, cs, t, L, reverse, BH), i_, f, o, ci, co, cs_grad, h_grad,
                wci, wcf, wco, use_peephole, lengths,
                dg + chunk_block(t, t0, t1, reverse) * B * ldg, ldg, cs_prev_grad,
                h_prev_grad, 0, B)
        return 1
    with parallel(num_threads=n_threads):
        tid = brnn_omp_get_thread_num()
        nt = brnn_omp_get_num_threads()
        u0 = unit_start(H, tid, nt)
        u1 = unit_start(H, tid + 1, nt)
        if pack:
            pack_cols(G4, H, w_h, s.hn, s.hk, wide, u0, u1, packed_t)
        r0 = tid * B // nt if by_rows else 0   # the rows whose gates it computes
        r1 = (tid + 1) * B // nt if by_rows else B
        rk = r0 * H
        if split:   # every step of the rows [r0, r1), once W_h^T is packed
            if pack:
                brnn_barrier_wait(&bar, nt)
            t = t1
            while t > t0:
                t = t - 1
                lstm_backward_rows_step(
                    t, step_at(t, L, reverse), B, H, off, packed_t, wide,
                    state_in(cs_prev, cs, t, L, reverse, BH), i_, f, o, ci, co, cs_grad, h_grad,
                    wci, wcf, wco, use_peephole, lengths,
                    dg + chunk_block(t, t0, t1, reverse) * B * ldg, ldg, cs_prev_grad,
                    h_prev_grad, r0, r1)
                if t > t0 and rows_leave(&sp, tid, cores):
                    break
            rows_done(&sp, tid, t)
        else:
            for t in range(t1 - 1, t0 - 1, -1):
                k = step_at(t, L, reverse) * BH + rk
                dgt = dg + chunk_block(t, t0, t1, reverse) * B * ldg
                if r1 > r0 and (by_rows or u1 > u0):
                    lstm_backward_block[float](
                        r1 - r0, H, off, state_in(cs_prev, cs, t, L, reverse, BH) + rk,
                        i_ + k, f + k, o + k, ci + k, co + k, cs_grad + k, h_grad + k,
                        h_prev_grad + rk, wci, wcf, wco, use_peephole, True,
                        lengths_from(lengths, r0), t, dgt + r0 * ldg, ldg,
                        cs_prev_grad + rk, 0 if by_rows else u0, H if by_rows else u1 - u0)
                if nt > 1 and step_barrier(&bar, nt, cores, patient):
                    if tid != 0:   # shed: thread 0 computes every row and cell from here
                        break
                    nt, u0, u1, r0, r1, rk = 1, 0, H, 0, B, 0
                if u1 > u0:
                    recurrent_product_ld(B, G4, dgt, ldg, packed_t, wide, H, u0, u1, False,
                                         h_prev_grad, H)
                if by_rows:   # the next step's gates read every cell of dh
                    brnn_barrier_wait(&rows_bar, nt)
    if split:   # the steps of the threads that left early, on the caller's thread
        for k in range(1, sp.nt):
            for t in range(sp.resume[k] - 1, t0 - 1, -1):
                lstm_backward_rows_step(
                    t, step_at(t, L, reverse), B, H, off, packed_t, wide,
                    state_in(cs_prev, cs, t, L, reverse, BH), i_, f, o, ci, co, cs_grad, h_grad,
                    wci, wcf, wco, use_peephole, lengths,
                    dg + chunk_block(t, t0, t1, reverse) * B * ldg, ldg, cs_prev_grad,
                    h_prev_grad, k * B // sp.nt, (k + 1) * B // sp.nt)
        return n_threads - sp.given
    return region_threads(&bar, n_threads)


cdef void block_lstm_backward_compute(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x,        # IN  [T, B, I]
        const floating* cs_prev, const floating* h_prev,  # IN [B, H]
        const floating* w_x,      # IN  W_x [I, 4H] (strides s.xk, s.xn)
        const floating* w_h,      # IN  W_h [H, 4H] (strides s.hk, s.hn)
        WeightStrides s,
        const floating* wci, const floating* wcf, const floating* wco,  # IN [H]
        const floating* i_, const floating* cs, const floating* f,     # IN [T, B, H]
        const floating* o, const floating* ci, const floating* co, const floating* h,
        const floating* cs_grad, const floating* h_grad,  # IN [T, B, H]
        bint use_peephole,
        const int64_t* lengths,   # IN  [B] or NULL
        bint reverse,             # time read backwards (step_at; lengths NULL, L == T)
        floating* ws,             # workspace [block_lstm_backward_workspace(L, B, H, I, float,
                                  #            max_threads)]
        double* acc,              # workspace [lstm_sums_workspace(L, B, H)]
        floating* x_grad,         # OUT [T, B, I]
        floating* cs_prev_grad, floating* h_prev_grad,  # OUT [B, H]
        floating* w_x_grad,       # OUT dW_x [I, 4H] (strides gs.xk, gs.xn)
        floating* w_h_grad,       # OUT dW_h [H, 4H] (strides gs.hk, gs.hn)
        WeightStrides gs,
        floating* wci_grad, floating* wcf_grad, floating* wco_grad,  # OUT [H] (if peephole)
        floating* b_grad,         # OUT [4H]
        int n_threads, int max_threads) noexcept nogil:
    """BlockLSTMGrad / BlockLSTMGradV2 (SPEC §5); with `lengths`, row b's
    gradients at t >= lengths[b] are zero (its upstream gradients there unused).

    The steps run back in time in chunks of S = backward_chunk_steps
    steps. Per chunk [t0, t1): the reverse time loop does only the gate
    gradients of each step (kept in the workspace dG) and the recurrent
    product dh = dG[t] @ W_h^T; then x_grad, the weight gradients, b_grad
    and the peephole gradients take the chunk's rows as single products /
    reductions (added onto the later chunks' sums):
      x_grad[t0:t1] = dG @ W_x^T,  dW_x += x[t0:t1]^T @ dG,
      dW_h += h[t0-1:t1-1]^T @ dG (h[-1] = h_prev),  b_grad += sum dG
    (with `reverse`, L == T and no lengths: step t at time T-1-t, its state
    from T-t, see lstm_backward_gemms; the forward's `reverse`).
    The carries live in the outputs: cs_prev_grad holds d cs[t-1] and
    h_prev_grad holds d h[t-1] while the loop runs. The weights are read, and
    their gradients written, in their layouts (WeightStrides s and gs:
    TensorFlow's w [I+H, 4H], or nn.LSTM's weight_ih [4H, I] and weight_hh
    [4H, H]), with no transposed copy. float32 runs the reverse loop in the
    packed kernel, on up to max_threads threads from the thread budget
    (lstm_backward_packed); at batch 1 its steps are GEMVs by the wide
    one-row kernel (W_h^T packed in the wide layout).
    float64 runs the per-step products on W_h^T packed once (dgemm_step), with
    gate loops and products on n_threads. Both
    precisions compute the products of a chunk through blockrnn's GEMM driver
    (lstm_backward_gemms: float32 or float64 packed kernels), so no product
    over steps runs on OpenBLAS's threads and no thread count changes their
    bits (S depends on the shape only)."""
    cdef Py_ssize_t t, t0, t1, m0, at, G4 = 4 * H, BH = B * H
    cdef Py_ssize_t ldg = lstm_dg_stride(H, sizeof(floating))
    cdef floating* dgt
    cdef Py_ssize_t S = backward_chunk_steps(L, B * 4 * H)
    cdef GateOffsets off = gate_offsets(layout, H)
    cdef const floating* cs_in
    cdef floating* dg = ws                            # [S*B, 4H], row stride ldg
    cdef floating* packed_t = ws + max(1, S) * B * ldg  # W_h^T packed (float32: then
    cdef floating* w_x_packed = NULL      # W_x^T packed for the driver, pack_bs); then the
                                          # driver's blocks
    cdef floating* gemm_ws = packed_t
    cdef gemm_spec x_grad_job
    cdef double* acc_b = acc                  # [4H]: b_grad's sums
    cdef double* acc_p = acc + G4             # [3, H]: the peepholes' sums
    cdef bint wide = B == 1 and row1_wide
    cdef int granted = 1
    memset(cs_prev_grad, 0, BH * sizeof(floating))
    memset(h_prev_grad, 0, BH * sizeof(floating))
    memset(acc, 0, (G4 + 3 * H) * sizeof(double))
    if floating is float:   # W_h^T packed (by the first chunk's region), from 64 bytes on
        packed_t = <floating*>align64(<float*>packed_t)
        w_x_packed = packed_t + brnn_packed_size(G4, H)
        gemm_ws = w_x_packed + lstm_x_grad_packed_size(I, H)
        if L > 0:   # x_grad's B, packed once for every chunk and thread
            x_grad_job = lstm_x_grad_job(0, I, H, NULL, 0, w_x, s, NULL)
            pack_bs(1, &x_grad_job, <float*>w_x_packed)
    else:        # W_h^T [4H, H] packed once for dgemm_step: W_h^T(k, n) = W_h(n, k)
        gemm_ws = packed_t + dpacked_size(G4, H)
        if L > 0:
            brnn_pack_f64(G4, H, w_h, s.hn, s.hk, packed_t)
    if L == 0:   # no step: zero weight gradients (x_grad has no row)
        zero_strided(I, G4, w_x_grad, gs.xk, gs.xn)
        zero_strided(H, G4, w_h_grad, gs.hk, gs.hn)
    t1 = L
    while t1 > 0:
        t0 = max(0, t1 - S)
        if floating is float:
            granted = brnn_budget_take(
                loop_threads(sequence_threads(B, G4, H, H, max_threads),
                             (t1 - t0) * B * G4 * H, LOOP_MIN_WORK_BACKWARD), max_threads)
            brnn_budget_give(lstm_backward_packed(
                t0, t1, L, reverse, B, H, off, w_h, s, packed_t, wide, t1 == L, cs_prev, i_, cs,
                f, o,
                ci, co, cs_grad, h_grad, wci, wcf, wco, use_peephole, lengths, dg, ldg,
                cs_prev_grad, h_prev_grad, granted))
        else:
            for t in range(t1 - 1, t0 - 1, -1):
                cs_in = state_in(cs_prev, cs, t, L, reverse, BH)
                at = step_at(t, L, reverse) * BH
                dgt = dg + chunk_block(t, t0, t1, reverse) * B * ldg
                lstm_backward_rows(B, H, off, cs_in, i_ + at, f + at, o + at, ci + at, co + at,
                                   cs_grad + at, h_grad + at, h_prev_grad, wci, wcf, wco,
                                   use_peephole, True, lengths, t, dgt, ldg, cs_prev_grad,
                                   n_threads)
                # dh = dG @ W_h^T
                dgemm_step(B, G4, dgt, ldg, packed_t, H, False, h_prev_grad, H, n_threads)
        lstm_backward_gemms(t0, t1, L, reverse, B, I, H, x, h_prev, h, w_x, s, dg, ldg,
                            t1 < L, x_grad, w_x_grad, w_h_grad, gs, w_x_packed, gemm_ws,
                            lstm_backward_gemm_threads(t1 - t0, B, I, H, max_threads))
        # The chunk's times [m0, m1): step 0 reads cs_prev, step t > 0 the cs of the
        # time before, so dG's rows (in time order) read cs[m0-1:m1-1], or with
        # `reverse` cs[m0+1:m1+1], with cs_prev for cs[-1] (the first rows) or cs[L]
        # (the last rows)
        m0 = L - t1 if reverse else t0
        if reverse:
            cs_in = cs + (m0 + 1) * BH
        else:
            cs_in = cs if t0 == 0 else cs + (t0 - 1) * BH
        lstm_param_sums((t1 - t0) * B, B, H, off, use_peephole, dg, ldg,
                        cs_prev if t0 == 0 else NULL, reverse, cs_in, cs + m0 * BH,
                        acc + 7 * H, acc, max_threads)
        t1 = t0
    memset(x_grad + L * B * I, 0, (T - L) * B * I * sizeof(floating))
    store(G4, acc_b, b_grad)
    if use_peephole:
        store(H, acc_p, wci_grad)
        store(H, acc_p + H, wcf_grad)
        store(H, acc_p + 2 * H, wco_grad)


def block_lstm_backward(
        Py_ssize_t L,
        const floating[:, :, ::1] x,     # IN  [T, B, I]
        const floating[:, ::1] cs_prev,  # IN  [B, H]
        const floating[:, ::1] h_prev,   # IN  [B, H]
        const floating[:, :] w_x,        # IN  W_x [I, 4H]: TF's w[:I], or weight_ih.T
        const floating[:, :] w_h,        # IN  W_h [H, 4H]: TF's w[I:], or weight_hh.T
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
        floating[:, :] w_x_grad,         # OUT dW_x [I, 4H], a view as w_x's
        floating[:, :] w_h_grad,         # OUT dW_h [H, 4H], a view as w_h's
        floating[::1] wci_grad, floating[::1] wcf_grad, floating[::1] wco_grad,  # OUT [H]
        floating[::1] b_grad,            # OUT [4H]
        const int64_t[::1] lengths=None,  # IN [B] per-row lengths, or None
        bint reverse=False):              # time read backwards (L == T, no lengths)
    """See block_lstm_backward_compute. The weights and their gradients: views
    as for block_lstm_forward (e.g. nn.LSTM's layout transposed), in place."""
    cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = cs_prev.shape[1]
    cdef WeightStrides s = weight_strides(w_x, w_h, I, H)
    cdef WeightStrides gs = weight_strides(w_x_grad, w_h_grad, I, H)
    dtype = np.float32 if floating is float else np.float64
    cdef floating[::1] ws = np.empty(
        block_lstm_backward_workspace(L, B, H, I, floating is float, max_threads), dtype=dtype)
    cdef double[::1] acc = np.empty(lstm_sums_workspace(L, B, H), dtype=np.float64)
    cdef const int64_t* lens = NULL
    if lengths is not None:
        lens = &lengths[0]
    check_reverse(reverse, L, T, lengths is not None)
    with nogil:
        block_lstm_backward_compute(
            L, T, B, I, H, layout, &x[0, 0, 0], &cs_prev[0, 0], &h_prev[0, 0], &w_x[0, 0],
            &w_h[0, 0], s, &wci[0], &wcf[0], &wco[0], &i_[0, 0, 0], &cs[0, 0, 0],
            &f[0, 0, 0], &o[0, 0, 0], &ci[0, 0, 0], &co[0, 0, 0], &h[0, 0, 0], &cs_grad[0, 0, 0],
            &h_grad[0, 0, 0], use_peephole, lens, reverse, &ws[0], &acc[0],
            &x_grad[0, 0, 0],
            &cs_prev_grad[0, 0], &h_prev_grad[0, 0], &w_x_grad[0, 0], &w_h_grad[0, 0], gs,
            &wci_grad[0],
            &wcf_grad[0], &wco_grad[0], &b_grad[0], n_threads, max_threads)
