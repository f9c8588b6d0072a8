"""Session 34, call 8: with each work tile's start and end cheaper (f89a660) and three Q buffers,
do the short-prefill rows still under 0.95x SDPA (D64 causal S512-1024, D64 full S512) want other
tiles? 128-row blocks against 192-row ones, 64-key tiles against 128-key ones (less of the causal
diagonal computed and thrown away, more key tiles), a deeper ring; the work queue with and without
ping-pong for causal. Each against the launch as chosen today, SDPA's default beside them, in
interleaved rounds; every output checked against the float64 reference first."""
import statistics
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
from lib.timing import sdpa_call, time_interleaved

ROWS = [(32, 16, 512, 64, True), (16, 16, 1024, 64, True), (8, 16, 2048, 64, True), (32, 16, 512, 64, False),
        (16, 16, 1024, 64, False)]
CAUSAL = [((128, 2, 3), "work queue without ping-pong"), ((64, 4, 2), "work queue without ping-pong"),
          ((64, 4, 2), "+ work queue"), ((128, 3, 2), "work queue without ping-pong"), ((128, 2, 2), "+ work queue")]
FULL = [((128, 2, 2), "+ persistent blocks"), ((128, 3, 3), "+ persistent blocks"), ((64, 4, 2), "+ persistent blocks"),
        ((128, 4, 3), "+ persistent blocks")]
sms = torch.cuda.get_device_properties(0).multi_processor_count
gains = {}
for B, H, S, D, causal in ROWS:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    ch = s6.choose(B, H, H, S, S, D, causal, sms)
    fns = {"as chosen": lambda: s6.attention(q, k, v, causal=causal)}
    for tiles, sched in (CAUSAL if causal else FULL):
        qs = 3 if s6.fits(D, tiles, 3) else 2
        name = f"{tiles[0]}x{tiles[1]}x{tiles[2]} q{qs} {sched.replace('work queue without ping-pong', 'queue no pp')}"
        fns[name] = lambda tiles=tiles, sched=sched, qs=qs: s6.attention(q, k, v, causal=causal, tiles=tiles,
                                                                         schedule=sched, q_stages=qs)
    ok = {n: check_output(f(), q, k, v, causal=causal).passed for n, f in fns.items()}
    t = time_interleaved({**fns, "SDPA": sdpa_call(q, k, v, causal=causal)}, budget_s=0.4)
    us = {n: x.median_us for n, x in t.items()}
    base = us["as chosen"]
    print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} (chosen: {ch['tiles']} {ch['schedule']} q{ch['q_stages']}): "
          + ", ".join(f"{n} {us[n]:.1f} ({base / us[n]:.3f}x{'' if ok[n] else ' FAIL'})" for n in fns)
          + f"; SDPA {us['SDPA']:.1f} -> chosen {us['SDPA'] / base:.3f}x", flush=True)
    for n in fns:
        gains.setdefault(n, []).append(base / us[n])
