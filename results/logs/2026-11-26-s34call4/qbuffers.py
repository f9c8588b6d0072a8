"""Session 34, call 4: stage 6's persistent launches with three Q buffers (Q_STAGES=3) against
two, at the short-prefill rows of the shape map (B·S = 16k, bf16), SDPA's default beside them, in
interleaved rounds; each launch as call_schedule and choose pick it (tiles, schedule), only the
Q buffers differ. The question: does a short work tile's next Q wait behind the tile before's
epilogue (Nsight Compute put 3.5% of the consumers' samples at D64 causal S512 on the q_full wait,
results/logs/2026-11-26-s34call2)? Each output checked against the float64 reference first."""
import statistics
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
from lib.timing import sdpa_call, time_interleaved

ROWS = [(32, 16, 512, 64, True), (16, 16, 1024, 64, True), (8, 16, 2048, 64, True), (32, 16, 512, 64, False),
        (16, 16, 1024, 64, False), (32, 32, 512, 128, True), (32, 32, 512, 128, False), (16, 32, 1024, 128, True),
        (16, 32, 1024, 128, False)]
sms = torch.cuda.get_device_properties(0).multi_processor_count
gains = []
for B, H, S, D, causal in ROWS:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    ch = s6.choose(B, H, H, S, S, D, causal, sms)
    tiles, sched = ch["tiles"], ch["schedule"]
    if not s6.fits(D, tiles, 3):
        print(f"B{B} H{H} S{S} D{D} causal={causal}: tiles {tiles} do not fit three Q buffers")
        continue
    fns = {f"q{n}": (lambda n=n: s6.attention(q, k, v, causal=causal, tiles=tiles, schedule=sched, q_stages=n))
           for n in (2, 3)}
    ok = all(check_output(f(), q, k, v, causal=causal).passed for f in fns.values())
    t = time_interleaved({**fns, "SDPA": sdpa_call(q, k, v, causal=causal)}, budget_s=0.5)
    us = {n: x.median_us for n, x in t.items()}
    gains.append(us["q2"] / us["q3"])
    print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {tiles} {sched}: q2 {us['q2']:.1f} µs, q3 {us['q3']:.1f} µs "
          f"({us['q2'] / us['q3']:.3f}x), SDPA {us['SDPA']:.1f} µs -> {us['SDPA'] / us['q2']:.3f}x / {us['SDPA'] / us['q3']:.3f}x "
          f"{'pass' if ok else 'FAIL'}", flush=True)
print(f"q3 against q2: {min(gains):.3f}x to {max(gains):.3f}x, median {statistics.median(gains):.3f}x over {len(gains)} rows")
