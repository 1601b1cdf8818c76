# Included by _kernels.pyx: the inference forward (issue 26), a family of its
# own. Weights are packed ONCE, by the constructor of a Packed*Weights object,
# and every forward(x, h0[, c0], lengths) writes only y [T, B, H] and the
# final state(s) [B, H]: no gate outputs. Per step and thread: the
# pre-activations of the thread's cells (x[t] @ W_x and h[t-1] @ W_h, each
# element ONE packed-kernel sum, as the training forwards' packed route), then
# the same gate row functions as the training forwards (include/brnn_lstm.h,
# brnn_gru.h, brnn_gru_reset_after.h) right away, on a [B, 4H] / [B, 3H]
# scratch. So y and the final states equal the training forward's (float32,
# every batch size: at batch 1 the training forward runs the same one-row
# kernel, step_product) bit for bit, at any thread count.
#
# Small batches (B < INFER_HOIST_ROWS) hoist the input projection of all
# steps before the time loop ([L, B, G] floats: full 12-row tiles instead of
# B-row ones), and one row's products run 8 panels at once
# (include/brnn_inference.h: the packed kernel's one row is one FMA chain per
# panel, latency-bound). Measured at T=64, B=1, I=H=256, 1 thread, loaded
# 2-core Zen 4: LSTM 7.6 -> 1.2 ms (the layer's forward 2.1 ms), reset-after
# GRU 5.0 -> 0.83 ms (1.2 ms). The batch-1 steps of the LSTM and the
# reset-after GRU go panel by panel (W_h gate-interleaved:
# brnn_pack_gates_f32): a 16-cell panel's gate columns in one pass, then its
# gate math right away, which overlaps the next panel's reads of W_h from L2
# (the step is bound by that stream; the TF GRU, whose c product reads every
# cell's r * h, keeps the wide layout). Measured at 50,1,128,128, 2-core
# Zen 5, back-to-back calls, median per process, alternated with the build
# before: LSTM with peepholes 77-80 -> 66-68 us on 2 threads, 116-118 ->
# 110-113 on one; reset-after GRU 55-56 -> 51-53 on 2, 81-83 -> 78-81 on one.
#
# Threads: ONE parallel region per call on up to max_threads threads from the
# thread budget (brnn_budget_take), also at batch 1. From 4 rows a thread
# (split_rows) each thread runs every step of its own block of rows, with no
# barrier in the time loop (infer_split_part: a thread that another caller
# needs, or that is behind when thread 0 is done, leaves at the end of a step
# and the caller runs the rest of its rows). Otherwise each thread owns whole
# 16-cell panels (unit_start) of the products; one barrier per step (two for
# the TF GRU, whose c product reads every cell's r * h), and from batch 2 on
# (gates_by_rows) one more after each product, before the gate math, which
# then runs by rows (a barrier within the step: a stall
# there counts as the step's, brnn_barrier_wait_within). The barrier that ends a step
# can shed (brnn_barrier_wait_shed in include/brnn_packed.h): when another
# caller had to be granted a thread beyond the budget, or a thread waited
# over 1 ms for its partner (another process held that core) or found it on
# its own CPU (in a call of long steps: once the waits add up to a third of
# the call's time, INFER_SHORT_STEP_WORK), the call gives its extra threads
# back and thread 0 runs every cell of the remaining steps;
# after the latter, the object runs its calls on one thread for a spell
# (_PackedBase.solo; brnn_solo_start: 4 ms, doubled up to 50 ms while stalls
# recur right after one). The split of cells never changes a bit, so neither
# does shedding.
#
# Conventions as the sequence ops + the layers' _last: row b of y is zero
# from step lengths[b] on; its final state is the state after step
# lengths[b] - 1 (h0/c0 when lengths[b] == 0); steps past L = max(lengths)
# are zeros.

cdef enum:
    # Batches of fewer rows hoist the input projection of all steps out of the
    # time loop (before it, in the same region: each thread its own columns,
    # read back by rows after the first step's barrier within, or by the same
    # thread), as one product of L*B rows: full tiles instead of B-row
    # ones. Its buffer [L, B, G] is allocated only then, and only up to
    # INFER_HOIST_MAX floats.
    INFER_HOIST_ROWS = 12
    INFER_HOIST_MAX = 1 << 22


cdef inline bint infer_hoisted(Py_ssize_t L, Py_ssize_t B, Py_ssize_t G) noexcept nogil:
    """Whether a call hoists its input projection ([L*B, G] floats)."""
    return B < INFER_HOIST_ROWS and L * B * G <= INFER_HOIST_MAX


cdef void infer_inputs(Py_ssize_t rows, Py_ssize_t I, Py_ssize_t H, int nq,
                       const float* x, const float* packed_x, Py_ssize_t stride, float* xall,
                       Py_ssize_t u0, Py_ssize_t u1) noexcept nogil:
    """xall[:, q*H + u0 : q*H + u1] = x @ W_x block q, for the nq blocks
    (xall [rows, nq*H]; block q packed at packed_x + q * stride)."""
    cdef Py_ssize_t q
    if u1 <= u0 or rows == 0:
        return
    for q in range(nq):
        step_product(rows, I, x, I, packed_x + q * stride, u0, u1, False, xall + q * H,
                     nq * H)


cdef enum:
    # Multiply-adds of one step per thread below which a further thread is not
    # asked for: batch 1 takes 2 threads from H = 96 (LSTM and GRU), batch 2
    # and more from H = 64. Measured with batch 1 on the wide one-row kernel,
    # T=64, I=H, fresh processes, quiet 2-core Zen 5 (1 MB L2 per core;
    # median time, 2 threads / 1): LSTM / reset-after GRU at H=64 1.17 / 1.41
    # (so they stay on 1), H=96 0.82 / 0.91, H=128 0.76 / 0.77, H=256
    # 0.44 / 0.65; batch 2 H=128 0.68 / 0.70, batch 4 0.65 / 0.65. (On the
    # panels of 16 columns batch 1 H=128 measured 0.86: then it stayed on 1.)
    # Where other processes keep the cores busy, a call's second thread is
    # time-sliced with them and waits at every step (that made calls 3-35x
    # slower before shedding): the call sheds it (brnn_barrier_wait_shed) and
    # the object then runs on one thread for a while (brnn_solo_*), so only
    # its periodic retries pay. Measured with one busy process on the 2
    # cores, calls in 2 s, 2 threads / 1: LSTM batch 1 H=256 0.97, GRU batch 8
    # H=128 0.84.
    INFER_WORK_PER_THREAD = 12288
    # A call of fewer multiply-adds in all runs on one thread when its object's
    # last call ended more than INFER_IDLE_NS ago (_PackedBase._plan): measured
    # with a 1 ms sleep between calls, T=64, I=H, 2-core Zen 5 VM, median us,
    # 1 thread / 2: reset-after GRU H=128 batch 1 113 / 400 (back to back
    # 103 / 82), LSTM H=256 batch 1 676 / 912 (back to back 650 / 275), LSTM
    # H=128 batch 8 657 / 909 (2^26 multiply-adds); LSTM H=256 batch 4 1288 /
    # 830 (2^27), batch 8 2396 / 1514.
    INFER_IDLE_WORK = 3 << 25
    INFER_IDLE_NS = 200000
    # A call whose step gives each thread more multiply-adds than this (~10 us
    # of work) is patient (brnn_barrier_wait_shed): it sheds for its partner
    # threads only once their waits at its barriers add up to a third of its
    # time, at least 20 ms of it (brnn_patient_sheds), not at a first stall (a
    # wait over 1 ms, or both on one CPU); it still sheds for another caller
    # at once. A stall in a long call is mostly a VM's or the kernel's moment,
    # and finishing on one thread (then a solo spell) costs more: LSTM at
    # 100,64,512,512, 2-core Zen 5 VM, nothing else running, ~48 calls in 3 s,
    # three processes: 3-6 calls shed at their first stall (70-97 ms) and the
    # next one, solo, took 109-115 ms, against 55-57 ms for the rest; on a
    # 2-core Zen 4 VM shedding at the second stall, then at a third within 30
    # ms, still ran 4-6 and 1-2 calls of ~25 on one thread (the bench's median
    # 1.7x ONNX Runtime's). A busy process on the partner's core makes it wait
    # about half the time, and there one thread is faster (Zen 5, same call:
    # 113-114 ms shedding at the second stall, 133-189 ms never shedding). At
    # batch 1 a step is ~1 us: its first stall sheds.
    INFER_SHORT_STEP_WORK = 1 << 20


cdef inline Py_ssize_t infer_step_work(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I,
                                       Py_ssize_t H, Py_ssize_t G) noexcept nogil:
    """Multiply-adds of one step of an inference call over G gate columns:
    B x (H, + I unless the input projection is hoisted) x G."""
    return B * (H + (0 if infer_hoisted(L, B, G) else I)) * G


