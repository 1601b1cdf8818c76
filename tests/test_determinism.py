"""Every op gives the same bits whatever the threads (issue 25): (a) blockrnn's own
thread count 1..4 (OpenMP limit of the calling thread), (b) OpenBLAS's thread count
1 vs 2, (c) 2-4 Python threads calling at once. float32 and float64, with and
without sequence_length.

The sequence ops' products over all steps (the backward's x_grad and weight
gradients, float64's input projection) run in blockrnn's GEMM driver
(include/brnn_gemm.h, float32 and float64 kernels), the per-step products in its
packed kernels (include/brnn_packed.h; float64's dgemm_step): their blocking
depends on the shapes only. The cells' one product per call goes through
SciPy's BLAS on the calling thread, in tiles of a size fixed by the shapes:
OpenBLAS splits a threaded GEMM's rows and columns between its threads, and
its kernels' edge tiles sum in another order, so a product it threads may
change bits with OPENBLAS_NUM_THREADS (measured on dgemm: at 600 output rows
even with K = 16). Until stop 62 float64 sent its larger products to that pool,
and they did change bits: (8, 20, 64, 200) below (every float64 sequence
output) and lstm_block_cell_grad_full's w_grad at B = 600
(test_float64_cell_products_change_no_bit).
"""
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import blockrnn
from blockrnn import _kernels
from blockrnn.gru_reset_after import _block_gru_reset_after, _block_gru_reset_after_grad
from blockrnn.lstm import _block_lstm_nn, _block_lstm_nn_grad
from blockrnn.lstm_proj import block_lstm_proj, block_lstm_proj_grad

# T, B, I, H: large enough for every route (several threads in the reverse loop,
# the GEMM driver after it); batch 1 (GEMV steps, packed input projection); H
# not a multiple of 16 with an odd batch.
SHAPES = [(30, 16, 128, 256), (20, 1, 64, 600), (9, 3, 40, 37), (8, 20, 64, 200)]
DTYPES = [np.float32, np.float64]


