# Included by _kernels.pyx: helpers every sequence family shares (row
# lengths, zeroing finished rows, double-accumulated column sums, the BLAS
# route's weight-transpose rule) and gemm_memview, the tests' handle on
# _blas.pxd's gemm.

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


cdef inline Py_ssize_t step_at(Py_ssize_t t, Py_ssize_t L, bint reverse) noexcept nogil:
    """The time index of a sequence call's step t (of L): t, or L - 1 - t where the
    kernels read time backwards themselves (`reverse`: the reverse direction of a
    bidirectional layer, every row of length L = T)."""
    return L - 1 - t if reverse else t


cdef check_reverse(bint reverse, Py_ssize_t L, Py_ssize_t T, bint has_lengths):
    """The kernels read time backwards (`reverse`) only for rows of one length, T."""
    if reverse and (has_lengths or L != T):
        raise ValueError(f"reverse=True needs every row at full length: no lengths and "
                         f"seq_len_max = T = {T}, got seq_len_max {L}"
                         + (" and lengths" if has_lengths else ""))


cdef inline const floating* state_in(const floating* first, const floating* seq, Py_ssize_t t,
                                     Py_ssize_t L, bint reverse, Py_ssize_t BH) noexcept nogil:
    """The state (h or cs, blocks of BH elements) step t reads: `first` (h_prev,
    cs_prev) at t = 0, else seq's block at the time index of step t - 1."""
    return first if t == 0 else seq + step_at(t - 1, L, reverse) * BH


cdef inline Py_ssize_t chunk_block(Py_ssize_t t, Py_ssize_t t0, Py_ssize_t t1,
                                   bint reverse) noexcept nogil:
    """The block of B rows step t fills in a backward chunk's gate gradients (the
    steps [t0, t1)): t - t0, or t1 - 1 - t with `reverse`, so that the blocks run in
    time order and the chunk's products over steps pair them with x's and h's rows."""
    return t1 - 1 - t if reverse else t - t0


cdef inline void zero_rows(Py_ssize_t rows, Py_ssize_t width, const int64_t* lengths,
                           Py_ssize_t t, floating* a) noexcept nogil:
    """a[r, :] = 0 for the rows (row stride `width`) past their length at step t."""
    cdef Py_ssize_t r
    if lengths == NULL:
        return
    for r in range(rows):
        if t >= lengths[r]:
            memset(a + r * width, 0, width * sizeof(floating))



cdef extern from "brnn_math.h" nogil:
    void brnn_column_sums_f32(Py_ssize_t rows, Py_ssize_t n, const float* a, Py_ssize_t lda,
                              double* acc)
    void brnn_column_sums_f64(Py_ssize_t rows, Py_ssize_t n, const double* a, Py_ssize_t lda,
                              double* acc)
    void brnn_product_sums_f32(Py_ssize_t rows, Py_ssize_t n, const float* a, Py_ssize_t lda,
                               const float* b, Py_ssize_t ldb, double* acc)
    void brnn_product_sums_f64(Py_ssize_t rows, Py_ssize_t n, const double* a, Py_ssize_t lda,
                               const double* b, Py_ssize_t ldb, double* acc)


cdef enum:
    # Rows per block of the backwards' bias (and peephole) gradient sums over
    # a chunk's rows of dG: each block's rows are summed in order into its own
    # partial sums (any thread may take a block), then the partials are added
    # in block order, so the bits depend on the shapes only. A block of 256
    # rows of 4H floats stays in L2 while its sums run.
    SUM_BLOCK_ROWS = 256


cdef inline Py_ssize_t sum_blocks(Py_ssize_t rows) noexcept nogil:
    """The blocks of SUM_BLOCK_ROWS rows (the last one shorter) of `rows` rows."""
    return (rows + SUM_BLOCK_ROWS - 1) // SUM_BLOCK_ROWS


cdef inline void column_sums_rows(Py_ssize_t rows, Py_ssize_t n, const floating* a,
                                  Py_ssize_t lda, double* acc) noexcept nogil:
    """acc[j] += a[r, j] over `rows` rows in order (row stride lda)."""
    if floating is float:
        brnn_column_sums_f32(rows, n, a, lda, acc)
    else:
        brnn_column_sums_f64(rows, n, a, lda, acc)


cdef inline void product_sums_rows(Py_ssize_t rows, Py_ssize_t n, const floating* a,
                                   Py_ssize_t lda, const floating* b, Py_ssize_t ldb,
                                   double* acc) noexcept nogil:
    """acc[j] += a[r, j] * b[r, j] over `rows` rows in order."""
    if floating is float:
        brnn_product_sums_f32(rows, n, a, lda, b, ldb, acc)
    else:
        brnn_product_sums_f64(rows, n, a, lda, b, ldb, acc)


