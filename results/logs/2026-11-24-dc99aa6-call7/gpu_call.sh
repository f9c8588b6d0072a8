#!/usr/bin/env bash
# GPU call 7 of 2026-11-24 at commit dc99aa6: stage 6 with call_schedule (short prefill) and the
# block-per-row combine, Q released by every consumer thread (racecheck): tests (stage 6 and the grad refusal, CUDA graphs, host time), compute-
# sanitizer on decode and short causal calls, stage 6 re-recorded (fp16, bf16, sweep), the shape
# map recorded (bf16). results/ and README.md come back in results.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=dc99aa6
python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py tests/test_stages.py -k "(test_stage6 and not compiles) or grad or stage6" > $OUT/pytest.log 2>&1
tail -4 $OUT/pytest.log
cat > /tmp/calls.py <<'PY'
import torch, stages.stage6 as s6
from lib.inputs import make_qkv
for B, H, Hkv, Sq, Sk, D, kw in [(1, 8, 1, 1, 20000, 128, {}), (2, 5, 1, 3, 777, 64, {}), (3, 4, 4, 300, 300, 64, {"causal": True}),
                                 (2, 4, 2, 517, 517, 128, {"causal": True}), (2, 4, 4, 300, 300, 128, {})]:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16)
    s6.attention(q, k, v, **kw)
torch.cuda.synchronize(); print("calls done")
PY
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 /tmp/calls.py > $OUT/sanitize-$tool.log 2>&1; echo "sanitize $tool rc=$?"; tail -1 $OUT/sanitize-$tool.log
done
python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6 > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -B2 -A8 "^| stage | shape | dtype | causal | µs" $OUT/bench.log | head -24; grep -A7 "host µs/call" $OUT/bench.log | head -8
timeout 330 python3 scripts/shape_map.py --record --dtype bfloat16 > $OUT/shapemap.log 2>&1; echo "shapemap rc=$?"
grep -v "^\[" $OUT/shapemap.log | tail -6
tar czf $OUT/results.tgz results README.md
