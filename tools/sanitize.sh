#!/usr/bin/env bash
# Build blockrnn's kernels with AddressSanitizer + UndefinedBehaviorSanitizer and run
# the test suite against that build.
#
#   PYTHON=.venv/bin/python tools/sanitize.sh                 # tests/ minus test_wheel.py
#   PYTHON=.venv/bin/python tools/sanitize.sh tests/test_fuzz.py -x   # any pytest args
#
# PYTHON (default python3) must have the build and test requirements (setuptools,
# Cython, SciPy, pytest, hypothesis, TensorFlow for the parity tests). Works from any
# directory; the source tree is not touched: the build happens in a temporary copy
# (KEEP=1 keeps it and prints where).
#
# How:
# * CC="gcc -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
#   and BLOCKRNN_DEBUG=O1 (setup.py: -O1 -g; at -O0 the packed kernel's intrinsics
#   run so slowly that the demo's time-bound training test no longer learns in its
#   4 seconds; -O1 is what ASan's documentation recommends). Setting CC, not CFLAGS, puts the flags on
#   every compile AND link, including setup.py's OpenMP probe program (with CFLAGS
#   alone the probe fails to link and the build silently drops OpenMP);
#   BLOCKRNN_FAIL_NO_OPENMP=1 makes that an error anyway.
# * The interpreter is not instrumented, so the ASan runtime must be loaded first:
#   LD_PRELOAD=$(gcc -print-file-name=libasan.so), followed by libstdc++: without it
#   ASan cannot find the real __cxa_throw, and the first C++ exception thrown by an
#   extension loaded later (TensorFlow's import hits one in matplotlib's ft2font)
#   aborts with "CHECK failed: asan_interceptors.cpp:320".
# * ASAN_OPTIONS=detect_leaks=0 (CPython never frees some memory by design);
#   UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1; both with log_path= so that
#   every process writes its report to a file (pytest captures fd 2, and a report
#   written there dies with the aborted process). PYTHONMALLOC=malloc so that
#   Python's own small objects also go through ASan's allocator.
# * test_wheel.py is left out: it compiles its own, uninstrumented wheel.
# Any sanitizer report is a bug: the script prints the reports, copies them with the
# pytest log to ./sanitize-pytest.log in the source tree and exits non-zero; it also
# exits non-zero when pytest fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
# An absolute path (the script changes directory); symlinks kept: a venv's python is one.
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac
CC_BASE=${CC_BASE:-gcc}
if [ "$#" -eq 0 ]; then
    set -- tests --ignore=tests/test_wheel.py
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/blockrnn-sanitize.XXXXXX")
if [ "${KEEP:-0}" = "1" ]; then
    trap 'echo "sanitize.sh: kept $WORK"' EXIT
else
    trap 'rm -rf "$WORK"' EXIT
fi

echo "== copying the source tree to $WORK/src"
mkdir -p "$WORK/src"
tar -C "$ROOT" --exclude=.git --exclude=.venv --exclude=build --exclude=dist \
    --exclude=wheelhouse --exclude='*.egg-info' --exclude=__pycache__ --exclude='*.so' \
    --exclude=.hypothesis --exclude=.pytest_cache --exclude=blockrnn/_kernels.c \
    -cf - . | tar -C "$WORK/src" -xf -

echo "== building with ASan + UBSan"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
(
    cd "$WORK/src"
    CC="$CC_BASE $SAN" BLOCKRNN_DEBUG=O1 BLOCKRNN_FAIL_NO_OPENMP=1 \
        "$PYTHON" setup.py build_ext --inplace --force > "$WORK/build.log" 2>&1 \
        || { tail -40 "$WORK/build.log"; exit 1; }
)
so=$(ls "$WORK"/src/blockrnn/_kernels*.so)
grep -E "^(gcc|cc|$CC_BASE) " "$WORK/build.log" | tail -2
if ! nm -D "$so" | grep "__asan_report" > /dev/null; then  # no -q: SIGPIPE + pipefail
    echo "sanitize.sh: $so is not instrumented" >&2
    exit 1
fi

LIBASAN=$("$CC_BASE" -print-file-name=libasan.so)
if [ ! -e "$LIBASAN" ]; then
    echo "sanitize.sh: no libasan.so next to $CC_BASE ($LIBASAN)" >&2
    exit 1
fi

LIBSTDCXX=$(readlink -f "$("$CC_BASE" -print-file-name=libstdc++.so)")
export LD_PRELOAD="$LIBASAN $LIBSTDCXX"
# Reports go to files (one per process, subprocesses and forked children included):
# pytest captures file descriptor 2, and a report written there is lost when the
# sanitizer aborts the process.
REPORTS="$WORK/reports"
mkdir -p "$REPORTS"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}:log_path=$REPORTS/asan
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}:log_path=$REPORTS/ubsan
export PYTHONMALLOC=malloc
export PYTHONPATH="$WORK/src"
export TF_CPP_MIN_LOG_LEVEL=2

echo "== the instrumented module"
(cd "$WORK" && "$PYTHON" -c "import blockrnn, blockrnn._kernels as k; \
print(k.__file__); blockrnn.show_config()")

echo "== pytest $* (LD_PRELOAD=$LD_PRELOAD ASAN_OPTIONS=$ASAN_OPTIONS UBSAN_OPTIONS=$UBSAN_OPTIONS)"
LOG="$WORK/pytest.log"
status=0
(cd "$WORK/src" && "$PYTHON" -m pytest -ra -p no:cacheprovider "$@") > "$LOG" 2>&1 || status=$?
tail -n 25 "$LOG"
if [ "$status" -ne 0 ]; then  # the tail may be all data: name the failures too
    echo "== failures"
    grep -E "^(FAILED|ERROR) |^E   " "$LOG" | head -n 40 || true  # none when pytest died
    cp "$LOG" "$ROOT/sanitize-pytest.log"
    echo "sanitize.sh: pytest log in $ROOT/sanitize-pytest.log" >&2
fi
shopt -s nullglob
report_files=("$REPORTS"/*)
echo "== pytest exit status $status; sanitizer report files: ${#report_files[@]}"
if [ "${#report_files[@]}" -ne 0 ]; then
    for f in "${report_files[@]}"; do
        echo "---- $f"
        head -n 60 "$f"
    done
    cat "$LOG" "${report_files[@]}" > "$ROOT/sanitize-pytest.log"
    echo "sanitize.sh: pytest log and reports in $ROOT/sanitize-pytest.log" >&2
    exit 1
fi
exit "$status"
