"""Sequence ops on the packed kernel (LSTM v1/v2 and GRU, forward and backward): the same bits for 1, 2, 3 and 4 threads
and for concurrent callers, every kernel variant of this CPU forced in turn
(BLOCKRNN_KERNEL, in a subprocess) against the float64 results, odd shapes,
and the process-wide thread budget."""
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import blockrnn
from _inputs import rel_err
from blockrnn import _kernels

# T, B, I, H: H not a multiple of 16, B not a multiple of the row tile, H = 1,
# B = 1 (the GRU backwards' BLAS route below PACKED_ROW1_MIN_CELLS cells, the
# packed loop from there: H = 400), I = 0, T = 1, and shapes large enough to run on
# several threads.
SHAPES = [(5, 3, 4, 37), (7, 9, 0, 1), (6, 1, 8, 64), (1, 2, 3, 16), (16, 7, 5, 100),
          (3, 13, 20, 200), (2, 2, 64, 600), (2, 24, 60, 200), (3, 1, 8, 400)]
# Batch 1 with an input projection large enough for several threads (its
# float32 error over 64 steps is above the variant test's float64 tolerance),
# and batch 1 with steps large enough for the one-row route's threads; at
# H = 96 the TF GRU's forward region takes 2 threads for its packing and
# projection and runs its steps on one (gru_forward_packed's step_threads).
THREAD_SHAPES = SHAPES + [(64, 1, 320, 160), (3, 1, 8, 848), (64, 1, 512, 96)]


