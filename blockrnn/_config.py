"""Build and threading configuration of the compiled kernels."""
import os

import scipy

from blockrnn import _kernels
from blockrnn._version import __version__

# Elementwise gate work (rows x cells) per step below which the OpenMP loops
# stay serial. Deliberately high: every step alternates SciPy's threaded
# OpenBLAS GEMM with the gate loop, and libgomp's spinning workers starve
# OpenBLAS's threads. Measured on 2 cores at T,B,I,H = 100,64,512,512 float32:
# parallel gate loops made BlockLSTMV2 forward 3x slower (1.28 s vs 0.41 s).
# Choosing a threading scheme that avoids the fight is the performance work's.
MIN_PARALLEL_WORK = 1 << 20


def kernel_threads(rows, cells):
    """OpenMP threads for one call's elementwise loops over a (rows, cells) block.

    Serial for small blocks; otherwise OpenMP's own limit (OMP_NUM_THREADS),
    capped at the CPUs this process may use.
    """
    if rows < 2 or rows * cells < MIN_PARALLEL_WORK:
        return 1
    return max(1, min(_kernels.openmp_max_threads(), _usable_cpus(), rows))


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _blas_info():
    """Name and version of SciPy's BLAS, from SciPy's build configuration."""
    try:
        blas = scipy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older SciPy without mode="dicts"
        return "unknown"


def build_config():
    """The build and runtime configuration as a dict (what ``python -m blockrnn`` prints)."""
    return {
        "blockrnn": __version__,
        "numpy": __import__("numpy").__version__,
        "scipy": scipy.__version__,
        "blas": f"SciPy's BLAS via scipy.linalg.cython_blas ({_blas_info()})",
        "openmp": "on" if _kernels.openmp_enabled() else "off (serial kernels)",
        "openmp_max_threads": _kernels.openmp_max_threads(),
        "usable_cpus": _usable_cpus(),
    }


def show_config():
    """Print the build and runtime configuration."""
    for key, value in build_config().items():
        print(f"{key:>20}: {value}")
