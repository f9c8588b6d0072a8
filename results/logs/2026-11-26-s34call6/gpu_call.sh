#!/usr/bin/env bash
# (Before running it again: bash $(dirname $0)/sources.sh, where git is, makes the files it reads.)
# GPU call 6 of session 34: stage 6 with its new rules (three Q buffers for persistent launches of
# short work tiles; at D128 with them the carried P·V): stage 6's tests and the shared suites,
# compute-sanitizer on every launch path (calls.py), then stage 6 re-recorded (lib.bench: the
# standard rows, sweep, README table and plots) and the shape map re-recorded with the time left
# (call 7 finishes it with --resume).
set -u
D=$(dirname $0)
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step tests 200 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py \
  tests/test_stages.py tests/test_backward.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/tests.log | cut -c1-240 | head -10
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 60 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $D/calls.py
  tail -n 1 $OUT/logs/sanitize-$tool.log
done
if [ $tests_rc -eq 0 ]; then
  step bench 240 python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 --stages 6
  grep -A8 "^| stage | shape | dtype | causal | µs" $OUT/logs/bench.log | head -12 | cut -c1-200
  left=$(( 570 - ($(date +%s) - T0) ))
  echo "shape map: $left s left"
  [ $left -gt 40 ] && step shape_map $left python3 scripts/shape_map.py --record --dtype bfloat16
  tail -n 4 $OUT/logs/shape_map.log | cut -c1-200
fi
tar czf $OUT/run.tgz results README.md
tar czf $OUT/logs.tgz -C $OUT logs
