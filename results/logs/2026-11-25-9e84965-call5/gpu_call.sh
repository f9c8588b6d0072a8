#!/usr/bin/env bash
# GPU call 5 of session 29 (2026-11-25) at commit 9e84965: stage 6's tests, compute-sanitizer
# memcheck, racecheck and synccheck on every launch path (persistent, both work queues, blocks of
# one consumer, split-KV with the combine in the last block and with the combine kernel, the
# softmax ping-pong) at shapes where the K/V ring wraps, then stage 6 re-recorded (fp16, bf16,
# sweep). results/ and README.md come back in run.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=9e84965
timeout 120 python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py tests/test_causal_varlen.py -k "not compiles and not shape_map_rows" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
tail -2 $OUT/pytest.log
cat > /tmp/calls.py <<'PY'
import torch, stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
ok = True
for B, H, Hkv, Sq, Sk, D, dt, kw in [
        (2, 70, 35, 300, 700, 128, torch.bfloat16, {}),                                   # persistent, 128-key tiles, Q2, TMA store
        (2, 70, 70, 300, 700, 128, torch.float16, {"causal": "bottom_right"}),            # work queue with ping-pong
        (2, 50, 25, 500, 900, 64, torch.float16, {}),                                     # persistent D64 (192-row blocks)
        (2, 70, 70, 400, 900, 64, torch.bfloat16, {"causal": True}),                      # work queue without ping-pong, 128-row blocks
        (1, 8, 8, 512, 700, 64, torch.float16, {"causal": True}),                         # blocks of one consumer (few rows)
        (1, 32, 8, 1, 5000, 128, torch.bfloat16, {}),                                     # split-KV, packed, combined in the last block
        (1, 8, 1, 1, 20000, 128, torch.bfloat16, {}), (2, 5, 1, 3, 777, 64, torch.float16, {}),  # split-KV, combine kernel
        (2, 4, 2, 517, 1100, 64, torch.bfloat16, {"schedule": "softmax ping-pong"}),     # turns at the softmax
        (2, 4, 2, 517, 1100, 128, torch.bfloat16, {"causal": True, "schedule": "+ intra-warpgroup overlap"})]:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dt)
    kw_ref = {x: y for x, y in kw.items() if x == "causal"}
    c = check_output(s6.attention(q, k, v, **kw), q, k, v, **kw_ref)
    ok &= c.passed
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
PY
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 /tmp/calls.py > $OUT/sanitize-$tool.log 2>&1; echo "sanitize $tool rc=$?"; tail -2 $OUT/sanitize-$tool.log
done
timeout 230 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6 > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -B2 -A8 "^| stage | shape | dtype | causal | µs" $OUT/bench.log | head -24
tar czf $OUT/run.tgz results README.md
