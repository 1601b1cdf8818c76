# The only place blockrnn names a BLAS routine: row-major GEMM over SciPy's
# BLAS (scipy.linalg.cython_blas), for float and double.
#
# Row-major trick: a C-contiguous [m, k] array is the column-major [k, m]
# array of its transpose, so C = op(A) @ op(B) is computed as the column-major
# product C^T = op(B)^T @ op(A)^T (operands and m/n swapped). `ld*` are row
# strides in elements, so a block of a larger buffer is passed without a copy.
# Callers guarantee every size fits a BLAS int (checked in Python).
from cython cimport floating
from scipy.linalg.cython_blas cimport sgemm, dgemm


# Small products run on the calling thread. OpenBLAS's interface runs a
# product of m*n*k <= 65536 * 4 on its caller and may hand larger ones to its
# thread pool; for a product below SMALL_GEMM_WORK waking the pool costs about
# what it saves, and with several Python threads calling at once the pool is
# shared and serialises them (measured: two threads doing batch-1 sequences
# got 0.82x one thread's throughput). So a small product is issued in blocks
# of rows of at most CALLER_GEMM_WORK each. Each element of C is still one dot
# product over all of k; the blocks depend only on the shapes, never on what
# other threads do.
# Except a product above WIDE_GEMM_WORK whose m and n are both at least
# WIDE_GEMM_ROWS: there the pool pays (a per-step recurrent product of 16 or
# 32 rows, 2 threads, LSTM forward median: 26.6 -> 20.5 ms at 100,16,256,256,
# 18.9 -> 14.3 ms at 100,32,128,128; with 4 rows, 200,4,256,512, the pool
# made it 42 -> 71 ms, so thin products stay on the caller).
cdef enum:
    SMALL_GEMM_WORK = 1 << 22
    WIDE_GEMM_WORK = 1 << 20
    WIDE_GEMM_ROWS = 16
    CALLER_GEMM_WORK = 1 << 18


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


cdef inline void gemm(bint trans_a, bint trans_b,
                      Py_ssize_t m, Py_ssize_t n, Py_ssize_t k,
                      floating alpha, const floating* a, Py_ssize_t lda,
                      const floating* b, Py_ssize_t ldb,
                      floating beta, floating* c, Py_ssize_t ldc) noexcept nogil:
    """C[m, n] = alpha * op(A) @ op(B) + beta * C, all row-major."""
    cdef Py_ssize_t i, j, rows
    if m == 0 or n == 0:
        return
    if k == 0:  # empty sum: C = beta * C (beta == 0 must not read C: NaN * 0)
        for i in range(m):
            for j in range(n):
                c[i * ldc + j] = 0 if beta == 0 else beta * c[i * ldc + j]
        return
    if (m * n * k > SMALL_GEMM_WORK or n * k >= CALLER_GEMM_WORK
            or (m * n * k > WIDE_GEMM_WORK and min(m, n) >= WIDE_GEMM_ROWS)):
        blas_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
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


cdef inline void gemm_small_by_weights(Py_ssize_t m, Py_ssize_t n, Py_ssize_t k,
                                       const floating* a, Py_ssize_t lda,
                                       const floating* w, Py_ssize_t ldw,
                                       const floating* w_t, bint accumulate,
                                       floating* c, Py_ssize_t ldc,
                                       floating* tmp) noexcept nogil:
    """C[m, n] (+)= A[m, k] @ W[k, n] for a small m. Given w_t, a copy of W^T
    [n, k] the caller made once for many products, this is
    gemm_small_by_weights_t(A, w_t) (tmp: [n, m]); with w_t NULL, one gemm."""
    if w_t != NULL:
        gemm_small_by_weights_t(m, n, k, a, lda, w_t, k, accumulate, c, ldc, tmp)
    else:
        gemm(False, False, m, n, k, 1, a, lda, w, ldw, 1 if accumulate else 0, c, ldc)
