#!/usr/bin/env bash
# GPU call 7 of session 34: the notebooks that show stage 6's record executed on the H100 against
# the record of call 6 (23d32ae): stage 6 (with section 10's new profile tables), the journey, the
# introduction, stages 7 and 8 (whose banners name every stage's commit).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
for nb in stage6_wgmma_tma journey 00_introduction stage7_fp8 stage8_backward; do
  step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -2 $OUT/logs/nb-$nb.log | cut -c1-200
done
tar czf $OUT/run.tgz notebooks
tar czf $OUT/logs.tgz -C $OUT logs
