"""The packed recurrent kernel (include/brnn_packed.h) against float64 products,
for every variant this CPU can run (the portable one always), and the
BLOCKRNN_KERNEL switch that forces a variant."""
import os
import subprocess
import sys

import numpy as np
import pytest

import blockrnn
from blockrnn import _kernels

PATHS = _kernels.packed_paths_supported()


def test_portable_and_auto_paths_exist():
    assert "portable" in PATHS
    assert _kernels.packed_kernel_name() == (os.environ.get("BLOCKRNN_KERNEL", "auto")
                                             .replace("auto", PATHS[0]))
    assert blockrnn.build_config()["packed_kernel"] == _kernels.packed_kernel_name()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", range(1, 8))
@pytest.mark.parametrize("K", [0, 1, 7, 64])
@pytest.mark.parametrize("N", [1, 15, 16, 17, 50])
def test_packed_product_matches_float64(path, rows, K, N):
    rng = np.random.default_rng(rows * 1000 + K * 10 + N)
    a = rng.standard_normal((rows, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    expected = a.astype(np.float64) @ w.astype(np.float64)
    c = np.full((rows, N), np.nan, np.float32)
    _kernels.packed_product_memview(a, w, False, c, path)
    np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-5 * (1 + K))
    start = rng.standard_normal((rows, N)).astype(np.float32)
    c = start.copy()
    _kernels.packed_product_memview(a, w, True, c, path)
    np.testing.assert_allclose(c, start + expected, rtol=1e-5, atol=1e-5 * (1 + K))


@pytest.mark.parametrize("path", PATHS)
def test_transposed_weights_and_column_ranges_give_the_same_bits(path):
    """Any split of the columns in panels, and W given transposed, keep the bits."""
    rng = np.random.default_rng(5)
    rows, K, N = 13, 37, 83
    a = rng.standard_normal((rows, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    whole = np.zeros((rows, N), np.float32)
    _kernels.packed_product_memview(a, w, False, whole, path)
    split = np.zeros((rows, N), np.float32)
    for n0, n1 in [(0, 16), (16, 48), (48, 83)]:
        _kernels.packed_product_memview(a, w, False, split, path, n0, n1)
    np.testing.assert_array_equal(split, whole)
    w_t = np.ascontiguousarray(w.T)
    via_t = np.zeros((rows, N), np.float32)
    _kernels.packed_product_memview(a, w_t.T, False, via_t, path)
    np.testing.assert_array_equal(via_t, whole)
    for r in range(rows):  # one row at a time: other row tiles, same bits
        one = np.zeros((1, N), np.float32)
        _kernels.packed_product_memview(a[r:r + 1], w, False, one, path)
        np.testing.assert_array_equal(one[0], whole[r])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [5, 6, 8, 9, 10, 14, 15, 16, 17, 18, 26, 32])
def test_row_tiling_never_changes_the_bits(path, rows):
    """Row counts whose remainder shares the last full tile (4-row tiles: 5, 6;
    6-row: 8, 9, 14, 15, 26, 32; 12-row: 14-18, 26) give each row the bits of
    that row alone, and match float64."""
    rng = np.random.default_rng(rows)
    K, N = 29, 40
    a = rng.standard_normal((rows, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    whole = np.full((rows, N), np.nan, np.float32)
    _kernels.packed_product_memview(a, w, False, whole, path)
    np.testing.assert_allclose(whole, a.astype(np.float64) @ w, rtol=0, atol=1e-4)
    for r in range(rows):
        one = np.zeros((1, N), np.float32)
        _kernels.packed_product_memview(a[r:r + 1], w, False, one, path)
        np.testing.assert_array_equal(one[0], whole[r])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 12, 13, 18])
@pytest.mark.parametrize("K", [0, 1, 7, 130])
@pytest.mark.parametrize("accumulate", [False, True])
def test_driver_kernel_gives_the_panel_kernels_bits(path, rows, K, accumulate):
    """The kernel every float32 product runs (brnn_gemm_kernel; on AVX-512 12 x 32
    tiles over panel pairs, and for at most 6 rows 6 x 64 tiles over groups of four
    panels, then pairs, then a last panel) computes every element as the variant's
    own 12 x 16 kernel: the same bits, for column ranges that start on any panel,
    end inside one, and hold 1-5 whole or partial groups of four panels, and never
    a store outside the range."""
    rng = np.random.default_rng(rows * 1000 + K)
    N = 200
    a = rng.standard_normal((rows, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    start = rng.standard_normal((rows, N)).astype(np.float32)
    for n0, n1 in [(0, N), (0, 64), (0, 63), (16, 80), (16, 200), (48, 176), (64, 65),
                   (0, 16), (32, 130), (176, 200)]:
        want, got = start.copy(), start.copy()
        _kernels.packed_product_memview(a, w, accumulate, want, path, n0, n1)
        _kernels.packed_product_memview(a, w, accumulate, got, path, n0, n1, driver=True)
        np.testing.assert_array_equal(got, want, err_msg=f"{n0=} {n1=}")
        np.testing.assert_array_equal(got[:, :n0], start[:, :n0])
        np.testing.assert_array_equal(got[:, n1:], start[:, n1:])


def test_a_path_the_cpu_lacks_is_refused():
    for name in ("avx512", "avx2"):
        if name not in PATHS:
            with pytest.raises(ValueError, match="not one of"):
                _kernels.packed_product_memview(np.ones((1, 1), np.float32),
                                                np.ones((1, 1), np.float32), False,
                                                np.ones((1, 1), np.float32), name)
    with pytest.raises(ValueError, match="not one of"):
        _kernels.packed_product_memview(np.ones((1, 1), np.float32),
                                        np.ones((1, 1), np.float32), False,
                                        np.ones((1, 1), np.float32), "sse9")


def _import_with(kernel):
    env = dict(os.environ, BLOCKRNN_KERNEL=kernel)
    return subprocess.run(
        [sys.executable, "-c", "from blockrnn import _kernels; print(_kernels.packed_kernel_name())"],
        env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kernel", ["avx512", "avx2", "portable", "auto", "bogus"])
def test_blockrnn_kernel_variable(kernel):
    out = _import_with(kernel)
    if kernel == "auto":
        assert out.returncode == 0 and out.stdout.strip() == PATHS[0]
    elif kernel in PATHS:
        assert out.returncode == 0 and out.stdout.strip() == kernel, out.stderr
    else:  # a clear Python error, never SIGILL
        assert out.returncode == 1, (out.returncode, out.stderr)
        assert "BLOCKRNN_KERNEL" in out.stderr


WIDE_PATHS = [p for p in PATHS if p != "portable"]


@pytest.mark.skipif(not WIDE_PATHS, reason="no x86 packed variant on this CPU: the fused "
                    "batch-1 step's kernel exists only for AVX2 and AVX-512")
@pytest.mark.parametrize("path", WIDE_PATHS)
@pytest.mark.parametrize("K", [0, 1, 7, 130])
@pytest.mark.parametrize("H", [1, 15, 16, 17, 37, 64])
@pytest.mark.parametrize("nq", [3, 4])
def test_gate_interleaved_kernel_gives_the_panel_kernels_bits(path, K, H, nq):
    """The fused batch-1 step's kernel on the gate-interleaved layout (each 16-cell
    panel's nq gate columns side by side, k-major) computes every element as the
    panels' kernel of the same variant: the same bits, with W given either way round
    (nn.LSTM's weight_hh is W^T) and H not a multiple of 16."""
    rng = np.random.default_rng(K * 100 + H * 10 + nq)
    a = rng.standard_normal(K).astype(np.float32)
    w = rng.standard_normal((K, nq * H)).astype(np.float32)
    panels = np.zeros((1, nq * H), np.float32)
    _kernels.packed_product_memview(a[None], w, False, panels, path)
    for wv in (w, np.ascontiguousarray(w.T).T):
        np.testing.assert_array_equal(_kernels.row1_gates_memview(a, wv, nq, path), panels[0])


@pytest.mark.skipif(not WIDE_PATHS, reason="no x86 packed variant on this CPU: the wide "
                    "one-row kernel exists only for AVX2 and AVX-512")
@pytest.mark.parametrize("path", WIDE_PATHS)
@pytest.mark.parametrize("K", [0, 1, 7, 130])
@pytest.mark.parametrize("N", [1, 15, 16, 17, 64, 80, 200, 256])
@pytest.mark.parametrize("accumulate", [False, True])
def test_wide_row_kernel_gives_the_panel_kernels_bits(path, K, N, accumulate):
    """The one-row kernel on the wide layout (64-column blocks, k-major) computes every
    element as the panels' kernel of the same variant (one FMA chain over k): the same
    bits, for every column range a thread split can give it (ranges start on a
    16-column panel, inside or across a block), with W given either way round, and
    never a store outside the range."""
    rng = np.random.default_rng(K * 1000 + N)
    a = rng.standard_normal(K).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    start = rng.standard_normal(N).astype(np.float32)
    panels = start[None].copy()
    _kernels.packed_product_memview(a[None], w, accumulate, panels, path)
    starts = sorted({0, 16, 48, 64, 80, 128} & set(range(0, N, 16)))
    ranges = [(0, N)] + [(n0, n1) for n0 in starts for n1 in (min(N, n0 + 16), N)]
    for wv in (w, np.ascontiguousarray(w.T).T):
        for n0, n1 in ranges:
            c = start.copy()
            _kernels.row1_wide_memview(a, wv, accumulate, c, path, n0, n1)
            np.testing.assert_array_equal(c[n0:n1], panels[0, n0:n1])
            np.testing.assert_array_equal(c[:n0], start[:n0])
            np.testing.assert_array_equal(c[n1:], start[n1:])
