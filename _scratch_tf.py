import os; os.environ["TF_CPP_MIN_LOG_LEVEL"]="2"
import numpy as np, tensorflow as tf, blockrnn, sys
sys.path.insert(0,'tests')
from _inputs import block_lstm_inputs
worst_len = 0; worst_plain = 0; n_diff_len = 0; n_diff_plain = 0; cases = 0
for seed, (T,B,I,H) in enumerate([(5,4,3,5),(20,8,16,24),(7,3,10,12),(12,16,32,32),(3,1,1,1),(30,4,8,64)]):
  for peep in (False, True):
    for clip in (0.0, 0.5):
        d = block_lstm_inputs(T,B,I,H,np.float32,seed)
        L = T - (seed % 2)
        tfo = tf.raw_ops.BlockLSTMV2(seq_len_max=np.int64(L), **{k: tf.constant(v) for k,v in d.items()}, cell_clip=clip, use_peephole=peep)
        plain = blockrnn.block_lstm_v2(L, **d, cell_clip=clip, use_peephole=peep)
        lens = blockrnn.block_lstm_v2(L, **d, cell_clip=clip, use_peephole=peep, sequence_length=np.full(B, L))
        cases += 1
        for name in ("cs", "h", "i", "f", "o", "ci", "co"):
            ref = getattr(tfo, name).numpy()[:L]
            a = getattr(plain, name)[:L]; b = getattr(lens, name)[:L]
            dp = float(np.max(np.abs(a-ref))) if a.size else 0; dl = float(np.max(np.abs(b-ref))) if b.size else 0
            worst_plain = max(worst_plain, dp); worst_len = max(worst_len, dl)
            n_diff_plain += dp > 0; n_diff_len += dl > 0
        same = all(np.array_equal(x, y) for x, y in zip(plain, lens))
        print(T,B,I,H,peep,clip,"plain==lengths:", same)
print("cases", cases, "plain vs TF max|diff|", worst_plain, "outputs differing", n_diff_plain,
      "| lengths=L vs TF max|diff|", worst_len, "outputs differing", n_diff_len)
