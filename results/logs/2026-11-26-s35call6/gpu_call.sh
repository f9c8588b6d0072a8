#!/usr/bin/env bash
# GPU call 6 of session 35: stage 8's new WGMMA build per head dim (D 128: two warpgroups, dQ
# by bulk reductions, TMA loads; D 64: one warpgroup, the same) — tests, compute-sanitizer on
# every switch and the stage's builds, then the backward record with every variant.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
L=results/logs/2026-11-26-s35call6
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 8"
step pytest 200 python3 -m pytest -q -x $XD tests/test_backward.py tests/test_hf.py; tail -3 $OUT/logs/pytest.log
for tool in racecheck memcheck synccheck; do
  step sanitize-$tool 100 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention --report-api-errors no python3 $L/calls.py; tail -1 $OUT/logs/sanitize-$tool.log
done
step backward 330 python3 scripts/backward_bench.py --record --variants --rounds 5
grep -E "^\| B|recorded|not recorded" $OUT/logs/backward.log | cut -c1-200
tar czf $OUT/run.tgz results/*.json results/*.png
