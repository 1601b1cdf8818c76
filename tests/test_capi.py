"""The C-level API: a tiny Cython extension cimports blockrnn.capi, is compiled
against the blockrnn that is imported (its .pxd files), and calls the kernels
from nogil code; its results must equal blockrnn.raw_ops'."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blockrnn
from blockrnn import raw_ops

EXTENSION = textwrap.dedent("""
    # cython: language_level=3, boundscheck=False, wraparound=False
    from libc.stdint cimport int64_t
    from blockrnn.capi cimport (
        BRNN_IFCO, brnn_block_lstm_f32, brnn_block_lstm_grad_f64, brnn_block_gru_f32,
        brnn_block_gru_grad_f64, brnn_lstm_cell_f64, brnn_gru_cell_f32)
    import numpy as np

    def block_lstm_v2(Py_ssize_t L, const float[:, :, ::1] x, const float[:, ::1] cs_prev,
                      const float[:, ::1] h_prev, const float[:, ::1] w,
                      const float[::1] wci, const float[::1] wcf, const float[::1] wco,
                      const float[::1] b, const int64_t[::1] lengths):
        cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
        outs = np.empty((7, T, B, H), np.float32)
        cdef float[:, :, :, ::1] o = outs
        cdef int rc
        with nogil:
            rc = brnn_block_lstm_f32(L, T, B, I, H, BRNN_IFCO, &x[0, 0, 0], &cs_prev[0, 0],
                                     &h_prev[0, 0], &w[0, 0], &wci[0], &wcf[0], &wco[0],
                                     &b[0], 0.0, 0.0, 1, &lengths[0], &o[0, 0, 0, 0],
                                     &o[1, 0, 0, 0], &o[2, 0, 0, 0], &o[3, 0, 0, 0],
                                     &o[4, 0, 0, 0], &o[5, 0, 0, 0], &o[6, 0, 0, 0])
        assert rc == 0
        return outs

    def block_lstm_grad_v2(Py_ssize_t L, const double[:, :, ::1] x,
                           const double[:, ::1] cs_prev, const double[:, ::1] h_prev,
                           const double[:, ::1] w, const double[::1] wci,
                           const double[::1] wcf, const double[::1] wco,
                           const double[:, :, :, ::1] fwd, const double[:, :, ::1] cs_grad,
                           const double[:, :, ::1] h_grad):
        cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
        x_grad = np.empty((T, B, I))
        state = np.empty((2, B, H))
        w_grad = np.empty((I + H, 4 * H))
        vec = np.empty((3, H))
        b_grad = np.empty(4 * H)
        cdef double[:, :, ::1] xg = x_grad
        cdef double[:, :, ::1] st = state
        cdef double[:, ::1] wg = w_grad
        cdef double[:, ::1] vg = vec
        cdef double[::1] bg = b_grad
        with nogil:
            rc = brnn_block_lstm_grad_f64(
                L, T, B, I, H, BRNN_IFCO, &x[0, 0, 0], &cs_prev[0, 0], &h_prev[0, 0],
                &w[0, 0], &wci[0], &wcf[0], &wco[0], &fwd[0, 0, 0, 0], &fwd[1, 0, 0, 0],
                &fwd[2, 0, 0, 0], &fwd[3, 0, 0, 0], &fwd[4, 0, 0, 0], &fwd[5, 0, 0, 0],
                &fwd[6, 0, 0, 0], &cs_grad[0, 0, 0], &h_grad[0, 0, 0], 1, NULL,
                &xg[0, 0, 0], &st[0, 0, 0], &st[1, 0, 0], &wg[0, 0], &vg[0, 0], &vg[1, 0],
                &vg[2, 0], &bg[0])
        assert rc == 0
        return x_grad, state[0], state[1], w_grad, vec[0], vec[1], vec[2], b_grad

    def block_gru(Py_ssize_t L, const float[:, :, ::1] x, const float[:, ::1] h_prev,
                  const float[:, ::1] w_ru, const float[:, ::1] w_c, const float[::1] b_ru,
                  const float[::1] b_c):
        cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
        outs = np.empty((4, T, B, H), np.float32)
        cdef float[:, :, :, ::1] o = outs
        with nogil:
            rc = brnn_block_gru_f32(L, T, B, I, H, &x[0, 0, 0], &h_prev[0, 0], &w_ru[0, 0],
                                    &w_c[0, 0], &b_ru[0], &b_c[0], NULL, &o[0, 0, 0, 0],
                                    &o[1, 0, 0, 0], &o[2, 0, 0, 0], &o[3, 0, 0, 0])
        assert rc == 0
        return outs

    def block_gru_grad(Py_ssize_t L, const double[:, :, ::1] x, const double[:, ::1] h_prev,
                       const double[:, ::1] w_ru, const double[:, ::1] w_c,
                       const double[:, :, :, ::1] fwd, const double[:, :, ::1] h_grad):
        cdef Py_ssize_t T = x.shape[0], B = x.shape[1], I = x.shape[2], H = h_prev.shape[1]
        x_grad = np.empty((T, B, I))
        h_prev_grad = np.empty((B, H))
        w_ru_grad = np.empty((I + H, 2 * H))
        w_c_grad = np.empty((I + H, H))
        b_ru_grad = np.empty(2 * H)
        b_c_grad = np.empty(H)
        cdef double[:, :, ::1] xg = x_grad
        cdef double[:, ::1] hg = h_prev_grad
        cdef double[:, ::1] wrg = w_ru_grad
        cdef double[:, ::1] wcg = w_c_grad
        cdef double[::1] brg = b_ru_grad
        cdef double[::1] bcg = b_c_grad
        with nogil:
            rc = brnn_block_gru_grad_f64(
                L, T, B, I, H, &x[0, 0, 0], &h_prev[0, 0], &w_ru[0, 0], &w_c[0, 0],
                &fwd[0, 0, 0, 0], &fwd[1, 0, 0, 0], &fwd[2, 0, 0, 0], &fwd[3, 0, 0, 0],
                &h_grad[0, 0, 0], NULL, &xg[0, 0, 0], &hg[0, 0], &wrg[0, 0], &wcg[0, 0],
                &brg[0], &bcg[0])
        assert rc == 0
        return x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad, b_c_grad

    def lstm_cell(const double[:, ::1] x, const double[:, ::1] cs_prev,
                  const double[:, ::1] h_prev, const double[:, ::1] w,
                  const double[::1] wci, const double[::1] wcf, const double[::1] wco,
                  const double[::1] b, double forget_bias, double cell_clip):
        cdef Py_ssize_t B = x.shape[0], I = x.shape[1], H = h_prev.shape[1]
        outs = np.empty((7, B, H))
        cdef double[:, :, ::1] o = outs
        with nogil:
            rc = brnn_lstm_cell_f64(B, I, H, 0, &x[0, 0], &cs_prev[0, 0], &h_prev[0, 0],
                                    &w[0, 0], &wci[0], &wcf[0], &wco[0], &b[0], forget_bias,
                                    cell_clip, 0, &o[0, 0, 0], &o[1, 0, 0], &o[2, 0, 0],
                                    &o[3, 0, 0], &o[4, 0, 0], &o[5, 0, 0], &o[6, 0, 0])
        assert rc == 0
        return outs

    def gru_cell(const float[:, ::1] x, const float[:, ::1] h_prev,
                 const float[:, ::1] w_ru, const float[:, ::1] w_c, const float[::1] b_ru,
                 const float[::1] b_c):
        cdef Py_ssize_t B = x.shape[0], I = x.shape[1], H = h_prev.shape[1]
        outs = np.empty((4, B, H), np.float32)
        cdef float[:, :, ::1] o = outs
        with nogil:
            rc = brnn_gru_cell_f32(B, I, H, &x[0, 0], &h_prev[0, 0], &w_ru[0, 0], &w_c[0, 0],
                                   &b_ru[0], &b_c[0], &o[0, 0, 0], &o[1, 0, 0], &o[2, 0, 0],
                                   &o[3, 0, 0])
        assert rc == 0
        return outs