cdef inline bint infer_patient(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
                               Py_ssize_t G, int threads) noexcept nogil:
    """Whether a call on `threads` threads is patient with a stalled partner:
    patient_with_stalls on its step's multiply-adds (infer_step_work)."""
    return patient_with_stalls(infer_step_work(L, B, I, H, G), threads)


def inference_patient_for(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
                          Py_ssize_t G, int threads):
    """infer_patient (for the tests)."""
    return infer_patient(L, B, I, H, G, threads)


cdef inline int inference_threads(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
                                  Py_ssize_t G, int max_threads,
                                  Py_ssize_t work_per_thread) noexcept nogil:
    """Threads a call asks of the budget: one per work_per_thread multiply-adds
    of a step (B x (H, + I unless hoisted) x G; 0: no limit), at most one per
    16-cell panel, at most max_threads, at least 1."""
    return step_threads(infer_step_work(L, B, I, H, G), max(work_per_thread, 1), H,
                        max_threads)


def inference_threads_for(Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
                          Py_ssize_t G, int max_threads,
                          Py_ssize_t work_per_thread=INFER_WORK_PER_THREAD):
    """inference_threads: the threads an inference call asks of the budget (for
    the tests)."""
    return inference_threads(L, B, I, H, G, max_threads, work_per_thread)


cdef inline int region_end(brnn_barrier* bar, int granted) noexcept nogil:
    """After a call's loop: gives back its threads (region_threads) and
    returns 0, or 1 / 2 if it shed for another caller / for a partner thread
    that was not running."""
    brnn_budget_give(region_threads(bar, granted))
    return 0 if not bar.shed else (2 if bar.slow else 1)


cdef inline bint step_end(brnn_barrier* bar, int nt, int cores, bint patient) noexcept nogil:
    """The shedding barrier that ends a step of nt threads (none for one):
    whether the call goes on with one thread (brnn_barrier_wait_shed)."""
    return nt > 1 and brnn_barrier_wait_shed(bar, nt, cores, patient)


# One inference call's arguments, as its threads read them (lstm_infer_part,
# gru_infer_part, gru_ra_infer_part). Rows b of x, h0, c0, y, h_n, c_n are
# the batch's B rows.
ctypedef struct InferCall:
    Py_ssize_t T, L, B, K, H     # x's steps, steps run (max of lengths), rows, I, H
    const float* packed          # the object's packed blocks (see its class)
    const float* wide            # W_h in batch 1's layout (batch 1), or NULL
    const float* b1              # LSTM b; TF GRU b_ru; reset-after GRU b_ih
    const float* b2              # TF GRU b_c; reset-after GRU b_hh; LSTM: NULL
    GateOffsets off              # LSTM only: gate blocks, peepholes, forget bias, clip
    const float* wci
    const float* wcf
    const float* wco
    float forget_bias, cell_clip
    bint peep
    const float* x               # IN  [T, B, I]
    const float* h0              # IN  [B, H]
    const float* c0              # IN  [B, H] (LSTM; else NULL)
    const int64_t* lengths       # IN  [B] or NULL (then L == T)
    float* ws                    # workspace (lstm_infer_workspace / gru_infer_workspace)
    float* y                     # OUT [T, B, H]
    float* h_n                   # OUT [B, H]
    float* c_n                   # OUT [B, H] (LSTM; else NULL)

ctypedef void (*infer_part_fn)(const InferCall* c, int tid, int nt, brnn_barrier* bar,
                               brnn_barrier* rows_bar, int cores) noexcept nogil
# A family's pieces of a call split by rows (infer_split_part): the hoisted
# input projection of the [L*B] rows [f0, f1), every gate column; step t of
# the batch rows [r0, r1), every cell, on the calling thread alone.
ctypedef void (*infer_inputs_fn)(const InferCall* c, Py_ssize_t f0,
                                 Py_ssize_t f1) noexcept nogil
ctypedef void (*infer_rows_fn)(const InferCall* c, Py_ssize_t t, Py_ssize_t r0,
                               Py_ssize_t r1) noexcept nogil


# One family's functions of a call (set by its class).
ctypedef struct InferFamily:
    infer_part_fn part            # the split by cells (one barrier or more a step)
    infer_inputs_fn inputs        # the split by rows: the hoisted projection
    infer_rows_fn rows            #                    and the steps of some rows
    int nq                        # gate blocks of H columns: 4 (LSTM) or 3 (GRUs)


cdef inline bint last_step(const int64_t* lengths, Py_ssize_t row, Py_ssize_t t,
                           Py_ssize_t L) noexcept nogil:
    """Whether step t is row `row`'s last valid one (its final state)."""
    if lengths == NULL:
        return t == L - 1
    return t == lengths[row] - 1


# ---------------------------------------------------------------------------
# LSTM
# ---------------------------------------------------------------------------

