#!/usr/bin/env bash
# (Before running it again: bash $(dirname $0)/sources.sh, where git is, makes the files it reads.)
# GPU call 3 of session 34: stage 6 with fewer fixed costs per work tile (the work index decoded
# without integer division, 1/l as one MUFU.RCP, shared memory addressed as shared): checked
# (stage 6's own tests, the shared suite and the varlen/causal suite at stage 6, sanitizers on the
# launch paths), then timed against the kernel before the change (d1832bb, this folder's
# stage6-d1832bb.cu) in the same interleaved rounds (scripts/stage6_ab.py). Logs only.
set -u
D=$(dirname $0)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step tests6 300 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage6.py tests/test_causal_varlen.py \
  tests/test_stages.py tests/test_backward.py; tests_rc=$?
grep -E "passed|failed|^FAILED" $OUT/logs/tests6.log | cut -c1-240 | head -20
step ab 240 python3 scripts/stage6_ab.py --against d1832bb --older-file $D/stage6-d1832bb.cu --rounds 5
cat $OUT/logs/ab.log | cut -c1-200
for tool in memcheck racecheck synccheck; do
  step sanitize-$tool 100 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 $D/calls.py
  tail -n 2 $OUT/logs/sanitize-$tool.log
done
tar czf $OUT/logs.tgz -C $OUT logs
