#!/usr/bin/env bash
# GPU call 8 of session 41 (issue 21): Nsight Compute on stage 6 and SDPA's default backend at the
# two decoding rows furthest under it in the map at a2c9671: B64 H32/8 Sq1 Sk1024 D64 (0.98x,
# 512 work tiles, two blocks per SM) and B8 H32/8 Sq1 Sk32768 D64 (0.985x, 128 blocks of 16,384
# keys). Question: is the last 1-2% in the bytes read, in the rate they are read at, or in the
# start and end of the launch? Details pages kept (gzipped); the reports are not.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s41call8
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for spec in "b64sk1k 64 32 8 1 1024 64" "b8sk32k 8 32 8 1 32768 64"; do
  set -- $spec; name=$1; shift
  step ncu-$name 200 ncu --profile-from-start off --clock-control none --set full --import-source no -o $L/$name python3 scripts/profile_pair.py "$@"
  ncu -i $L/$name.ncu-rep --page details --print-details all > $L/$name-details.txt 2>&1
  grep -E "^  [a-zA-Z_]|^    (Duration|Elapsed Cycles|SM Frequency|DRAM Frequency|DRAM Throughput|Memory Throughput|L2 Hit Rate|Achieved Occupancy|Waves Per SM|Grid Size|Block Size|Registers Per Thread|Dynamic Shared Memory Per Block|Issue Slots Busy|One or More Eligible) " $L/$name-details.txt | cut -c1-150 | head -60
  gzip -f $L/$name-details.txt; rm -f $L/*.ncu-rep
done
tar czf $OUT/run.tgz $L
