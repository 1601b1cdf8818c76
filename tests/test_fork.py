"""Fork safety: a child forked after the parent ran OpenMP gate loops must not hang.

GNU libgomp's thread pool does not survive ``fork`` (GCC bug 60035): the child
inherits the parent's pool bookkeeping but none of its threads, and the first
parallel region it enters can wait forever for them. blockrnn's remedy
(``blockrnn/_config.py``): ``kernel_threads`` returns 1 in any process other than the
one that imported blockrnn, and a gate loop with one thread enters no OpenMP region at
all, so a forked child never touches the inherited pool.

Every test here forces the gate loops parallel in the parent
(``_config.MIN_PARALLEL_WORK = 0``, as in test_threads.py), runs every op family
there, forks, and has the child run them again with the loops still "forced
parallel". A child that hangs is killed after CHILD_TIMEOUT seconds and the test
fails with that diagnosis; pytest itself never waits longer.
"""
import multiprocessing
import os
import pickle
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import blockrnn
from _inputs import (
    block_lstm_grad_inputs, block_lstm_inputs, gru_cell_grad_inputs, gru_cell_inputs,
    lstm_cell_grad_inputs, lstm_cell_inputs)
from blockrnn import _config, _kernels

CHILD_TIMEOUT = 60.0
HANG = ("the forked child did not finish within {:.0f} s and was killed: libgomp's "
        "thread pool does not survive fork (GCC bug 60035); blockrnn must run its gate "
        "loops serially in a forked child (kernel_threads in blockrnn/_config.py)")

pytestmark = pytest.mark.filterwarnings(
    # Python >= 3.12 warns that forking a multi-threaded process may deadlock the
    # child: that is exactly the situation under test.
    "ignore:This process .* is multi-threaded:DeprecationWarning")


def _calls(dtype, seed):
    """One call of each of the 10 entry points: (function name, args, kwargs).
    B = 16 rows so that the forced-parallel gate loops really split rows."""
    T, B, I, H, L = 5, 16, 8, 12, 4
    peep = dict(use_peephole=True)
    cell = lstm_cell_inputs(B, I, H, dtype, seed)
    cell_grad = lstm_cell_grad_inputs(B, I, H, dtype, seed, use_peephole=True)
    seq = block_lstm_inputs(T, B, I, H, dtype, seed)
    seq_grad = block_lstm_grad_inputs(T, B, I, H, L, dtype, seed, use_peephole=True)
    seq_grad_v2 = block_lstm_grad_inputs(T, B, I, H, L, dtype, seed, use_peephole=True,
                                         v2=True)
    gru = gru_cell_inputs(B, I, H, dtype, seed)
    gru_grad = gru_cell_grad_inputs(B, I, H, dtype, seed)
    return [
        ("lstm_block_cell", cell, dict(forget_bias=1.0, cell_clip=0.5, **peep)),
        ("lstm_block_cell_grad", cell_grad, peep),
        ("lstm_block_cell_grad_full", cell_grad, peep),
        ("block_lstm", dict(seq_len_max=L, **seq), dict(cell_clip=0.5, **peep)),
        ("block_lstm_v2", dict(seq_len_max=L, **seq), peep),
        ("block_lstm_grad", seq_grad, peep),
        ("block_lstm_grad_v2", seq_grad_v2, peep),
        ("gru_block_cell", gru, {}),
        ("gru_block_cell_grad", gru_grad, {}),
        ("gru_block_cell_grad_full", gru_grad, {}),
    ]


CALLS = [c for seed, dtype in enumerate((np.float32, np.float64)) for c in _calls(dtype, seed)]


def _run(calls=CALLS):
    return [tuple(getattr(blockrnn, name)(**args, **kwargs)) for name, args, kwargs in calls]


def _mismatches(expected, got):
    bad = []
    for (name, _, _), exp, out in zip(CALLS, expected, got):
        if len(exp) != len(out) or not all(
                e.dtype == g.dtype and e.shape == g.shape and np.array_equal(e, g, equal_nan=True)
                for e, g in zip(exp, out)):
            bad.append(name)
    return bad


