#!/usr/bin/env bash
# GPU call 9 of session 36: the notebooks executed against call 8's record (stage 6 and its shape
# map at ec1586d: stage 6, journey, introduction, and stages 7 and 8, whose banners name stage 6's
# rows) and those whose show_source markers were mended (stages 1, 3, 4 and 5).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
NBS="stage6_wgmma_tma journey 00_introduction stage7_fp8 stage8_backward stage1_unfused_wmma stage3_warp_softmax stage4_large_tiles stage5_vectorized"
for nb in $NBS; do step nb-$nb 120 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
cat $OUT/logs/nb-*.log > $OUT/notebooks.log; rm -f $OUT/logs/nb-*.log
tar czf $OUT/run.tgz $(for nb in $NBS; do echo notebooks/$nb.ipynb; done)
