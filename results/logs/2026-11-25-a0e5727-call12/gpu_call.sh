#!/usr/bin/env bash
# GPU call 12 of session 30 (2026-11-25) at commit a0e5727: the stage 8 notebook executed (its new picture),
# then the whole GPU suite.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=a0e5727
timeout 120 python3 -m lib.notebook --execute notebooks/stage8_backward.ipynb > $OUT/notebooks.log 2>&1; echo "stage8_backward rc=$?"
tar czf $OUT/run.tgz notebooks/stage8_backward.ipynb
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 tests --ignore=tests/test_notebook_consistency.py > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|FAILED" $OUT/pytest.log | head -20 | cut -c1-250
