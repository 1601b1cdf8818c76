# ---------------------------------------------------------------------------
# C-level API (declared, with its contract, in _kernels.pxd; cimported from
# blockrnn.capi). Each function allocates its workspace, runs the compute
# function with serial gate loops and returns 0, or -1 without memory.
# ---------------------------------------------------------------------------

cdef int api_lstm_cell(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const floating* x,
        const floating* cs_prev, const floating* h_prev, const floating* w,
        const floating* wci, const floating* wcf, const floating* wco, const floating* b,
        floating forget_bias, floating cell_clip, int use_peephole, floating* i_,
        floating* cs, floating* f, floating* o, floating* ci, floating* co,
        floating* h) noexcept nogil:
    cdef floating* ws = <floating*>malloc(lstm_cell_workspace(B, I, H) * sizeof(floating))
    if ws == NULL:
        return -1
    lstm_cell_compute(B, I, H, gate_offsets(layout, H), x, cs_prev, h_prev, w, wci, wcf,
                      wco, b, forget_bias, cell_clip, use_peephole != 0, ws,
                      i_, cs, f, o, ci, co, h, 1)
    free(ws)
    return 0


cdef int api_block_lstm(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x, const floating* cs_prev, const floating* h_prev,
        const floating* w, const floating* wci, const floating* wcf, const floating* wco,
        const floating* b, floating forget_bias, floating cell_clip, int use_peephole,
        const int64_t* lengths, floating* i_, floating* cs, floating* f, floating* o,
        floating* ci, floating* co, floating* h) noexcept nogil:
    cdef floating* g = <floating*>malloc(
        block_lstm_forward_workspace(L, B, H, I, floating is float, 1) * sizeof(floating))
    if g == NULL:
        return -1
    block_lstm_forward_compute(L, T, B, I, H, layout, x, cs_prev, h_prev, w, w + I * 4 * H,
                               tf_weight_strides(H), wci, wcf, wco, b, forget_bias, cell_clip,
                               use_peephole != 0, lengths, False, g, i_, cs, f, o, ci, co, h,
                               1, 1)
    free(g)
    return 0


cdef int api_block_lstm_grad(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const floating* x, const floating* cs_prev, const floating* h_prev,
        const floating* w, const floating* wci, const floating* wcf, const floating* wco,
        const floating* i_, const floating* cs, const floating* f, const floating* o,
        const floating* ci, const floating* co, const floating* h,
        const floating* cs_grad, const floating* h_grad, int use_peephole,
        const int64_t* lengths, floating* x_grad, floating* cs_prev_grad,
        floating* h_prev_grad, floating* w_grad, floating* wci_grad, floating* wcf_grad,
        floating* wco_grad, floating* b_grad) noexcept nogil:
    cdef floating* ws = <floating*>malloc(
        block_lstm_backward_workspace(L, B, H, I, floating is float, 1) * sizeof(floating))
    cdef double* acc = <double*>malloc(lstm_sums_workspace(L, B, H) * sizeof(double))
    if ws == NULL or acc == NULL:
        free(ws)
        free(acc)
        return -1
    block_lstm_backward_compute(L, T, B, I, H, layout, x, cs_prev, h_prev, w, w + I * 4 * H,
                                tf_weight_strides(H), wci, wcf, wco, i_, cs, f, o, ci, co, h,
                                cs_grad, h_grad, use_peephole != 0, lengths, False, ws, acc,
                                x_grad, cs_prev_grad, h_prev_grad, w_grad, w_grad + I * 4 * H,
                                tf_weight_strides(H), wci_grad, wcf_grad, wco_grad, b_grad, 1, 1)
    free(ws)
    free(acc)
    return 0


