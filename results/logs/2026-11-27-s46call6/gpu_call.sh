#!/usr/bin/env bash
# GPU call 6 of session 46: stage 7 at D 64 with four consumers on 64-key tiles
# (scripts/fp8_four_consumers_ab.py), checked against the emulation at odd and timed shapes, then
# timed against the build as called and stage 6 (issue 25's D 64 target).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-27-s46call6
L=$here/device; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee $L/gpu.txt
timeout 300 python3 scripts/fp8_four_consumers_ab.py --out $L/ab.json 2>&1 | tee $L/ab.log
echo "rc=${PIPESTATUS[0]}"
tar czf $OUT/run.tgz $L
