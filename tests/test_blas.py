"""blockrnn/_blas.pxd's gemm, the routine every product of the kernels goes
through, against NumPy: each transpose, float32 and float64, column blocks of
larger arrays (leading dimensions), and each of its routes: one row or one
column, or up to three rows by large weights (GEMV, on the caller in blocks or
whole), small products in row blocks on the caller, large ones in one call."""
import numpy as np
import pytest

from blockrnn import _kernels

# (m, n, k): GEMV with one row / one column, below 2^18 multiply-adds (one
# call), between 2^18 and 2^20 (blocks), above 2^20 (one call); a dot product;
# three rows by large weights (a GEMV per row) and by small ones; three
# columns (GEMM); GEMM in caller row blocks and in one call (float64; float32
# in tiles of rows and columns on the caller: the cell at B=16, I+H=384,
# 4H=1024, a long k, tiles with remainders both ways).
SHAPES = [(1, 7, 5), (6, 1, 9), (1, 700, 600), (900, 1, 500), (1, 1100, 1000),
          (1030, 1, 1050), (1, 1, 33), (3, 700, 600), (3, 40, 30), (700, 3, 600),
          (40, 3, 30), (5, 40, 30), (64, 96, 80), (16, 1024, 384), (20, 300, 2000),
          (37, 530, 600)]


def operand(rng, rows, cols, dtype, trans, pad):
    """op(X) of shape (rows, cols), stored transposed if `trans`, as a column
    block of a wider array when `pad` (a leading dimension above its width)."""
    shape = (cols, rows) if trans else (rows, cols)
    full = rng.standard_normal((shape[0], shape[1] + pad)).astype(dtype)
    return full[:, :shape[1]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True),
                                              (True, False), (True, True)])
@pytest.mark.parametrize("pad", [0, 3])
def test_gemm_matches_numpy(dtype, m, n, k, trans_a, trans_b, pad):
    rng = np.random.default_rng(m * 1000 + n + k)
    a = operand(rng, m, k, dtype, trans_a, pad)
    b = operand(rng, k, n, dtype, trans_b, pad)
    c_full = rng.standard_normal((m, n + pad)).astype(dtype)
    c = c_full[:, :n]
    c0, c0_pad = c.copy(), c_full[:, n:].copy()
    op_a = (a.T if trans_a else a).astype(np.float64)
    op_b = (b.T if trans_b else b).astype(np.float64)
    want = 0.5 * op_a @ op_b + 2.0 * c0
    _kernels.gemm_memview(trans_a, trans_b, 0.5, a, b, 2.0, c)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(c, want, rtol=tol, atol=tol * np.sqrt(k))
    np.testing.assert_array_equal(c_full[:, n:], c0_pad)   # the columns beside C


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_beta_zero_never_reads_c(dtype, m, n, k):
    """beta = 0: NaN in C must not leak into the result (outputs are np.empty)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = np.full((m, n), np.nan, dtype)
    _kernels.gemm_memview(False, False, 1.0, a, b, 0.0, c)
    assert np.isfinite(c).all()
    np.testing.assert_allclose(c, a.astype(np.float64) @ b,
                               rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-4 * np.sqrt(k))


def test_padding_of_c_is_untouched():
    """A column block of C: the columns beside it keep their values (NaN here)."""
    rng = np.random.default_rng(2)
    for m, n, k in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        c_full = np.full((m, n + 2), np.nan, np.float32)
        _kernels.gemm_memview(False, False, 1.0, a, b, 0.0, c_full[:, :n])
        assert np.isnan(c_full[:, n:]).all() and np.isfinite(c_full[:, :n]).all()


def test_mismatched_shapes_raise():
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="does not give C"):
        _kernels.gemm_memview(False, False, 1.0, a, np.zeros((4, 5), np.float32), 0.0,
                              np.zeros((2, 5), np.float32))