def _problem(T, B, I, H, dtype, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    p = dict(T=T, x=r(T, B, I), cs=r(B, H), h=r(B, H), w=r(I + H, 4 * H) / 4, wci=r(H),
             wcf=r(H), wco=r(H), b=r(4 * H), dcs=r(T, B, H), dh=r(T, B, H),
             w_ru=r(I + H, 2 * H) / 4, w_c=r(I + H, H) / 4, b_ru=r(2 * H), b_c=r(H),
             w_ih=r(3 * H, I) / 4, w_hh=r(3 * H, H) / 4, b_ih=r(3 * H), b_hh=r(3 * H))
    lengths = rng.integers(0, T + 1, B)
    lengths[0] = T
    p["lengths"] = lengths
    return p


def _all_ops(p, with_lengths):
    """Every op's outputs, as {name: [arrays]}."""
    lens = p["lengths"] if with_lengths else None
    lstm = (p["T"], p["x"], p["cs"], p["h"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"])
    cell = (p["x"][0],) + lstm[2:]
    gru_cell = (p["x"][0], p["h"], p["w_ru"], p["w_c"], p["b_ru"], p["b_c"])
    gru = (p["T"], p["x"]) + gru_cell[1:]
    out = {}
    c = blockrnn.lstm_block_cell(*cell, use_peephole=True)
    out["lstm_block_cell"] = c
    out["lstm_block_cell_grad"] = blockrnn.lstm_block_cell_grad(
        *cell, *c[:6], p["dcs"][0], p["dh"][0], use_peephole=True)
    out["lstm_block_cell_grad_full"] = blockrnn.lstm_block_cell_grad_full(
        *cell, *c[:6], p["dcs"][0], p["dh"][0], use_peephole=True)
    for name, op, grad in (("block_lstm", blockrnn.block_lstm, blockrnn.block_lstm_grad),
                           ("block_lstm_v2", blockrnn.block_lstm_v2,
                            blockrnn.block_lstm_grad_v2)):
        f = op(*lstm, use_peephole=True, sequence_length=lens)
        out[name] = f
        out[name.replace("lstm", "lstm_grad")] = grad(*lstm, *f, p["dcs"], p["dh"],
                                                      use_peephole=True, sequence_length=lens)
    g = blockrnn.gru_block_cell(*gru_cell)
    out["gru_block_cell"] = g
    out["gru_block_cell_grad"] = blockrnn.gru_block_cell_grad(*gru_cell, *g[:3], p["dh"][0])
    out["gru_block_cell_grad_full"] = blockrnn.gru_block_cell_grad_full(*gru_cell, *g[:3],
                                                                        p["dh"][0])
    gs = blockrnn.block_gru(*gru, sequence_length=lens)
    out["block_gru"] = gs
    out["block_gru_grad"] = blockrnn.block_gru_grad(*gru, *gs, p["dh"], sequence_length=lens)
    ra_cell = (p["x"][0], p["h"], p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"])
    ra = (p["T"], p["x"]) + ra_cell[1:]
    g = blockrnn.gru_cell_reset_after(*ra_cell)
    out["gru_cell_reset_after"] = g
    out["gru_cell_reset_after_grad"] = blockrnn.gru_cell_reset_after_grad(
        *ra_cell, *g[:4], p["dh"][0])
    gs = blockrnn.block_gru_reset_after(*ra, sequence_length=lens)
    out["block_gru_reset_after"] = gs
    out["block_gru_reset_after_grad"] = blockrnn.block_gru_reset_after_grad(
        *ra, *gs, p["dh"], sequence_length=lens)
    if not with_lengths:   # the reverse direction read by the LSTM kernels themselves
        I = p["x"].shape[2]
        nn = (p["T"], p["x"], p["cs"], p["h"], np.ascontiguousarray(p["w"][:I].T),
              np.ascontiguousarray(p["w"][I:].T), p["wci"], p["wcf"], p["wco"], p["b"])
        f = _block_lstm_nn(*nn, use_peephole=True, reverse=True)
        out["lstm_nn_reverse"] = f
        out["lstm_nn_reverse_grad"] = _block_lstm_nn_grad(
            *nn, *f, p["dcs"], p["dh"], use_peephole=True, reverse=True)
        gs = _block_gru_reset_after(*ra, reverse=True)
        out["gru_reset_after_reverse"] = gs
        out["gru_reset_after_reverse_grad"] = _block_gru_reset_after_grad(
            *ra, *gs, p["dh"], reverse=True)
    return out


def _assert_same(expected, got, what):
    assert expected.keys() == got.keys()
    for name in expected:
        assert len(expected[name]) == len(got[name])
        for k, (e, g) in enumerate(zip(expected[name], got[name])):
            assert e.dtype == g.dtype
            assert np.array_equal(e, g, equal_nan=True), f"{name} output {k}: {what}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_blockrnn_thread_count_changes_no_bit(shape, dtype, with_lengths):
    p = _problem(*shape, dtype)
    with threadpool_limits(1, user_api="openmp"):
        serial = _all_ops(p, with_lengths)
    for n in (2, 3, 4):
        with threadpool_limits(n, user_api="openmp"):
            _assert_same(serial, _all_ops(p, with_lengths), f"{n} vs 1 OpenMP threads")


def _openblas_cases():
    for shape in SHAPES:
        for dtype in DTYPES:
            yield shape, dtype


@pytest.mark.parametrize("shape,dtype", list(_openblas_cases()))
@pytest.mark.parametrize("with_lengths", [False, True])
def test_openblas_thread_count_changes_no_bit(shape, dtype, with_lengths):
    p = _problem(*shape, dtype)
    with threadpool_limits(1, user_api="blas"):
        one = _all_ops(p, with_lengths)
    with threadpool_limits(2, user_api="blas"):
        two = _all_ops(p, with_lengths)
    _assert_same(one, two, "OpenBLAS 2 vs 1 threads")


def test_the_openblas_test_covers_every_sequence_op():
    """The sequence ops are checked at every shape in both dtypes, not only where
    OpenBLAS happens to agree with itself."""
    names = set(_all_ops(_problem(2, 2, 3, 4, np.float32), True))
    assert {n for n in names if n.startswith("block_")} == {
        "block_lstm", "block_lstm_grad", "block_lstm_v2", "block_lstm_grad_v2",
        "block_gru", "block_gru_grad", "block_gru_reset_after",
        "block_gru_reset_after_grad"}
    for dtype in DTYPES:
        assert [s for s, d in _openblas_cases() if d == dtype] == SHAPES


@pytest.mark.parametrize("dtype", DTYPES)
def test_cell_products_change_no_bit(dtype):
    """A large batch's cell products (the gradient's weight product sums over the B
    rows) on 1 and 2 OpenBLAS threads and blockrnn threads: the same bits."""
    B, I, H = 600, 16, 64
    p = _problem(1, B, I, H, dtype, seed=5)
    cell = (p["x"][0], p["cs"], p["h"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"])
    gru = (p["x"][0], p["h"], p["w_ru"], p["w_c"], p["b_ru"], p["b_c"])

    def run():
        c = blockrnn.lstm_block_cell(*cell, use_peephole=True)
        g = blockrnn.gru_block_cell(*gru)
        return {"lstm": c, "lstm_grad_full": blockrnn.lstm_block_cell_grad_full(
                    *cell, *c[:6], p["dcs"][0], p["dh"][0], use_peephole=True),
                "gru": g, "gru_grad_full": blockrnn.gru_block_cell_grad_full(
                    *gru, *g[:3], p["dh"][0])}
    with threadpool_limits(1):
        one = run()
    with threadpool_limits(2):
        _assert_same(one, run(), "2 vs 1 threads (OpenBLAS and OpenMP)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("callers", [2, 4])
def test_concurrent_callers_change_no_bit(dtype, callers):
    problems = [(_problem(*shape, dtype, seed=k), k % 2 == 0)
                for k, shape in enumerate(SHAPES * 2)]
    serial = [_all_ops(p, lens) for p, lens in problems]
    with ThreadPoolExecutor(max_workers=callers) as pool:
        threaded = list(pool.map(lambda a: _all_ops(*a), problems))
    for e, g in zip(serial, threaded):
        _assert_same(e, g, f"{callers} concurrent callers")
    assert _kernels.thread_budget_in_use() == 0


def _shedding_ops(p, cell):
    """run(lengths) -> (forward outputs, gradients) of the float32 sequence op `cell`
    ("lstm": block_lstm_v2, "gru": the reset-after GRU, "tf_gru": block_gru,
    "lstm_proj": block_lstm_proj with P = H / 2; "lstm_reverse", "gru_reverse": the
    LSTM's and the reset-after GRU's kernels reading the reverse direction themselves,
    without lengths, and with lengths the forward direction); the threads its time loops ask of a
    budget of 2 (their steps' rule, and one below a loop's LOOP_MIN_WORK, loop_threads);
    and its step's recurrent product (K, N) (sequence_patient)."""
    T, B, H = p["T"], p["h"].shape[0], p["h"].shape[1]
    I, S = p["x"].shape[2], _kernels.backward_chunk_steps_for(T, B * 4 * H)

    def loop(threads, nq):   # the forward's and the backward's loop (one chunk of S steps)
        return [_kernels.loop_threads_for(threads, T * B * (I + H) * nq * H, "forward"),
                _kernels.loop_threads_for(threads, S * B * nq * H * H, "backward")]
    if cell == "lstm_reverse":   # reverse=True where it runs (no lengths), else forward
        I_ = p["x"].shape[2]
        nn = (T, p["x"], p["cs"], p["h"], np.ascontiguousarray(p["w"][:I_].T),
              np.ascontiguousarray(p["w"][I_:].T), p["wci"], p["wcf"], p["wco"], p["b"])

        def run(lengths):
            kw = dict(sequence_length=lengths, reverse=lengths is None)
            f = _block_lstm_nn(*nn, use_peephole=True, **kw)
            return f, _block_lstm_nn_grad(*nn, *f, p["dcs"], p["dh"], use_peephole=True, **kw)
        return run, [loop(_kernels.sequence_threads_for(B, H, 4 * H, H, 2), 4)[0],
                     loop(_kernels.sequence_threads_for(B, 4 * H, H, H, 2), 4)[1]], (H, 4 * H)
    if cell == "lstm":
        args = (T, p["x"], p["cs"], p["h"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"])

        def run(lengths):
            f = blockrnn.block_lstm_v2(*args, use_peephole=True, sequence_length=lengths)
            return f, blockrnn.block_lstm_grad_v2(*args, *f, p["dcs"], p["dh"],
                                                  use_peephole=True, sequence_length=lengths)
        return run, [loop(_kernels.sequence_threads_for(B, H, 4 * H, H, 2), 4)[0],
                     loop(_kernels.sequence_threads_for(B, 4 * H, H, H, 2), 4)[1]], (H, 4 * H)
    if cell == "tf_gru":
        args = (T, p["x"], p["h"], p["w_ru"], p["w_c"], p["b_ru"], p["b_c"])

        def run(lengths):
            f = blockrnn.block_gru(*args, sequence_length=lengths)
            return f, blockrnn.block_gru_grad(*args, *f, p["dh"], sequence_length=lengths)
        threads = loop(_kernels.gru_sequence_threads_for(B, H, 2), 3)
        return run, threads[:1] if B == 1 else threads, (H, 3 * H)   # as below
    if cell == "lstm_proj":
        P = H // 2
        rng = np.random.default_rng(7)
        r = lambda *s: rng.uniform(-1, 1, s).astype(np.float32) / 4  # noqa: E731
        args = (T, p["x"], p["h"][:, :P], p["cs"], p["w"][:p["x"].shape[2]].T.copy(),
                r(4 * H, P), p["b"], r(4 * H), r(P, H))
        dh = p["dh"][:, :, :P].copy()

        def run(lengths):
            f = block_lstm_proj(*args, sequence_length=lengths)
            return f, block_lstm_proj_grad(*args, *f, p["dcs"], dh,
                                           sequence_length=lengths)
        return run, [_kernels.lstm_proj_loop_threads_for(T, B, H, P, 2)], (P, 5 * H)
    args = (T, p["x"], p["h"], p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"])

    def run(lengths):   # "gru_reverse": reverse=True where it runs (no lengths)
        kw = dict(sequence_length=lengths, reverse=cell == "gru_reverse" and lengths is None)
        f = _block_gru_reset_after(*args, **kw)
        return f, _block_gru_reset_after_grad(*args, *f, p["dh"], **kw)
    # the forward asks by the LSTM's rule (batch 1's as the inference forward's), the
    # backward by the GRUs'; batch 1's backward runs its steps on the calling thread (BLAS)
    threads = [loop(_kernels.sequence_threads_for(B, H, 3 * H, H, 2), 3)[0],
               loop(_kernels.gru_sequence_threads_for(B, H, 2), 3)[1]]
    return run, threads[:1] if B == 1 else threads, (H, 3 * H)


@pytest.mark.parametrize("cell,T,B,I,H", [
    (cell, *shape) for cell in ("lstm", "gru", "tf_gru", "lstm_proj", "lstm_reverse",
                                "gru_reverse")
    for shape in [(20, 8, 32, 128), (40, 3, 24, 100), (20, 1, 24, 256)]])
def test_training_calls_that_shed_for_another_caller_keep_the_bits(cell, T, B, I, H):
    """Two Python threads calling a float32 sequence op's forward and backward at once,
    150 times each: a call on 2 threads sheds its partner at a step barrier whenever
    the other caller takes a thread of the budget (step_barrier), and thread 0 goes on
    with every row and cell. Small batches, gate math by rows, so the rows thread 0
    takes over are the partner's (an LSTM backward whose shed kept thread 0's own rows
    gave wrong gradients in ~20% of such calls); batch 1, the one-row loops. At batch
    8 the LSTM's and both GRUs' loops split their rows instead (split_rows): the
    partner leaves at the end of a step (rows_leave) and the caller runs the rest of
    its rows (the projected LSTM's still splits its cells)."""
    p = _problem(T, B, I, H, np.float32, seed=5)
    run, threads, (K, N) = _shedding_ops(p, cell)
    assert threads and all(n == 2 for n in threads)
    assert _kernels.gates_by_rows_for(B, 2) == (B > 1)
    assert not _kernels.sequence_patient_for(B, K, N, 2)   # sheds at a first stall
    cases = [None, p["lengths"]]
    want = [run(lengths) for lengths in cases]

    def caller(k):
        bad = 0
        for n in range(150):
            got = run(cases[(n + k) % 2])
            expected = want[(n + k) % 2]
            bad += any(not np.array_equal(g, e) for a, b in zip(got, expected)
                       for g, e in zip(a, b))
        return bad

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert list(pool.map(caller, range(2))) == [0, 0]
    assert _kernels.thread_budget_in_use() == 0


@pytest.mark.parametrize("cell", ["lstm", "gru", "tf_gru", "lstm_reverse", "gru_reverse"])
@pytest.mark.parametrize("T,B,I,H", [(40, 8, 32, 64), (20, 13, 20, 70)])
def test_training_loops_split_by_rows_keep_the_bits(cell, T, B, I, H):
    """From 4 rows a thread (split_rows) the LSTM's and both GRUs' float32 loops give
    each thread every step of its own block of rows: 13 rows in blocks of 6 and 7 at
    2 threads, 4, 4 and 5 at 3; 8 rows in two blocks of 4 at 2 threads. At 4 threads
    (and 8 rows at 3) 4 rows a thread are not reached and the cells split. The
    forward's outputs and the gradients are those of one thread at 2-4 threads, with
    lengths 0 and T in the first and last blocks."""
    assert _kernels.split_rows_for(B, 2) and not _kernels.split_rows_for(7, 2)
    assert _kernels.split_rows_for(B, 3) == (B == 13) and not _kernels.split_rows_for(B, 4)
    p = _problem(T, B, I, H, np.float32, seed=11)
    p["lengths"][0], p["lengths"][-1] = 0, T
    run, threads, _ = _shedding_ops(p, cell)
    assert all(n == 2 for n in threads)
    for lengths in (None, p["lengths"]):
        with threadpool_limits(1, user_api="openmp"):
            want = run(lengths)
        for n in (2, 3, 4):
            with threadpool_limits(n, user_api="openmp"):
                got = run(lengths)
            for a, b in zip(got, want):
                for g, e in zip(a, b):
                    np.testing.assert_array_equal(g, e)
    assert _kernels.thread_budget_in_use() == 0


def test_training_loops_are_patient_only_with_long_steps():
    """A training loop sheds at a partner's first stall unless a step gives each thread
    more than 2^20 multiply-adds (the inference calls' rule)."""
    assert not _kernels.sequence_patient_for(1, 128, 4 * 128, 2)   # batch 1
    assert not _kernels.sequence_patient_for(8, 128, 4 * 128, 2)
    assert not _kernels.sequence_patient_for(8, 256, 4 * 256, 2)   # 2^20 a thread: not over
    assert _kernels.sequence_patient_for(9, 256, 4 * 256, 2)
    assert _kernels.sequence_patient_for(32, 256, 4 * 256, 2)   # 2^22 a thread
    assert not _kernels.sequence_patient_for(32, 256, 4 * 256, 8)   # 2^20 a thread


def test_gru_and_projected_lstm_loops_take_a_second_thread_from_2_16_multiply_adds():
    """The GRUs' training loops ask one thread per 2^15 multiply-adds of a step's
    recurrent products B x H x 3H at every batch size (TF's GRU, and the reset-after
    GRU's backward): TF's batch 1 at H = 128 stays on one thread, where two were
    slower. The LSTM's batch-1 loops take two there, and so does the reset-after GRU's
    forward (the LSTM's rule, on B x H x 3H). The projected LSTM's likewise on
    B x P x 5H, split by panels of P."""
    assert _kernels.sequence_threads_for(1, 128, 4 * 128, 128, 2) == 2
    assert _kernels.sequence_threads_for(1, 128, 3 * 128, 128, 2) == 2
    assert _kernels.sequence_threads_for(1, 64, 3 * 64, 64, 2) == 1   # 12288: one a thread
    assert _kernels.gru_sequence_threads_for(1, 128, 2) == 1
    assert _kernels.gru_sequence_threads_for(1, 256, 2) == 2
    assert _kernels.gru_sequence_threads_for(8, 32, 2) == 1   # 24576
    assert _kernels.gru_sequence_threads_for(2, 128, 2) == 2
    assert _kernels.gru_sequence_threads_for(8, 128, 1) == 1
    assert _kernels.gru_sequence_threads_for(8, 128, 8) == 8
    assert _kernels.gru_sequence_threads_for(64, 40, 8) == 3   # 3 panels of 16
    assert _kernels.lstm_proj_step_threads_for(1, 256, 128, 2) == 2   # 163840
    assert _kernels.lstm_proj_step_threads_for(1, 128, 32, 2) == 1    # 20480
    assert _kernels.lstm_proj_step_threads_for(8, 256, 40, 8) == 3    # 3 panels of P


def test_the_shapes_reach_the_threaded_routes():
    """The first shape runs the LSTM's forward and reverse loops and the GEMM
    driver on 2+ threads when 2 are allowed (else the thread-count test checks
    little)."""
    T, B, I, H = SHAPES[0]
    assert _kernels.sequence_threads_for(B, H, 4 * H, H, 4) >= 2
    assert _kernels.sequence_threads_for(B, 4 * H, H, H, 4) >= 2
    assert _kernels.packed_gemm_threads_for(T * B * 4 * H * (2 * I + H), 4) == 4
    assert SHAPES[1][1] == 1 and SHAPES[2][3] % 16 != 0
    # the step's gate math by rows (batch 16; batch 3 on 2 or 3 threads) and by
    # cells (batch 1; batch 3 on 4 threads), so both splits are checked
    assert _kernels.gates_by_rows_for(B, 2) and _kernels.gates_by_rows_for(SHAPES[2][1], 3)
    assert not _kernels.gates_by_rows_for(1, 2) and not _kernels.gates_by_rows_for(3, 4)
    H1 = SHAPES[1][3]   # batch 1: the LSTM's forward and reverse loops on 2+ threads too
    assert _kernels.sequence_threads_for(1, H1, 4 * H1, H1, 4) == 4
    assert _kernels.sequence_threads_for(1, 4 * H1, H1, H1, 4) == 4


OPENBLAS_IDLE = """
import os, time, numpy as np, blockrnn
from threadpoolctl import threadpool_limits
# OpenBLAS (NumPy's and SciPy's) starts its workers when loaded; libgomp starts
# blockrnn's at its first parallel region: the threads now, less this one, are
# OpenBLAS's.
workers = set(os.listdir("/proc/self/task")) - {str(os.getpid())}
assert workers, "no OpenBLAS worker threads: the test measures nothing"

def cpu_ticks():
    total = 0
    for tid in workers:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])   # utime + stime
    return total

def calls(T, B, I, H):
    rng = np.random.default_rng(0)
    r = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
    x, cs, h, p, dh = r(T, B, I), r(B, H), r(B, H), r(H), r(T, B, H)
    w, b, w_ru, w_c = r(I + H, 4 * H) / 4, r(4 * H), r(I + H, 2 * H) / 4, r(I + H, H) / 4
    lens = rng.integers(0, T + 1, B)
    for op, grad in ((blockrnn.block_lstm, blockrnn.block_lstm_grad),
                     (blockrnn.block_lstm_v2, blockrnn.block_lstm_grad_v2)):
        f = op(T, x, cs, h, w, p, p, p, b, sequence_length=lens)
        grad(T, x, cs, h, w, p, p, p, b, *f, dh, dh, use_peephole=False, sequence_length=lens)
    g = blockrnn.block_gru(T, x, h, w_ru, w_c, b[:2 * H], p)
    blockrnn.block_gru_grad(T, x, h, w_ru, w_c, b[:2 * H], p, *g, dh)
    w_ih, w_hh, b3 = r(3 * H, I) / 4, r(3 * H, H) / 4, r(3 * H)
    g = blockrnn.block_gru_reset_after(T, x, h, w_ih, w_hh, b3, b3)
    blockrnn.block_gru_reset_after_grad(T, x, h, w_ih, w_hh, b3, b3, *g, dh)

time.sleep(0.3)
before = cpu_ticks()
with threadpool_limits(2, user_api="openmp"):
    for _ in range(5):
        for shape in ((40, 32, 256, 256), (40, 1, 256, 600)):
            calls(*shape)
print("ticks", cpu_ticks() - before)
"""


def test_openblas_workers_stay_idle_during_float32_sequence_calls():
    """Every float32 product of a sequence call runs on blockrnn's threads or the
    caller: OpenBLAS's workers get no CPU time (they did: the backward's sgemm)."""
    import subprocess
    import sys
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", OPENBLAS_IDLE], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ticks", "0"], out.stdout
