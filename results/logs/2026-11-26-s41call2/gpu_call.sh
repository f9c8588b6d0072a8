#!/usr/bin/env bash
# GPU call 2 of session 41 (issue 21): decoding blocks of one warpgroup without a producer, 2-4
# per SM as cuDNN's (scripts/decode_launch_ab.py --launch no-producer), against the launch as
# called at the map's Sq 1 rows; compute-sanitizer on that launch path (calls_noprod.py). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s41call2
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step noprod 300 python3 scripts/decode_launch_ab.py --launch no-producer --out $L/noprod.json
grep -E "^\[|every|failed|Error" $L/noprod.log | cut -c1-330
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 120 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $here/calls_noprod.py
  echo "  $(grep -h 'calls done' $L/sanitize-$tool.log) / $(tail -n 1 $L/sanitize-$tool.log)"
done
tar czf $OUT/run.tgz $L
