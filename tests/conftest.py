"""Plain `pytest` picks the mode itself: real kernels on a GPU, numba's simulator and offline
compilation without one (tiny shapes, fast)."""
import random

import pytest

import lib  # noqa: F401  (decides the mode before numba is imported)
from lib.simulator import HAS_GPU

gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
cpu_only = pytest.mark.skipif(HAS_GPU, reason="CPU-mode behaviour")


def pytest_report_header(config):
    from lib.simulator import banner
    return banner()


def runs_here(mod) -> bool:
    """Whether a stage module runs on this machine: numba stages everywhere (the simulator
    without a GPU); CUDA C++ stages on a GPU of their compute capability (an arch-specific
    one, sm_90a, on exactly that one)."""
    if mod.INFO.backend == "numba":
        return True
    if not HAS_GPU:
        return False
    import torch
    cc = torch.cuda.get_device_capability()
    return cc == mod.INFO.min_cc if mod.INFO.extra.get("arch", "").endswith("a") else cc >= mod.INFO.min_cc


@pytest.fixture
def seed():
    """A fresh seed per test, printed on failure so a case can be replayed."""
    return random.SystemRandom().randrange(2**31)


def assert_matches_reference(attention, dtypes, shapes, D, seed, label, **kwargs):
    """`attention(q, k, v, causal=…, **kwargs)` against the reference for every dtype, every
    (B, H, Sq, Sk) in `shapes` and both masks, on fresh inputs from `seed`, with NaN-poisoned
    outputs (an element the kernel never writes fails). `label` names the case on failure."""
    from lib.inputs import make_qkv, poisoned_outputs
    from lib.reference import check_output
    for dtype in dtypes:
        for B, H, Sq, Sk in shapes:
            for causal in (False, True):
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, dtype=dtype, seed=seed)
                with poisoned_outputs():
                    out = attention(q, k, v, causal=causal, **kwargs)
                c = check_output(out, q, k, v, causal=causal)
                assert c.passed, (f"{label} {dtype} {(B, H, Sq, Sk, D)} causal={causal} "
                                  f"seed {seed}: {c.summary()}")


def assert_graph_replays(call, qkv, new_inputs, *, causal, label):
    """`call(q, k, v)` captured into a CUDA graph (compiled and planned first on the stream that
    captures, outside the capture), then replayed on each set of `new_inputs` copied into the
    static q, k, v: every replay's output, NaN-poisoned before it, against the reference."""
    import math

    import torch

    from lib.reference import check_output
    q, k, v = qkv
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(q, k, v)
    for i, new in enumerate(new_inputs):
        for t, x in zip((q, k, v), new):
            t.copy_(x)
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        c = check_output(out, q, k, v, causal=causal)
        assert c.passed, f"{label}, replay {i}: {c.summary()}"
