"""Train issue 27's word language model with torch.nn.LSTM and with blockrnn.torch.LSTM.

The model of pytorch/examples' word_language_model: Embedding(V, 200) -> dropout ->
2-layer LSTM(200, 200, dropout=0.2) -> dropout -> Linear(200, V); SGD lr 20,
clip_grad_norm_(0.25), truncated BPTT of 35 steps on 20 columns, the hidden state carried
and detached between batches. The data are the words of blockrnn/data/shakespeare.txt
(the 1000 most frequent words, the rest <unk>, <eos> at each line end).

Both models start from the same weights (the blockrnn LSTM loads the nn.LSTM's
state_dict) and see the same batches and the same dropout masks (each model has its own
copy of the RNG state, seeded alike). They train in lockstep, one step each in turn, so
that both see the same machine load; the script prints both loss curves every
--print-every steps and the mean wall time per training step (forward, backward,
clipping, SGD) of each.

    python tools/lm_compare.py --steps 300                  # float32
    python tools/lm_compare.py --steps 50 --dtype float64   # equal to float64 rounding
    python tools/lm_compare.py --steps 300 --peer nn-1ulp   # the control: how far two
        # nn.LSTM runs drift apart in float32 when one starts 1 ulp away in one weight

SGD at lr 20 is chaotic: float32 rounding differences (another summation order in a
matrix product) grow from step to step, so float32 curves agree to rounding only at
first and then drift apart as much as the control does; float64 keeps them equal to
float64 rounding for longer.
"""
import argparse
import collections
import os
import time

import numpy as np
import torch
from torch import nn

import blockrnn.torch as bt

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "blockrnn",
                    "data", "shakespeare.txt")


def corpus(vocab_size):
    """The text as word ids (1-D int64 tensor) and the vocabulary size."""
    with open(DATA, encoding="utf-8") as fh:
        words = [w for line in fh for w in line.split() + ["<eos>"]]
    common = [w for w, _ in collections.Counter(words).most_common(vocab_size - 1)]
    index = {w: k for k, w in enumerate(["<unk>"] + common)}
    return torch.tensor([index.get(w, 0) for w in words]), len(index)


def batchify(ids, columns):
    """(N,) -> (N // columns, columns), column j a contiguous slice of the text."""
    n = ids.numel() // columns
    return ids[:n * columns].view(columns, n).t().contiguous()


class WordLM(nn.Module):
    def __init__(self, rnn, vocab, emb=200, hidden=200, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, emb)
        self.rnn = rnn
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, tokens, hidden):
        y, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        return self.decoder(self.drop(y)), hidden


class Trainer:
    """One model, its optimizer state (plain SGD), hidden state and RNG state."""

    def __init__(self, model, seed, lr, clip):
        self.model, self.lr, self.clip = model, lr, clip
        self.hidden, self.times, self.losses = None, [], []
        gen = torch.Generator().manual_seed(seed)
        self.rng = gen.get_state()

    def step(self, tokens, targets):
        saved = torch.get_rng_state()
        torch.set_rng_state(self.rng)               # this model's own dropout stream
        start = time.perf_counter()
        self.model.zero_grad()
        logits, hidden = self.model(tokens, self.hidden)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(p.grad, alpha=-self.lr)
        self.hidden = tuple(h.detach() for h in hidden)
        self.times.append(time.perf_counter() - start)
        self.rng = torch.get_rng_state()
        torch.set_rng_state(saved)
        self.losses.append(loss.item())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--print-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1111)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--bptt", type=int, default=35)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--lr", type=float, default=20.0)
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--peer", choices=["blockrnn", "nn-1ulp"], default="blockrnn",
                    help="the second model: blockrnn.torch.LSTM, or (a control) nn.LSTM "
                         "with one weight moved by 1 ulp")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)

    ids, V = corpus(args.vocab)
    data = batchify(ids, args.batch)
    torch.manual_seed(args.seed)
    ref = WordLM(nn.LSTM(200, 200, 2, dropout=0.2), V).to(dtype)
    peer = (bt.LSTM(200, 200, 2, dropout=0.2) if args.peer == "blockrnn"
            else nn.LSTM(200, 200, 2, dropout=0.2))
    ours = WordLM(peer, V).to(dtype)
    ours.load_state_dict(ref.state_dict(), strict=True)    # the same initial weights
    name = "blockrnn" if args.peer == "blockrnn" else "nn 1ulp"
    if args.peer == "nn-1ulp":
        with torch.no_grad():
            w = ours.rnn.weight_hh_l0
            w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0, dtype=dtype))
    n_params = [sum(p.numel() for p in m.rnn.parameters()) for m in (ref, ours)]
    print(f"data: {ids.numel()} words, vocabulary {V}, {data.shape[0]} rows x {args.batch} "
          f"columns; {args.dtype}; torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads")
    print(f"LSTM parameters: nn.LSTM {n_params[0]}, {type(peer).__module__}."
          f"{type(peer).__name__} {n_params[1]}")
    trainers = {"nn.LSTM": Trainer(ref, args.seed, args.lr, args.clip),
                name: Trainer(ours, args.seed, args.lr, args.clip)}
    print(f"{'step':>6} {'nn.LSTM loss':>14} {name + ' loss':>14} {'rel. diff':>10}")
    pos, worst = 0, 0.0
    for step in range(1, args.steps + 1):
        if pos + 1 >= data.shape[0] - 1:        # an epoch is over: start again, fresh state
            pos = 0
            for tr in trainers.values():
                tr.hidden = None
        n = min(args.bptt, data.shape[0] - 1 - pos)
        tokens, targets = data[pos:pos + n], data[pos + 1:pos + 1 + n]
        pos += n
        for tr in trainers.values():
            tr.step(tokens, targets)
        a, b = trainers["nn.LSTM"].losses[-1], trainers[name].losses[-1]
        rel = abs(a - b) / abs(a)
        worst = max(worst, rel)
        if step % args.print_every == 0 or step == 1:
            print(f"{step:>6} {a:>14.8f} {b:>14.8f} {rel:>10.2e}")
    print(f"largest relative loss difference over {args.steps} steps: {worst:.2e}")
    for name, tr in trainers.items():
        t = np.array(tr.times[1:]) * 1e3      # the first step (warm-up) left out
        print(f"{name:>9}: mean {t.mean():7.1f} ms/step, median {np.median(t):7.1f} ms/step "
              f"(steps 2..{args.steps})")


if __name__ == "__main__":
    main()
