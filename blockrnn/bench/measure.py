"""Measurement helpers: cell-loop calibration, peak memory, the sgemm roofline, the header."""
import ctypes
import ctypes.util
import gc
import os
import platform
import time
import tracemalloc

import numpy as np


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

def calibrate(fn, target):
    """Calls per sample so that one sample lasts about ``target`` seconds (at least 1)."""
    if target <= 0:
        return 1
    start = time.perf_counter()
    fn()
    single = time.perf_counter() - start
    return max(1, min(100_000, int(target / max(single, 1e-9))))


# --------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------

def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _load_malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        return trim
    except (OSError, AttributeError):   # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


class _NoGC:
    """No garbage-collection pass inside a measured call (gc.collect() itself takes
    ~0.2 s once TensorFlow is loaded, so it is not called either)."""

    def __enter__(self):
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.enabled:
            gc.enable()


def rss_peak_increase(fn):
    """Peak resident memory increase (bytes) during one ``fn()`` call, or None.

    Linux only: glibc's free heap memory is first returned to the OS (malloc_trim(0)),
    then writing "5" to /proc/self/clear_refs resets VmHWM (the RSS high-water mark) to
    the current RSS; after the call, VmHWM - VmRSS(before) is the increase. Memory that
    an allocator of its own keeps resident from earlier calls (TF's, ORT's arenas) is
    reused without raising the RSS, so this is a lower bound for such peers.
    """
    try:
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)
        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        if _status_kb("VmHWM") > before + 1024:   # reset did not take
            return None
        with _NoGC():
            result = fn()
            peak = _status_kb("VmHWM")
            del result
        return max(0, peak - before) * 1024
    except (OSError, KeyError, ValueError):
        return None


def tracemalloc_peak(fn):
    """Peak of the memory traced by tracemalloc (bytes) during one ``fn()`` call.

    NumPy reports its array buffers to tracemalloc, so for blockrnn (whose outputs and
    workspaces are NumPy arrays) this is its exact allocation peak.
    """
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with _NoGC():
            result = fn()
            _, peak = tracemalloc.get_traced_memory()
            del result
        return max(0, peak - base)
    finally:
        if not was_tracing:
            tracemalloc.stop()


# --------------------------------------------------------------------------
# The sgemm roofline
# --------------------------------------------------------------------------

def sgemm_peak(n=2048, repeats=3):
    """Best GFLOP/s of ``scipy.linalg.blas.sgemm`` on n x n x n float32 (Fortran order)."""
    from scipy.linalg.blas import sgemm
    rng = np.random.default_rng(0)
    a = np.asfortranarray(rng.standard_normal((n, n), dtype=np.float32))
    b = np.asfortranarray(rng.standard_normal((n, n), dtype=np.float32))
    sgemm(1.0, a, b)   # warm-up (thread pool start-up)
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        sgemm(1.0, a, b)
        best = min(best, time.perf_counter() - start)
    return {"n": n, "repeats": repeats, "best_s": best, "gflops": 2.0 * n ** 3 / best / 1e9}


# --------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------

def usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def threadpool_info():
    """threadpoolctl's view of the loaded BLAS/OpenMP pools, or None if not installed."""
    try:
        from threadpoolctl import threadpool_info as info
    except ImportError:
        return None
    return [{k: d.get(k) for k in ("user_api", "internal_api", "num_threads", "version",
                                     "filepath")} for d in info()]


THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "BLOCKRNN_NUM_THREADS")
