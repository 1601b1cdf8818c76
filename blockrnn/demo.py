"""A character-level language model trained with blockrnn on Shakespeare, in NumPy.

    python -m blockrnn demo [--cell {lstm,gru}] [--seconds 45] [--seed 0] [--plot loss.png]

Model: embedding -> one blockrnn LSTM (default) or GRU layer -> softmax over the
characters. Training: truncated backpropagation through time over B parallel streams
of the text (the recurrent state is carried from one chunk to the next, its gradient is
cut), global-norm gradient clipping and Adam, all in NumPy (float32). The RNN runs each
(T, B) chunk through one fused blockrnn op forward and one backward; the embedding and
the softmax are batched matrix products (no per-time-step Python loop, except when
sampling, which is sequential by nature).

The text (``blockrnn/data/shakespeare.txt``, the opening of Coriolanus, public domain) is
split 90/10 into training and held-out parts. Losses are cross-entropies in nats per
character (bits = nats / ln 2); the baseline is the unigram entropy of the text, the loss
of a model that knows only the character frequencies.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

from blockrnn.layers import GRU, LSTM

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shakespeare.txt")
LN2 = math.log(2.0)


def load_text(path=DATA):
    with open(path, encoding="utf-8") as f:
        return f.read()


def unigram_entropy(text):
    """Entropy of the character distribution of ``text``, in nats per character."""
    _, counts = np.unique(np.frombuffer(text.encode("utf-32-le"), np.uint32),
                          return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


class CharModel:
    """embedding (V, D) -> blockrnn LSTM/GRU (D -> H) -> logits (H -> V)."""

    def __init__(self, vocab_size, embed=32, hidden=128, cell="lstm", seed=0):
        rng = np.random.default_rng(seed)
        f32 = np.float32
        self.V, self.D, self.H, self.cell = vocab_size, embed, hidden, cell
        self.embedding = (0.1 * rng.standard_normal((vocab_size, embed))).astype(f32)
        self.w_out = (rng.standard_normal((hidden, vocab_size)) / np.sqrt(hidden)).astype(f32)
        self.b_out = np.zeros(vocab_size, f32)
        layer_seed = int(rng.integers(2**31))
        if cell == "lstm":
            self.rnn = LSTM(embed, hidden, dtype=f32, seed=layer_seed)
            self.rnn.b_l0[hidden:2 * hidden] += 1.0   # forget-gate bias 1 (IFCO: f block)
        elif cell == "gru":
            self.rnn = GRU(embed, hidden, dtype=f32, seed=layer_seed)
        else:
            raise ValueError(f"cell must be 'lstm' or 'gru', got {cell!r}")

    @property
    def params(self):
        p = {"embedding": self.embedding, "w_out": self.w_out, "b_out": self.b_out}
        p.update({"rnn." + k: v for k, v in self.rnn.params.items()})
        return p

    def zero_state(self, B):
        z = np.zeros((1, B, self.H), np.float32)           # (num_layers * directions, B, H)
        return (z, z.copy()) if self.cell == "lstm" else z

    def loss(self, ids, targets, state, grad=False):
        """Mean cross-entropy (nats/char) of ``targets`` (T, B) given ``ids`` (T, B).

        Returns (loss, final state, grads or None)."""
        T, B = ids.shape
        x = self.embedding[ids]                                   # (T, B, D)
        y, state, ctx = self.rnn.forward(x, state)                # (T, B, H)
        logits = y.reshape(T * B, self.H) @ self.w_out + self.b_out
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        flat = targets.reshape(-1)
        rows = np.arange(T * B)
        loss = float(-logp[rows, flat].mean())
        if not grad:
            return loss, state, None
        dlogits = np.exp(logp)
        dlogits[rows, flat] -= 1.0
        dlogits /= T * B
        grads = {"w_out": y.reshape(T * B, self.H).T @ dlogits, "b_out": dlogits.sum(0)}
        dy = (dlogits @ self.w_out.T).reshape(T, B, self.H)
        dx, _ = self.rnn.backward(ctx, dy)                        # state gradient is cut
        onehot = np.zeros((T * B, self.V), np.float32)
        onehot[rows, ids.reshape(-1)] = 1.0
        grads["embedding"] = onehot.T @ dx.reshape(T * B, self.D)
        grads.update({"rnn." + k: v for k, v in self.rnn.grads.items()})
        return loss, state, grads

    def sample(self, vocab, length, rng, prime="\n", temperature=0.8):
        """Generate ``length`` characters after ``prime`` (one step per character)."""
        index = {c: i for i, c in enumerate(vocab)}
        ids = np.array([[index[c]] for c in prime], np.int64)
        x = self.embedding[ids]
        y, state, _ = self.rnn.forward(x, self.zero_state(1))
        out, h = [], y[-1]
        for _ in range(length):
            logits = (h @ self.w_out + self.b_out)[0] / temperature
            p = np.exp(logits - logits.max())
            c = int(rng.choice(self.V, p=p / p.sum()))
            out.append(vocab[c])
            y, state, _ = self.rnn.forward(self.embedding[[[c]]], state)
            h = y[-1]
        return "".join(out)


class Adam:
    def __init__(self, params, lr=3e-3, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads):
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for k, p in params.items():
            g = grads[k]
            self.m[k] *= self.b1
            self.m[k] += (1 - self.b1) * g
            self.v[k] *= self.b2
            self.v[k] += (1 - self.b2) * g * g
            p -= (self.lr / c1) * self.m[k] / (np.sqrt(self.v[k] / c2) + self.eps)


def clip_global_norm(grads, max_norm):
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if norm > max_norm:
        for g in grads.values():
            g *= max_norm / norm
    return norm


def _streams(ids, B):
    """Cut ``ids`` into B equal contiguous streams: array (L, B)."""
    L = len(ids) // B
    return ids[:L * B].reshape(B, L).T.copy()


def evaluate(model, ids, B=16, chunk=256):
    """Mean loss (nats/char) over ``ids``, run as B streams carrying state across chunks."""
    s = _streams(ids, B)
    state, total, n = model.zero_state(B), 0.0, 0
    for start in range(0, s.shape[0] - 1, chunk):
        x = s[start:start + chunk + 1]
        if len(x) < 2:
            break
        loss, state, _ = model.loss(x[:-1], x[1:], state)
        total += loss * (len(x) - 1)
        n += len(x) - 1
    return total / n


def _progress(enabled, seconds):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=seconds, unit="s", dynamic_ncols=True,
                bar_format="{desc}{percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}")


def _blas_threads(n):
    """Limit the BLAS threads (threadpoolctl, if installed) -- a context manager.

    The demo's matrix products are small (32 rows per step); on 2 busy cores OpenBLAS's
    threads were measured to make training 4-5x slower than one thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(limits=n, user_api="blas")


