#!/usr/bin/env bash
# GPU call 13 of session 30 (2026-11-25) at commit 8423a0d: issue 25's first FP8 tile on the H100
# (scripts/fp8_tile_probe.py), two seeds.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache
for seed in 0 1; do timeout 60 python3 scripts/fp8_tile_probe.py --seed $seed; echo "probe seed $seed rc=$?"; done
