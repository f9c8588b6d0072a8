#!/usr/bin/env bash
# GPU call 3 of session 46 (call 2 again with the per-SM clock count fixed): the special-function unit's 2^x rate in half precision against
# float32 (scripts/mufu_half_rates.py), for issue 25's D64 target (stage 7 there is bound by its
# exponentials; P is e4m3, so a 16-bit 2^x would be precise enough if it were faster).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-27-s46call3
L=$here/device; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee $L/gpu.txt
timeout 200 python3 scripts/mufu_half_rates.py 2>&1 | tee $L/mufu_half_rates.log
tar czf $OUT/run.tgz $L
