#!/usr/bin/env bash
# Re-record stages one by one within a time budget (a GPU call's limit): each stage is its own
# `lib.bench --record` run, so a limit reached mid-way loses only the stage then running, and a
# stage whose usual duration no longer fits is not started.
#   bash scripts/record_stages.sh SECONDS STAGE...    e.g.  bash scripts/record_stages.sh 560 0 1
# Logs go to $OUT/bench-stageN.log (OUT defaults to ./gpu-out).
set -u
budget=$1; shift
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
# Seconds one stage's record took on the H100 (fp16 and bf16, standard shapes and sweep, with
# --max-call-s 10) with session 44's settled timing, plus slack: stage 0 452 s, stage 2 past 114 s
# (results/logs/2026-11-26-s45call1).
declare -A USUAL=([0]=460 [1]=170 [2]=150 [3]=150 [4]=150 [5]=150 [6]=150)
deadline=$(( $(date +%s) + budget ))
# a call's own deadline (scripts/gpu_call.sh FA_DEADLINE), when it comes first
[ -n "${FA_DEADLINE:-}" ] && [ "$FA_DEADLINE" -lt "$deadline" ] && deadline=$FA_DEADLINE
for s in "$@"; do
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt "${USUAL[$s]:-150}" ]; then
    echo "stage $s not started: ${left} s left, it usually takes ${USUAL[$s]:-150} s"; continue
  fi
  t0=$(date +%s)
  timeout "$left" python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 \
    --stages "$s" > "$OUT/bench-stage$s.log" 2>&1
  echo "stage $s rc=$? $(( $(date +%s) - t0 )) s"
done
# The notebooks that read the re-recorded rows now show older ones: CI fails until they are
# executed against the new record (python3 -m lib.notebook --execute-stale, on the GPU).
echo "notebooks to execute again (python3 -m lib.notebook --execute-stale):"
python3 -m lib.notebook --stale 2> /dev/null | sed 's/^/  /'
# Their prose is not executed: once they ran, `--prose-since` lists the numbers it cites that moved.
echo "once executed, read again what python3 -m lib.notebook --prose-since $(git rev-parse --short HEAD 2> /dev/null || echo HEAD) lists"
