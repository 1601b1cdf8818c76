"""`python -m blockrnn`: build configuration and self-check against the reference."""
import subprocess
import sys

import blockrnn
from blockrnn.__main__ import main


def test_main_job_passes_and_reports_the_configuration(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert blockrnn.__version__ in out
    for key in ("blas", "openmp", "openmp_max_threads"):
        assert key in out
    assert out.count(" ok") == 26  # twelve entry points (+ lengths) x two dtypes
    assert "FAILED" not in out


def test_main_job_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "blockrnn", "--seed", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all ops agree with the reference" in proc.stdout


def test_main_job_fails_when_an_op_disagrees(monkeypatch, capsys):
    real = blockrnn.gru_block_cell

    def off_by_a_little(*args):
        out = real(*args)
        return out._replace(h=out.h + 1e-3)

    monkeypatch.setattr(blockrnn, "gru_block_cell", off_by_a_little)
    assert main([]) == 1
    assert "FAILED" in capsys.readouterr().out
