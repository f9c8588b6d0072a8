#!/usr/bin/env bash
# GPU call 3 of session 40 (issue 21): which half of call 2's epilogue change made D64 causal
# S512-1024 0.5% slower (bisect_ab.py), and blocks of one consumer with 64-key tiles, two or
# three per SM, at the decoding rows under SDPA (decode_ab.py). Logs only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s40call3
L=$here/device; mkdir -p $L /tmp/before /tmp/zeroonly
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
git apply -R results/logs/2026-11-26-s40call2/stage6_epilogue.patch && cp stages/stage6.cu /tmp/before/stage6_before.cu && git apply results/logs/2026-11-26-s40call2/stage6_epilogue.patch
git apply $here/stage6_zero_o_only.patch && cp stages/stage6.cu /tmp/zeroonly/stage6_zeroonly.cu && git apply -R $here/stage6_zero_o_only.patch
cp stages/stage6.py /tmp/before/stage6_before.py; cp stages/stage6.py /tmp/zeroonly/stage6_zeroonly.py
git diff --no-index --stat /tmp/zeroonly/stage6_zeroonly.cu stages/stage6.cu | tail -1
step bisect 300 python3 $here/bisect_ab.py; grep -E "^B|Error" $L/bisect.log | cut -c1-200
step decode 240 python3 $here/decode_ab.py; grep -E "^B|Error" $L/decode.log | cut -c1-200
tar czf $OUT/run.tgz $L
