import sys; sys.path.insert(0,'tests')
import numpy as np
import test_input_variants as t
for name, call, inputs in t.ENTRY_POINTS:
    errs=[]
    for dt in t.DTYPES:
        for s,(T,B,I,H) in t.SHAPES.items():
            _, e = t._run(call, inputs(dt,T,B,I,H))
            if e: errs.append(f"{np.dtype(dt).name}/{s}:{type(e).__name__}:{str(e)[:50]}")
    print(name, len(errs), errs[:3])
