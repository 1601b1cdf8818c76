"""Shared pytest fixtures for the blockrnn tests.

* ``tf`` (session fixture): imports TensorFlow lazily -- only test modules that request it pay
  for the import -- and FAILS (not skips) if it is missing: the parity tests are mandatory.
* ``parity_record`` (session fixture): ``record(label, err)`` keeps the worst error seen per
  label; the table is printed in the terminal summary (use ``-rA`` or just read the end of
  the run's output).
* Random-input generators live in ``tests/_inputs.py`` (``from _inputs import ...``); this
  conftest makes that import work whatever pytest's import mode is.
"""

import os
import sys

import pytest

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

_PARITY_WORST = {}


@pytest.fixture(scope="session")
def tf():
    """The ``tensorflow`` module (2.21, used eagerly as the oracle)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow
    except ImportError as exc:  # pragma: no cover - depends on the environment
        pytest.fail(
            "TensorFlow is required for the parity tests but cannot be imported "
            f"({exc!r}); install the test extras with `pip install -e .[test]`.",
            pytrace=False)
    return tensorflow


@pytest.fixture(scope="session")
def parity_record():
    """``record(label, err)``: remember the worst (largest) error seen for ``label``."""
    def record(label, err):
        err = float(err)
        if label not in _PARITY_WORST or not (err <= _PARITY_WORST[label]):
            _PARITY_WORST[label] = err
    return record


def pytest_terminal_summary(terminalreporter):
    if not _PARITY_WORST:
        return
    terminalreporter.section("worst parity errors (max |a-b| / max(1,|b|))")
    for label in sorted(_PARITY_WORST):
        terminalreporter.write_line(f"{label:58s} {_PARITY_WORST[label]:.3e}")
