"""The installed wheel, not the source tree, passes the test suite.

SLOW (about a minute): this module compiles blockrnn into a wheel, installs it into a
fresh virtual environment and runs the other tests there. It catches what in-place
tests cannot: a module, .pxd or compiled extension missing from the wheel, a test
that only passes because it imports the source tree, an extension that only loads
beside its build directory.

How the fresh environment sees the test dependencies without seeing this checkout:
a ``.pth`` file in its site-packages lists the running environment's site-packages
directories. A plain path line in a ``.pth`` file only appends that directory to
``sys.path``; ``site`` does not read the ``.pth`` files inside it, so the editable
install's import hook (``__editable__*.pth`` in the outer site-packages, which is how
``pip install -e .`` maps ``blockrnn`` to this checkout) stays inactive. The fresh
environment's own site-packages comes first on ``sys.path`` anyway; the test still
checks where ``blockrnn`` was imported from.

The wheel is built with ``pip wheel --no-deps --no-build-isolation`` when the running
environment has the build requirements (setuptools with bdist_wheel, Cython >= 3.1,
SciPy), so nothing is downloaded; otherwise pip builds it in an isolated environment
from the package index.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from xml.etree import ElementTree

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)

# Every module the package needs at run time, and the Cython declarations it ships
# for code that cimports it (pyproject.toml: package-data *.pxd).
PACKAGE_FILES = [
    "blockrnn/__init__.py", "blockrnn/__main__.py", "blockrnn/_config.py",
    "blockrnn/_reference.py", "blockrnn/_validation.py", "blockrnn/_version.py",
    "blockrnn/gru.py", "blockrnn/lstm.py", "blockrnn/raw_ops.py",
    "blockrnn/layers.py", "blockrnn/torch.py", "blockrnn/convert.py", "blockrnn/demo.py",
    "blockrnn/onnx.py", "blockrnn/jax.py", "blockrnn/inference.py",
    "blockrnn/bench/__init__.py", "blockrnn/bench/run.py", "blockrnn/bench/peers.py",
    "blockrnn/bench/measure.py", "blockrnn/bench/targets.py", "blockrnn/bench/threads.py",
    "blockrnn/bench/worker.py", "blockrnn/bench/serve.py",
    "blockrnn/data/shakespeare.txt",
    "blockrnn/_blas.pxd", "blockrnn/_openmp.pxd", "blockrnn/_kernels.pxd", "blockrnn/capi.pxd",
]
# The installed-wheel run leaves out this module (it would recurse), the slow
# randomised modules, which test the same compiled code as the in-place run, and
# the benchmark harness's smoke test (the installed harness runs end to end in
# test_installed_wheel_runs_the_benchmark instead).
NOT_RERUN = ("test_wheel.py", "test_fuzz.py", "test_stress.py", "test_benchmarks.py")
# Files beside tests/ that the tests read; pyproject.toml's cibuildwheel
# test-sources lists them with tests/.
TEST_SOURCE_FILES = ("README.md",)
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "wheelhouse", "*.egg-info", "__pycache__",
    ".pytest_cache", ".hypothesis", "*.so", "*.o", "_kernels.c", "_kernels.html")


def _run(cmd, timeout, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                    f"--- stdout ---\n{proc.stdout[-6000:]}\n"
                    f"--- stderr ---\n{proc.stderr[-6000:]}", pytrace=False)
    return proc


def _clean_env():
    """The environment minus what would put the source tree on sys.path."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"):
        env.pop(name, None)
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _missing_build_requirements():
    """What the running environment lacks to build the wheel without isolation."""
    missing = []
    try:
        import setuptools
        major_minor = tuple(int(p) for p in setuptools.__version__.split(".")[:2])
        if major_minor < (70, 1) and importlib.util.find_spec("wheel") is None:
            missing.append("wheel (setuptools < 70.1 has no bdist_wheel of its own)")
        if major_minor < (64, 0):
            missing.append("setuptools>=64")
    except ImportError:
        missing.append("setuptools>=64")
    try:
        import Cython
        if tuple(int(p) for p in Cython.__version__.split(".")[:2]) < (3, 1):
            missing.append("Cython>=3.1")
    except ImportError:
        missing.append("Cython>=3.1")
    if importlib.util.find_spec("scipy") is None:
        missing.append("scipy")
    return missing


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a clean copy of the source tree (no in-place .so, no build/)."""
    if not os.path.exists(os.path.join(ROOT, "setup.py")):
        pytest.fail(f"test_wheel.py needs the source tree; no setup.py in {ROOT}. Run it "
                    "from a checkout (cibuildwheel runs the suite with --ignore=tests/"
                    "test_wheel.py).", pytrace=False)
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=COPY_IGNORE)
    out = tmp / "out"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)]
    if not _missing_build_requirements():
        cmd.insert(cmd.index("--no-deps"), "--no-build-isolation")
    env = _clean_env()
    env["BLOCKRNN_FAIL_NO_OPENMP"] = "1" if _outer_openmp() else "0"
    _run(cmd, timeout=600, cwd=tmp, env=env)
    wheels = list(out.glob("blockrnn-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _outer_openmp():
    from blockrnn import _kernels
    return bool(_kernels.openmp_enabled())


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh virtual environment with the wheel installed and the running
    environment's third-party packages visible through a .pth file."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    _run([sys.executable, "-m", "venv", str(path)], timeout=300, env=_clean_env())
    python = path / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
         timeout=300, env=_clean_env())
    inner_site = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        timeout=60, env=_clean_env()).stdout.strip()
    # The running environment's site directories: its own, and any that it reaches
    # through .pth files of its own (never the source tree).
    outer = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    outer += [p for p in sys.path
              if p and os.path.basename(p) in ("site-packages", "dist-packages")]
    outer = [os.path.realpath(p) for p in outer if os.path.isdir(p)]
    outer = [p for p in dict.fromkeys(outer) if p != os.path.realpath(ROOT)]
    # A sentinel directory whose own .pth file would flag it if site processed it:
    # proves the claim above whatever the outer environment's install mode is.
    sentinel = path.parent / "sentinel_site"
    sentinel.mkdir()
    (sentinel / "sentinel.pth").write_text("import builtins; builtins.SENTINEL_PTH_RAN = True\n")
    with open(os.path.join(inner_site, "_outer_site_packages.pth"), "w") as f:
        f.write("".join(p + "\n" for p in outer + [str(sentinel)]))
    return python


def test_wheel_contains_the_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    missing = [n for n in PACKAGE_FILES if n not in names]
    assert not missing, f"{wheel.name} lacks {missing}; it has {sorted(names)}"
    extensions = [n for n in names if n.startswith("blockrnn/_kernels") and n.endswith(".so")]
    assert len(extensions) == 1, f"{wheel.name}: compiled kernels {extensions}"
    assert not [n for n in names if n.startswith(("tests/", "include/"))], names


_PROBE = r"""
import json, os, sys
import blockrnn
from blockrnn import _kernels
print(json.dumps({
    "blockrnn": os.path.realpath(blockrnn.__file__),
    "kernels": os.path.realpath(_kernels.__file__),
    "openmp": bool(_kernels.openmp_enabled()),
    "editable_hooks": [m for m in (getattr(f, "__module__", "") for f in sys.meta_path)
                       if "editable" in m],
    "nested_pth_ran": hasattr(__import__("builtins"), "SENTINEL_PTH_RAN"),
    "sys_path": [os.path.realpath(p) for p in sys.path if p],
}))
"""


def test_fresh_venv_imports_the_wheel_not_the_source_tree(venv, tmp_path):
    info = json.loads(_run([str(venv), "-c", _PROBE], timeout=120, cwd=tmp_path,
                           env=_clean_env()).stdout)
    prefix = os.path.realpath(venv.parent.parent) + os.sep
    assert info["blockrnn"].startswith(prefix), info
    assert info["kernels"].startswith(prefix), info
    assert not info["blockrnn"].startswith(os.path.realpath(ROOT) + os.sep), info
    # The outer site-packages is on sys.path, but its .pth files (the editable
    # install's finder among them) were not processed.
    assert info["editable_hooks"] == [], info
    assert not info["nested_pth_ran"], info
    assert any(p.endswith("sentinel_site") for p in info["sys_path"]), info
    assert os.path.realpath(ROOT) not in info["sys_path"], info
    assert info["openmp"] == _outer_openmp(), info


def test_installed_wheel_passes_the_test_suite(venv, tmp_path):
    tests = tmp_path / "tests"
    shutil.copytree(TESTS_DIR, tests, ignore=shutil.ignore_patterns("__pycache__", *NOT_RERUN))
    # What cibuildwheel's test-sources copies (pyproject.toml): test_readme.py runs
    # the README's examples from ../README.md.
    for name in TEST_SOURCE_FILES:
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    # One more test, run inside the inner session: blockrnn comes from the fresh venv.
    prefix = os.path.realpath(venv.parent.parent) + os.sep
    (tests / "test_zz_installed_location.py").write_text(
        "import os\n"
        "import blockrnn\n\n\n"
        "def test_blockrnn_comes_from_the_fresh_venv():\n"
        f"    assert os.path.realpath(blockrnn.__file__).startswith({prefix!r}), \\\n"
        "        blockrnn.__file__\n")
    run_dir = tmp_path / "cwd"
    run_dir.mkdir()
    report = tmp_path / "report.xml"
    cmd = [str(venv), "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider",
           f"--junitxml={report}", str(tests)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=run_dir,
                          env=_clean_env())
    out = proc.stdout[-5000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"the installed-wheel test run failed:\n{out}"
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, out)
    ran = {(c.get("classname", "").rsplit(".", 1)[-1], c.get("name").split("[")[0])
           for c in suite.iter("testcase")}
    expected_modules = {n[:-3] for n in os.listdir(TESTS_DIR)
                        if n.startswith("test_") and n.endswith(".py") and n not in NOT_RERUN}
    assert expected_modules <= {m for m, _ in ran}, (expected_modules, sorted(ran)[:20])
    assert ("test_zz_installed_location", "test_blockrnn_comes_from_the_fresh_venv") in ran
    assert counts["tests"] > 1000, counts  # the whole suite, not a collection accident


def test_installed_wheel_runs_the_benchmark(venv, tmp_path):
    """``python -m blockrnn bench --quick`` from the wheel, outside the source tree:
    the harness ships in the package (blockrnn.bench), every installed peer checked."""
    cmd = [str(venv), "-m", "blockrnn", "bench", "--quick", "--shapes", "6,2,4,8",
           "--cell-shape", "1,4,4", "--sgemm-size", "128",
           "--json", str(tmp_path / "bench.json")]
    proc = _run(cmd, timeout=600, cwd=tmp_path, env=_clean_env())
    print(proc.stdout)   # shown with pytest -s: the wheel-installed bench output
    results = json.loads((tmp_path / "bench.json").read_text())
    assert not results["failed"] and all(p["ok"] for p in results["parity"]), results["parity"]
    impls = {r["impl"] for r in results["rows"]}
    assert "blockrnn" in impls, impls
    assert {(r["workload"], tuple(r["shape"])) for r in results["rows"]
            if r["impl"] == "blockrnn"} >= {("lstm_fwd", (6, 2, 4, 8)),
                                            ("gru_fwdbwd", (6, 2, 4, 8))}
    assert "\ntargets (medians" in proc.stdout, proc.stdout[-2000:]
    # every implementation timed in a worker process of the installed package
    assert {w["impl"] for w in results["workers"]} == impls
    assert len({w["pid"] for w in results["workers"]}) == len(results["workers"])
    where = _run([str(venv), "-c", "import blockrnn.bench, os; "
                  "print(os.path.realpath(blockrnn.bench.__file__))"],
                 timeout=120, cwd=tmp_path, env=_clean_env()).stdout.strip()
    assert where.startswith(os.path.realpath(venv.parent.parent) + os.sep), where
