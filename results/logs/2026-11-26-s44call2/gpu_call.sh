#!/usr/bin/env bash
# GPU call 2 of session 44: with SKIP_ROWS_PAST_END, stage 6's full D64 rows as called (persistent
# blocks in a fixed stride) against the work queue (rows_past_end_ab.py --parts queue); whether a
# callable's place in an interleaved round moves its time (place_probe.py); compute-sanitizer on
# stage 7's small shapes (idle consumers among them) and synccheck on stage 6's.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call2
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step queue 200 python3 scripts/rows_past_end_ab.py --parts queue --out $L/queue_ab.json
grep -E "^\[" $L/queue.log | cut -c1-330
step place 150 python3 scripts/place_probe.py --out $L/place.json
grep -E "^B" $L/place.log | cut -c1-250
for tool in memcheck racecheck synccheck; do
  left=$(( 560 - ($(date +%s) - T0) ))
  [ $left -lt 40 ] && { echo "no time left for $tool"; break; }
  step sanitize7-$tool $left compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 -m pytest -x -q -p no:cacheprovider tests/test_stage7.py -k sanitizers
  tail -2 $L/sanitize7-$tool.log | cut -c1-300
done
left=$(( 590 - ($(date +%s) - T0) ))
[ $left -gt 30 ] && step sanitize6-synccheck $left compute-sanitizer --tool synccheck --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 -m lib.bench --check --stages 6 && tail -2 $L/sanitize6-synccheck.log | cut -c1-300
tar czf $OUT/run.tgz $L
