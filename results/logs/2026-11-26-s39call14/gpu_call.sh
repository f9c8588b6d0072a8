#!/usr/bin/env bash
# GPU call 14 of session 39 (issue 25): Nsight Compute on stage 7 at B16 H16 S2048 D64 with the
# row sums by P·V (the default since call 3), as session 38's call 4 profiled it without them:
# how busy the exponential unit, the tensor cores and the issue slots are now, and where the
# warps stall. For the notebook's §9 and the next step at D64.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s39call14
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
name=fp8d64rowsum
step ncu-$name 200 ncu --profile-from-start off --clock-control none --set full --import-source no -o $L/$name python3 scripts/profile_pair.py 16 16 16 2048 2048 64 --stage 7 --no-sdpa
ncu -i $L/$name.ncu-rep --page details --print-details all > $L/$name-details.txt 2>&1
ncu -i $L/$name.ncu-rep --page source --print-source sass --csv > $L/$name-sass.csv 2>&1; gzip -f $L/$name-sass.csv
grep -E "^    (Duration|SM Frequency)|Issue Slots Busy|Pipe Tensor Cycles Active|Inst Executed Pipe Xu|Pipe Fma Cycles Active|Pipe Alu Cycles|No Eligible|Registers Per Thread|Eligible Warps|Active Warps Per" $L/$name-details.txt | sort -u | cut -c1-140 | head -24
gzip -f $L/$name-details.txt
rm -f $L/*.ncu-rep
tar czf $OUT/run.tgz $L
