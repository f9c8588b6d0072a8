#!/usr/bin/env bash
# GPU call 3 of session 28 (2026-11-24) at commit dd84642: turns passed across work tiles (call 2's run
# stopped at a missing tile choice); tests of the persistent launches, then the short-prefill launches and
# the timeline measured again with deeper rings (printed only).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=dd84642
timeout 150 python3 -m pytest -p no:cacheprovider -q -n 8 tests/test_stage6.py -k "q_buffers or work_queue or every_schedule or tile_choice or timeline or decoding" > $OUT/pytest.log 2>&1; echo "pytest rc=$?"
tail -4 $OUT/pytest.log
timeout 420 python3 scripts/shape_map.py --parts timeline schedules > $OUT/short.log 2>&1; echo "short rc=$?"
grep -v "^\[\|stamps" $OUT/short.log | tail -8
