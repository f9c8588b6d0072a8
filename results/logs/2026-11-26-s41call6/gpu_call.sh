#!/usr/bin/env bash
# GPU call 6 of session 41 (issue 21): compute-sanitizer on stage 6's default launches where
# few_keys_per_block takes blocks without a producer (with the log-sum-exp, per-entry key lengths,
# causal, the combine kernel: calls_fewkeys.py); the other test files that run stage 6 (stage 8's
# backward runs its forward); the shape map re-recorded with the waterfall's new last step (blocks
# without a producer, at a D64 shape); the stage 6, journey and introduction notebooks against it.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s41call6
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 60 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $here/calls_fewkeys.py
  echo "  $(grep -h 'calls done' $L/sanitize-$tool.log) / $(tail -n 1 $L/sanitize-$tool.log)"
done
step tests 170 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_backward.py tests/test_lib.py tests/test_lib_layers.py tests/test_shape_map_splits.py
grep -E "passed|failed|^FAILED" $L/tests.log | cut -c1-240 | head -10
step shape_map 290 python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 4 $L/shape_map.log | cut -c1-200
for nb in stage6_wgmma_tma journey 00_introduction; do
  left=$(( 590 - ($(date +%s) - T0) )); [ $left -gt 20 ] || { echo "no time left for $nb"; continue; }
  step nb-$nb $left python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log
done
tar czf $OUT/run.tgz results/*.json results/*.png notebooks $L
