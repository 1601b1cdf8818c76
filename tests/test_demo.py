"""blockrnn.demo: a short training run of both cells learns the text.

The held-out loss after a few seconds must be well below the unigram entropy of the
text (the loss of a model that knows only the character frequencies).
"""
import math

import numpy as np
import pytest

from blockrnn import demo


def test_unigram_entropy():
    assert demo.unigram_entropy("aaaa") == 0.0
    assert math.isclose(demo.unigram_entropy("abab"), math.log(2))
    text = demo.load_text()
    assert len(text) > 50_000
    assert 2.5 < demo.unigram_entropy(text) < 4.0


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_short_training_beats_unigram_entropy(cell):
    r = demo.train(seconds=4.0, cell=cell, seed=0, hidden=64, bptt=32, lr=1e-2,
                   eval_every=2.0, sample_length=40, progress=False)
    assert r["cell"] == cell and r["steps"] > 10
    first_val = r["history"][0][3]
    assert first_val > 0.95 * r["entropy"]            # untrained: about log(V)
    assert r["val_loss"] < 0.85 * r["entropy"], r
    assert r["train_loss"] < 0.85 * r["entropy"], r
    assert len(r["sample"]) == 40 and set(r["sample"]) <= set(demo.load_text())


def test_main_prints_report_and_plots(tmp_path, capsys):
    png = tmp_path / "loss.png"
    status = demo.main(["--seconds", "1", "--cell", "gru", "--hidden", "32",
                        "--sample-length", "20", "--no-progress", "--plot", str(png)])
    assert status == 0
    out = capsys.readouterr().out
    for needle in ("unigram entropy of the text:", "final train loss:",
                   "final held-out loss:", "nats/char", "bits/char", "sample"):
        assert needle in out
    assert png.exists() and png.stat().st_size > 1000


def test_clip_and_adam():
    grads = {"a": np.full(4, 3.0, np.float32), "b": np.full(9, 4.0 / 3, np.float32)}
    norm = demo.clip_global_norm(grads, 1.0)
    assert math.isclose(norm, math.sqrt(4 * 9 + 9 * 16 / 9), rel_tol=1e-6)
    assert math.isclose(math.sqrt(sum(float((g ** 2).sum()) for g in grads.values())), 1.0,
                        rel_tol=1e-5)
    p = {"w": np.array([1.0, -1.0], np.float32)}
    opt = demo.Adam(p, lr=0.1)
    opt.step(p, {"w": np.array([2.0, -0.5], np.float32)})
    np.testing.assert_allclose(p["w"], [0.9, -0.9], rtol=1e-5)   # first Adam step: lr*sign
