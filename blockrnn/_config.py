"""Build and threading configuration of the compiled kernels."""
import os

import scipy

from blockrnn import _kernels
from blockrnn._version import __version__

# Threads of the elementwise gate loops outside the packed kernel's regions (the
# cell ops, float64's and the GRU backwards' batch-1 float32 steps): serial unless a
# step's gate block is so large (rows x cells of at least MIN_PARALLEL_WORK) that one
# parallel region per step is noise. (Measured when OpenBLAS's pool ran the products
# in between, 2 cores, 100,64,512,512 float32 forward: 192 ms serial, 1078 ms with
# this threshold lowered to 2^14, libgomp's spinning workers and OpenBLAS's threads
# starving each other; with OMP_WAIT_POLICY=PASSIVE, 39.0 ms vs 39.9 serial at
# 100,32,256,256: waking the workers at every step cost what the second core saved.)
# The float32 sequence ops' loops and the sequence ops' products (but those GEMV steps)
# run on the thread budget instead (_kernels.pyx); OpenBLAS runs on the calling thread.
MIN_PARALLEL_WORK = 1 << 20

# GNU OpenMP's thread pool does not survive fork() (GCC bug 60035): a child
# that opens a parallel region after its parent did can hang. A process other
# than the one that imported blockrnn is a forked child (spawned processes
# import afresh), and it runs every gate loop serially.
_IMPORT_PID = os.getpid()


def kernel_threads(rows, cells):
    """OpenMP threads for one call's elementwise loops over a (rows, cells) block.

    Serial for small blocks and in forked children; otherwise OpenMP's limit
    for the calling thread (OMP_NUM_THREADS, or threadpoolctl's
    ``threadpool_limits``), capped at the CPUs this process may use.
    """
    if rows < 2 or rows * cells < MIN_PARALLEL_WORK or os.getpid() != _IMPORT_PID:
        return 1
    return max(1, min(_kernels.openmp_max_threads(), _usable_cpus(), rows))


def thread_limit():
    """Threads one sequence call may run its time loop on: OpenMP's limit for
    the calling thread (OMP_NUM_THREADS, or threadpoolctl's
    ``threadpool_limits``), capped at the CPUs this process may use; 1 in a
    forked child. The call takes what its size can use, up to this, from the
    process-wide thread budget (README, Threads)."""
    if os.getpid() != _IMPORT_PID:
        return 1
    return max(1, min(_kernels.openmp_max_threads(), _usable_cpus()))


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
        "packed_kernel": _kernels.packed_kernel_name(),
        "usable_cpus": _usable_cpus(),
    }


def show_config():
    """Print the build and runtime configuration."""
    for key, value in build_config().items():
        print(f"{key:>20}: {value}")
