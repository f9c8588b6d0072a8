#!/usr/bin/env bash
# GPU call 5 of session 36 (issue 21): the shape map re-recorded at call 4's stage 6 (two blocks
# per SM where decoding blocks fill the GPU; the decoding waterfall with that step), then the
# stage 6, journey and introduction notebooks executed against it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step shape_map 400 python3 scripts/shape_map.py --record --dtype bfloat16
tail -n 4 $OUT/logs/shape_map.log | cut -c1-200
step tests_map 60 python3 -m pytest -q -p no:cacheprovider tests/test_stage6.py -k "shape_map_rows"
tail -n 1 $OUT/logs/tests_map.log
for nb in stage6_wgmma_tma journey 00_introduction; do step nb-$nb 150 python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $OUT/logs/nb-$nb.log; done
tar czf $OUT/run.tgz results/*.json results/*.png README.md notebooks/stage6_wgmma_tma.ipynb notebooks/journey.ipynb notebooks/00_introduction.ipynb
tar czf $OUT/logs.tgz -C $OUT logs
