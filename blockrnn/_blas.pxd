# The only place blockrnn names a BLAS routine: row-major GEMM over SciPy's
# BLAS (scipy.linalg.cython_blas), for float and double; a product with one
# row or one column (batch 1), or two or three rows by large weights, goes to
# SciPy's GEMV instead (see gemm).
#
# Row-major trick: a C-contiguous [m, k] array is the column-major [k, m]
# array of its transpose, so C = op(A) @ op(B) is computed as the column-major
# product C^T = op(B)^T @ op(A)^T (operands and m/n swapped). `ld*` are row
# strides in elements, so a block of a larger buffer is passed without a copy.
# Callers guarantee every size fits a BLAS int (checked in Python).
from cython cimport floating
from scipy.linalg.cython_blas cimport sgemm, dgemm, sgemv, dgemv


# Small products run on the calling thread. OpenBLAS's interface runs a
# product of m*n*k <= 65536 * 4 on its caller and may hand larger ones to its
# thread pool; for a product below SMALL_GEMM_WORK waking the pool costs about
# what it saves, and with several Python threads calling at once the pool is
# shared and serialises them (measured: two threads doing batch-1 sequences
# got 0.82x one thread's throughput). So a small product is issued in blocks
# of rows of at most CALLER_GEMM_WORK each. Each element of C is still one dot
# product over all of k; the blocks depend only on the shapes, never on what
# other threads do. No product goes to the pool (see gemm): a large one is cut
# into tiles of rows and columns that OpenBLAS runs on its caller, since the
# pool's split changes bits with its thread count. (float64 did send its large
# products there until stop 62, for its per-step recurrent products: those now
# run in blockrnn's float64 kernel, dgemm_step; and the pool's split changed
# lstm_block_cell_grad_full's w_grad at B = 600 between 1 and 2 OpenBLAS
# threads.)
cdef enum:
    SMALL_GEMM_WORK = 1 << 22
    WIDE_GEMM_WORK = 1 << 20
    WIDE_GEMM_ROWS = 16
    CALLER_GEMM_WORK = 1 << 18
    GEMV_ROWS = 3


cdef inline void blas_gemm(bint trans_a, bint trans_b,
                           Py_ssize_t m, Py_ssize_t n, Py_ssize_t k,
                           floating alpha, const floating* a, Py_ssize_t lda,
                           const floating* b, Py_ssize_t ldb,
                           floating beta, floating* c, Py_ssize_t ldc) noexcept nogil:
    """One row-major GEMM call (m, n, k > 0)."""
    cdef char ta = b't' if trans_a else b'n'
    cdef char tb = b't' if trans_b else b'n'
    cdef int m_ = <int>m, n_ = <int>n, k_ = <int>k
    cdef int lda_ = <int>(lda if lda > 1 else 1)
    cdef int ldb_ = <int>(ldb if ldb > 1 else 1)
    cdef int ldc_ = <int>(ldc if ldc > 1 else 1)
    if floating is float:
        sgemm(&tb, &ta, &n_, &m_, &k_, &alpha, <float*>b, &ldb_, <float*>a, &lda_,
              &beta, c, &ldc_)
    else:
        dgemm(&tb, &ta, &n_, &m_, &k_, &alpha, <double*>b, &ldb_, <double*>a, &lda_,
              &beta, c, &ldc_)


cdef inline void blas_gemv(bint trans, Py_ssize_t rows, Py_ssize_t cols,
                           floating alpha, const floating* a, Py_ssize_t lda,
                           const floating* x, Py_ssize_t incx, floating beta,
                           floating* y, Py_ssize_t incy) noexcept nogil:
    """One GEMV call: y = alpha * op(A) @ x + beta * y for a row-major A [rows,
    cols] (row stride lda), op(A) = A, or A^T if trans; x and y strided."""
    # Row-major A is the column-major A^T: op(A) = A is 't' there, A^T is 'n'.
    cdef char ta = b'n' if trans else b't'
    cdef int m_ = <int>cols, n_ = <int>rows
    cdef int lda_ = <int>max(lda, cols, 1)
    cdef int incx_ = <int>incx, incy_ = <int>incy
    if floating is float:
        sgemv(&ta, &m_, &n_, &alpha, <float*>a, &lda_, <float*>x, &incx_, &beta, y, &incy_)
    else:
        dgemv(&ta, &m_, &n_, &alpha, <double*>a, &lda_, <double*>x, &incx_, &beta, y, &incy_)


