#!/usr/bin/env bash
# GPU call 7 of session 27 (2026-11-24) at commit 9d189d8: stage 4 without the clamped key count —
# its GPU tests (bottom-right included), its re-record; generate() re-recorded (now with each
# entry's first tokens); the notebooks of stages 0-3 executed against the records (their rows
# are final: stages 0-1 from call 3, 2-3 from call 4).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=9d189d8
timeout 90 python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stages.py tests/test_causal_varlen.py tests/test_sass_bf16.py -k "stage4 or bottom_right_matches or test_bf16" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/pytest.log | tail -6
OUT=$OUT bash scripts/record_stages.sh 170 4
grep "throughput\|B16 H16 S2048 D64 float16" $OUT/bench-stage4.log | head -4
timeout 100 python3 scripts/generate_record.py --record > $OUT/generate.log 2>&1; echo "generate rc=$?"
for nb in stage0_scalar stage1_unfused_wmma stage2_fused stage3_warp_softmax; do
  timeout 80 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tar czf $OUT/run.tgz results README.md notebooks
