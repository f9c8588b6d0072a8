#!/usr/bin/env bash
# GPU call 9 of 2026-11-24 at commit 511f4c1 (the kernel as in call 7, where memcheck and racecheck
# were clean; the launch rules changed): stage 6 tests, stage 6 re-recorded (fp16, bf16, sweep),
# the shape map recorded (bf16), and the notebooks that read them executed (stage 6, journey,
# introduction). results/, README.md and the notebooks come back in run.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=511f4c1
python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py tests/test_stages.py -k "(test_stage6 and (decod or split or every_schedule or timeline or work_queue or strided)) or (stage6 and (graph or host or matches or grad))" > $OUT/pytest.log 2>&1
tail -3 $OUT/pytest.log
python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6 > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -A8 "^| stage | shape | dtype | causal | µs" $OUT/bench.log | head -9; grep -A7 "host µs/call" $OUT/bench.log | head -7
timeout 260 python3 scripts/shape_map.py --record --dtype bfloat16 > $OUT/shapemap.log 2>&1; echo "shapemap rc=$?"
grep -v "^\[" $OUT/shapemap.log | tail -5
for nb in stage6_wgmma_tma journey 00_introduction; do
  timeout 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tar czf $OUT/run.tgz results README.md notebooks
