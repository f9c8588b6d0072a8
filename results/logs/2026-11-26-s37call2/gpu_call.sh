#!/usr/bin/env bash
# GPU call 2 of session 37 (issue 23): where stage 8's time goes at D 64. Call 1 found a third
# block per SM (BLOCKS_PER_SM 3) no faster (0.99x), so the blocks' waits are not what limits it.
# Nsight Compute, full set, at B16 H16 S2048 D64 (non-causal, bf16): the stage's build, and
# SDPA's default backward (cuDNN) for its launch shape and throughputs. The details page as text.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step ncu-d64 240 ncu --profile-from-start off --clock-control none --set full --import-source no -o $OUT/logs/d64 python3 scripts/profile_backward.py 16 16 2048 64
ncu -i $OUT/logs/d64.ncu-rep --page details --print-details all > $OUT/logs/d64-details.txt 2>&1
ncu -i $OUT/logs/d64.ncu-rep --page raw --csv > $OUT/logs/d64-raw.csv 2>&1; gzip -f $OUT/logs/d64-raw.csv
ncu -i $OUT/logs/d64.ncu-rep --page source --print-source sass --csv --kernel-name attention_backward > $OUT/logs/d64-sass.csv 2>&1; gzip -f $OUT/logs/d64-sass.csv
grep -E "^  [a-zA-Z_]|Duration|Registers Per|Block Size|Grid Size|Shared Memory Config|Dynamic Shared|Achieved Occ|Issue Slots Busy|Tensor|Shared.*%|L1/TEX Hit|Mem Pipes" $OUT/logs/d64-details.txt | cut -c1-150 | head -120
rm -f $OUT/logs/*.ncu-rep
