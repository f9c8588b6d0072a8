#!/usr/bin/env bash
# GPU call 4 of session 43: TAIL_SPLIT again, its pieces now combined by a second kernel
# (attention_fp8_combine_tail) instead of in the last piece, whose code cost the main loop 1-2.6%
# in call 2: stage 7's tests, compute-sanitizer on the small shapes (a split tail among them),
# then scripts/tail_split_ab.py (rounds ordered split, whole, whole, split).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call4
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest7 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $L/pytest7.log | cut -c1-300 | head -12
if [ $tests_rc -eq 0 ]; then
  step ab 240 python3 scripts/tail_split_ab.py --out $L/tail_split_ab.json
  grep -E "^B" $L/ab.log | cut -c1-400
fi
for tool in memcheck racecheck synccheck; do
  left=$(( 590 - ($(date +%s) - T0) ))
  [ $left -lt 30 ] && { echo "no time left for $tool"; break; }
  step sanitize-$tool $left compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 -m pytest -x -q -p no:cacheprovider tests/test_stage7.py -k sanitizers
  tail -3 $L/sanitize-$tool.log | cut -c1-300
done
tar czf $OUT/run.tgz $L