@pytest.fixture
def forced_parallel(monkeypatch):
    """Gate loops forced parallel in this process; returns the parent's results."""
    if not _kernels.openmp_enabled():
        pytest.fail(f"blockrnn was built without OpenMP, so there is no fork hazard to "
                    f"test here (build with OpenMP): {_config.build_config()}",
                    pytrace=False)
    monkeypatch.setattr(_config, "MIN_PARALLEL_WORK", 0)
    if _config.kernel_threads(16, 12) < 2:
        pytest.fail(f"the gate loops cannot go parallel here (OMP_NUM_THREADS=1 or one "
                    f"usable CPU?): {_config.build_config()}", pytrace=False)
    return _run()


def _fork_and_check(expected, child_body=_run):
    """Fork; the child runs ``child_body`` and reports through a pipe; the parent
    waits at most CHILD_TIMEOUT seconds. Returns the child's report."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status, message = 3, b"child crashed before reporting"
        try:
            os.close(read_end)
            bad = _mismatches(expected, child_body())
            status, message = (1, f"differ from the parent's: {bad}".encode()) if bad else (0, b"")
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            status, message = 2, f"raised {exc!r}".encode()
        finally:
            try:
                os.write(write_end, message)
            finally:
                os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + CHILD_TIMEOUT
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            pytest.fail(HANG.format(CHILD_TIMEOUT), pytrace=False)
        time.sleep(0.02)
    with os.fdopen(read_end, "rb") as f:
        message = f.read().decode()
    if os.WIFSIGNALED(wait_status):
        pytest.fail(f"the forked child died of signal {os.WTERMSIG(wait_status)}",
                    pytrace=False)
    code = os.WEXITSTATUS(wait_status)
    assert code == 0, f"forked child exit status {code}: results {message}"


def test_forked_child_runs_every_op_after_parallel_loops_in_the_parent(forced_parallel):
    _fork_and_check(forced_parallel)
    # The parent's pool is still fine afterwards.
    assert not _mismatches(forced_parallel, _run())


def test_forked_child_of_a_forked_child(forced_parallel):
    """The hook must hold in a grandchild too (fork again inside the child)."""
    def child_body():
        _fork_and_check(forced_parallel)  # raises in the child on failure
        return _run()
    _fork_and_check(forced_parallel, child_body)


def _pool_task(index):
    name, args, kwargs = CALLS[index]
    return pickle.dumps(tuple(getattr(blockrnn, name)(**args, **kwargs)))


def test_fork_pool_maps_every_op(forced_parallel):
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(2)
    results = None
    try:
        pending = pool.map_async(_pool_task, range(len(CALLS)))
        try:
            results = pending.get(timeout=CHILD_TIMEOUT)
        except multiprocessing.TimeoutError:
            for child in multiprocessing.active_children():
                child.kill()
    finally:
        pool.terminate()
        pool.join()
    if results is None:
        pytest.fail("multiprocessing fork Pool: " + HANG.format(CHILD_TIMEOUT), pytrace=False)
    got = [pickle.loads(r) for r in results]
    assert not _mismatches(forced_parallel, got), _mismatches(forced_parallel, got)


def test_forked_child_after_several_python_threads_used_openmp(forced_parallel):
    """Four Python threads (each with its own libgomp pool) run the ops in parallel
    regions, stay alive and idle, and the main thread forks."""
    n_threads = 4
    finished_calls = threading.Barrier(n_threads + 1, timeout=CHILD_TIMEOUT)
    release = threading.Event()
    thread_results = [None] * n_threads

    def worker(k):
        thread_results[k] = _run()
        finished_calls.wait()
        release.wait(CHILD_TIMEOUT)

    with ThreadPoolExecutor(max_workers=n_threads) as pool:
        futures = [pool.submit(worker, k) for k in range(n_threads)]
        try:
            finished_calls.wait()
            _fork_and_check(forced_parallel)
        finally:
            release.set()
        for f in futures:
            f.result()
    for got in thread_results:
        assert not _mismatches(forced_parallel, got)
    # and once the threads are gone
    _fork_and_check(forced_parallel)
