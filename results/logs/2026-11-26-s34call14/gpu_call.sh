#!/usr/bin/env bash
# GPU call 14 of session 34: stage 7 back at its recorded kernel (63e58db's change reverted: 0.90x and
# 0.94x at D128 in call 13); its tests, then its notebook executed against stage 6's f098bb7 record.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step tests7 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py
tail -n 1 $OUT/logs/tests7.log
step nb-stage7_fp8 150 python3 -m lib.notebook --execute notebooks/stage7_fp8.ipynb; tail -1 $OUT/logs/nb-stage7_fp8.log
tar czf $OUT/run.tgz notebooks