""")

SETUP = textwrap.dedent("""
    import sys
    import numpy
    from Cython.Build import cythonize
    from setuptools import Extension, setup

    ext = Extension("capi_user", ["capi_user.pyx"], include_dirs=[numpy.get_include()])
    setup(ext_modules=cythonize([ext], include_path=[sys.argv.pop()], quiet=True),
          script_args=["build_ext", "--inplace", "-q"])
""")


@pytest.fixture(scope="module")
def capi_user(tmp_path_factory):
    """Build the extension in a temporary directory and import it."""
    build = tmp_path_factory.mktemp("capi")
    (build / "capi_user.pyx").write_text(EXTENSION)
    (build / "setup.py").write_text(SETUP)
    package_parent = os.path.dirname(os.path.dirname(blockrnn.__file__))
    run = subprocess.run([sys.executable, "setup.py", package_parent], cwd=build,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    built = [p for p in os.listdir(build) if p.startswith("capi_user") and p.endswith(".so")]
    spec = importlib.util.spec_from_file_location("capi_user", build / built[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rand(rng, dtype, *shape):
    return rng.uniform(-1, 1, shape).astype(dtype)


def test_block_lstm_through_the_c_api(capi_user):
    rng = np.random.default_rng(0)
    T, B, I, H = 5, 3, 4, 6
    f32 = [_rand(rng, np.float32, *s) for s in
           [(T, B, I), (B, H), (B, H), (I + H, 4 * H), (H,), (H,), (H,), (4 * H,)]]
    lengths = np.array([5, 0, 3], dtype=np.int64)
    got = capi_user.block_lstm_v2(4, *f32, lengths)
    expected = blockrnn.block_lstm_v2(4, *f32, use_peephole=True, sequence_length=lengths)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)

    f64 = [a.astype(np.float64) for a in f32]
    names = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
    fwd = raw_ops.BlockLSTMV2(seq_len_max=4, **dict(zip(names, f64)), use_peephole=True)
    cs_grad, h_grad = _rand(rng, np.float64, T, B, H), _rand(rng, np.float64, T, B, H)
    got = capi_user.block_lstm_grad_v2(4, *f64[:7], np.stack(fwd), cs_grad, h_grad)
    expected = raw_ops.BlockLSTMGradV2(seq_len_max=4, **dict(zip(names, f64)),
                                       **fwd._asdict(), cs_grad=cs_grad, h_grad=h_grad,
                                       use_peephole=True)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_block_gru_through_the_c_api(capi_user):
    rng = np.random.default_rng(1)
    T, B, I, H = 6, 2, 3, 5
    shapes = [(T, B, I), (B, H), (I + H, 2 * H), (I + H, H), (2 * H,), (H,)]
    f32 = [_rand(rng, np.float32, *s) for s in shapes]
    names = ("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c")
    expected = raw_ops.BlockGRU(seq_len_max=5, **dict(zip(names, f32)))
    for g, e in zip(capi_user.block_gru(5, *f32), expected):
        np.testing.assert_array_equal(g, e)
    f64 = [a.astype(np.float64) for a in f32]
    fwd = raw_ops.BlockGRU(seq_len_max=5, **dict(zip(names, f64)))
    h_grad = _rand(rng, np.float64, T, B, H)
    expected = raw_ops.BlockGRUGrad(seq_len_max=5, **dict(zip(names, f64)), **fwd._asdict(),
                                    h_grad=h_grad)
    got = capi_user.block_gru_grad(5, *f64[:4], np.stack(fwd), h_grad)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_cells_through_the_c_api(capi_user):
    rng = np.random.default_rng(2)
    B, I, H = 3, 4, 5
    lstm = [_rand(rng, np.float64, *s) for s in
            [(B, I), (B, H), (B, H), (I + H, 4 * H), (H,), (H,), (H,), (4 * H,)]]
    names = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
    expected = raw_ops.LSTMBlockCell(**dict(zip(names, lstm)), forget_bias=0.5, cell_clip=0.3)
    for g, e in zip(capi_user.lstm_cell(*lstm, 0.5, 0.3), expected):
        np.testing.assert_array_equal(g, e)
    gru = [_rand(rng, np.float32, *s) for s in
           [(B, I), (B, H), (I + H, 2 * H), (I + H, H), (2 * H,), (H,)]]
    expected = raw_ops.GRUBlockCell(**dict(zip(("x", "h_prev", "w_ru", "w_c", "b_ru", "b_c"),
                                               gru)))
    for g, e in zip(capi_user.gru_cell(*gru), expected):
        np.testing.assert_array_equal(g, e)
