#!/usr/bin/env bash
# GPU call 12 of session 40 (issue 25): stage 7's work queue with stage 6's tail order (the last two
# waves of causal work tiles handed out longest first). Its A/B against the plain order
# (tail7_ab.py), stage 7's tests, compute-sanitizer on the queue with the tail (tail7_calls.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call12
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
step tail7 200 python3 $here/tail7_ab.py; grep -E "^B|Error" $L/tail7.log | cut -c1-230
step pytest 240 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py
grep -E "passed|failed|^FAILED" $L/pytest.log | cut -c1-240 | head -8
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 120 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=fp8 --report-api-errors no python3 $here/tail7_calls.py
  echo "  $(grep -h 'calls done' $L/sanitize-$tool.log) / $(tail -n 1 $L/sanitize-$tool.log)"
done
tar czf $OUT/run.tgz $L