def train(seconds=45.0, cell="lstm", seed=0, hidden=128, embed=32, batch=32, bptt=64,
          lr=5e-3, clip=5.0, eval_every=3.0, sample_length=300, progress=True,
          text=None, out=None, blas_threads=1):
    """Train for ``seconds`` of wall time; return a dict of results (see ``_train``).

    ``blas_threads``: BLAS threads during training (None: leave as is). Progress lines
    without tqdm go to ``out`` (default sys.stdout)."""
    out = sys.stdout if out is None else out
    if blas_threads is None:
        return _train(seconds, cell, seed, hidden, embed, batch, bptt, lr, clip, eval_every,
                      sample_length, progress, text, out)
    with _blas_threads(blas_threads):
        return _train(seconds, cell, seed, hidden, embed, batch, bptt, lr, clip, eval_every,
                      sample_length, progress, text, out)


def _train(seconds, cell, seed, hidden, embed, batch, bptt, lr, clip, eval_every,
           sample_length, progress, text, out):
    """Train for ``seconds`` of wall time; return a dict of results.

    The held-out loss is measured every ``eval_every`` seconds and the parameters of the
    best measurement are kept at the end (early stopping: the 64 KB text is small enough
    for a long run to overfit).

    Keys: ``cell``, ``entropy`` (unigram entropy of the text, nats/char), ``train_loss``
    and ``val_loss`` (nats/char, of the kept parameters, on a training slice and on the
    held-out 10%),
    ``history`` (list of (seconds, characters seen, smoothed train loss, held-out loss)),
    ``chars_per_second``, ``steps``, ``sample`` (generated text).
    """
    text = load_text() if text is None else text
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = np.array([index[c] for c in text], np.int64)
    split = int(0.9 * len(ids))
    train_ids, val_ids = ids[:split], ids[split:]
    rng = np.random.default_rng(seed)
    model = CharModel(len(vocab), embed, hidden, cell, seed)
    params = model.params
    opt = Adam(params, lr)
    streams = _streams(train_ids, batch)
    entropy = unigram_entropy(text)

    bar = _progress(progress, seconds)
    history, ema, pos, steps, seen = [], None, 0, 0, 0
    state = model.zero_state(batch)
    t0 = last_eval = last_print = time.perf_counter()
    history.append((0.0, 0, None, evaluate(model, val_ids)))
    best = (history[0][3], {k: v.copy() for k, v in params.items()})
    while True:
        now = time.perf_counter()
        if now - t0 >= seconds:
            break
        if pos + bptt + 1 > streams.shape[0]:           # end of the streams: start over
            pos, state = 0, model.zero_state(batch)
        chunk = streams[pos:pos + bptt + 1]
        loss, state, grads = model.loss(chunk[:-1], chunk[1:], state, grad=True)
        clip_global_norm(grads, clip)
        opt.step(params, grads)
        pos += bptt
        steps += 1
        seen += bptt * batch
        ema = loss if ema is None else 0.95 * ema + 0.05 * loss
        now = time.perf_counter()
        elapsed = now - t0
        if now - last_eval >= eval_every:
            val = evaluate(model, val_ids)
            history.append((elapsed, seen, ema, val))
            if val < best[0]:
                best = (val, {k: v.copy() for k, v in params.items()})
            last_eval = now
        if bar is not None:
            bar.update(min(elapsed, seconds) - bar.n)
            bar.set_postfix_str(f"loss {ema:.3f} nats/char, {seen / elapsed:,.0f} chars/s",
                                refresh=False)
        elif progress and now - last_print >= 5.0:
            print(f"  {elapsed:5.1f} s  loss {ema:.3f} nats/char  "
                  f"{seen / elapsed:,.0f} chars/s", file=out, flush=True)
            last_print = now
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    val_loss = evaluate(model, val_ids)
    history.append((elapsed, seen, ema, val_loss))
    if best[0] < val_loss:          # early stopping: keep the best checkpoint
        for k, p in params.items():
            p[...] = best[1][k]
        val_loss = best[0]
    train_loss = evaluate(model, train_ids[:len(val_ids)])
    sample = model.sample(vocab, sample_length, rng) if sample_length else ""
    return {"cell": cell, "entropy": entropy, "train_loss": train_loss, "val_loss": val_loss,
            "history": history, "chars_per_second": seen / elapsed, "steps": steps,
            "seconds": elapsed, "sample": sample, "chars": len(text)}