cdef inline int sum_threads(Py_ssize_t rows, int max_threads) noexcept nogil:
    """Threads the blocked sums of `rows` rows ask of the budget: one per
    block, at most max_threads."""
    return <int>max(1, min(sum_blocks(rows), <Py_ssize_t>max_threads))


cdef void add_blocks(Py_ssize_t blocks, Py_ssize_t width, const double* part,
                     double* acc) noexcept nogil:
    """acc[j] += part[k, j] for the blocks k = 0, 1, ... in order."""
    cdef Py_ssize_t k, j
    for k in range(blocks):
        for j in range(width):
            acc[j] += part[k * width + j]


cdef inline Py_ssize_t sums_workspace(Py_ssize_t L, Py_ssize_t B, Py_ssize_t row,
                                      Py_ssize_t n) noexcept nogil:
    """Doubles of a backward's sums over its chunks' rows of a width-n block of
    dG (row width `row`, chunks of backward_chunk_steps): the sums [n], then
    a chunk's partial sums [sum_blocks(S * B), n] (blocked_column_sums)."""
    cdef Py_ssize_t S = max(1, backward_chunk_steps(L, B * row))
    return n * (1 + sum_blocks(S * B))


cdef void column_sums_block(Py_ssize_t k, Py_ssize_t rows, Py_ssize_t n, const floating* a,
                            Py_ssize_t lda, double* part) noexcept nogil:
    """Row block k's column sums, part[k] [n] (see blocked_column_sums)."""
    cdef Py_ssize_t R0 = k * SUM_BLOCK_ROWS
    memset(part + k * n, 0, n * sizeof(double))
    column_sums_rows(min(rows, R0 + SUM_BLOCK_ROWS) - R0, n, a + R0 * lda, lda, part + k * n)


cdef void blocked_column_sums(
        Py_ssize_t rows, Py_ssize_t n, const floating* a, Py_ssize_t lda,  # IN a [rows, n]
        double* part,   # workspace [sum_blocks(rows), n]
        double* acc,    # IN/OUT [n]
        int max_threads) noexcept nogil:
    """acc[j] += sum over rows of a[r, j], in row blocks of SUM_BLOCK_ROWS on up
    to max_threads threads from the budget, the blocks' sums then added in
    block order: the bits do not depend on the threads."""
    cdef Py_ssize_t k, nb = sum_blocks(rows)
    cdef int threads = brnn_budget_take(sum_threads(rows, max_threads), max_threads)
    if threads == 1:
        for k in range(nb):
            column_sums_block(k, rows, n, a, lda, part)
    else:
        for k in prange(nb, num_threads=threads, schedule="static"):
            column_sums_block(k, rows, n, a, lda, part)
    brnn_budget_give(threads)
    add_blocks(nb, n, part, acc)


cdef inline void store(Py_ssize_t n, const double* src, floating* dst) noexcept nogil:
    cdef Py_ssize_t j
    for j in range(n):
        dst[j] = <floating>src[j]



cdef enum:
    # The sequence backwards (LSTM, TF GRU, reset-after GRU) keep the gate gradients
    # dG of a chunk of steps, not of all of them: the reverse loop runs over
    # a chunk, then the products over its rows (x_grad, the weight
    # gradients) and the bias sums, then the next chunk back in time. A chunk
    # is as many steps as fit in this many floats of dG (at least one step).
    # A dG of every step (the earlier design) was a fresh T x B x 4H buffer
    # per call, over glibc's mmap threshold from 32 MB on: at 100,64,512,512
    # its page faults were ~5% of an LSTM training step (perf), and it was
    # most of the call's memory. (2^19 and 2^21 measured no better.)
    BACKWARD_CHUNK_FLOATS = 1 << 20


cdef inline Py_ssize_t backward_chunk_steps(Py_ssize_t L,
                                            Py_ssize_t floats_per_step) noexcept nogil:
    """Steps per chunk of a sequence backward whose dG has floats_per_step
    elements per step: a function of the shape only, so the bits never depend
    on the thread count. 0 when L == 0."""
    return min(L, max(1, BACKWARD_CHUNK_FLOATS // max(1, floats_per_step)))


def backward_chunk_steps_for(Py_ssize_t L, Py_ssize_t floats_per_step):
    """backward_chunk_steps (for the tests)."""
    return backward_chunk_steps(L, floats_per_step)