def _problem(T, B, I, H, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    lstm = (T, r(T, B, I), r(B, H), r(B, H), r(I + H, 4 * H) / 4, r(H), r(H), r(H), r(4 * H))
    lengths = rng.integers(0, T + 1, B)
    lengths[0] = 0   # a row of length 0
    gru = (T, lstm[1], lstm[3], r(I + H, 2 * H) / 4, r(I + H, H) / 4, r(2 * H), r(H))
    return lstm, lengths, (r(T, B, H), r(T, B, H)), gru


def _run(problem, with_lengths=True, ops=blockrnn):
    """The TF GRU's and both LSTMs' forwards and gradients on `problem`, by `ops`
    (blockrnn, or its NumPy reference blockrnn._reference)."""
    lstm, lengths, grads, gru = problem
    lens = lengths if with_lengths else None
    g_fwd = ops.block_gru(*gru, sequence_length=lens)
    out = [*g_fwd, *ops.block_gru_grad(*gru, *g_fwd, grads[1], sequence_length=lens)]
    for op, grad_op in ((ops.block_lstm, ops.block_lstm_grad),
                        (ops.block_lstm_v2, ops.block_lstm_grad_v2)):
        fwd = op(*lstm, use_peephole=True, sequence_length=lens)
        bwd = grad_op(*lstm, *fwd, *grads, use_peephole=True, sequence_length=lens)
        out += [*fwd, *bwd]
    return out


@pytest.mark.parametrize("shape", THREAD_SHAPES)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_bits_do_not_depend_on_the_thread_count(shape, with_lengths):
    problem = _problem(*shape, seed=sum(shape))
    with threadpool_limits(1, user_api="openmp"):
        serial = _run(problem, with_lengths)
    for n in (2, 3, 4):
        with threadpool_limits(n, user_api="openmp"):
            got = _run(problem, with_lengths)
        for e, g in zip(serial, got):
            np.testing.assert_array_equal(g, e)


def test_large_enough_calls_do_run_on_several_threads():
    """The shapes above reach the threaded route (else the test above checks nothing)."""
    if _kernels.openmp_max_threads() < 2 and blockrnn.build_config()["usable_cpus"] < 2:
        pytest.fail("this machine runs one thread: the thread-count test proves nothing")
    # the LSTM's loops: its steps' recurrent product B x H x 4H (forward), B x 4H x H
    for B, H in [(13, 200), (2, 600), (7, 100), (24, 200), (1, 848)]:
        assert _kernels.sequence_threads_for(B, H, 4 * H, H, 4) == 4
        assert _kernels.sequence_threads_for(B, 4 * H, H, H, 4) == 4
    assert _kernels.sequence_threads_for(3, 37, 4 * 37, 37, 4) == 1
    # TensorFlow's GRU's loops (block_gru), forward and backward
    for B, H in [(13, 200), (2, 600), (7, 100), (24, 200), (1, 848)]:
        assert _kernels.gru_sequence_threads_for(B, H, 4) == 4
    assert _kernels.gru_sequence_threads_for(3, 37, 4) == 1
    assert _kernels.gru_sequence_threads_for(1, 160, 4) == 2   # 76800 multiply-adds
    assert _kernels.packed_input_threads_for(64, 320, 4 * 160, 160, 4) == 3   # batch 1
    assert _kernels.packed_input_threads_for(64, 320, 3 * 160, 160, 4) == 2   # GRU
    assert _kernels.packed_input_threads_for(50, 128, 4 * 128, 128, 4) == 1   # bench
    # the TF GRU's batch-1 forward at THREAD_SHAPES[-1]: 2 threads pack and project,
    # 1 runs the steps
    assert _kernels.gru_sequence_threads_for(1, 96, 4) == 1
    assert _kernels.packed_input_threads_for(64, 512, 3 * 96, 96, 4) == 2
    assert _kernels.loop_threads_for(2, 64 * (512 + 96) * 3 * 96, "forward") == 2


def test_tf_gru_batch1_forward_gives_back_every_thread_when_its_steps_shed():
    """The TF GRU's batch-1 forward region can hold more threads for its packing and
    projection (4 here) than its steps use (2): with a budget of 4 on fewer cores the
    budget is over-committed, so the steps' barrier sheds at once, giving back the
    step threads but thread 0; the threads that only projected must be given back too
    (bc8a660 returned only the steps' share: two threads of the budget leaked for good
    at each such call). The bits are the serial ones."""
    T, I, H = 64, 640, 160
    assert _kernels.gru_sequence_threads_for(1, H, 4) == 2
    assert _kernels.packed_input_threads_for(T, I, 3 * H, H, 4) == 4
    rng = np.random.default_rng(11)
    r = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    args = (T, r(T, 1, I), r(1, H), r(I + H, 2 * H) / 8, r(I + H, H) / 8, r(2 * H), r(H))

    def run(threads):
        outs = [np.empty((T, 1, H), np.float32) for _ in range(4)]
        _kernels.block_gru_forward(*args, threads, threads, *outs)
        return outs

    serial = run(1)
    for _ in range(3):
        for e, g in zip(serial, run(4)):
            np.testing.assert_array_equal(g, e)
        assert _kernels.thread_budget_in_use() == 0


def test_concurrent_callers_give_the_serial_bits():
    problems = [_problem(*shape, seed=i) for i, shape in enumerate(THREAD_SHAPES * 3)]
    serial = [_run(p) for p in problems]
    with ThreadPoolExecutor(max_workers=6) as pool:
        threaded = list(pool.map(_run, problems))
    for expected, got in zip(serial, threaded):
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(g, e)
    assert _kernels.thread_budget_in_use() == 0


def test_thread_budget_grants_what_is_free_and_at_least_one():
    assert _kernels.thread_budget_in_use() == 0
    first = _kernels.thread_budget_take(3, 4)
    second = _kernels.thread_budget_take(3, 4)
    third = _kernels.thread_budget_take(3, 4)
    try:
        assert (first, second, third) == (3, 1, 1)
        assert _kernels.thread_budget_in_use() == 5
    finally:
        for n in (first, second, third):
            _kernels.thread_budget_give(n)
    assert _kernels.thread_budget_in_use() == 0


CHECK = textwrap.dedent("""
    import numpy as np, blockrnn
    from threadpoolctl import threadpool_limits
    from blockrnn import _kernels
    assert _kernels.packed_kernel_name() == {path!r}, _kernels.packed_kernel_name()
    rng = np.random.default_rng(1)
    worst = 0.0
    for T, B, I, H in {shapes!r}:
        r = lambda *s: rng.uniform(-1, 1, s)
        args = (T, r(T, B, I), r(B, H), r(B, H), r(I + H, 4 * H) / 4, r(H), r(H), r(H),
                r(4 * H))
        lengths = rng.integers(0, T + 1, B)
        f32 = tuple(a.astype(np.float32) if isinstance(a, np.ndarray) else a for a in args)
        grads = (r(T, B, H), r(T, B, H))
        gru = (T, args[1], args[3], r(I + H, 2 * H) / 4, r(I + H, H) / 4, r(2 * H), r(H))
        gru32 = tuple(a.astype(np.float32) if isinstance(a, np.ndarray) else a for a in gru)

        def both(a, g, gr):
            fwd = blockrnn.block_lstm_v2(*a, use_peephole=True, sequence_length=lengths)
            g_fwd = blockrnn.block_gru(*gr, sequence_length=lengths)
            return [*fwd, *blockrnn.block_lstm_grad_v2(*a, *fwd, *g, use_peephole=True,
                                                       sequence_length=lengths),
                    *g_fwd, *blockrnn.block_gru_grad(*gr, *g_fwd, g[1],
                                                     sequence_length=lengths)]
        ref = both(args, grads, gru)
        runs = []
        for n in (1, 2, 4):
            with threadpool_limits(n, user_api="openmp"):
                runs.append(both(f32, [g.astype(np.float32) for g in grads], gru32))
        for run in runs[1:]:
            for a, b in zip(runs[0], run):
                np.testing.assert_array_equal(a, b)
        for a, b in zip(runs[0], ref):
            worst = max(worst, float(np.max(np.abs(a - b) / (1 + np.abs(b)), initial=0)))
    assert worst < 2e-5, worst
    print("ok", worst)
""")


@pytest.mark.parametrize("path", _kernels.packed_paths_supported())
def test_every_kernel_variant_forced_matches_float64(path):
    """Forward and backward, float32 in the forced variant against float64."""
    env = dict(os.environ, BLOCKRNN_KERNEL=path)
    out = subprocess.run([sys.executable, "-c", CHECK.format(path=path, shapes=SHAPES)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]


# float64 in every kernel variant: the sequence ops' float64 per-step products and
# GEMMs run in blockrnn's own float64 kernels (brnn_dgemm_*), one per variant. Each
# variant, forced in a fresh process, must give the in-process (auto) variant's
# answers to float64 rounding, the same bits on 1 and 2 threads; the auto variant's
# answers are checked against the NumPy reference (blockrnn._reference) here.
F64_SHAPES = [(5, 3, 4, 37), (6, 13, 20, 100), (4, 1, 8, 64), (3, 24, 60, 200)]


def _float64_results(ops=blockrnn, seed=5):
    """Every float64 sequence op, forward and backward, with and without lengths, on
    F64_SHAPES, by `ops`: {name: array}. blockrnn._reference has every family but the
    projected LSTM (its float64 parity is tests/test_lstm_proj.py's). B x 4H x H
    reaches dgemm_step's threads at the two larger shapes (STEP_PARALLEL_MACS)."""
    from blockrnn import lstm_proj
    out = {}
    for s, (T, B, I, H) in enumerate(F64_SHAPES):
        problem = _problem(T, B, I, H, seed + s, np.float64)
        x, h0, c0 = problem[0][1], problem[0][3], problem[0][2]
        rng = np.random.default_rng(seed + s)
        r = lambda *sh: rng.uniform(-1, 1, sh)  # noqa: E731
        P = max(1, H // 3)
        ra = (T, x, h0, r(3 * H, I) / 4, r(3 * H, H) / 4, r(3 * H), r(3 * H))
        proj = (T, x, r(B, P), c0, r(4 * H, I) / 4, r(4 * H, P) / 4, r(4 * H), r(4 * H),
                r(P, H) / 4)
        proj_h_grad = r(T, B, P)
        for with_lengths in (False, True):
            lens = problem[1] if with_lengths else None
            results = _run(problem, with_lengths, ops)
            fwd = ops.block_gru_reset_after(*ra, sequence_length=lens)
            results += [*fwd, *ops.block_gru_reset_after_grad(
                *ra, *fwd, problem[2][1], sequence_length=lens)]
            if ops is blockrnn:
                fwd = lstm_proj.block_lstm_proj(*proj, sequence_length=lens)
                results += [*fwd, *lstm_proj.block_lstm_proj_grad(
                    *proj, *fwd, problem[2][0], proj_h_grad, sequence_length=lens)]
            for k, a in enumerate(results):
                out[f"{T},{B},{I},{H},{with_lengths},{k}"] = np.asarray(a)
    return out


def test_float64_results_match_the_numpy_reference():
    from blockrnn import _reference
    ours, ref = _float64_results(), _float64_results(_reference)
    assert len(ref) > 100 and set(ref) < set(ours)
    worst = max(rel_err(ours[k], ref[k]) for k in ref)
    assert worst < 1e-12, worst


F64_CHECK = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from threadpoolctl import threadpool_limits
    from blockrnn import _kernels
    import test_packed_threads as t
    assert _kernels.packed_kernel_name() == {path!r}, _kernels.packed_kernel_name()
    with threadpool_limits(1, user_api="openmp"):
        one = t._float64_results()
    with threadpool_limits(2, user_api="openmp"):
        two = t._float64_results()
    for k in one:
        assert one[k].dtype == np.float64, k
        np.testing.assert_array_equal(one[k], two[k], err_msg=k)
    np.savez({out!r}, **one)
    print("ok")
""")


@pytest.mark.parametrize("path", _kernels.packed_paths_supported())
def test_float64_under_every_kernel_variant(path, tmp_path):
    """float64 forward and backward of every sequence family in the forced variant: 1 and
    2 threads bit for bit, and the auto variant's answers to 1e-13."""
    out = tmp_path / "f64.npz"
    script = F64_CHECK.format(tests=os.path.dirname(os.path.abspath(__file__)), path=path,
                              out=str(out))
    env = dict(os.environ, BLOCKRNN_KERNEL=path)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stderr[-3000:]
    here = _float64_results()
    with np.load(out) as theirs:
        assert set(theirs.files) == set(here)
        worst = max(rel_err(theirs[k], here[k]) for k in here)
    assert worst < 1e-13, (path, worst)
