"""The GEMM driver of include/brnn_gemm.h (float32 products over all steps, e.g. the
backward's x_grad and weight gradients): every kernel variant of this CPU against
float64, transposed and strided operands, the same bits for every thread split and
thread count, and its bits are those of its fixed K blocks."""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from blockrnn import _kernels

PATHS = _kernels.packed_paths_supported()
KC, DKC = _kernels.packed_gemm_k_blocks()  # K blocks: float32 (512), float64 (256)
# M, N, K: edges of every tile and block (M past MC = 96 / 48, N past NC = 256 and not
# a multiple of 16, K past one and two KC of both), one row, one column, tall and wide.
SHAPES = [(1, 1, 1), (7, 5, 3), (13, 37, 256), (97, 40, 257), (30, 530, 600),
          (600, 17, 513), (12, 16, 1), (250, 130, 1100), (3, 600, 40), (20, 300, 512),
          (5, 40, 1025)]


def _operands(M, N, K, trans_a, trans_b, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (K, M) if trans_a else (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (N, K) if trans_b else (K, N)).astype(np.float32)
    return (a.T if trans_a else a), (b.T if trans_b else b)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
def test_driver_matches_float64(path, shape, trans_a, trans_b):
    M, N, K = shape
    a, b = _operands(M, N, K, trans_a, trans_b)
    c0 = np.random.default_rng(1).uniform(-1, 1, (M, N)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    for accumulate in (False, True):
        c = c0.copy()
        _kernels.packed_gemm_memview(a, b, accumulate, c, path)
        want = expected + c0 if accumulate else expected
        np.testing.assert_allclose(c, want, rtol=0, atol=2e-6 * (K + 1) ** 0.5 * 4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_transposed_operands_give_the_bits_of_their_copies(path, shape):
    """Packing a transposed A or B (4 x 4 blocks transposed, include/brnn_packed.h's
    brnn_transpose4, and scalar edges) is a copy: the bits of the contiguous copy."""
    for trans_a, trans_b in [(True, False), (False, True), (True, True)]:
        a, b = _operands(*shape, trans_a=trans_a, trans_b=trans_b)
        c = np.empty((shape[0], shape[1]), np.float32)
        _kernels.packed_gemm_memview(a, b, False, c, path)
        want = np.empty_like(c)
        _kernels.packed_gemm_memview(np.ascontiguousarray(a), np.ascontiguousarray(b), False,
                                     want, path)
        np.testing.assert_array_equal(c, want, err_msg=f"{trans_a=} {trans_b=}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_thread_split_gives_the_same_bits(path, shape):
    """parts = nt thread parts run one after another: every split of rows or panels."""
    a, b = _operands(*shape, trans_a=True, trans_b=False)
    ref = np.empty((shape[0], shape[1]), np.float32)
    _kernels.packed_gemm_memview(a, b, False, ref, path)
    for parts in (2, 3, 4, 5, 8):
        c = np.full_like(ref, np.nan)
        _kernels.packed_gemm_memview(a, b, False, c, path, parts=parts)
        np.testing.assert_array_equal(c, ref)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES + [(3, 1100, 300), (5, 1600, 513)])
def test_b_packed_once_gives_the_bits_of_b_packed_by_each_part(path, shape):
    """A B packed beforehand (brnn_gemm_prepack_b, the job's bp: a backward's weight
    packed once for all its chunks and threads) gives the bits of the driver packing
    it itself, for every split; the wide shapes split columns inside a block of NC
    = 512 (a part's first column not on a block's)."""
    for trans_b in (False, True):
        a, b = _operands(*shape, trans_a=False, trans_b=trans_b)
        c0 = np.random.default_rng(2).uniform(-1, 1, (shape[0], shape[1])).astype(np.float32)
        for accumulate in (False, True):
            ref = c0.copy()
            _kernels.packed_gemm_memview(a, b, accumulate, ref, path)
            for parts in (1, 2, 3, 5):
                c = c0.copy()
                _kernels.packed_gemm_memview(a, b, accumulate, c, path, parts=parts,
                                             prepack_b=True)
                np.testing.assert_array_equal(c, ref, err_msg=f"{trans_b=} {parts=}")


@pytest.mark.parametrize("shape", [(250, 130, 1100), (30, 530, 600), (600, 17, 513)])
def test_thread_counts_give_the_same_bits(shape):
    """Real threads from the thread budget, 1..4 allowed."""
    a, b = _operands(*shape, trans_a=False, trans_b=True)
    ref = np.empty((shape[0], shape[1]), np.float32)
    _kernels.packed_gemm_memview(a, b, False, ref)
    for n in (2, 3, 4):
        for prepack_b in (False, True):
            c = np.full_like(ref, np.nan)
            with threadpool_limits(n, user_api="openmp"):
                _kernels.packed_gemm_memview(a, b, False, c, threads=n, prepack_b=prepack_b)
            np.testing.assert_array_equal(c, ref)
    assert _kernels.thread_budget_in_use() == 0


@pytest.mark.parametrize("path", PATHS)
def test_bits_are_those_of_fixed_k_blocks(path):
    """C = ((A[:, :KC] B[:KC]) + A[:, KC:2KC] B[KC:2KC]) + ..., each block one packed-
    kernel sum: what the driver promises (its bits depend on K only)."""
    M, N, K = 40, 50, 2 * KC + 77
    a, b = _operands(M, N, K, trans_a=False, trans_b=False)
    c = np.empty((M, N), np.float32)
    _kernels.packed_gemm_memview(a, b, False, c, path)
    manual = np.empty((M, N), np.float32)
    for k0 in range(0, K, KC):
        _kernels.packed_product_memview(np.ascontiguousarray(a[:, k0:k0 + KC]),
                                        b[k0:k0 + KC], k0 > 0, manual, path)
    np.testing.assert_array_equal(c, manual)


def test_empty_k_zeroes_or_keeps_c():
    a = np.empty((5, 0), np.float32)
    b = np.empty((0, 20), np.float32)
    c = np.ones((5, 20), np.float32)
    _kernels.packed_gemm_memview(a, b, True, c)
    assert (c == 1).all()
    _kernels.packed_gemm_memview(a, b, False, c)
    assert (c == 0).all()


def test_bad_arguments_are_refused():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="inconsistent"):
        _kernels.packed_gemm_memview(a, np.ones((5, 2), np.float32), False,
                                     np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="path"):
        _kernels.packed_gemm_memview(a, np.ones((4, 2), np.float32), False,
                                     np.ones((3, 2), np.float32), "sse9")


# ---- float64: the double driver (the backward's float64 products over all steps) ----

def _operands64(M, N, K, trans_a, trans_b, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (K, M) if trans_a else (M, K))
    b = rng.uniform(-1, 1, (N, K) if trans_b else (K, N))
    return (a.T if trans_a else a), (b.T if trans_b else b)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True),
                                             (True, True)])
