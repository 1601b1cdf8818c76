"""``python -m blockrnn``: print the build configuration and self-check every op.

Subcommands: ``python -m blockrnn demo`` trains a character-level language
model (``blockrnn.demo``); ``python -m blockrnn bench`` runs the benchmarks
against TensorFlow, PyTorch, ONNX Runtime and JAX (``blockrnn.bench``; the
peers come with ``pip install blockrnn[bench]``). Each has its own ``--help``.

Runs each of the twelve entry points once (block_lstm_v2 also with per-row
lengths) on a small random input, in float32 and
float64, and compares it with blockrnn's float64 NumPy reference
(``blockrnn._reference``). Exits with status 0 only if every op agrees.
"""
import argparse
import sys

import numpy as np

import blockrnn
from blockrnn import _reference

# Max |ours - reference| / max(1, |reference|) allowed per dtype.
TOLERANCE = {np.float32: 1e-4, np.float64: 1e-10}


def _inputs(rng, dtype, T=6, B=3, I=5, H=4):
    """A small random problem; returns the argument tuples of every op."""
    def rand(*shape, scale=1.0):
        return (scale * rng.uniform(-1, 1, shape)).astype(dtype)

    x, cs, h = rand(T, B, I), rand(B, H), rand(B, H)
    w, peep, b = rand(I + H, 4 * H, scale=0.5), [rand(H) for _ in range(3)], rand(4 * H)
    L = T - 2
    cell_args = (x[0], cs, h, w, *peep, b)
    cell = blockrnn.lstm_block_cell(*cell_args, use_peephole=True)
    cell_grad_args = cell_args + tuple(cell[:6]) + (rand(B, H), rand(B, H))
    seq_args = (L, x, cs, h, w, *peep, b)
    seq_grads = (rand(T, B, H), rand(T, B, H))
    seq = blockrnn.block_lstm(*seq_args, use_peephole=True, cell_clip=0.0)
    seq_v2 = blockrnn.block_lstm_v2(*seq_args, use_peephole=True)
    gru_args = (x[0], h, rand(I + H, 2 * H, scale=0.5), rand(I + H, H, scale=0.5),
                rand(2 * H), rand(H))
    gru = blockrnn.gru_block_cell(*gru_args)
    gru_grad_args = gru_args + tuple(gru[:3]) + (rand(B, H),)
    gru_seq_args = (L, x) + gru_args[1:]
    gru_seq = blockrnn.block_gru(*gru_seq_args)
    lengths = {"sequence_length": [T, 0, L - 1]}
    peephole = {"use_peephole": True}
    return [
        ("lstm_block_cell", cell_args, {"use_peephole": True, "forget_bias": 0.5}),
        ("lstm_block_cell_grad", cell_grad_args, peephole),
        ("lstm_block_cell_grad_full", cell_grad_args, peephole),
        ("block_lstm", seq_args, {"use_peephole": True, "cell_clip": 0.8}),
        ("block_lstm_v2", seq_args, peephole),
        ("block_lstm_grad", seq_args + tuple(seq) + seq_grads, peephole),
        ("block_lstm_grad_v2", seq_args + tuple(seq_v2) + seq_grads, peephole),
        ("gru_block_cell", gru_args, {}),
        ("gru_block_cell_grad", gru_grad_args, {}),
        ("gru_block_cell_grad_full", gru_grad_args, {}),
        ("block_gru", gru_seq_args, lengths),
        ("block_gru_grad", gru_seq_args + tuple(gru_seq) + (rand(T, B, H),), {}),
        ("block_lstm_v2", seq_args, dict(peephole, **lengths)),
    ]


def self_check(seed=0):
    """Compare every op with the reference; print a table; return True if all agree."""
    rng = np.random.default_rng(seed)
    all_ok = True
    print(f"\n{'op':<28}{'dtype':<9}{'max rel. error':>16}{'tolerance':>11}  result")
    for dtype in (np.float32, np.float64):
        for name, args, kwargs in _inputs(rng, dtype):
            ours = getattr(blockrnn, name)(*args, **kwargs)
            ref = getattr(_reference, name)(*args, **kwargs)
            error = max(
                float(np.max(np.abs(o.astype(np.float64) - r) / np.maximum(1, np.abs(r)),
                             initial=0.0))
                for o, r in zip(ours, ref))
            ok = (error <= TOLERANCE[dtype] and ours._fields == ref._fields
                  and all(o.dtype == dtype for o in ours))
            all_ok &= ok
            print(f"{name:<28}{np.dtype(dtype).name:<9}{error:>16.2e}"
                  f"{TOLERANCE[dtype]:>11.0e}  {'ok' if ok else 'FAILED'}")
    return all_ok


def _bench(argv):
    """Run the benchmark harness, ``blockrnn.bench`` (the peers: ``blockrnn[bench]``)."""
    from blockrnn.bench.run import main as bench_main
    return bench_main(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:
        from blockrnn.demo import main as demo_main
        return demo_main(argv[1:])
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m blockrnn",
        description="Print blockrnn's build configuration and check every op against "
                    "its float64 NumPy reference (exit status 0 if all agree). "
                    "Subcommands: `demo` (train a character-level language model), "
                    "`bench` (benchmarks against TensorFlow, PyTorch, ONNX Runtime, JAX).")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    args = parser.parse_args(argv)
    blockrnn.show_config()
    ok = self_check(args.seed)
    print("\nall ops agree with the reference" if ok else "\nSOME OPS DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