def plot(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError(f"--plot needs matplotlib ({exc}); install it with "
                           f"`pip install matplotlib`") from exc
    h = [row for row in result["history"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    tr = [(r[1], r[2]) for r in h if r[2] is not None]
    ax.plot([c for c, _ in tr], [l for _, l in tr], label="train (smoothed)")
    ax.plot([r[1] for r in h], [r[3] for r in h], "o-", label="held-out")
    ax.axhline(result["entropy"], color="gray", ls="--", label="unigram entropy")
    ax.set_xlabel("characters seen")
    ax.set_ylabel("loss (nats/char)")
    ax.set_title(f"blockrnn char-level {result['cell'].upper()} on Shakespeare")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(r, out=None):
    out = sys.stdout if out is None else out
    def both(x):
        return f"{x:.3f} nats/char ({x / LN2:.3f} bits/char)"
    print(f"text: {r['chars']:,} characters of Shakespeare (public domain); "
          f"90% train / 10% held out", file=out)
    print(f"trained a {r['cell'].upper()} for {r['seconds']:.1f} s: {r['steps']} steps, "
          f"{r['chars_per_second']:,.0f} chars/s", file=out)
    print("loss curve (held-out, nats/char):", file=out)
    print("   seconds   chars seen   train (smoothed)   held-out", file=out)
    for sec, seen, tr, va in r["history"]:
        trs = "       -" if tr is None else f"{tr:8.3f}"
        print(f"  {sec:8.1f} {seen:12,d}   {trs:>16}   {va:8.3f}", file=out)
    print(f"unigram entropy of the text: {both(r['entropy'])}", file=out)
    print("final model = the checkpoint with the lowest held-out loss (early stopping)",
          file=out)
    print(f"final train loss:            {both(r['train_loss'])}", file=out)
    print(f"final held-out loss:         {both(r['val_loss'])} = "
          f"{r['val_loss'] / r['entropy']:.2f} x unigram entropy", file=out)
    print("sample (temperature 0.8):", file=out)
    print("-" * 60, file=out)
    print(r["sample"], file=out)
    print("-" * 60, file=out)


def main(argv=None):
    """Entry point of ``python -m blockrnn demo``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m blockrnn demo",
        description="Train a character-level language model on Shakespeare with blockrnn "
                    "(NumPy only) and sample from it.")
    parser.add_argument("--cell", choices=("lstm", "gru"), default="lstm")
    parser.add_argument("--seconds", type=float, default=45.0,
                        help="wall-clock training time (default 45)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--bptt", type=int, default=64, help="truncated BPTT length")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--sample-length", type=int, default=300)
    parser.add_argument("--plot", metavar="PNG", help="save the loss curve to this file")
    parser.add_argument("--no-progress", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if args.plot:   # fail before training, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib; install it with `pip install matplotlib`",
                  file=sys.stderr)
            return 2
    r = train(seconds=args.seconds, cell=args.cell, seed=args.seed, hidden=args.hidden,
              batch=args.batch, bptt=args.bptt, lr=args.lr,
              sample_length=args.sample_length, progress=not args.no_progress)
    report(r)
    if args.plot:
        plot(r, args.plot)
        print(f"loss curve saved to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