def test_double_driver_matches_numpy(path, shape, trans_a, trans_b):
    M, N, K = shape
    a, b = _operands64(M, N, K, trans_a, trans_b)
    c0 = np.random.default_rng(1).uniform(-1, 1, (M, N))
    expected = a @ b
    for accumulate in (False, True):
        c = c0.copy()
        _kernels.packed_dgemm_memview(a, b, accumulate, c, path)
        want = expected + c0 if accumulate else expected
        # ~1e-13 relative to the size of the terms (sum |a||b| <= K)
        np.testing.assert_allclose(c, want, rtol=0, atol=1e-13 * max(K, 1))
        assert np.abs(c - want).max(initial=0) <= 1e-13 * (np.abs(a) @ np.abs(b)).max(
            initial=1) + 1e-300


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_double_every_thread_split_gives_the_same_bits(path, shape):
    a, b = _operands64(*shape, trans_a=True, trans_b=False)
    ref = np.empty((shape[0], shape[1]))
    _kernels.packed_dgemm_memview(a, b, False, ref, path)
    for parts in (2, 3, 4, 5, 8):
        c = np.full_like(ref, np.nan)
        _kernels.packed_dgemm_memview(a, b, False, c, path, parts=parts)
        np.testing.assert_array_equal(c, ref)


@pytest.mark.parametrize("shape", [(250, 130, 1100), (30, 530, 600), (600, 17, 513)])
def test_double_thread_counts_give_the_same_bits(shape):
    a, b = _operands64(*shape, trans_a=False, trans_b=True)
    ref = np.empty((shape[0], shape[1]))
    _kernels.packed_dgemm_memview(a, b, False, ref)
    for n in (2, 3, 4):
        c = np.full_like(ref, np.nan)
        with threadpool_limits(n, user_api="openmp"):
            _kernels.packed_dgemm_memview(a, b, False, c, threads=n)
        np.testing.assert_array_equal(c, ref)
    assert _kernels.thread_budget_in_use() == 0


@pytest.mark.parametrize("path", PATHS)
def test_double_bits_are_those_of_fixed_k_blocks(path):
    """C = ((A[:, :DKC] B[:DKC]) + A[:, DKC:2DKC] B[DKC:2DKC]) + ...: a product of
    K > DKC is the chain of its K blocks' products, each added onto C in order."""
    M, N, K = 40, 50, 2 * DKC + 77
    a, b = _operands64(M, N, K, trans_a=False, trans_b=False)
    c = np.empty((M, N))
    _kernels.packed_dgemm_memview(a, b, False, c, path)
    manual = np.empty((M, N))
    for k0 in range(0, K, DKC):
        _kernels.packed_dgemm_memview(a[:, k0:k0 + DKC], b[k0:k0 + DKC], k0 > 0, manual, path)
    np.testing.assert_array_equal(c, manual)


def test_double_portable_block_is_the_in_order_sum():
    """The portable kernel's block sum is s = (((0 + a_0 b_0) + a_1 b_1) + ...), each
    product and each sum rounded (no FMA): NumPy's elementwise float64 replays it
    exactly. Past DKC the blocks' sums are added onto C one after another."""
    M, N, K = 13, 37, DKC + 40
    a, b = _operands64(M, N, K, trans_a=True, trans_b=False)
    c = np.empty((M, N))
    _kernels.packed_dgemm_memview(a, b, False, c, "portable")
    want = None
    for k0 in range(0, K, DKC):
        s = np.zeros((M, N))
        for k in range(k0, min(K, k0 + DKC)):
            s = s + a[:, k:k + 1] * b[k:k + 1, :]
        want = s if want is None else want + s
    np.testing.assert_array_equal(c, want)


def test_double_empty_k_and_bad_arguments():
    c = np.ones((5, 20))
    _kernels.packed_dgemm_memview(np.empty((5, 0)), np.empty((0, 20)), True, c)
    assert (c == 1).all()
    _kernels.packed_dgemm_memview(np.empty((5, 0)), np.empty((0, 20)), False, c)
    assert (c == 0).all()
    with pytest.raises(ValueError, match="inconsistent"):
        _kernels.packed_dgemm_memview(np.ones((3, 4)), np.ones((5, 2)), False, np.ones((3, 2)))
    with pytest.raises(ValueError, match="path"):
        _kernels.packed_dgemm_memview(np.ones((3, 4)), np.ones((4, 2)), False, np.ones((3, 2)),
                                      "sse9")
