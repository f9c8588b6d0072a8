#!/usr/bin/env bash
# GPU call 4 of session 35: stage 8's WGMMA build with a fourth switch, TMA_LOADS (Q, dO, lse and
# δ of each step loaded by the copy engine two steps ahead, mbarriers instead of the block
# barrier), and the bulk dQ tiles double-buffered: tests, compute-sanitizer on every switch,
# every switch timed (no record), the fastest D128 candidate profiled.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
L=results/logs/2026-11-26-s35call4
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 8"
step pytest 300 python3 -m pytest -q -x $XD tests/test_backward.py; tail -3 $OUT/logs/pytest.log
for tool in racecheck memcheck synccheck; do
  step sanitize-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 $L/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
step bench 300 python3 scripts/backward_bench.py --variants wgmma --rounds 3
grep -E "WGMMA|^\| B|stage 8 " $OUT/logs/bench.log | cut -c1-200 | head -60
step ncu-tma128 150 ncu --profile-from-start off --clock-control none --set full --import-source no -o $OUT/logs/tma128 python3 scripts/profile_backward.py 2 16 4096 128 --warpgroups 2 --dq-atomics 1 --dq-bulk 1 --tma-loads 1 --no-sdpa
ncu -i $OUT/logs/tma128.ncu-rep --page source --print-source sass --csv > $OUT/logs/tma128-sass.csv 2>&1; gzip -f $OUT/logs/tma128-sass.csv
ncu -i $OUT/logs/tma128.ncu-rep --page details --print-details all 2>&1 | awk '/^  attention_backward /,0' | grep -E "Duration|Tensor Cycles Active|Stall [A-Z]" | head -12
rm -f $OUT/logs/*.ncu-rep
