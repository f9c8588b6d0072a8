#!/usr/bin/env bash
# GPU call 1 of session 44: SKIP_ROWS_PAST_END (stages 6 and 7: a consumer of the last query
# block whose rows all lie past the sequence's end computes nothing). Its new tests first, then
# scripts/rows_past_end_ab.py (skip, without, without, skip in each round), then stage 6's and 7's
# test files, then compute-sanitizer on the small shapes while time is left.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s44call1
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step new 120 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_stage7.py -k rows_past_end; new_rc=$?
grep -E "passed|failed|^FAILED" $L/new.log | cut -c1-300 | head -12
if [ $new_rc -eq 0 ]; then
  step ab 330 python3 scripts/rows_past_end_ab.py --out $L/rows_past_end_ab.json
  grep -E "^\[|^stage 7" $L/ab.log | cut -c1-330
fi
left=$(( 560 - ($(date +%s) - T0) ))
echo "tests: $left s left"
step pytest67 $left python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_stage7.py tests/test_causal_varlen.py
grep -E "passed|failed|^FAILED" $L/pytest67.log | cut -c1-300 | head -12
for tool in memcheck racecheck; do
  left=$(( 590 - ($(date +%s) - T0) ))
  [ $left -lt 40 ] && { echo "no time left for $tool"; break; }
  step sanitize6-$tool $left compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 -m lib.bench --check --stages 6
  tail -2 $L/sanitize6-$tool.log | cut -c1-300
done
tar czf $OUT/run.tgz $L
