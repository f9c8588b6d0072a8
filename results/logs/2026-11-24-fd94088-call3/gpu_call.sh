#!/usr/bin/env bash
# GPU call 3 of 2026-11-24 (issues 21, 23) at commit fd94088: stage 6's decode tests after the split
# cap and the per-stream partial buffers; stage 6 re-recorded (fp16, bf16, sweep); the notebooks
# that read stage 6 executed against it (stage 6, introduction, journey). results/, README.md
# and the executed notebooks come back in run.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=fd94088
python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py -k "decod or split or timeline or tile_choice" > $OUT/pytest.log 2>&1
tail -4 $OUT/pytest.log
python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6 > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -A12 "^| stage" $OUT/bench.log | head -14; tail -3 $OUT/bench.log
for nb in stage6_wgmma_tma journey 00_introduction; do
  timeout 200 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tail -5 $OUT/notebooks.log
tar czf $OUT/run.tgz results README.md notebooks
