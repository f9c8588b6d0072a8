#!/usr/bin/env bash
# GPU call 8 of session 35: the journey notebook executed (its stage 8 section reads call 7's
# backward and training records, and its text was brought to them).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step nb-journey 200 python3 -m lib.notebook --execute notebooks/journey.ipynb; tail -1 $OUT/logs/nb-journey.log
tar czf $OUT/run.tgz notebooks/journey.ipynb
