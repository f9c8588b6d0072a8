#!/usr/bin/env bash
# GPU call 7 of session 29 (2026-11-25) at commit edf711c: stage 6 re-recorded (its prediction is now
# shares of the matmul ceiling: a source change, no kernel change), the schedule record in
# interleaved rounds (every variant of a shape in the same rounds; the overlap-without-ping-pong
# timeline), then the notebooks that read them executed. results/ and notebooks/ in run.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=edf711c
timeout 200 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6 > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -A8 "^| stage | shape | dtype | causal | µs" $OUT/bench.log | head -20
timeout 250 python3 scripts/stage6_schedules.py --record > $OUT/schedules.log 2>&1; echo "schedules rc=$?"
grep -E "SDPA default|intra-warpgroup|ping-pong|no warp|recorded|Error|error" $OUT/schedules.log | head -40
for nb in stage6_wgmma_tma journey 00_introduction; do
  timeout 60 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tar czf $OUT/run.tgz results notebooks README.md
