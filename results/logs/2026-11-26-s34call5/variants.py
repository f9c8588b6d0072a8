"""Session 34, call 5: after call 3's cheaper work-tile start and end, what is left per work tile
at short prefill is the first S = Q·Kᵀ waited for alone and the last P·V alone (Nsight Compute,
results/logs/2026-11-26-s34call4: 17% of the consumers' samples at D64 causal S512). CARRY_PV
issues a work tile's last P·V with the next one's first S; measured level at 2590269 (0.95-1.04x,
results/logs/2026-11-25-0a60c0e-call3), when each work tile's start and end cost more. Timed again
here, with two and three Q buffers, against the launch as chosen today (two), SDPA's default
beside them, in interleaved rounds; the work queue with ping-pong at D64 causal too. Each output
checked against the float64 reference first."""
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
best = {}
for B, H, S, D, causal in ROWS:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    ch = s6.choose(B, H, H, S, S, D, causal, sms)
    tiles, sched = ch["tiles"], ch["schedule"]
    opts = {"q2": dict(q_stages=2), "q3": dict(q_stages=3), "q2 carry": dict(q_stages=2, carry_pv=True),
            "q3 carry": dict(q_stages=3, carry_pv=True)}
    if D == 64 and causal:
        opts["q3 queue pp"] = dict(q_stages=3, schedule="+ work queue")
    fns = {}
    for name, o in opts.items():
        o = {"tiles": tiles, "schedule": sched, **o}
        if not s6.fits(D, o["tiles"], o["q_stages"]):
            continue
        try:
            s6.config(D, o["tiles"], o["schedule"], q_stages=o["q_stages"], carry_pv=o.get("carry_pv"))
        except ValueError as e:
            print(f"  {name}: not built ({e})")
            continue
        fns[name] = lambda o=o: s6.attention(q, k, v, causal=causal, **o)
    ok = {n: check_output(f(), q, k, v, causal=causal).passed for n, f in fns.items()}
    t = time_interleaved({**fns, "SDPA": sdpa_call(q, k, v, causal=causal)}, budget_s=0.4)
    us = {n: x.median_us for n, x in t.items()}
    row = ", ".join(f"{n} {us[n]:.1f} ({us['q2'] / us[n]:.3f}x{'' if ok[n] else ' FAIL'})" for n in fns)
    print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {tiles} {sched}: {row}; SDPA {us['SDPA']:.1f} "
          f"-> q2 {us['SDPA'] / us['q2']:.3f}x", flush=True)
    for n in fns:
        best.setdefault(n, []).append(us["q2"] / us[n])
for n, g in best.items():
    print(f"{n} against q2: {min(g):.3f}x to {max(g):.3f}x, median {statistics.median(g):.3f}x over {len(g)} rows")
