# C-level API of blockrnn's kernels, for other Cython extensions' nogil code
# (as scipy.linalg.cython_blas is for BLAS). Cimport it from blockrnn.capi:
#
#     from blockrnn.capi cimport brnn_block_lstm_f32, BRNN_IFCO
#
# The contract, for every function (they check nothing):
# - Every array is C-contiguous (row-major), of the shape given below, and
#   does not overlap an output. B batch, I input size, H cell size, T steps,
#   L steps to run with 0 <= L <= T. Every size, and T*B, I+H and 4H, must
#   be below 2^31 (SciPy's BLAS takes 32-bit ints).
# - The math and the outputs are those of the Python functions of the same
#   name (blockrnn.block_lstm, ...): TensorFlow 2.21's ops. layout is
#   BRNN_ICFO (LSTMBlockCell, BlockLSTM) or BRNN_IFCO (BlockLSTMV2).
# - Peephole vectors wci, wcf, wco (and their gradients) have H elements and
#   are read/written only when use_peephole is nonzero.
# - lengths: NULL, or B int64 per-row lengths in [0, T] (sequence_length).
# - Gate loops run serially on the calling thread; the GEMMs use SciPy's
#   OpenBLAS and its threads. Safe to call from many threads at once.
# - Returns 0, or -1 if the workspace could not be allocated (outputs are
#   then unspecified).
from libc.stdint cimport int64_t

cdef enum:
    BRNN_ICFO = 0
    BRNN_IFCO = 1

# LSTMBlockCell. IN x [B, I], cs_prev/h_prev [B, H], w [I+H, 4H], wci/wcf/wco [H],
# b [4H]. OUT i, cs, f, o, ci, co, h [B, H].
cdef int brnn_lstm_cell_f32(
    Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const float* x,
    const float* cs_prev, const float* h_prev, const float* w, const float* wci,
    const float* wcf, const float* wco, const float* b, float forget_bias, float cell_clip,
    int use_peephole, float* i, float* cs, float* f, float* o, float* ci, float* co,
    float* h) noexcept nogil
cdef int brnn_lstm_cell_f64(
    Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const double* x,
    const double* cs_prev, const double* h_prev, const double* w, const double* wci,
    const double* wcf, const double* wco, const double* b, double forget_bias,
    double cell_clip, int use_peephole, double* i, double* cs, double* f, double* o,
    double* ci, double* co, double* h) noexcept nogil

# BlockLSTM / BlockLSTMV2. IN x [T, B, I], cs_prev/h_prev [B, H], w [I+H, 4H],
# wci/wcf/wco [H], b [4H]. OUT i, cs, f, o, ci, co, h [T, B, H] (zero for t >= L).
cdef int brnn_block_lstm_f32(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
    const float* x, const float* cs_prev, const float* h_prev, const float* w,
    const float* wci, const float* wcf, const float* wco, const float* b, float forget_bias,
    float cell_clip, int use_peephole, const int64_t* lengths, float* i, float* cs,
    float* f, float* o, float* ci, float* co, float* h) noexcept nogil
cdef int brnn_block_lstm_f64(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
    const double* x, const double* cs_prev, const double* h_prev, const double* w,
    const double* wci, const double* wcf, const double* wco, const double* b,
    double forget_bias, double cell_clip, int use_peephole, const int64_t* lengths,
    double* i, double* cs, double* f, double* o, double* ci, double* co,
    double* h) noexcept nogil

# BlockLSTMGrad / BlockLSTMGradV2. IN as the forward plus its outputs i, cs, f, o,
# ci, co, h and cs_grad, h_grad [T, B, H]. OUT x_grad [T, B, I], cs_prev_grad and
# h_prev_grad [B, H], w_grad [I+H, 4H], wci/wcf/wco_grad [H], b_grad [4H].
cdef int brnn_block_lstm_grad_f32(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
    const float* x, const float* cs_prev, const float* h_prev, const float* w,
    const float* wci, const float* wcf, const float* wco, const float* i, const float* cs,
    const float* f, const float* o, const float* ci, const float* co, const float* h,
    const float* cs_grad, const float* h_grad, int use_peephole, const int64_t* lengths,
    float* x_grad, float* cs_prev_grad, float* h_prev_grad, float* w_grad,
    float* wci_grad, float* wcf_grad, float* wco_grad, float* b_grad) noexcept nogil
cdef int brnn_block_lstm_grad_f64(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
    const double* x, const double* cs_prev, const double* h_prev, const double* w,
    const double* wci, const double* wcf, const double* wco, const double* i,
    const double* cs, const double* f, const double* o, const double* ci,
    const double* co, const double* h, const double* cs_grad, const double* h_grad,
    int use_peephole, const int64_t* lengths, double* x_grad, double* cs_prev_grad,
    double* h_prev_grad, double* w_grad, double* wci_grad, double* wcf_grad,
    double* wco_grad, double* b_grad) noexcept nogil

# GRUBlockCell. IN x [B, I], h_prev [B, H], w_ru [I+H, 2H], w_c [I+H, H], b_ru [2H],
# b_c [H]. OUT r, u, c, h [B, H].
cdef int brnn_gru_cell_f32(
    Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const float* x, const float* h_prev,
    const float* w_ru, const float* w_c, const float* b_ru, const float* b_c, float* r,
    float* u, float* c, float* h) noexcept nogil
cdef int brnn_gru_cell_f64(
    Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const double* x, const double* h_prev,
    const double* w_ru, const double* w_c, const double* b_ru, const double* b_c,
    double* r, double* u, double* c, double* h) noexcept nogil

# block_gru. IN x [T, B, I] and the GRUBlockCell parameters. OUT r, u, c, h [T, B, H].
cdef int brnn_block_gru_f32(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const float* x,
    const float* h_prev, const float* w_ru, const float* w_c, const float* b_ru,
    const float* b_c, const int64_t* lengths, float* r, float* u, float* c,
    float* h) noexcept nogil
cdef int brnn_block_gru_f64(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const double* x,
    const double* h_prev, const double* w_ru, const double* w_c, const double* b_ru,
    const double* b_c, const int64_t* lengths, double* r, double* u, double* c,
    double* h) noexcept nogil

# block_gru_grad. IN x, h_prev, w_ru, w_c, the forward's r, u, c, h and h_grad
# [T, B, H]. OUT x_grad [T, B, I], h_prev_grad [B, H], w_ru_grad [I+H, 2H],
# w_c_grad [I+H, H], b_ru_grad [2H], b_c_grad [H].
cdef int brnn_block_gru_grad_f32(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const float* x,
    const float* h_prev, const float* w_ru, const float* w_c, const float* r,
    const float* u, const float* c, const float* h, const float* h_grad,
    const int64_t* lengths, float* x_grad, float* h_prev_grad, float* w_ru_grad,
    float* w_c_grad, float* b_ru_grad, float* b_c_grad) noexcept nogil
cdef int brnn_block_gru_grad_f64(
    Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const double* x,
    const double* h_prev, const double* w_ru, const double* w_c, const double* r,
    const double* u, const double* c, const double* h, const double* h_grad,
    const int64_t* lengths, double* x_grad, double* h_prev_grad, double* w_ru_grad,
    double* w_c_grad, double* b_ru_grad, double* b_c_grad) noexcept nogil
