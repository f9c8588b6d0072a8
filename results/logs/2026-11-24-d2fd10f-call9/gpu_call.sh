#!/usr/bin/env bash
# GPU call 9 of session 27 (2026-11-24) at commit d2fd10f: generate() re-recorded with the adapter's
# packed offsets made from host values (lib.inputs.offsets_tensor: no read-back per layer), then
# the stage 4 notebook (its summary line changed) and the journey (reads the generate record)
# executed. Stage sources as in calls 6-7.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=d2fd10f
timeout 120 python3 scripts/generate_record.py --record > $OUT/generate.log 2>&1; echo "generate rc=$?"
grep "^|" $OUT/generate.log
for nb in stage4_large_tiles journey; do
  timeout 100 python3 -m lib.notebook --execute notebooks/$nb.ipynb >> $OUT/notebooks.log 2>&1; echo "$nb rc=$?"
done
tar czf $OUT/run.tgz results notebooks
