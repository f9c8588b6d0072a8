#!/usr/bin/env bash
# GPU call 5 of session 43: TAIL_SPLIT kept at D128 (stage7.TAIL_SPLIT, call 4's A/B): stage 7's
# tests and compute-sanitizer at these sources, its records (fp8_tiles, fp8_bench with the split
# and unsplit kernels beside, fp8_waterfall with the split as a step), the queue probe again
# (unsplit, as call 3), and the stage 7 and journey notebooks executed against the records.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call5
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest7 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $L/pytest7.log | cut -c1-300 | head -12
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 120 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 -m pytest -x -q -p no:cacheprovider tests/test_stage7.py -k sanitizers
  tail -1 $L/sanitize-$tool.log | cut -c1-200
done
if [ $tests_rc -eq 0 ]; then
  step tiles 120 python3 scripts/fp8_tiles.py --record --out $L/fp8_tiles.json; grep -E "recorded|FAIL" $L/tiles.log
  step fp8bench 120 python3 scripts/fp8_bench.py --record --out $L/fp8_bench.json
  grep -E "^\| B|ceilings|recorded|FAIL" $L/fp8bench.log | cut -c1-300
  step waterfall 120 python3 scripts/fp8_waterfall.py --record --out $L/fp8_waterfall.json; grep -E "recorded|FAIL" $L/waterfall.log
  step probe 60 python3 scripts/queue_tail_probe.py --out $L/queue_tail.json; cut -c1-400 $L/probe.log
  for nb in stage7_fp8 journey; do
    left=$(( 590 - ($(date +%s) - T0) ))
    [ $left -lt 30 ] && { echo "no time left for $nb"; break; }
    step nb-$nb $left python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log
  done
fi
tar czf $OUT/run.tgz results/*.json notebooks/stage7_fp8.ipynb notebooks/journey.ipynb $L