cdef int api_gru_cell(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const floating* x, const floating* h_prev,
        const floating* w_ru, const floating* w_c, const floating* b_ru,
        const floating* b_c, floating* r, floating* u, floating* c,
        floating* h) noexcept nogil:
    # (calloc: GCC cannot see that gru_cell_compute fills [x, h] before reading it)
    cdef floating* ws = <floating*>calloc(gru_cell_workspace(B, I, H), sizeof(floating))
    if ws == NULL:
        return -1
    gru_cell_compute(B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, ws, r, u, c, h, 1)
    free(ws)
    return 0


cdef int api_block_gru(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x, const floating* h_prev, const floating* w_ru,
        const floating* w_c, const floating* b_ru, const floating* b_c,
        const int64_t* lengths, floating* r, floating* u, floating* c,
        floating* h) noexcept nogil:
    cdef floating* ws = <floating*>malloc(
        block_gru_forward_workspace(L, B, H, I, floating is float, 1) * sizeof(floating))
    if ws == NULL:
        return -1
    block_gru_forward_compute(L, T, B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, lengths, ws,
                              r, u, c, h, 1, 1)
    free(ws)
    return 0


cdef int api_block_gru_grad(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const floating* x, const floating* h_prev, const floating* w_ru,
        const floating* w_c, const floating* r, const floating* u, const floating* c,
        const floating* h, const floating* h_grad, const int64_t* lengths,
        floating* x_grad, floating* h_prev_grad, floating* w_ru_grad, floating* w_c_grad,
        floating* b_ru_grad, floating* b_c_grad) noexcept nogil:
    cdef floating* ws = <floating*>malloc(
        block_gru_backward_workspace(L, B, H, I, floating is float, 1) * sizeof(floating))
    cdef double* acc = <double*>malloc((sums_workspace(L, B, 4 * H, 3 * H) + 1)
                                       * sizeof(double))
    if ws == NULL or acc == NULL:
        free(ws)
        free(acc)
        return -1
    block_gru_backward_compute(L, T, B, I, H, x, h_prev, w_ru, w_c, r, u, c, h, h_grad,
                               lengths, ws, acc, x_grad, h_prev_grad,
                               w_ru_grad, w_c_grad, b_ru_grad, b_c_grad, 1, 1)
    free(ws)
    free(acc)
    return 0



cdef int brnn_lstm_cell_f32(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const float* x,
        const float* cs_prev, const float* h_prev, const float* w, const float* wci,
        const float* wcf, const float* wco, const float* b, float forget_bias,
        float cell_clip, int use_peephole, float* i, float* cs, float* f, float* o,
        float* ci, float* co, float* h) noexcept nogil:
    return api_lstm_cell(B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, i, cs, f, o, ci, co, h)


cdef int brnn_lstm_cell_f64(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout, const double* x,
        const double* cs_prev, const double* h_prev, const double* w, const double* wci,
        const double* wcf, const double* wco, const double* b, double forget_bias,
        double cell_clip, int use_peephole, double* i, double* cs, double* f, double* o,
        double* ci, double* co, double* h) noexcept nogil:
    return api_lstm_cell(B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, i, cs, f, o, ci, co, h)


cdef int brnn_block_lstm_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const float* x, const float* cs_prev, const float* h_prev, const float* w,
        const float* wci, const float* wcf, const float* wco, const float* b,
        float forget_bias, float cell_clip, int use_peephole, const int64_t* lengths,
        float* i, float* cs, float* f, float* o, float* ci, float* co, float* h) noexcept nogil:
    return api_block_lstm(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, lengths, i, cs, f, o, ci, co, h)


cdef int brnn_block_lstm_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const double* x, const double* cs_prev, const double* h_prev, const double* w,
        const double* wci, const double* wcf, const double* wco, const double* b,
        double forget_bias, double cell_clip, int use_peephole, const int64_t* lengths,
        double* i, double* cs, double* f, double* o, double* ci, double* co, double* h) noexcept nogil:
    return api_block_lstm(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco, b,
        forget_bias, cell_clip, use_peephole, lengths, i, cs, f, o, ci, co, h)


