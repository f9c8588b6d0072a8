"""Session 34, call 9: call 8 found deeper K/V rings faster at D64 short prompts (full S512:
(128, 4, 3) 1.054x and (128, 3, 3) 1.046x against (128, 2, 3); causal S512: (128, 3, 2) 1.031x
against (128, 2, 2)). A work tile of a short prompt has 1-8 key tiles; with a ring as deep as
most of them, the producer copies the next work tile's first K and V while this one still
runs, and its first S does not wait for them. Here: the same against the launch as chosen today
at D64 S512-4096, with (128, 4, 2) for causal too, and how far up in length it holds. Same-run
ratios; outputs checked against the float64 reference first."""
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
from lib.timing import sdpa_call, time_interleaved

ROWS = [(32, 16, 512, True), (16, 16, 1024, True), (8, 16, 2048, True), (32, 16, 512, False), (16, 16, 1024, False),
        (8, 16, 2048, False), (4, 16, 4096, False)]
CAUSAL = [((128, 3, 2), "work queue without ping-pong"), ((128, 4, 2), "work queue without ping-pong")]
FULL = [((128, 3, 3), "+ persistent blocks"), ((128, 4, 3), "+ persistent blocks")]
sms = torch.cuda.get_device_properties(0).multi_processor_count
for B, H, S, causal in ROWS:
    D = 64
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    ch = s6.choose(B, H, H, S, S, D, causal, sms)
    fns = {"as chosen": lambda: s6.attention(q, k, v, causal=causal)}
    for tiles, sched in (CAUSAL if causal else FULL):
        for qs in (2, 3):
            if qs == 3 and not s6.fits(D, tiles, 3):
                continue
            fns[f"{tiles[0]}x{tiles[1]}x{tiles[2]} q{qs}"] = (
                lambda tiles=tiles, sched=sched, qs=qs: s6.attention(q, k, v, causal=causal, tiles=tiles, schedule=sched,
                                                                     q_stages=qs))
    ok = {n: check_output(f(), q, k, v, causal=causal).passed for n, f in fns.items()}
    t = time_interleaved({**fns, "SDPA": sdpa_call(q, k, v, causal=causal)}, budget_s=0.4)
    us = {n: x.median_us for n, x in t.items()}
    base = us["as chosen"]
    print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} (chosen: {ch['tiles']} {ch['schedule']} q{ch['q_stages']}): "
          + ", ".join(f"{n} {us[n]:.1f} ({base / us[n]:.3f}x{'' if ok[n] else ' FAIL'})" for n in fns)
          + f"; SDPA {us['SDPA']:.1f} -> chosen {us['SDPA'] / base:.3f}x", flush=True)
