"""Thread stress: 8 Python threads x a few hundred mixed calls of all 10 entry points.

Every call is first made serially; then 8 threads make the same calls at once (each
thread runs its own list and then its neighbour's, so every input array is read by
two threads). Results must be bit-identical, with the same dtype and shape, and
nothing may crash. Shapes are random (zero-sized dimensions included), as are the
dtype (float32 / float64), use_peephole, cell_clip, forget_bias and seq_len_max <= T.
The second test repeats the threaded half with the OpenMP gate loops forced parallel
(``_config.MIN_PARALLEL_WORK = 0``): OpenMP teams inside concurrent Python threads.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import blockrnn
from blockrnn import _config, _kernels

N_THREADS = 8
CALLS_PER_THREAD = 500
OPS = ("lstm_block_cell", "lstm_block_cell_grad", "lstm_block_cell_grad_full",
       "block_lstm", "block_lstm_v2", "block_lstm_grad", "block_lstm_grad_v2",
       "gru_block_cell", "gru_block_cell_grad", "gru_block_cell_grad_full")


def _dim(rng, low=0):
    """Mostly small, sometimes 0, sometimes a medium size (long enough nogil work
    for the threads to overlap)."""
    r = rng.random()
    if r < 0.06 and low == 0:
        return 0
    if r < 0.2:
        return int(rng.integers(24, 97))
    return int(rng.integers(max(low, 1), 7))


def _random_call(rng):
    """(op name, kwargs) for one random valid call."""
    op = OPS[int(rng.integers(len(OPS)))]
    dtype = (np.float32, np.float64)[int(rng.integers(2))]
    cell_op = op.startswith("lstm_block_cell") or op.startswith("gru")
    B = _dim(rng, low=1 if op == "lstm_block_cell" else 0)
    H = _dim(rng, low=1 if op == "lstm_block_cell" else 0)
    I = _dim(rng)
    T = 0 if rng.random() < 0.05 else int(rng.integers(1, 11))
    use_peephole = bool(rng.integers(2))

    def a(*shape):
        return rng.uniform(-1, 1, shape).astype(dtype)

    if op.startswith("gru"):
        args = dict(x=a(B, I), h_prev=a(B, H), w_ru=a(I + H, 2 * H) / 4, w_c=a(I + H, H) / 4,
                    b_ru=a(2 * H), b_c=a(H))
        if op != "gru_block_cell":
            args.update(r=a(B, H), u=a(B, H), c=a(B, H), d_h=a(B, H))
        return op, args
    forward = op in ("lstm_block_cell", "block_lstm", "block_lstm_v2")
    # Unused peephole vectors may have any length, except in the sequence forwards.
    peep_len = H if (use_peephole or op.startswith("block_lstm") and forward) \
        else int(rng.integers(0, 4))
    x = a(B, I) if cell_op else a(T, B, I)
    args = dict(x=x, cs_prev=a(B, H), h_prev=a(B, H), w=a(I + H, 4 * H) / 4,
                wci=a(peep_len), wcf=a(peep_len), wco=a(peep_len), b=a(4 * H))
    if not cell_op:
        L = int(rng.integers(0, T + 1))
        args = dict(seq_len_max=(int, np.int32, np.int64)[int(rng.integers(3))](L), **args)
    if forward:
        args["use_peephole"] = use_peephole
        args["cell_clip"] = float(rng.choice([0.0, -1.0, 0.25, 3.0]))
        if op != "block_lstm_v2":
            args["forget_bias"] = float(rng.uniform(-1, 2))
        return op, args
    shape = (B, H) if cell_op else (T, B, H)
    names = ("i", "cs", "f", "o", "ci", "co") + (() if cell_op else ("h",)) + ("cs_grad", "h_grad")
    args.update({n: a(*shape) for n in names})
    if op == "lstm_block_cell_grad_full" and rng.random() < 0.3:
        args[("cs_grad", "h_grad")[int(rng.integers(2))]] = None
    args["use_peephole"] = use_peephole
    return op, args


def _problems():
    return [[_random_call(np.random.default_rng([k, j])) for j in range(CALLS_PER_THREAD)]
            for k in range(N_THREADS)]


def _call(op, args):
    return tuple(getattr(blockrnn, op)(**args))


def _check_same(expected, got, where):
    assert len(expected) == len(got), where
    for k, (e, g) in enumerate(zip(expected, got)):
        assert type(g) is np.ndarray, (where, k, type(g))
        assert g.dtype == e.dtype and g.shape == e.shape, (where, k, g.dtype, g.shape,
                                                           e.dtype, e.shape)
        assert np.array_equal(g, e, equal_nan=True), (where, k)


def _stress(problems, serial):
    """Threads k run problems[k] then problems[k+1]; compare with ``serial``."""
    start = threading.Barrier(N_THREADS, timeout=60)

    def worker(k):
        start.wait()
        mine = [_call(*c) for c in problems[k]]
        nxt = (k + 1) % N_THREADS
        theirs = [_call(*c) for c in problems[nxt]]
        return mine, theirs

    with ThreadPoolExecutor(max_workers=N_THREADS) as pool:
        results = list(pool.map(worker, range(N_THREADS)))
    for k, (mine, theirs) in enumerate(results):
        nxt = (k + 1) % N_THREADS
        for j, (e, g) in enumerate(zip(serial[k], mine)):
            _check_same(e, g, (problems[k][j][0], "thread", k, "call", j))
        for j, (e, g) in enumerate(zip(serial[nxt], theirs)):
            _check_same(e, g, (problems[nxt][j][0], "thread", k, "neighbour call", j))


@pytest.fixture(scope="module")
def problems_and_serial():
    problems = _problems()
    ops_covered = {op for calls in problems for op, _ in calls}
    assert ops_covered == set(OPS), set(OPS) - ops_covered
    serial = [[_call(*c) for c in calls] for calls in problems]
    return problems, serial


def test_threads_give_the_serial_bits(problems_and_serial):
    _stress(*problems_and_serial)


def test_threads_with_parallel_gate_loops_give_the_serial_bits(problems_and_serial,
                                                                monkeypatch):
    if not _kernels.openmp_enabled():
        pytest.fail(f"blockrnn was built without OpenMP: {_config.build_config()}",
                    pytrace=False)
    monkeypatch.setattr(_config, "MIN_PARALLEL_WORK", 0)
    if _config.kernel_threads(8, 8) < 2:
        pytest.fail(f"the gate loops cannot go parallel here (OMP_NUM_THREADS=1 or one "
                    f"usable CPU?): {_config.build_config()}", pytrace=False)
    _stress(*problems_and_serial)