cdef int brnn_block_lstm_grad_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const float* x, const float* cs_prev, const float* h_prev, const float* w,
        const float* wci, const float* wcf, const float* wco, const float* i,
        const float* cs, const float* f, const float* o, const float* ci, const float* co,
        const float* h, const float* cs_grad, const float* h_grad, int use_peephole,
        const int64_t* lengths, float* x_grad, float* cs_prev_grad, float* h_prev_grad,
        float* w_grad, float* wci_grad, float* wcf_grad, float* wco_grad, float* b_grad) noexcept nogil:
    return api_block_lstm_grad(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco,
        i, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole, lengths, x_grad, cs_prev_grad,
        h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)


cdef int brnn_block_lstm_grad_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, int layout,
        const double* x, const double* cs_prev, const double* h_prev, const double* w,
        const double* wci, const double* wcf, const double* wco, const double* i,
        const double* cs, const double* f, const double* o, const double* ci,
        const double* co, const double* h, const double* cs_grad, const double* h_grad,
        int use_peephole, const int64_t* lengths, double* x_grad, double* cs_prev_grad,
        double* h_prev_grad, double* w_grad, double* wci_grad, double* wcf_grad,
        double* wco_grad, double* b_grad) noexcept nogil:
    return api_block_lstm_grad(L, T, B, I, H, layout, x, cs_prev, h_prev, w, wci, wcf, wco,
        i, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole, lengths, x_grad, cs_prev_grad,
        h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)


cdef int brnn_gru_cell_f32(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const float* x, const float* h_prev,
        const float* w_ru, const float* w_c, const float* b_ru, const float* b_c, float* r,
        float* u, float* c, float* h) noexcept nogil:
    return api_gru_cell(B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h)


cdef int brnn_gru_cell_f64(
        Py_ssize_t B, Py_ssize_t I, Py_ssize_t H, const double* x, const double* h_prev,
        const double* w_ru, const double* w_c, const double* b_ru, const double* b_c,
        double* r, double* u, double* c, double* h) noexcept nogil:
    return api_gru_cell(B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h)


cdef int brnn_block_gru_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* x, const float* h_prev, const float* w_ru, const float* w_c,
        const float* b_ru, const float* b_c, const int64_t* lengths, float* r, float* u,
        float* c, float* h) noexcept nogil:
    return api_block_gru(L, T, B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, lengths, r, u, c,
                  h)


cdef int brnn_block_gru_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const double* x, const double* h_prev, const double* w_ru, const double* w_c,
        const double* b_ru, const double* b_c, const int64_t* lengths, double* r, double* u,
        double* c, double* h) noexcept nogil:
    return api_block_gru(L, T, B, I, H, x, h_prev, w_ru, w_c, b_ru, b_c, lengths, r, u, c,
                  h)


cdef int brnn_block_gru_grad_f32(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* x, const float* h_prev, const float* w_ru, const float* w_c,
        const float* r, const float* u, const float* c, const float* h, const float* h_grad,
        const int64_t* lengths, float* x_grad, float* h_prev_grad, float* w_ru_grad,
        float* w_c_grad, float* b_ru_grad, float* b_c_grad) noexcept nogil:
    return api_block_gru_grad(L, T, B, I, H, x, h_prev, w_ru, w_c, r, u, c, h, h_grad,
        lengths, x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad, b_c_grad)


cdef int brnn_block_gru_grad_f64(
        Py_ssize_t L, Py_ssize_t T, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const double* x, const double* h_prev, const double* w_ru, const double* w_c,
        const double* r, const double* u, const double* c, const double* h,
        const double* h_grad, const int64_t* lengths, double* x_grad, double* h_prev_grad,
        double* w_ru_grad, double* w_c_grad, double* b_ru_grad, double* b_c_grad) noexcept nogil:
    return api_block_gru_grad(L, T, B, I, H, x, h_prev, w_ru, w_c, r, u, c, h, h_grad,
        lengths, x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad, b_c_grad)
