#!/usr/bin/env bash
# GPU call 8 of session 37 (issue 25): where stage 7's time goes at B4 H16 S8192 D128 (full),
# 914 TFLOPS in call 7's record, which the stage 7 notebook's count put at the exponentials'
# pace (MUFU plus the rest of the softmax: about 920). Nsight Compute, full set, on the kernel
# alone (inputs already quantized): the pipes' utilization (XU is MUFU), issue slots, stalls.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
mkdir -p $OUT/logs
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $OUT/logs/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
step ncu-fp8d128 200 ncu --profile-from-start off --clock-control none --set full --import-source no -o $OUT/logs/fp8d128 python3 scripts/profile_pair.py 4 16 16 8192 8192 128 --stage 7 --no-sdpa
ncu -i $OUT/logs/fp8d128.ncu-rep --page details --print-details all > $OUT/logs/fp8d128-details.txt 2>&1
ncu -i $OUT/logs/fp8d128.ncu-rep --page source --print-source sass --csv > $OUT/logs/fp8d128-sass.csv 2>&1; gzip -f $OUT/logs/fp8d128-sass.csv
grep -E "^  [a-zA-Z_]|Duration|SM Frequency|Issue Active|Pipe Tensor Cycles|Pipe Xu|Inst Executed Pipe Xu|Pipe Fma Cycles|Pipe Alu|Issued Warp|No Eligible|Stall [A-Z][a-z]+ +inst" $OUT/logs/fp8d128-details.txt | cut -c1-140 | head -60
gzip -f $OUT/logs/fp8d128-details.txt
rm -f $OUT/logs/*.ncu-rep
