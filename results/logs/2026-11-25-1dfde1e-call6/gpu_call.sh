#!/usr/bin/env bash
# GPU call 6 of session 29 (2026-11-25) at commit 1dfde1e (stage 6's sources as in call 5, 9e84965):
# the shape map recorded (bf16: prefill grid, decoding, decoding waterfall), then the notebooks
# that read stage 6's record and the map executed. results/ and notebooks/ come back in run.tgz.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=1dfde1e
timeout 400 python3 scripts/shape_map.py --record --dtype bfloat16 > $OUT/shapemap.log 2>&1; echo "shapemap rc=$?"
grep -v "^\[" $OUT/shapemap.log | tail -6
for nb in stage6_wgmma_tma journey 00_introduction; do
  timeout 60 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tar czf $OUT/run.tgz results notebooks