cdef void lstm_infer_step(
        Py_ssize_t t, Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        GateOffsets off, const float* packed, const float* b,
        const float* wci, const float* wcf, const float* wco,
        float forget_bias, float cell_clip, bint peep, const int64_t* lengths,
        const float* xt, const float* h_in, const float* c_in, bint hoisted,
        const float* gates, float* xg, float* g, float* c_out, float* yt,
        float* h_n, float* c_n, Py_ssize_t u0, Py_ssize_t u1, Py_ssize_t r0, Py_ssize_t r1,
        brnn_barrier* rows_bar, int nt, brnn_barrier* step_bar) noexcept nogil:
    """Step t for the cells [u0, u1): xg = x[t] @ W_x (unless hoisted: then xg
    already holds it) and g = h_in @ W_h (gate columns in W's layout, [B, 4H]
    each), then brnn_lstm_infer_row_f32 (the training forward's gate math with
    acc, pre = (xg + g) + b, writing c_out and h = y[t] only); a row's last
    step also writes its final state. With rows_bar, the gate math is that of
    the rows [r0, r1), every cell, after a barrier of the nt threads (within
    the step's barrier step_bar); without, that of the cells [u0, u1), every
    row. With `gates` (batch 1: W_h in the gate-interleaved layout of
    brnn_inference.h), panel by panel: a 16-cell panel's four gate columns in
    one product, then its gate math at once."""
    cdef Py_ssize_t q, r, k, p, c0, nu = u1 - u0, G4 = 4 * H
    cdef Py_ssize_t ps = brnn_packed_size(H, H), psx = brnn_packed_size(I, H)
    cdef float* xr
    cdef float* gr
    cdef float gp[64]   # one panel's gate columns: [4, 16], W's gate order
    if nu > 0 and not hoisted:
        for q in range(4):
            step_product(B, I, xt, I, packed + 4 * ps + q * psx, u0, u1, False,
                         xg + q * H, G4)
    if gates != NULL:   # batch 1: every step t < L = lengths[0] is valid
        if nu <= 0:
            return
        for p in range(u0 // BRNN_NR, (u1 + BRNN_NR - 1) // BRNN_NR):
            c0 = p * BRNN_NR
            row1_gates_product(H, h_in, gates + p * H * 4 * BRNN_NR, 4, gp)
            brnn_lstm_infer_row_f32(
                min(<Py_ssize_t>BRNN_NR, H - c0), gp + off.i // H * BRNN_NR,
                gp + off.c // H * BRNN_NR, gp + off.f // H * BRNN_NR,
                gp + off.o // H * BRNN_NR, xg + off.i + c0, xg + off.c + c0,
                xg + off.f + c0, xg + off.o + c0, b + off.i + c0, b + off.c + c0,
                b + off.f + c0, b + off.o + c0, wci + c0, wcf + c0, wco + c0, forget_bias,
                cell_clip, peep, c_in + c0, c_out + c0, yt + c0)
        if last_step(lengths, 0, t, L):
            memcpy(h_n + u0, yt + u0, nu * sizeof(float))
            memcpy(c_n + u0, c_out + u0, nu * sizeof(float))
        return
    if nu > 0:
        for q in range(4):
            recurrent_product(B, H, h_in, packed + q * ps, False, H, u0, u1, False, g + q * H,
                              G4)
    gate_math_block(rows_bar, nt, step_bar, H, &u0, &u1, &r0, &r1)
    nu = u1 - u0
    if nu <= 0:
        return
    for r in range(r0, r1):
        k = r * H + u0
        if finished(lengths, r, t):   # as lstm_forward_block: zeros
            memset(yt + k, 0, nu * sizeof(float))
            memset(c_out + k, 0, nu * sizeof(float))
            continue
        xr = xg + r * G4 + u0
        gr = g + r * G4 + u0
        brnn_lstm_infer_row_f32(
            nu, gr + off.i, gr + off.c, gr + off.f, gr + off.o, xr + off.i, xr + off.c,
            xr + off.f, xr + off.o, b + off.i + u0, b + off.c + u0, b + off.f + u0,
            b + off.o + u0, wci + u0, wcf + u0, wco + u0, forget_bias, cell_clip, peep,
            c_in + k, c_out + k, yt + k)
        if last_step(lengths, r, t, L):
            memcpy(h_n + k, yt + k, nu * sizeof(float))
            memcpy(c_n + k, c_out + k, nu * sizeof(float))


cdef inline Py_ssize_t lstm_infer_workspace(Py_ssize_t L, Py_ssize_t B,
                                            Py_ssize_t H) noexcept nogil:
    """Floats of lstm_infer_part's workspace: g [B, 4H], c of even and odd steps
    [2, B, H], then xg: [L, B, 4H] if infer_hoisted, else [B, 4H]."""
    return B * 4 * H + 2 * B * H + (L if infer_hoisted(L, B, 4 * H) else 1) * B * 4 * H + 1


cdef void lstm_infer_part(const InferCall* c, int tid, int nt, brnn_barrier* bar,
                          brnn_barrier* rows_bar, int cores) noexcept nogil:
    """Thread tid of nt's share of the float32 LSTM inference forward (see the
    top of this file; run by infer_run): its cells' columns of the hoisted
    input projection, then every step's cells, one barrier per step (bar,
    which can shed: thread 0 then runs every cell) and, by rows
    (gates_by_rows), one more (rows_bar)."""
    cdef Py_ssize_t t, L = c.L, B = c.B, I = c.K, H = c.H, BH = B * H, G4 = 4 * H
    cdef Py_ssize_t ps = brnn_packed_size(H, H), psx = brnn_packed_size(I, H)
    cdef float* g = c.ws
    cdef float* cbuf = g + B * G4        # [2, B, H]: c of even / odd steps
    cdef float* xg = cbuf + 2 * BH
    cdef bint hoisted = infer_hoisted(L, B, G4)
    cdef Py_ssize_t xstep = B * G4 if hoisted else 0
    cdef bint by_rows = c.wide == NULL and gates_by_rows(B, nt)
    cdef bint patient = infer_patient(L, B, I, H, G4, nt)
    cdef Py_ssize_t u0 = unit_start(H, tid, nt), u1 = unit_start(H, tid + 1, nt)
    cdef Py_ssize_t r0 = tid * B // nt if by_rows else 0
    cdef Py_ssize_t r1 = (tid + 1) * B // nt if by_rows else B
    if hoisted:   # each thread its own columns (read back by rows after a barrier)
        infer_inputs(L * B, I, H, 4, c.x, c.packed + 4 * ps, psx, xg, u0, u1)
    for t in range(L):
        lstm_infer_step(t, L, B, I, H, c.off, c.packed, c.b1, c.wci, c.wcf, c.wco,
                        c.forget_bias, c.cell_clip, c.peep, c.lengths, c.x + t * B * I,
                        c.h0 if t == 0 else c.y + (t - 1) * BH,
                        c.c0 if t == 0 else cbuf + ((t - 1) % 2) * BH, hoisted, c.wide,
                        xg + t * xstep, g, cbuf + (t % 2) * BH, c.y + t * BH, c.h_n, c.c_n,
                        u0, u1, r0, r1, rows_bar if nt > 1 and by_rows else NULL, nt, bar)
        if step_end(bar, nt, cores, patient):
            if tid != 0:   # shed (brnn_barrier_wait_shed): thread 0 runs every cell
                break
            nt, u0, u1, r0, r1 = 1, 0, H, 0, B


cdef void lstm_infer_inputs(const InferCall* c, Py_ssize_t f0, Py_ssize_t f1) noexcept nogil:
    """The hoisted input projection of the [L*B] rows [f0, f1) (infer_split_part)."""
    cdef Py_ssize_t H = c.H, G4 = 4 * H
    infer_inputs(f1 - f0, c.K, H, 4, c.x + f0 * c.K, c.packed + 4 * brnn_packed_size(H, H),
                 brnn_packed_size(c.K, H), c.ws + c.B * G4 + 2 * c.B * H + f0 * G4, 0, H)


cdef void lstm_infer_rows(const InferCall* c, Py_ssize_t t, Py_ssize_t r0,
                          Py_ssize_t r1) noexcept nogil:
    """Step t of the rows [r0, r1), every cell, no barrier (infer_split_part):
    lstm_infer_step on those rows' blocks of every array (workspace as
    lstm_infer_part's)."""
    cdef Py_ssize_t B = c.B, H = c.H, BH = B * H, G4 = 4 * H, o = r0 * H
    cdef float* g = c.ws
    cdef float* cbuf = g + B * G4
    cdef float* xg = cbuf + 2 * BH
    cdef bint hoisted = infer_hoisted(c.L, B, G4)
    if hoisted:
        xg += t * B * G4
    lstm_infer_step(t, c.L, r1 - r0, c.K, H, c.off, c.packed, c.b1, c.wci, c.wcf, c.wco,
                    c.forget_bias, c.cell_clip, c.peep, lengths_from(c.lengths, r0),
                    c.x + (t * B + r0) * c.K, (c.h0 if t == 0 else c.y + (t - 1) * BH) + o,
                    (c.c0 if t == 0 else cbuf + ((t - 1) % 2) * BH) + o, hoisted, NULL,
                    xg + r0 * G4, g + r0 * G4, cbuf + (t % 2) * BH + o, c.y + t * BH + o,
                    c.h_n + o, c.c_n + o, 0, H, 0, r1 - r0, NULL, 1, NULL)


# ---------------------------------------------------------------------------
# TF GRU (GRUBlockCell, reset before)
# ---------------------------------------------------------------------------

cdef void gru_infer_half(
        int half, Py_ssize_t t, Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* packed, const float* b_ru, const float* b_c, const int64_t* lengths,
        const float* xt, const float* h_in, bint hoisted, const float* wide, float* xg,
        float* ru, float* rh, float* yt, float* h_n, Py_ssize_t u0, Py_ssize_t u1,
        Py_ssize_t r0, Py_ssize_t r1, brnn_barrier* rows_bar, int nt,
        brnn_barrier* step_bar) noexcept nogil:
    """Half 0 or 1 of step t, as gru_forward_packed_half but into the scratch
    xg [B, 3H] (blocks r, u, c: x[t]'s products, unless hoisted, then the
    gates) and y[t]: the products' columns of the cells [u0, u1), then with
    rows_bar the gate math of the rows [r0, r1), every cell, after a barrier
    of the nt threads (within the step's barrier step_bar); without, that of
    the cells [u0, u1), every row. Packed block q (r, u, c) at packed + q *
    ps: its x rows, then at + psx its h rows; `wide` (or NULL): the h rows'
    three blocks in the wide layout, block q at wide + q * psh."""
    cdef Py_ssize_t psx = brnn_packed_size(I, H), ps = psx + brnn_packed_size(H, H)
    cdef Py_ssize_t psh = brnn_packed_size(H, H)
    cdef bint w1 = wide != NULL
    cdef Py_ssize_t H3 = 3 * H, row, k, kx, nu, q
    if u1 > u0 and half == 0:
        if not hoisted:
            for q in range(3):
                step_product(B, I, xt, I, packed + q * ps, u0, u1, False,
                             xg + q * H, H3)
        recurrent_product(B, H, h_in, wide if w1 else packed + psx, w1, H, u0, u1, False,
                          ru, 2 * H)
        recurrent_product(B, H, h_in, wide + psh if w1 else packed + ps + psx, w1, H, u0, u1,
                          False, ru + H, 2 * H)
    elif u1 > u0:
        recurrent_product(B, H, rh, wide + 2 * psh if w1 else packed + 2 * ps + psx, w1, H,
                          u0, u1, True, xg + 2 * H, H3)
    gate_math_block(rows_bar, nt, step_bar, H, &u0, &u1, &r0, &r1)
    nu = u1 - u0
    if nu <= 0:
        return
    for row in range(r0, r1):
        k = row * H + u0
        kx = row * H3 + u0
        if half == 0:
            brnn_gru_gates_row_f32(nu, ru + row * 2 * H + u0, ru + row * 2 * H + H + u0,
                                   b_ru + u0, b_ru + H + u0, h_in + k, True,
                                   xg + kx, xg + H + kx, rh + k)
            continue
        if finished(lengths, row, t):
            memset(yt + k, 0, nu * sizeof(float))
            continue
        brnn_gru_output_row_f32(nu, b_c + u0, h_in + k, xg + H + kx, xg + 2 * H + kx, yt + k)
        if last_step(lengths, row, t, L):
            memcpy(h_n + k, yt + k, nu * sizeof(float))


cdef inline Py_ssize_t gru_infer_workspace(Py_ssize_t L, Py_ssize_t B,
                                           Py_ssize_t H) noexcept nogil:
    """Floats of gru_infer_part's and gru_ra_infer_part's workspace: 4 [B, H] (ru and rh,
    or g [B, 3H] and hn) then xg: [L, B, 3H] if infer_hoisted, else [B, 3H]."""
    return 4 * B * H + (L if infer_hoisted(L, B, 3 * H) else 1) * B * 3 * H + 1


cdef void gru_infer_part(const InferCall* c, int tid, int nt, brnn_barrier* bar,
                         brnn_barrier* rows_bar, int cores) noexcept nogil:
    """Thread tid of nt's share of the float32 TF-GRU inference forward, as
    lstm_infer_part: two barriers per step (the c product reads every cell's
    r * h[t-1]), and by rows one more after each product."""
    cdef Py_ssize_t t, L = c.L, B = c.B, I = c.K, H = c.H, BH = B * H
    cdef Py_ssize_t psx = brnn_packed_size(I, H), ps = psx + brnn_packed_size(H, H)
    cdef float* ru = c.ws
    cdef float* rh = c.ws + 2 * BH
    cdef float* xg = rh + 2 * BH
    cdef bint hoisted = infer_hoisted(L, B, 3 * H)
    cdef Py_ssize_t xstep = B * 3 * H if hoisted else 0
    cdef bint by_rows = gates_by_rows(B, nt)
    cdef bint patient = infer_patient(L, B, I, H, 3 * H, nt)
    cdef Py_ssize_t u0 = unit_start(H, tid, nt), u1 = unit_start(H, tid + 1, nt)
    cdef Py_ssize_t r0 = tid * B // nt if by_rows else 0
    cdef Py_ssize_t r1 = (tid + 1) * B // nt if by_rows else B
    cdef int half
    if hoisted:   # each thread its own columns (read back by rows after a barrier)
        infer_inputs(L * B, I, H, 3, c.x, c.packed, ps, xg, u0, u1)
    for t in range(L):
        for half in range(2):
            gru_infer_half(half, t, L, B, I, H, c.packed, c.b1, c.b2, c.lengths,
                           c.x + t * B * I, c.h0 if t == 0 else c.y + (t - 1) * BH, hoisted,
                           c.wide, xg + t * xstep, ru, rh, c.y + t * BH, c.h_n, u0, u1, r0, r1,
                           rows_bar if nt > 1 and by_rows else NULL, nt, bar)
            if half == 0 and nt > 1:
                brnn_barrier_wait(bar, nt)
        if step_end(bar, nt, cores, patient):
            if tid != 0:   # shed (brnn_barrier_wait_shed): thread 0 runs every cell
                break
            nt, u0, u1, r0, r1 = 1, 0, H, 0, B


cdef void gru_infer_inputs(const InferCall* c, Py_ssize_t f0, Py_ssize_t f1) noexcept nogil:
    """The hoisted input projection of the [L*B] rows [f0, f1) (infer_split_part)."""
    cdef Py_ssize_t H = c.H
    infer_inputs(f1 - f0, c.K, H, 3, c.x + f0 * c.K, c.packed,
                 brnn_packed_size(c.K, H) + brnn_packed_size(H, H),
                 c.ws + 4 * c.B * H + f0 * 3 * H, 0, H)


cdef void gru_infer_rows(const InferCall* c, Py_ssize_t t, Py_ssize_t r0,
                         Py_ssize_t r1) noexcept nogil:
    """Step t of the rows [r0, r1), every cell, no barrier (infer_split_part):
    both halves of gru_infer_half on those rows (workspace as gru_infer_part's)."""
    cdef Py_ssize_t B = c.B, H = c.H, BH = B * H, o = r0 * H
    cdef float* ru = c.ws
    cdef float* rh = c.ws + 2 * BH
    cdef float* xg = rh + 2 * BH
    cdef bint hoisted = infer_hoisted(c.L, B, 3 * H)
    cdef int half
    if hoisted:
        xg += t * B * 3 * H
    for half in range(2):
        gru_infer_half(half, t, c.L, r1 - r0, c.K, H, c.packed, c.b1, c.b2,
                       lengths_from(c.lengths, r0), c.x + (t * B + r0) * c.K,
                       (c.h0 if t == 0 else c.y + (t - 1) * BH) + o, hoisted, NULL,
                       xg + 3 * o, ru + 2 * o, rh + o, c.y + t * BH + o, c.h_n + o, 0, H,
                       0, r1 - r0, NULL, 1, NULL)


# ---------------------------------------------------------------------------
# Reset-after GRU (nn.GRU)
# ---------------------------------------------------------------------------

cdef void gru_ra_infer_step(
        Py_ssize_t t, Py_ssize_t L, Py_ssize_t B, Py_ssize_t I, Py_ssize_t H,
        const float* packed, const float* b_ih, const float* b_hh, const int64_t* lengths,
        const float* xt, const float* h_in, bint hoisted, const float* gates, float* xg,
        float* g, float* hn, float* yt, float* h_n, Py_ssize_t u0, Py_ssize_t u1,
        Py_ssize_t r0, Py_ssize_t r1, brnn_barrier* rows_bar, int nt,
        brnn_barrier* step_bar) noexcept nogil:
    """Step t for the cells [u0, u1): xg = x[t] @ w_ih^T (unless hoisted),
    g = h_in @ w_hh^T ([B, 3H] each, blocks r, z, n), then
    brnn_gru_ra_forward_row_f32 into y[t], by rows after a barrier if
    rows_bar, as lstm_infer_step. With `gates` (batch 1: w_hh^T
    gate-interleaved, brnn_inference.h), panel by panel as lstm_infer_step."""
    cdef Py_ssize_t q, row, k, p, c0, nu = u1 - u0, H3 = 3 * H
    cdef Py_ssize_t ps = brnn_packed_size(H, H), psx = brnn_packed_size(I, H)
    cdef float* xr
    cdef float* gr
    cdef float gp[48]   # one panel's gate columns: [3, 16], r, z, n
    if nu > 0 and not hoisted:
        for q in range(3):
            step_product(B, I, xt, I, packed + 3 * ps + q * psx, u0, u1, False,
                         xg + q * H, H3)
    if gates != NULL:   # batch 1: every step t < L = lengths[0] is valid
        if nu <= 0:
            return
        for p in range(u0 // BRNN_NR, (u1 + BRNN_NR - 1) // BRNN_NR):
            c0 = p * BRNN_NR
            row1_gates_product(H, h_in, gates + p * H * 3 * BRNN_NR, 3, gp)
            brnn_gru_ra_forward_row_f32(
                min(<Py_ssize_t>BRNN_NR, H - c0), gp, gp + BRNN_NR, gp + 2 * BRNN_NR,
                b_ih + c0, b_ih + H + c0, b_ih + 2 * H + c0, b_hh + c0, b_hh + H + c0,
                b_hh + 2 * H + c0, h_in + c0, xg + c0, xg + H + c0, xg + 2 * H + c0,
                hn + c0, yt + c0)
        if last_step(lengths, 0, t, L):
            memcpy(h_n + u0, yt + u0, nu * sizeof(float))
        return
    if nu > 0:
        for q in range(3):
            recurrent_product(B, H, h_in, packed + q * ps, False, H, u0, u1, False, g + q * H,
                              H3)
    gate_math_block(rows_bar, nt, step_bar, H, &u0, &u1, &r0, &r1)
    nu = u1 - u0
    if nu <= 0:
        return
    for row in range(r0, r1):
        k = row * H + u0
        if finished(lengths, row, t):
            memset(yt + k, 0, nu * sizeof(float))
            continue
        xr = xg + row * H3 + u0
        gr = g + row * H3 + u0
        brnn_gru_ra_forward_row_f32(
            nu, gr, gr + H, gr + 2 * H, b_ih + u0, b_ih + H + u0, b_ih + 2 * H + u0,
            b_hh + u0, b_hh + H + u0, b_hh + 2 * H + u0, h_in + k,
            xr, xr + H, xr + 2 * H, hn + k, yt + k)
        if last_step(lengths, row, t, L):
            memcpy(h_n + k, yt + k, nu * sizeof(float))


cdef void gru_ra_infer_part(const InferCall* c, int tid, int nt, brnn_barrier* bar,
                            brnn_barrier* rows_bar, int cores) noexcept nogil:
    """Thread tid of nt's share of the float32 reset-after GRU inference
    forward, as lstm_infer_part: one barrier per step (two by rows)."""
    cdef Py_ssize_t t, L = c.L, B = c.B, I = c.K, H = c.H, BH = B * H
    cdef Py_ssize_t ps = brnn_packed_size(H, H), psx = brnn_packed_size(I, H)
    cdef float* g = c.ws
    cdef float* hn = g + 3 * BH
    cdef float* xg = hn + BH
    cdef bint hoisted = infer_hoisted(L, B, 3 * H)
    cdef Py_ssize_t xstep = B * 3 * H if hoisted else 0
    cdef bint by_rows = c.wide == NULL and gates_by_rows(B, nt)
    cdef bint patient = infer_patient(L, B, I, H, 3 * H, nt)
    cdef Py_ssize_t u0 = unit_start(H, tid, nt), u1 = unit_start(H, tid + 1, nt)
    cdef Py_ssize_t r0 = tid * B // nt if by_rows else 0
    cdef Py_ssize_t r1 = (tid + 1) * B // nt if by_rows else B
    if hoisted:
        infer_inputs(L * B, I, H, 3, c.x, c.packed + 3 * ps, psx, xg, u0, u1)
    for t in range(L):
        gru_ra_infer_step(t, L, B, I, H, c.packed, c.b1, c.b2, c.lengths, c.x + t * B * I,
                          c.h0 if t == 0 else c.y + (t - 1) * BH, hoisted, c.wide,
                          xg + t * xstep, g, hn, c.y + t * BH, c.h_n, u0, u1, r0, r1,
                          rows_bar if nt > 1 and by_rows else NULL, nt, bar)
        if step_end(bar, nt, cores, patient):
            if tid != 0:   # shed (brnn_barrier_wait_shed): thread 0 runs every cell
                break
            nt, u0, u1, r0, r1 = 1, 0, H, 0, B


cdef void gru_ra_infer_inputs(const InferCall* c, Py_ssize_t f0, Py_ssize_t f1) noexcept nogil:
    """The hoisted input projection of the [L*B] rows [f0, f1) (infer_split_part)."""
    cdef Py_ssize_t H = c.H
    infer_inputs(f1 - f0, c.K, H, 3, c.x + f0 * c.K, c.packed + 3 * brnn_packed_size(H, H),
                 brnn_packed_size(c.K, H), c.ws + 4 * c.B * H + f0 * 3 * H, 0, H)


cdef void gru_ra_infer_rows(const InferCall* c, Py_ssize_t t, Py_ssize_t r0,
                            Py_ssize_t r1) noexcept nogil:
    """Step t of the rows [r0, r1), every cell, no barrier (infer_split_part):
    gru_ra_infer_step on those rows (workspace as gru_ra_infer_part's)."""
    cdef Py_ssize_t B = c.B, H = c.H, BH = B * H, o = r0 * H
    cdef float* g = c.ws
    cdef float* hn = g + 3 * BH
    cdef float* xg = hn + BH
    cdef bint hoisted = infer_hoisted(c.L, B, 3 * H)
    if hoisted:
        xg += t * B * 3 * H
    gru_ra_infer_step(t, c.L, r1 - r0, c.K, H, c.packed, c.b1, c.b2,
                      lengths_from(c.lengths, r0), c.x + (t * B + r0) * c.K,
                      (c.h0 if t == 0 else c.y + (t - 1) * BH) + o, hoisted, NULL, xg + 3 * o,
                      g + 3 * o, hn + o, c.y + t * BH + o, c.h_n + o, 0, H, 0, r1 - r0, NULL,
                      1, NULL)


# ---------------------------------------------------------------------------
# Running a call: one region (infer_run)
# ---------------------------------------------------------------------------

cdef void infer_split_part(const InferCall* c, const InferFamily* fam, int tid, int nt,
                           brnn_barrier* bar, RowSplit* sp, int cores) noexcept nogil:
    """Thread tid of nt's share of a call split by rows: the hoisted input
    projection of its block of the [L*B] rows (then one barrier: a step reads
    every thread's block), then every step of its batch rows [B*tid/nt,
    B*(tid+1)/nt). Every row's steps run the same code whichever thread runs
    them, so the split changes no bit. A thread other than 0 leaves at the end
    of a step when another caller needs a thread or thread 0 is done
    (rows_leave), and the caller runs the rest of its rows' steps after the
    region (infer_run)."""
    cdef Py_ssize_t t, L = c.L, B = c.B
    cdef Py_ssize_t r0 = tid * B // nt, r1 = (tid + 1) * B // nt
    if infer_hoisted(L, B, fam.nq * c.H):
        fam.inputs(c, tid * L * B // nt, (tid + 1) * L * B // nt)
        brnn_barrier_wait(bar, nt)
    for t in range(L):
        fam.rows(c, t, r0, r1)
        if t + 1 < L and rows_leave(sp, tid, cores):
            rows_done(sp, tid, t + 1)
            return
    rows_done(sp, tid, L)


cdef int infer_run(const InferFamily* fam, const InferCall* c, int want,
                   int max_threads) noexcept nogil:
    """One inference call: h_n (and c_n) start as h0 (c0: a row of length 0
    keeps them), then the part of each of up to `want` threads from the budget
    (no OpenMP region at all on one: cheaper, and safe after fork): split by
    rows (split_rows) or by cells (fam.part); then the steps past L are
    zeros. Returns 0, or 1 / 2 if it shed for another caller / for a partner
    thread that was not running (region_end)."""
    cdef int tid = 0, k = 0, granted, cores = brnn_omp_get_num_procs()
    cdef brnn_barrier bar, rows_bar
    cdef RowSplit sp
    cdef Py_ssize_t t = 0, BH = c.B * c.H
    cdef int shed = 0
    memset(&bar, 0, sizeof(bar))
    memset(&rows_bar, 0, sizeof(rows_bar))
    memcpy(c.h_n, c.h0, BH * sizeof(float))
    if c.c_n != NULL:
        memcpy(c.c_n, c.c0, BH * sizeof(float))
    granted = brnn_budget_take(want, max_threads)
    if split_rows(c.B, granted):
        memset(&sp, 0, sizeof(sp))
        with parallel(num_threads=granted):
            tid = brnn_omp_get_thread_num()
            infer_split_part(c, fam, tid, brnn_omp_get_num_threads(), &bar, &sp, cores)
        for k in range(1, sp.nt):   # the steps left by threads that left early
            for t in range(sp.resume[k], c.L):
                fam.rows(c, t, k * c.B // sp.nt, (k + 1) * c.B // sp.nt)
        brnn_budget_give(granted - sp.given)
        shed = 1 if sp.over else 0
    else:
        if granted == 1:
            fam.part(c, 0, 1, &bar, &rows_bar, cores)
        else:
            with parallel(num_threads=granted):
                tid = brnn_omp_get_thread_num()
                fam.part(c, tid, brnn_omp_get_num_threads(), &bar, &rows_bar, cores)
        shed = region_end(&bar, granted)
    memset(c.y + c.L * BH, 0, (c.T - c.L) * BH * sizeof(float))
    return shed


# ---------------------------------------------------------------------------
# The packed-weight objects
# ---------------------------------------------------------------------------

cdef object _f32_array(str where, str name, value, tuple shape):
    """value as a C-contiguous float32 array of `shape` (None entries free):
    float32 as is, float16 converted exactly (float16 is computed in float32,
    as the ops do); ValueError/TypeError naming the argument otherwise."""
    arr = np.asarray(value)
    if arr.dtype.newbyteorder("=") not in (np.float32, np.float16):   # any byte order
        raise TypeError(f"{where}: {name} must have dtype float32 (or float16), "
                        f"got {arr.dtype}")
    if arr.ndim != len(shape) or any(s is not None and s != a
                                     for s, a in zip(shape, arr.shape)):
        want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + \
            ("," if len(shape) == 1 else "") + ")"
        raise ValueError(f"{where}: {name} must have shape {want}, got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=np.float32)


cdef object _weight(str where, str name, value):
    """A 2-D float32 weight (any strides, not copied), or the float32 copy of a
    float16 or non-native-order one."""
    arr = np.asarray(value)
    if arr.dtype.newbyteorder("=") in (np.float16, np.float32) and arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    if arr.dtype != np.float32 or arr.ndim != 2:
        raise TypeError(f"{where}: {name} must be a 2-D float32 (or float16) array, got "
                        f"{arr.dtype} of shape {arr.shape}")
    return arr


cdef object _lengths_array(str where, lengths, Py_ssize_t B, Py_ssize_t T):
    if lengths is None:
        return None
    arr = np.asarray(lengths)
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        raise TypeError(f"{where}: sequence_length must be an integer array of shape "
                        f"({B},), got dtype {arr.dtype}")
    if arr.shape != (B,):
        raise ValueError(f"{where}: sequence_length must have shape ({B},), got {arr.shape}")
    if B and (arr.min() < 0 or arr.max() > T):
        raise ValueError(f"{where}: sequence_length must be in [0, {T}], got values in "
                         f"[{arr.min()}, {arr.max()}]")
    return np.ascontiguousarray(arr, dtype=np.int64)


cdef void pack_blocks(Py_ssize_t K, Py_ssize_t H, int nq, const float[:, :] w,
                      bint rows_are_gates, float* dst, bint wide=False) noexcept nogil:
    """Pack nq gate blocks of H columns of W [K, nq*H] (view `w` is W itself,
    or W^T [nq*H, K] if rows_are_gates: nn.LSTM / nn.GRU's layout) at
    dst + q * brnn_packed_size(K, H): as panels, or in the wide layout of the
    one-row kernel if `wide` (pack_recurrent)."""
    cdef Py_ssize_t q, s0 = w.strides[0] // 4, s1 = w.strides[1] // 4
    cdef Py_ssize_t ps = brnn_packed_size(K, H)
    if K == 0:
        return
    for q in range(nq):
        if rows_are_gates:   # W(k, n) = w[q*H + n, k]
            pack_recurrent(K, H, &w[q * H, 0], s1, s0, wide, dst + q * ps)
        else:                # W(k, n) = w[k, q*H + n]
            pack_recurrent(K, H, &w[0, q * H], s0, s1, wide, dst + q * ps)


cdef object _aligned_floats(Py_ssize_t n):
    """n uninitialised float32, the first on a 64-byte boundary (a view into a
    buffer PACKED_ALIGN_PAD floats longer): see align64."""
    buf = np.empty(n + PACKED_ALIGN_PAD, np.float32)
    cdef size_t addr = <size_t>cnp.PyArray_DATA(<cnp.ndarray>buf)
    cdef Py_ssize_t skip = <Py_ssize_t>(<size_t>align64(<float*>addr) - addr) // 4
    return buf[skip:skip + n]


cdef inline float* fdata(arr):
    """The data of a C-contiguous float32 ndarray (cheaper than a memoryview)."""
    return <float*>cnp.PyArray_DATA(<cnp.ndarray>arr)


cdef inline const int64_t* lengths_data(lens):
    if lens is None:
        return NULL
    return <const int64_t*>cnp.PyArray_DATA(<cnp.ndarray>lens)


cdef inline float* new_floats(Py_ssize_t n) except NULL:
    """A workspace of n floats (PyMem_RawFree it), or MemoryError."""
    cdef float* p = <float*>PyMem_RawMalloc(n * sizeof(float))
    if p == NULL:
        raise MemoryError(f"cannot allocate an inference workspace of {n} floats")
    return p


cdef inline object new_f32(Py_ssize_t a, Py_ssize_t b, Py_ssize_t c=-1):
    """An uninitialised C-contiguous float32 array (a, b) or (a, b, c)."""
    cdef cnp.npy_intp dims[3]
    dims[0], dims[1], dims[2] = a, b, c
    return cnp.PyArray_EMPTY(2 if c < 0 else 3, dims, cnp.NPY_FLOAT32, 0)


cdef inline object new_f32_rows(Py_ssize_t T, Py_ssize_t B, Py_ssize_t H, bint aligned):
    """y [T, B, H] of an inference call; if `aligned` (the call runs on several
    threads), its data starts on a 64-byte boundary. The threads write
    neighbouring 16-cell panels of every row of y and of the workspace (also
    aligned): with H a multiple of 16, their boundaries are then cache-line
    boundaries, else a line holding both threads' cells is written by both at
    every step (false sharing). Measured at T=64, B=8, I=H=128 on 2 threads,
    2-core Zen 5, fresh processes alternated (16 and 11 of them), median ms
    per call: reset-after GRU 0.60 -> 0.45, LSTM 0.72 -> 0.56. (Giving the
    barrier a cache line of its own measured no different.)"""
    if not aligned:
        return new_f32(T, B, H)
    return _aligned_floats(T * B * H).reshape(T, B, H)


cdef inline const float* state_data(arr, const float* zeros):
    """The data of an initial state, or `zeros` (B x H zeros) for None."""
    return zeros if arr is None else fdata(arr)


# The rules of _PackedBase._plan, in the order it tries them, and their names
# (last_plan).
cdef enum PlanRule:
    PLAN_SIZE = 0     # the thread rule alone (inference_threads)
    PLAN_SOLO = 1     # a solo spell: one thread
    PLAN_IDLE = 2     # after an idle spell: one thread
    PLAN_PACE = 3     # what small calls measured (brnn_pace_plan)
PLAN_NAMES = {PLAN_SIZE: "size", PLAN_SOLO: "solo", PLAN_IDLE: "idle", PLAN_PACE: "pace"}


ctypedef struct CallPlan:
    int threads       # what the call asks of the budget
    int paced         # -1: not timed for the pace; 0: asked for one thread; 1: for more
    long long start   # monotonic ns before the compiled call (when paced)
    Py_ssize_t work   # the call's multiply-adds: L*B*(I+H)*G


cdef class _PackedBase:
    """What every packed-weight object shares: sizes, the packed copy, the
    number of packings it did (always 1: counted to test that forward never
    repacks), the thread limit."""
    cdef readonly Py_ssize_t input_size, hidden_size
    cdef readonly int packings
    cdef float[::1] packed
    # The recurrent weight once more, in the layout batch-1 calls read
    # (include/brnn_inference.h): its gate blocks in the wide layout of the
    # one-row kernel (GRU objects), or gate-interleaved for the fused step
    # (PackedLSTMWeights). Where this CPU has no such kernel (portable), one
    # unused float.
    cdef float[::1] wide
    cdef float[::1] bias
    cdef readonly Py_ssize_t work_per_thread   # see inference_threads
    # Calls run on one thread until solo_spell.until (monotonic ns; 0: never): a spell
    # set when a call shed because a partner thread was not running
    # (brnn_barrier_wait_shed; brnn_solo_start sets its length).
    cdef brnn_solo solo_spell
    cdef int shed_calls
    # Monotonic ns of the end of the last call (0: none), and how long after it
    # a small call runs on one thread (0: never, and no pace); see _plan.
    cdef long long last_end
    cdef readonly long long idle_ns
    # What small calls measured on one thread and on more (brnn_pace); see _plan.
    cdef brnn_pace pace
    # The threads the last call asked of the budget (after _plan; it may have
    # been granted fewer), and which rule of _plan chose them. For the tests,
    # and for a user who wonders.
    cdef readonly int last_threads
    cdef PlanRule last_rule
    # The family: its functions of a call (InferFamily), its gate columns (4H, 3H).
    cdef InferFamily family
    cdef Py_ssize_t gate_cols

    @property
    def solo(self):
        """Whether calls run on one thread now: a call found a partner thread
        not running (another process held its core) within the last spell
        (4 ms, doubled up to 50 ms while it happens again right after one)."""
        return bool(brnn_solo_now(&self.solo_spell))

    cdef inline CallPlan _plan(self, Py_ssize_t L, Py_ssize_t B, Py_ssize_t G,
                               int max_threads) noexcept nogil:
        """The threads a call of L steps, B rows and G gate columns asks for,
        from the thread rule's `want` (inference_threads): one while the
        object is solo; for a small call (less than INFER_IDLE_WORK
        multiply-adds; idle_ns > 0), one when the object's last call ended
        more than idle_ns ago (brnn_idle_for: its partner thread's core is
        likely halted, and waking it costs more than a second thread saves),
        else what the object's small calls measured faster, one thread or
        `want` (brnn_pace_plan; a timed call's time goes into the means)."""
        cdef CallPlan plan
        cdef int choice
        cdef Py_ssize_t I = self.input_size, H = self.hidden_size, work = L * B * (I + H) * G
        cdef int want = inference_threads(L, B, I, H, G, max_threads, self.work_per_thread)
        plan.threads, plan.paced, plan.start, plan.work = want, -1, 0, work
        self.last_rule = PLAN_SIZE
        if want > 1 and brnn_solo_now(&self.solo_spell):
            plan.threads, self.last_rule = 1, PLAN_SOLO
            brnn_pace_idle(&self.pace)   # the next several-thread call starts a run
        elif want > 1 and self.idle_ns > 0 and work < INFER_IDLE_WORK:
            if brnn_idle_for(&self.last_end, self.idle_ns):
                plan.threads, self.last_rule = 1, PLAN_IDLE
                brnn_pace_idle(&self.pace)
            else:
                self.last_rule = PLAN_PACE
                plan.start = brnn_now_ns()
                choice = brnn_pace_plan(&self.pace, plan.start)
                plan.threads = want if choice & BRNN_PACE_MANY else 1
                if choice & BRNN_PACE_TIMED:
                    plan.paced = 1 if choice & BRNN_PACE_MANY else 0
        self.last_threads = plan.threads
        return plan

    @property
    def last_plan(self):
        """Which rule of _plan chose the last call's threads: "size" (the
        thread rule alone), "solo" (a solo spell), "idle" (after an idle
        spell) or "pace" (what small calls measured; brnn_pace_plan)."""
        return PLAN_NAMES[self.last_rule]

    @property
    def pace_fs_per_mac(self):
        """(one thread, several): the mean femtoseconds per multiply-add that
        this object's small calls measured asking for one thread and for more
        (0: none yet); see brnn_pace in include/brnn_packed.h."""
        return (self.pace.fs_per_mac[0], self.pace.fs_per_mac[1])

    def _set_pace(self, long long one, long long many, long long retry_in_ns=10**12):
        """For the tests: set the pace's means, restart its probe count, no run
        of several-thread calls, the next try in retry_in_ns, no solo spell."""
        self.pace.fs_per_mac[0], self.pace.fs_per_mac[1], self.pace.calls = one, many, 0
        self.pace.streak, self.pace.after_one = 0, 0
        self.pace.retry_at = brnn_now_ns() + retry_in_ns
        self.solo_spell.until, self.solo_spell.spell = 0, 0

    @property
    def sheds(self):
        """Calls that gave their extra threads back before their last step
        (brnn_barrier_wait_shed: another caller needed one, or a partner
        thread was not running)."""
        return brnn_atomic_load(&self.shed_calls)

    cdef inline void _ran(self, CallPlan plan, int shed) noexcept nogil:
        """After a call planned by _plan: shed is the loop's answer (0: kept its
        threads, 1: shed for another caller, 2: shed for a partner that was not
        running). A paced call's time goes into the pace, unless it shed for a
        partner (the solo rule takes over)."""
        brnn_mark_now(&self.last_end)
        if plan.paced >= 0 and shed != 2:
            brnn_pace_record(&self.pace, plan.paced, self.last_end - plan.start, plan.work)
        if shed:
            brnn_atomic_add(&self.shed_calls, 1)
        if shed == 2:
            brnn_solo_start(&self.solo_spell)

    @property
    def nbytes(self):
        """Bytes of the packed weights (panels, and the recurrent weight again
        in batch 1's layout) and bias this object holds."""
        return (self.packed.shape[0] + self.wide.shape[0] + self.bias.shape[0]) * 4

    cdef void _pack_wide(self, Py_ssize_t nq, const float[:, :] w_h, bint rows_are_gates):
        """self.wide: the nq gate blocks of W_h [H, nq*H] (or its transpose if
        rows_are_gates) in the wide layout, if this CPU has the kernel."""
        cdef Py_ssize_t H = self.hidden_size
        self.wide = _aligned_floats(nq * brnn_packed_size(H, H) + 1 if row1_wide else 1)
        if row1_wide:
            with nogil:
                pack_blocks(H, H, <int>nq, w_h, rows_are_gates, &self.wide[0], True)

    cdef void _pack_gates(self, int nq, const float[:, :] w_h, bint rows_are_gates):
        """self.wide: W_h [H, nq*H] (or its transpose if rows_are_gates)
        gate-interleaved for the fused batch-1 step (brnn_pack_gates_f32), if
        this CPU has its kernel."""
        cdef Py_ssize_t H = self.hidden_size
        cdef Py_ssize_t sk = w_h.strides[1 if rows_are_gates else 0] // 4
        cdef Py_ssize_t sn = w_h.strides[0 if rows_are_gates else 1] // 4
        self.wide = _aligned_floats(nq * brnn_packed_size(H, H) + 1
                                    if row1_gates_product != NULL else 1)
        if row1_gates_product != NULL:
            with nogil:
                brnn_pack_gates_f32(H, H, nq, &w_h[0, 0], sk, sn, &self.wide[0])

    cdef inline const float* _wide_for(self, Py_ssize_t B) noexcept:
        """Batch 1's copy of W_h for a call of B rows (batch 1 only, where this
        CPU has its kernel), or NULL."""
        return &self.wide[0] if B == 1 and self.wide.shape[0] > 1 else NULL

    @property
    def packed_address(self):
        """Address of the packed copy (for tests: it never changes)."""
        return <size_t>&self.packed[0]

    cdef tuple _prepare(self, str where, x, Py_ssize_t nstates, states, sequence_length):
        """Checked x [T, B, I] (float32, C-contiguous), states [B, H] each (None
        stays None: the forward reads zeros), lengths, L and x's dtype."""
        if (type(x) is np.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>x) == cnp.NPY_FLOAT32
                and cnp.PyArray_NDIM(<cnp.ndarray>x) == 3
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x)
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>x)
                and x.shape[2] == self.input_size):   # the common call
            xa, xd = x, x.dtype
        else:
            xd = np.asarray(x).dtype.newbyteorder("=")
            xa = _f32_array(where, "x", x, (None, None, self.input_size))
        cdef Py_ssize_t T = xa.shape[0], B = xa.shape[1], H = self.hidden_size
        out = [xa]
        names = ("h0", "c0")
        for k in range(nstates):
            s = states[k]
            if s is not None and np.asarray(s).dtype.newbyteorder("=") != xd:
                raise TypeError(f"{where}: {names[k]} must have x's dtype {xd}, got "
                                f"{np.asarray(s).dtype}")
            out.append(None if s is None else _f32_array(where, names[k], s, (B, H)))
        lens = _lengths_array(where, sequence_length, B, T)
        L = T if lens is None or B == 0 else min(T, int(lens.max()))
        out.append(lens)
        out.append(L)
        out.append(xd)
        return tuple(out)

    cdef Py_ssize_t _workspace(self, Py_ssize_t L, Py_ssize_t B) noexcept nogil:
        """Floats of the family's workspace for L steps of B rows."""
        return 0

    cdef void _fill(self, InferCall* c):
        """The family's fields of a call: weights, biases, gate layout."""
        pass

    cdef tuple _forward(self, str where, x, tuple states, sequence_length, max_threads):
        """The forward of every family: y [T, B, H] and the final states [B, H]
        (one per entry of `states`: h0, or h0 and c0) of x [T, B, I]."""
        cdef Py_ssize_t ns = len(states)
        prepared = self._prepare(where, x, ns, states, sequence_length)
        xa, s0 = prepared[0], prepared[1:1 + ns]
        lens, L, xd = prepared[1 + ns], prepared[2 + ns], prepared[3 + ns]
        cdef int nt = _threads(where, max_threads)
        cdef Py_ssize_t T = xa.shape[0], B = xa.shape[1], H = self.hidden_size, L_ = L
        finals = [new_f32(B, H) for _ in range(ns)]
        if B == 0 or T == 0:
            for f, s in zip(finals, s0):
                f[...] = 0 if s is None else s
            return _stored(xd, (new_f32(T, B, H), *finals))
        cdef CallPlan plan = self._plan(L_, B, self.gate_cols, nt)
        y = new_f32_rows(T, B, H, plan.threads > 1)
        cdef InferCall c
        memset(&c, 0, sizeof(c))   # a GRU leaves the LSTM's fields at NULL / 0
        self._fill(&c)
        c.T, c.L, c.B, c.K, c.H = T, L_, B, self.input_size, H
        cdef Py_ssize_t nws = self._workspace(L_, B)
        # then B x H zeros (a None state); from a 64-byte boundary, as y
        cdef float* ws_block = new_floats(nws + B * H + PACKED_ALIGN_PAD)
        c.ws = align64(ws_block)
        memset(c.ws + nws, 0, B * H * sizeof(float))
        c.x = fdata(xa)
        c.h0 = state_data(s0[0], c.ws + nws)
        c.c0 = state_data(s0[1], c.ws + nws) if ns == 2 else NULL
        c.lengths = lengths_data(lens)
        c.y, c.h_n = fdata(y), fdata(finals[0])
        c.c_n = fdata(finals[1]) if ns == 2 else NULL
        c.wide = self._wide_for(B)
        with nogil:
            self._ran(plan, infer_run(&self.family, &c, plan.threads, nt))
        PyMem_RawFree(ws_block)
        return _stored(xd, (y, *finals))


cdef tuple _stored(dtype, tuple outs):
    """The outputs in the storage dtype: float16 rounded once, as the ops do."""
    if dtype == np.float16:
        return tuple(o.astype(np.float16) for o in outs)
    return outs


def checked_max_threads(str where, max_threads):
    """max_threads as None or a Python int >= 1 (any integral value: NumPy's too);
    TypeError / ValueError naming `where` otherwise. Also checks LSTMInference's and
    GRUInference's."""
    if max_threads is None:
        return None
    if isinstance(max_threads, (bool, np.bool_)) or not isinstance(max_threads, numbers.Integral):
        raise TypeError(f"{where}: max_threads must be None or a positive int, got "
                        f"{type(max_threads).__name__}")
    if max_threads < 1:
        raise ValueError(f"{where}: max_threads must be None or a positive int, got "
                         f"{max_threads}")
    return int(max_threads)


cdef int _threads(str where, max_threads) except -1:
    if max_threads is None:
        return brnn_omp_get_max_threads()
    # capped before the cast: a count past a C int does not overflow
    return <int>min(checked_max_threads(where, max_threads), brnn_omp_get_max_threads())


cdef class PackedLSTMWeights(_PackedBase):
    """An LSTM's weights packed once for inference (float32).

    PackedLSTMWeights(w_x, w_h, b, wci=None, wcf=None, wco=None, layout=IFCO,
                      forget_bias=0.0, cell_clip=0.0, use_peephole=False,
                      gates_in_rows=False)

    w_x [I, 4H], w_h [H, 4H] (TensorFlow's w[:I], w[I:]; any strides), or with
    gates_in_rows=True nn.LSTM's weight_ih_l0 [4H, I] and weight_hh_l0 [4H, H]
    (gate order i, f, g, o: layout IFCO; b = bias_ih + bias_hh). b [4H]. The
    arrays are copied: later changes to them are not seen."""
    cdef float[::1] peep_w     # [3H]: wci, wcf, wco (zeros without peepholes)
    cdef readonly int layout
    cdef readonly float forget_bias, cell_clip
    cdef readonly bint use_peephole

    def __init__(self, w_x, w_h, b, wci=None, wcf=None, wco=None, int layout=IFCO,
                 double forget_bias=0.0, double cell_clip=0.0, bint use_peephole=False,
                 bint gates_in_rows=False, Py_ssize_t work_per_thread=INFER_WORK_PER_THREAD,
                 long long idle_ns=INFER_IDLE_NS):
        cdef Py_ssize_t I, H4, H
        where = "PackedLSTMWeights"
        wx = _weight(where, "w_x", w_x)
        wh = _weight(where, "w_h", w_h)
        if gates_in_rows:
            H4, I = wx.shape
        else:
            I, H4 = wx.shape
        if H4 % 4 or H4 == 0:
            raise ValueError(f"{where}: w_x must have 4H gate columns, got {wx.shape}")
        H = H4 // 4
        want = (H4, H) if gates_in_rows else (H, H4)
        if wh.shape != want:
            raise ValueError(f"{where}: w_h must have shape {want}, got {wh.shape}")
        if layout not in (ICFO, IFCO):
            raise ValueError(f"{where}: layout must be ICFO (0) or IFCO (1), got {layout}")
        self.input_size, self.hidden_size = I, H
        self.layout, self.forget_bias, self.cell_clip = layout, forget_bias, cell_clip
        self.use_peephole = use_peephole
        self.bias = _f32_array(where, "b", b, (H4,)).copy()
        peep = np.zeros(3 * H, np.float32)
        if use_peephole:
            for q, (name, v) in enumerate((("wci", wci), ("wcf", wcf), ("wco", wco))):
                peep[q * H:(q + 1) * H] = _f32_array(where, name, v, (H,))
        self.peep_w = peep
        self.packed = _aligned_floats(4 * brnn_packed_size(H, H) + 4 * brnn_packed_size(I, H) + 1)
        cdef const float[:, :] vx = wx
        cdef const float[:, :] vh = wh
        with nogil:
            pack_blocks(H, H, 4, vh, gates_in_rows, &self.packed[0])
            pack_blocks(I, H, 4, vx, gates_in_rows, &self.packed[4 * brnn_packed_size(H, H)])
        self._pack_gates(4, vh, gates_in_rows)   # batch 1's copy: lstm_infer_step
        self.packings = 1
        self.work_per_thread = work_per_thread
        self.idle_ns = idle_ns
        self.family = InferFamily(lstm_infer_part, lstm_infer_inputs, lstm_infer_rows, 4)
        self.gate_cols = 4 * self.hidden_size

    cdef Py_ssize_t _workspace(self, Py_ssize_t L, Py_ssize_t B) noexcept nogil:
        return lstm_infer_workspace(L, B, self.hidden_size)

    cdef void _fill(self, InferCall* c):
        cdef Py_ssize_t H = self.hidden_size
        c.packed, c.b1, c.b2 = &self.packed[0], &self.bias[0], NULL
        c.off = gate_offsets(self.layout, H)
        c.wci, c.wcf, c.wco = &self.peep_w[0], &self.peep_w[H], &self.peep_w[2 * H]
        c.forget_bias, c.cell_clip, c.peep = self.forget_bias, self.cell_clip, self.use_peephole

    def forward(self, x, h0=None, c0=None, sequence_length=None, max_threads=None):
        """y [T, B, H], h_n [B, H], c_n [B, H] of x [T, B, I] from h0, c0 [B, H]
        (None: zeros); sequence_length None or int (B,) in [0, T]."""
        return self._forward("PackedLSTMWeights.forward", x, (h0, c0), sequence_length,
                             max_threads)


cdef class PackedGRUWeights(_PackedBase):
    """TensorFlow's GRUBlockCell GRU's weights packed once for inference
    (float32): w_ru [I+H, 2H], w_c [I+H, H], b_ru [2H], b_c [H] (copied)."""
    cdef float[::1] bias_c

    def __init__(self, w_ru, w_c, b_ru, b_c, Py_ssize_t work_per_thread=INFER_WORK_PER_THREAD,
                 long long idle_ns=INFER_IDLE_NS):
        where = "PackedGRUWeights"
        wru = _weight(where, "w_ru", w_ru)
        wc = _weight(where, "w_c", w_c)
        cdef Py_ssize_t H = wc.shape[1], I = wc.shape[0] - H
        if H == 0 or I < 0 or wru.shape != (I + H, 2 * H):
            raise ValueError(f"{where}: w_ru must have shape (I+H, 2H) and w_c (I+H, H), "
                             f"got {wru.shape} and {wc.shape}")
        self.input_size, self.hidden_size = I, H
        self.bias = _f32_array(where, "b_ru", b_ru, (2 * H,)).copy()
        self.bias_c = _f32_array(where, "b_c", b_c, (H,)).copy()
        cdef Py_ssize_t psx = brnn_packed_size(I, H), ps = psx + brnn_packed_size(H, H)
        self.packed = _aligned_floats(3 * ps + 1)
        cdef const float[:, :] vru = wru
        cdef const float[:, :] vc = wc
        cdef int q
        with nogil:
            for q in range(2):
                pack_blocks(I, H, 1, vru[:I, q * H:(q + 1) * H], False, &self.packed[q * ps])
                pack_blocks(H, H, 1, vru[I:, q * H:(q + 1) * H], False,
                            &self.packed[q * ps + psx])
            pack_blocks(I, H, 1, vc[:I], False, &self.packed[2 * ps])
            pack_blocks(H, H, 1, vc[I:], False, &self.packed[2 * ps + psx])
        # the h rows of w_ru's r, u blocks and of w_c: [H, 3H]
        self._pack_wide(3, np.concatenate([wru[I:], wc[I:]], axis=1), False)
        self.packings = 1
        self.work_per_thread = work_per_thread
        self.idle_ns = idle_ns
        self.family = InferFamily(gru_infer_part, gru_infer_inputs, gru_infer_rows, 3)
        self.gate_cols = 3 * self.hidden_size

    @property
    def nbytes(self):
        return (self.packed.shape[0] + self.wide.shape[0] + self.bias.shape[0]
                + self.bias_c.shape[0]) * 4

    cdef Py_ssize_t _workspace(self, Py_ssize_t L, Py_ssize_t B) noexcept nogil:
        return gru_infer_workspace(L, B, self.hidden_size)

    cdef void _fill(self, InferCall* c):
        c.packed, c.b1, c.b2 = &self.packed[0], &self.bias[0], &self.bias_c[0]

    def forward(self, x, h0=None, sequence_length=None, max_threads=None):
        """y [T, B, H], h_n [B, H] of x [T, B, I] from h0 [B, H] (None: zeros)."""
        return self._forward("PackedGRUWeights.forward", x, (h0,), sequence_length,
                             max_threads)


cdef class PackedGRUResetAfterWeights(_PackedBase):
    """nn.GRU's (reset-after) weights packed once for inference (float32):
    w_ih [3H, I], w_hh [3H, H], b_ih, b_hh [3H] (copied; any strides)."""

    def __init__(self, w_ih, w_hh, b_ih, b_hh,
                 Py_ssize_t work_per_thread=INFER_WORK_PER_THREAD, long long idle_ns=INFER_IDLE_NS):
        where = "PackedGRUResetAfterWeights"
        wih = _weight(where, "w_ih", w_ih)
        whh = _weight(where, "w_hh", w_hh)
        cdef Py_ssize_t H = whh.shape[1], I = wih.shape[1]
        if H == 0 or whh.shape != (3 * H, H) or wih.shape[0] != 3 * H:
            raise ValueError(f"{where}: w_ih must have shape (3H, I) and w_hh (3H, H), "
                             f"got {wih.shape} and {whh.shape}")
        self.input_size, self.hidden_size = I, H
        self.bias = np.concatenate([_f32_array(where, "b_ih", b_ih, (3 * H,)),
                                    _f32_array(where, "b_hh", b_hh, (3 * H,))])
        self.packed = _aligned_floats(3 * brnn_packed_size(H, H) + 3 * brnn_packed_size(I, H) + 1)
        cdef const float[:, :] vih = wih
        cdef const float[:, :] vhh = whh
        with nogil:
            pack_blocks(H, H, 3, vhh, True, &self.packed[0])
            pack_blocks(I, H, 3, vih, True, &self.packed[3 * brnn_packed_size(H, H)])
        self._pack_gates(3, vhh, True)   # batch 1's copy: gru_ra_infer_step
        self.packings = 1
        self.work_per_thread = work_per_thread
        self.idle_ns = idle_ns
        self.family = InferFamily(gru_ra_infer_part, gru_ra_infer_inputs, gru_ra_infer_rows, 3)
        self.gate_cols = 3 * self.hidden_size

    cdef Py_ssize_t _workspace(self, Py_ssize_t L, Py_ssize_t B) noexcept nogil:
        return gru_infer_workspace(L, B, self.hidden_size)

    cdef void _fill(self, InferCall* c):
        cdef Py_ssize_t H = self.hidden_size
        c.packed, c.b1, c.b2 = &self.packed[0], &self.bias[0], &self.bias[3 * H]

    def forward(self, x, h0=None, sequence_length=None, max_threads=None):
        """y [T, B, H], h_n [B, H] of x [T, B, I] from h0 [B, H] (None: zeros)."""
        return self._forward("PackedGRUResetAfterWeights.forward", x, (h0,),
                             sequence_length, max_threads)
