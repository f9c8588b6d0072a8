#!/usr/bin/env bash
# GPU call 7 of session 35: the backward record again (call 6's, at the same stage 8 sources,
# lacked the per-gradient errors and the pass flag the issue asks each row to carry), the
# training record (stage 8 changed since 38ba1c1), the launch-arguments test fixed for an H100,
# and the stage 8 notebook executed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step pytest 100 python3 -m pytest -q tests/test_backward.py -k "launch_arguments or deterministic or per_head"; tail -1 $OUT/logs/pytest.log
step backward 200 python3 scripts/backward_bench.py --record --variants --rounds 5
grep -E "^\| B|recorded|not recorded" $OUT/logs/backward.log | cut -c1-200
step train 150 python3 scripts/train_curve.py --record; tail -4 $OUT/logs/train.log
step nb-stage8_backward 120 python3 -m lib.notebook --execute notebooks/stage8_backward.ipynb; tail -1 $OUT/logs/nb-stage8_backward.log
tar czf $OUT/run.tgz results/*.json results/*.png notebooks/stage8_backward.ipynb
