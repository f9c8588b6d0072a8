#!/usr/bin/env bash
# GPU call 11 of session 30 (2026-11-25) at commit cfa692f: compute-sanitizer memcheck, racecheck and synccheck on
# every build of stage 8 (WGMMA with and without its overlap; mma.sync with the dQ pass at both
# head dims' tiles and with dQ atomics at 128-key blocks) and on stage 5's forward saving the
# log-sum-exp, at odd shapes where both kernels' rings wrap (several query blocks per key block,
# several key tiles per query block), GQA and both causal alignments; each call's gradients
# checked against float64 autograd.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0
cat > /tmp/calls8.py <<'PY'
import torch, stages.stage5 as s5, stages.stage8 as s8
from lib.inputs import make_qkv
from lib.reference import check_gradients
ok = True
builds = [{}, {"overlap": 0}, {"wgmma": 0}, {"wgmma": 0, "tiles": (64, 32)}, {"wgmma": 0, "tiles": (128, 64), "dq_atomics": 1}]
for B, H, Hkv, Sq, Sk, D, dt, causal in [(2, 4, 2, 200, 150, 64, torch.float16, True),
                                         (1, 4, 1, 130, 260, 128, torch.bfloat16, "bottom_right"),
                                         (1, 2, 2, 97, 97, 128, torch.float16, False)]:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dt)
    dout = torch.randn_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = s5.attention(q, k, v, causal=causal, lse=lse)
    for kw in builds:
        grads = s8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw)
        ok &= all(c.passed for c in check_gradients(grads, q, k, v, dout, causal=causal).values())
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
PY
for tool in memcheck racecheck synccheck; do
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 /tmp/calls8.py > $OUT/sanitize-$tool.log 2>&1; echo "sanitize $tool rc=$?"; tail -2 $OUT/sanitize-$tool.log
done
