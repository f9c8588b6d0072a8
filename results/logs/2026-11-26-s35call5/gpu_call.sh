#!/usr/bin/env bash
# GPU call 5 of session 35: call 4 again after two changes: every thread (not each warp's lane 0)
# arrives on a buffer's "empty" mbarrier (call 4's racecheck: lse and δ read by lanes 1-31 had no
# ordering before lane 0's arrive), and warpgroups that each sum their own keys' dQ share (D 64) meet
# at a barrier of their own, not the block's. Tests, sanitizers, every switch timed (no record).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
L=results/logs/2026-11-26-s35call5
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 8"
step pytest 300 python3 -m pytest -q -x $XD tests/test_backward.py; tail -3 $OUT/logs/pytest.log
for tool in racecheck memcheck synccheck; do
  step sanitize-$tool 150 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 $L/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
step bench 300 python3 scripts/backward_bench.py --variants wgmma --rounds 3
grep -E "WGMMA|^\| B|stage 8 " $OUT/logs/bench.log | cut -c1-200 | head -60
