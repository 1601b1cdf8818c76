"""Memory of the sequence ops: beyond the outputs, one call allocates at most one
T x B x 4H workspace plus O(B x H); the backwards also allocate the GEMM
driver's packing blocks for x_grad and the weight gradients (include/brnn_gemm.h:
at most 710 KB per thread for float32, 611 KB for float64, whatever the sizes). The forward ops allocate only
O(B x H), plus transposed copies of the recurrent weights (4H x H for the LSTM,
3H x H for the GRU) when those are no larger than T x B x 4H, or for the float32
forwards a packed copy of the weights (NumPy reports its allocations to
tracemalloc)."""
import platform
import re
import resource
import tracemalloc

import numpy as np
import pytest

import blockrnn
from blockrnn import _config, _kernels

T, B, I, H = 40, 16, 24, 32
SLACK = 64 * 1024   # O(B*H) scratch, small NumPy objects, the namedtuple


def _driver_blocks(dtype, gates, products):
    """Bytes of the backward's GEMM-driver blocks: one block per thread, sized for
    its largest product (M, N, K); `gates` columns of dG (4H or 3H)."""
    L_B = T * B
    work = L_B * gates * H * (2 * I + H)
    threads = _kernels.packed_gemm_threads_for(work, _config.thread_limit())
    ws_for = (_kernels.packed_gemm_ws_for if dtype == np.float32
              else _kernels.packed_dgemm_ws_for)
    return threads * max(ws_for(*p) for p in products) * np.dtype(dtype).itemsize


def _peak(fn, *args, **kwargs):
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        out = fn(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    return out, peak


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sequence_ops_stay_within_one_workspace(dtype):
    rng = np.random.default_rng(0)
    rand = lambda *s: rng.uniform(-1, 1, s).astype(dtype)  # noqa: E731
    item = np.dtype(dtype).itemsize
    workspace = T * B * 4 * H * item
    lstm = (T, rand(T, B, I), rand(B, H), rand(B, H), rand(I + H, 4 * H), rand(H), rand(H),
            rand(H), rand(4 * H))
    fwd, peak = _peak(blockrnn.block_lstm_v2, *lstm, use_peephole=True)
    outputs = sum(a.nbytes for a in fwd)
    # The LSTM forward needs no T x B x 4H buffer: its input projection goes
    # into the gate outputs, and a step's recurrent product into B x 4H.
    # float64: from a 4H x H copy of W_h (H <= T * B here) through a 4H x B
    # transpose; float32: from w [I+H, 4H] packed (each gate block's columns
    # padded to a multiple of 16).
    if dtype == np.float64:
        scratch = (2 * B * 4 * H + 4 * H * H) * item
    else:
        scratch = (B * 4 * H + (I + H) * 4 * (-(-H // 16) * 16)) * item
    assert 4 * H * H <= T * B * 4 * H
    assert outputs <= peak <= outputs + scratch + SLACK, (peak, outputs)
    assert workspace > scratch + 2 * SLACK   # so the line above fails with a T x B x 4H buffer

    grads, peak = _peak(blockrnn.block_lstm_grad_v2, *lstm, *fwd, fwd.cs, fwd.h,
                        use_peephole=True)
    outputs = sum(a.nbytes for a in grads)
    driver = _driver_blocks(dtype, 4, [(T * B, I, 4 * H), (I, 4 * H, T * B),
                                       (H, 4 * H, T * B)])
    assert driver <= 629 * 1024 * _config.thread_limit()
    assert outputs <= peak <= outputs + workspace + driver + SLACK, (peak, outputs, workspace)

    gru = (T, lstm[1], lstm[3], rand(I + H, 2 * H), rand(I + H, H), rand(2 * H), rand(H))
    g_fwd, peak = _peak(blockrnn.block_gru, *gru)
    outputs = sum(a.nbytes for a in g_fwd)
    # O(B x H), plus copies of the recurrent weights [3H, H] and a [2H, B] transpose
    # (float64), or w_ru and w_c packed ([I+H, 3H], columns padded to 16; float32)
    if dtype == np.float64:
        scratch = (B * 3 * H + 3 * H * H + 2 * H * B) * item
    else:
        scratch = (B * 3 * H + (I + H) * 3 * (-(-H // 16) * 16)) * item
    assert outputs <= peak <= outputs + scratch + SLACK, (peak, outputs)
    g_grads, peak = _peak(blockrnn.block_gru_grad, *gru, *g_fwd, g_fwd.h)
    outputs = sum(a.nbytes for a in g_grads)
    driver = _driver_blocks(dtype, 3, [(T * B, I, 2 * H), (I, 2 * H, T * B),
                                       (H, 2 * H, T * B)])
    assert outputs <= peak <= outputs + workspace + driver + SLACK, (peak, outputs, workspace)


def test_outputs_of_4_mb_or_more_are_traced_and_freed():
    """Outputs of SHARED_BLOCK_BYTES or more each are blocks blockrnn maps itself
    (include/brnn_alloc.h, on Linux): tracemalloc counts them, and their memory goes
    back when the arrays are freed."""
    rng = np.random.default_rng(0)
    rand = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    h = 8
    b = _kernels.SHARED_BLOCK_BYTES // (h * 4)
    args = (1, rand(1, b, 4), rand(b, h), rand(b, h), rand(4 + h, 4 * h), rand(h), rand(h),
            rand(h), rand(4 * h))
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        fwd = blockrnn.block_lstm_v2(*args, use_peephole=True)
        outputs = sum(a.nbytes for a in fwd)
        held = tracemalloc.get_traced_memory()[0] - start
        del fwd
        left = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert outputs >= 7 * _kernels.SHARED_BLOCK_BYTES
    assert outputs <= held <= outputs + SLACK, (held, outputs)
    assert left <= SLACK, left


def _populate_supported():
    """Whether this OS faults a range in on request (MADV_POPULATE_WRITE: Linux 5.14)."""
    if platform.system() != "Linux":
        return False
    release = tuple(int(part) for part in re.findall(r"\d+", platform.release())[:2])
    return release >= (5, 14)


@pytest.mark.skipif(not _populate_supported(),
                    reason="needs MADV_POPULATE_WRITE (Linux 5.14 or newer)")
@pytest.mark.parametrize("count, shape", [
    (1, (_kernels.SHARED_BLOCK_BYTES // 4,)),   # exactly 2 frames of 2 MB
    (5, (100, 64, 512)),                        # 6.25 frames each
    (7, (3, 700, 1000)),                        # not a whole number of 4 KB pages
])
def test_outputs_of_4_mb_or_more_are_faulted_in_before_the_kernel(count, shape):
    """Outputs of SHARED_BLOCK_BYTES or more each are faulted in when they are made
    (include/brnn_alloc.h), before the kernel's threads write them: writing them
    afterwards takes no page fault.

    A fault the kernel or Python takes for another reason (a NUMA-balancing hint,
    a new allocator arena) can land inside the window, so up to five fresh sets of
    buffers are tried and one must fill with no fault: outputs that were not
    faulted in take at least one fault per 2 MB frame on every try."""
    tries = []
    for _ in range(5):
        bufs = _kernels.output_buffers(count, shape, np.float32)
        assert len(bufs) == count and all(a.shape == shape for a in bufs)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for a in bufs:
            a.fill(1.0)
        tries.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        del bufs
        if tries[-1] == 0:
            break
    assert min(tries) == 0, f"page faults while filling, per try: {tries}"
