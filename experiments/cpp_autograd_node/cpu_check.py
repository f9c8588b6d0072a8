"""What of the C++ node can be checked without a GPU (a CPU build of torch, no libcuda): that
node.cpp builds and imports; that its tensor-map parameters are lib/tma.tensor_map's (the
dimensions, byte strides and box cuda.core hands cuTensorMapEncodeTiled, in the driver's order);
that a launch's argument words hold the scalars' bits; that attach() makes the output's grad_fn
the node with edges to q, k and v; and that its backward (no driver here, and an empty plan)
raises a clear error instead of crashing. The first build takes about a minute on two cores (then cached).

    python3 experiments/cpp_autograd_node/cpu_check.py
"""
import gc
import struct
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.cpp_autograd_node import attention as A  # noqa: E402


def tma_rule(t: torch.Tensor, rows: int):
    """lib/tma.tensor_map's parameters as cuda.core's _from_tiled passes them to the driver:
    strides of size-1 dimensions replaced by 8·(numel + 1) elements, the last stride 1, a uint16
    view; dimensions, boxes reversed (innermost first); byte strides of all but the innermost."""
    strides = [st if n > 1 else 8 * (t.numel() + 1) for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    shape, box = list(t.shape), [1, 1, rows, 64]
    byte_strides = [s * 2 for s in strides]
    return (shape[::-1], [byte_strides[2 - i] for i in range(3)], box[::-1], [1, 1, 1, 1])


def main():
    started = time.perf_counter()
    ext = A.extension()
    print(f"extension: {'built/loaded' if ext else 'FAILED'} in {A.BUILD['seconds']:.2f} s "
          f"(torch {torch.__version__}){'' if ext else ': ' + str(A.BUILD['error'])}")
    if ext is None:
        sys.exit(1)
    print(f"node pointer type: {ext.node_pointer()}; driver: {ext.driver_problem() or 'loaded'}")
    failures = 0

    # tensor-map parameters, several layouts
    layouts = {
        "contiguous B2 H4 S130 D64": torch.empty(2, 4, 130, 64, dtype=torch.bfloat16),
        "contiguous B1 H8 S512 D128": torch.empty(1, 8, 512, 128, dtype=torch.float16),
        "[B, S, H, D] transposed B2 H4 S130 D64": torch.empty(2, 130, 4, 64, dtype=torch.bfloat16).transpose(1, 2),
        "size-1 batch and head B1 H1 S200 D128": torch.empty(1, 1, 200, 128, dtype=torch.bfloat16),
    }
    for name, t in layouts.items():
        got = tuple(list(x) for x in ext.map_params(t, 64))
        want = tuple(list(x) for x in tma_rule(t, 64))
        ok = got == want
        failures += not ok
        print(f"  map params {name}: {'ok' if ok else f'DIFFER: {got} vs {want}'}")

    # argument words: the scalars' bits, slots left for the call
    plan = ext.Plan()
    K, S = ext.KINDS, ext.SLOTS
    args = [(K["slot"], S["dout"]), (K["map"], 0)] + A._scalars((np.int32(-7), np.int64(1 << 40), np.float32(0.125)))
    plan.add_launch("test", 0, [3], [256], 0, args)
    words = plan.words(0)
    want = [0, 0, struct.unpack("<I", struct.pack("<i", -7))[0], 1 << 40, struct.unpack("<I", struct.pack("<f", 0.125))[0]]
    ok = words == want
    failures += not ok
    print(f"  argument words: {'ok' if ok else f'DIFFER: {words} vs {want}'}")

    # the autograd wiring, on CPU tensors
    q, k, v = (torch.randn(1, 2, 8, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        out = torch.empty_like(q)
    lse = torch.empty(1, 2, 8)
    ext.attach(out, q, k, v, lse, plan)
    fn = out.grad_fn
    nexts = [type(f).__name__ if f is not None else None for f, _ in fn.next_functions]
    ok = fn.name() == A.NODE_NAME and out.requires_grad and nexts == ["AccumulateGrad"] * 3 and all(
        f.variable is t for (f, _), t in zip(fn.next_functions, (q, k, v)))
    failures += not ok
    print(f"  attach: grad_fn {fn.name()}, next {nexts}: {'ok' if ok else 'WRONG'}")
    try:
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        print("  backward without a driver: DID NOT RAISE")
        failures += 1
    except RuntimeError as e:
        msg = str(e).splitlines()[0]
        ok = "cpp_autograd_node" in msg  # no driver here; with one, the plan (no launches) is refused
        failures += not ok
        print(f"  backward of an empty plan on CPU tensors raises: {msg[:160]}")
    # nothing kept alive: the node (and with it the saved lse) dies with the output
    with torch.no_grad():
        out2 = torch.empty_like(q)
    lse2 = torch.empty(1, 2, 8)
    ext.attach(out2, q, k, v, lse2, plan)
    gone = weakref.ref(lse2)
    del lse2, out2
    gc.collect()
    ok = gone() is None
    failures += not ok
    print(f"  the node and its saved tensors freed with the output: {'ok' if ok else 'NO (a reference cycle?)'}")
    print(f"{'PASS' if not failures else f'FAIL ({failures})'} in {time.perf_counter() - started:.1f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