cdef inline void gemv(bint trans, Py_ssize_t rows, Py_ssize_t cols, floating alpha,
                      const floating* a, Py_ssize_t lda, const floating* x,
                      Py_ssize_t incx, floating beta, floating* y,
                      Py_ssize_t incy) noexcept nogil:
    """y = alpha * op(A) @ x + beta * y, A row-major [rows, cols] (rows, cols > 0).

    Like gemm, it runs on the calling thread, in blocks of at most
    CALLER_GEMM_WORK: blocks of rows of A, which are blocks of y (op(A) = A)
    or partial sums over the rows (op(A) = A^T, accumulated with beta = 1).
    The blocks depend only on the shapes. beta == 0 never reads y (y is
    zeroed first: some OpenBLAS versions scale y by beta, and 0 * NaN is NaN).
    Never OpenBLAS's pool: its workers would spin on the cores blockrnn's
    threads use, and a threaded product's bits may depend on OpenBLAS's thread
    count. (float64 sent its GEMVs above 2^20 multiply-adds to the pool until
    stop 62, measured 41 vs 52-61 us at 2^20 for one caller.)"""
    cdef Py_ssize_t r, step, n_y = cols if trans else rows
    if beta == 0:
        for r in range(n_y):
            y[r * incy] = 0
    step = max(1, CALLER_GEMM_WORK // cols)
    r = 0
    while r < rows:
        if trans:   # y (+)= alpha * A[r:r+step]^T @ x[r:r+step]
            blas_gemv(True, min(step, rows - r), cols, alpha, a + r * lda, lda,
                      x + r * incx, incx, beta if r == 0 else 1, y, incy)
        else:       # y[r:r+step] = alpha * A[r:r+step] @ x + beta * y[r:r+step]
            blas_gemv(False, min(step, rows - r), cols, alpha, a + r * lda, lda,
                      x, incx, beta, y + r * incy, incy)
        r += step


cdef inline void gemm(bint trans_a, bint trans_b,
                      Py_ssize_t m, Py_ssize_t n, Py_ssize_t k,
                      floating alpha, const floating* a, Py_ssize_t lda,
                      const floating* b, Py_ssize_t ldb,
                      floating beta, floating* c, Py_ssize_t ldc) noexcept nogil:
    """C[m, n] = alpha * op(A) @ op(B) + beta * C, all row-major."""
    cdef Py_ssize_t i, j, rows, cols
    if m == 0 or n == 0:
        return
    if k == 0:  # empty sum: C = beta * C (beta == 0 must not read C: NaN * 0)
        for i in range(m):
            for j in range(n):
                c[i * ldc + j] = 0 if beta == 0 else beta * c[i * ldc + j]
        return
    # One row or one column (batch 1): GEMV. OpenBLAS's GEMM packs the other
    # operand, all of the weights, at every call, which GEMV never does
    # (measured, one row of 64..1024 by weights of 128..2048 columns: GEMM
    # 1-7x slower than GEMV with OpenBLAS's AVX-512 kernels, 9-18x with its
    # AVX2 ones, OPENBLAS_CORETYPE=Haswell). Two or three rows by weights of
    # at least CALLER_GEMM_WORK elements too, one GEMV per row (GEMV vs GEMM
    # per step, H = 512: 89-122 vs 310-313 us with the AVX-512 kernels, 99-140
    # vs 498-520 with the AVX2 ones; H = 256: 27-40 vs 23-52, 26-48 vs
    # 131-136). With smaller weights OpenBLAS's AVX-512 small-matrix GEMM wins
    # (3.8 vs 5.6 us).
    # Not for two or three columns (the backward's dh^T = W_h @ dG^T at batch
    # 2 or 3): the row blocks below read W_h once, a GEMV per column once per
    # column (measured, backward at 100,2,512,512: 15-17 vs 22 ms).
    if m == 1 or (m <= GEMV_ROWS and n * k >= CALLER_GEMM_WORK):
        for i in range(m):   # C[i, :] = alpha * op(A)[i, :] @ op(B) + beta * C[i, :]
            gemv(not trans_b, n if trans_b else k, k if trans_b else n, alpha, b, ldb,
                 a + (i if trans_a else i * lda), lda if trans_a else 1, beta,
                 c + i * ldc, 1)
        return
    if n == 1:    # C[:, 0] = alpha * op(A) @ b + beta * C[:, 0]
        gemv(trans_a, k if trans_a else m, m if trans_a else k, alpha, a, lda,
             b, 1 if trans_b else ldb, beta, c, ldc)
        return
    if (m * n * k > SMALL_GEMM_WORK or n * k >= CALLER_GEMM_WORK
            or (m * n * k > WIDE_GEMM_WORK and min(m, n) >= WIDE_GEMM_ROWS)):
        # The cell ops and their gradients at large sizes: never on OpenBLAS's
        # pool. Its threaded product's bits may depend on its thread count (with
        # OpenBLAS's Haswell kernels, lstm_block_cell at B=16, I=128, H=256
        # differed between 1 and 2 OpenBLAS threads), and its workers would spin
        # on the cores blockrnn's threads use. Tiles of at most CALLER_GEMM_WORK
        # multiply-adds, each run on the calling thread.
        cols = min(n, max(16, CALLER_GEMM_WORK // (16 * k) // 16 * 16))
        rows = max(1, CALLER_GEMM_WORK // (cols * k))
        j = 0
        while j < n:
            i = 0
            while i < m:
                blas_gemm(trans_a, trans_b, min(rows, m - i), min(cols, n - j), k, alpha,
                          a + (i if trans_a else i * lda), lda,
                          b + (j * ldb if trans_b else j), ldb, beta, c + i * ldc + j, ldc)
                i += rows
            j += cols
        return
    rows = CALLER_GEMM_WORK // (n * k)  # >= 1
    i = 0
    while i < m:  # row i of op(A) starts at a + i*lda, or at a + i if transposed
        blas_gemm(trans_a, trans_b, min(rows, m - i), n, k, alpha,
                  a + (i if trans_a else i * lda), lda, b, ldb, beta, c + i * ldc, ldc)
        i += rows


cdef inline void transpose(Py_ssize_t rows, Py_ssize_t cols, const floating* a,
                           Py_ssize_t lda, bint accumulate, floating* c,
                           Py_ssize_t ldc) noexcept nogil:
    """C[cols, rows] (+)= A[rows, cols]^T (row strides lda, ldc), in 16 x 16
    tiles so that both sides stay in cache."""
    cdef Py_ssize_t i0, j0, i, j, i_end, j_end
    for i0 in range(0, cols, 16):
        i_end = min(i0 + 16, cols)
        for j0 in range(0, rows, 16):
            j_end = min(j0 + 16, rows)
            for i in range(i0, i_end):
                if accumulate:
                    for j in range(j0, j_end):
                        c[i * ldc + j] = c[i * ldc + j] + a[j * lda + i]
                else:
                    for j in range(j0, j_end):
                        c[i * ldc + j] = a[j * lda + i]


cdef inline void gemm_small_by_weights_t(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k,
                                         const floating* a, Py_ssize_t lda,
                                         const floating* w, Py_ssize_t ldw,
                                         bint accumulate, floating* c, Py_ssize_t ldc,
                                         floating* tmp) noexcept nogil:
    """C[m, n] (+)= A[m, k] @ W[n, k]^T for a small m (a batch of rows) and a
    weight matrix W, all row-major; tmp is an [n, m] workspace.

    OpenBLAS is 1.3-2.3x faster at this shape when the weights are the second
    column-major operand, unpacked as stored (measured on the per-step
    recurrent product dh = dG @ W_h^T, B = 16..64, H = 256..512). That is the
    row-major product C^T = W @ A^T, so it is computed into tmp and transposed
    into C. Each C[i, j] is still one dot product over k."""
    if m == 0 or n == 0:
        return
    gemm(False, True, n, m, k, 1, w, ldw, a, lda, 0, tmp, m)
    transpose(n, m, tmp, m, accumulate, c, ldc)
