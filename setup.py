"""Build script for blockrnn's compiled core.

The kernels are one Cython module, ``blockrnn._kernels``. OpenMP is detected the
way scikit-learn (<= 1.4) does it: compile, link *and run* a tiny program with the
compiler's OpenMP flag; without OpenMP the build still succeeds and the ``prange``
loops run serially (set ``BLOCKRNN_FAIL_NO_OPENMP=1`` to make that an error).

Environment switches:
- ``BLOCKRNN_FAIL_NO_OPENMP=1``: fail instead of building without OpenMP.
- ``BLOCKRNN_DEBUG=1``: ``-O0 -g`` (for debuggers); ``BLOCKRNN_DEBUG=O1``: ``-O1 -g``
  (for sanitizers: tools/sanitize.sh).
"""
import glob
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("BLOCKRNN_DEBUG", "0")
DEBUG_OPT = {"1": "-O0", "O1": "-O1"}.get(DEBUG)
DEBUG = DEBUG_OPT is not None

OPENMP_TEST_PROGRAM = textwrap.dedent(
    """
    #include <omp.h>
    #include <stdio.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        printf("%d", n == omp_get_max_threads());
        return 0;
    }
    """
)


def openmp_flag(compiler):
    """The compiler flag that enables OpenMP, or [] where it comes from the environment."""
    if compiler.compiler_type == "msvc":
        return ["/openmp"]
    if sys.platform == "darwin":
        # Apple clang: CPPFLAGS carries -Xpreprocessor -fopenmp, LDFLAGS -lomp.
        return []
    return ["-fopenmp"]


def openmp_works(compiler, flags):
    """Compile, link and run a thread-count program with ``flags``."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "test_openmp.c")
        with open(src, "w") as f:
            f.write(OPENMP_TEST_PROGRAM)
        try:
            objects = compiler.compile([src], output_dir=tmp, extra_postargs=flags)
            exe = os.path.join(tmp, "test_openmp")
            compiler.link_executable(objects, exe, extra_postargs=flags)
            out = subprocess.run([exe], capture_output=True, text=True, timeout=60)
        except Exception:  # compile, link or run failure: no usable OpenMP
            return False
        return out.returncode == 0 and out.stdout.strip() == "1"


class BuildExt(build_ext):
    """Adds OpenMP and optimisation flags once the compiler is known."""

    def build_extensions(self):
        flags = openmp_flag(self.compiler)
        if openmp_works(self.compiler, flags):
            print("blockrnn: building with OpenMP (%s)" % " ".join(flags or ["from environment"]))
        else:
            if os.environ.get("BLOCKRNN_FAIL_NO_OPENMP", "0") == "1":
                raise RuntimeError("blockrnn: OpenMP is not usable and BLOCKRNN_FAIL_NO_OPENMP=1")
            warnings.warn("blockrnn: OpenMP not usable with this compiler; building serial kernels")
            flags = []
        if self.compiler.compiler_type == "msvc":
            opt = [] if DEBUG else ["/O2"]
        else:
            # No -ffast-math: NaN/Inf must propagate exactly as TensorFlow's do.
            # -fno-trapping-math changes no result (nobody reads the FP
            # exception flags); it lets GCC vectorise the branch-free selects
            # of include/brnn_math.h's activations.
            # -g0 drops the debug info Python's own CFLAGS ask for (2.5 MB -> 0.5 MB).
            opt = [DEBUG_OPT, "-g"] if DEBUG else ["-O3", "-g0", "-fno-trapping-math"]
        for ext in self.extensions:
            ext.extra_compile_args = opt + flags + ext.extra_compile_args
            ext.extra_link_args = flags + ext.extra_link_args
        super().build_extensions()


def extensions():
    import numpy
    from Cython.Build import cythonize

    kernels = Extension(
        "blockrnn._kernels",
        sources=["blockrnn/_kernels.pyx"],
        include_dirs=[os.path.join(HERE, "include"), numpy.get_include()],
        # Every header and Cython include: editing any of them rebuilds the module
        # (a hand-kept list had missed include/brnn_gemm.h).
        depends=sorted(os.path.relpath(path, HERE) for pattern in
                       ("include/*.h", "blockrnn/_*.pxi", "blockrnn/*.pxd")
                       for path in glob.glob(os.path.join(HERE, pattern))),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    directives = {
        "language_level": 3,
        # Shapes are validated in Python before any kernel runs, and the
        # kernels take &a[0, 0] of possibly empty arrays: no bounds checks.
        "boundscheck": False,
        "wraparound": False,
        "initializedcheck": False,
        "nonecheck": False,
        "cdivision": True,
        "embedsignature": True,
    }
    return cythonize([kernels], compiler_directives=directives)


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
