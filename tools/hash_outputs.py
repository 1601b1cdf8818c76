"""Hash every output of the float32 sequence ops and their gradients (block_lstm,
block_lstm_v2 with and without peephole, block_gru, block_gru_reset_after; with and
without sequence_length, seq_len_max T and T - 2) at several shapes, on 1 and 2
threads: one line per (shape, case, threads, op). A change meant to keep every bit
(a loop restructured, a product moved) must leave the output unchanged:

    PYTHONPATH=<tree A> python tools/hash_outputs.py > a.txt
    PYTHONPATH=<tree B> python tools/hash_outputs.py > b.txt && diff a.txt b.txt

(BLOCKRNN_KERNEL=avx2 / portable for the other kernel variants.)"""
import hashlib, sys
import numpy as np
from threadpoolctl import threadpool_limits
import blockrnn

SHAPES = [(30, 16, 128, 256), (100, 32, 256, 256), (9, 13, 40, 37), (20, 4, 64, 600),
          (12, 24, 300, 48), (7, 2, 20, 16), (5, 1, 33, 20)]

def problem(T, B, I, H, seed=0):
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)
    p = dict(T=T, x=r(T, B, I), cs=r(B, H), h=r(B, H), w=r(I + H, 4 * H) / 4, wci=r(H),
             wcf=r(H), wco=r(H), b=r(4 * H), dcs=r(T, B, H), dh=r(T, B, H),
             w_ru=r(I + H, 2 * H) / 4, w_c=r(I + H, H) / 4, b_ru=r(2 * H), b_c=r(H),
             w_ih=r(3 * H, I) / 4, w_hh=r(3 * H, H) / 4, b_ih=r(3 * H), b_hh=r(3 * H))
    lengths = rng.integers(0, T + 1, B); lengths[0] = T - 1
    p["lengths"] = lengths
    return p

def ops(p, lens, L):
    lstm = (L, p["x"], p["cs"], p["h"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"])
    out = {}
    for peep in (False, True):
        for name, op, grad in (("block_lstm", blockrnn.block_lstm, blockrnn.block_lstm_grad),
                               ("block_lstm_v2", blockrnn.block_lstm_v2, blockrnn.block_lstm_grad_v2)):
            f = op(*lstm, use_peephole=peep, sequence_length=lens)
            out[f"{name}/peep={peep}"] = f
            out[f"{name}_grad/peep={peep}"] = grad(*lstm, *f, p["dcs"], p["dh"],
                                                   use_peephole=peep, sequence_length=lens)
    gru = (L, p["x"], p["h"], p["w_ru"], p["w_c"], p["b_ru"], p["b_c"])
    gs = blockrnn.block_gru(*gru, sequence_length=lens)
    out["block_gru"] = gs
    out["block_gru_grad"] = blockrnn.block_gru_grad(*gru, *gs, p["dh"], sequence_length=lens)
    ra = (L, p["x"], p["h"], p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"])
    gs = blockrnn.block_gru_reset_after(*ra, sequence_length=lens)
    out["block_gru_reset_after"] = gs
    out["block_gru_reset_after_grad"] = blockrnn.block_gru_reset_after_grad(
        *ra, *gs, p["dh"], sequence_length=lens)
    return out

for shape in SHAPES:
    p = problem(*shape)
    for lens_on in (False, True):
        for L in (shape[0], shape[0] - 2):
            lens = p["lengths"] if lens_on else None
            if lens_on and L != shape[0]:
                continue
            for nt in (1, 2):
                with threadpool_limits(nt, user_api="openmp"):
                    out = ops(p, lens, L)
                for name, arrs in out.items():
                    h = hashlib.sha256()
                    for a in arrs:
                        a = np.ascontiguousarray(a); assert a.dtype == np.float32
                        h.update(a.tobytes())
                    print(f"{shape} lens={lens_on} L={L} threads={nt} {name} {h.hexdigest()[:16]}")
