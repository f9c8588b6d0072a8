#!/usr/bin/env bash
# GPU call 12 of session 35: dQ's postprocess as one kernel (stages/stage8_postprocess.cu: the
# bulk-summed tiles back to rows in q's dtype; a PyTorch copy through a permuted view before).
# Tests, compute-sanitizer on every build, every WGMMA switch timed (no record).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
L=results/logs/2026-11-26-s35call12
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 8"
step pytest 120 python3 -m pytest -q -x $XD tests/test_backward.py; tail -1 $OUT/logs/pytest.log
for tool in racecheck memcheck synccheck; do
  step sanitize-$tool 80 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 $L/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
step backward 200 python3 scripts/backward_bench.py --variants wgmma --rounds 5
grep -E "bulk reduction, TMA|without overlap|^\| B" $OUT/logs/backward.log | cut -c1-200
