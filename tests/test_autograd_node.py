"""Stage 8's backward as a C++ autograd node (stages/autograd_node.py, stages/stage8_node.cpp),
the default backward of stages.autograd.attention(..., forward=6) on an H100/H200.

Without a GPU: which path each call takes (the node, or the Python autograd.Function as before;
FA_AUTOGRAD_NODE=0; the Python Function when the extension does not build), and the extension
itself compiled with the host's g++ and checked where no driver is needed (its tensor-map
parameters, argument words, the autograd wiring, no reference cycle, a clear error without
libcuda). On an sm_90 GPU: gradients through the node against float64 autograd at odd shapes and
layouts, the same dK and dV bits as the Python Function, a fresh thread, a side stream,
retain_graph."""
import gc
import os
import shutil
import struct
import sys
import warnings
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import gpu
from lib.inputs import make_qkv
from stages import autograd, autograd_node, stage6, stage8

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
hopper = pytest.mark.skipif(not HOPPER, reason="the node runs on an sm_90 GPU (H100/H200)")


def _toolchain() -> str | None:
    """Why the extension cannot be built here (None: it can)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "no C++ compiler (g++) on PATH"
    try:
        from torch.utils.cpp_extension import is_ninja_available
    except Exception as e:  # noqa: BLE001
        return f"torch.utils.cpp_extension does not import: {e}"
    if not is_ninja_available():
        return "ninja is not available (pip install ninja)"
    return None


NO_TOOLCHAIN = _toolchain()
needs_toolchain = pytest.mark.skipif(NO_TOOLCHAIN is not None, reason=f"builds stages/stage8_node.cpp: {NO_TOOLCHAIN}")


# --------------------------------------------------------------------------------------------
# Routing, on the CPU: CPU tensors dressed up as an sm_90 device's, the GPU's parts faked.

class _OnGpu(torch.Tensor):
    """A CPU tensor that says it is on cuda:0, for the node's checks (nothing is launched)."""

    @property
    def is_cuda(self):
        return True

    @property
    def device(self):
        return torch.device("cuda", 0)


def _inputs(D=64, dtype=torch.bfloat16, Sq=20, Sk=30, grad=True):
    q, k, v = make_qkv(1, 4, Sq, D, Sk=Sk, Hkv=2, dtype=dtype, device="cpu")
    return [t.as_subclass(_OnGpu).requires_grad_(grad) for t in (q, k, v)]


@pytest.fixture
def fresh_node(monkeypatch):
    """The module with empty caches, an sm_90 device 0 and an extension that must not be built
    (replace `_load` to allow it); restored after the test."""
    monkeypatch.delenv("FA_AUTOGRAD_NODE", raising=False)
    for name in ("_plans", "REASONS", "_kernels"):
        monkeypatch.setattr(autograd_node, name, {})
    monkeypatch.setattr(autograd_node, "BUILD", {"seconds": None, "error": None})
    monkeypatch.setattr(autograd_node, "_extension", None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(stage8, "wgmma_here", lambda: True)

    def no_build():
        raise AssertionError("the extension was built for an input the node cannot take")
    monkeypatch.setattr(autograd_node, "_load", no_build)
    return autograd_node


@pytest.mark.parametrize("case,reason", [
    (dict(dtype=torch.float32), "float16 or all bfloat16"),
    (dict(D=96), "head dim 96"),
    (dict(D=256), "head dim 256"),
])
def test_what_the_node_does_not_take_goes_to_the_python_function(fresh_node, case, reason):
    """Inputs the node cannot take: the Python Function, with the reason, before the extension
    is built (a wrong call never costs the 30-s build)."""
    q, k, v = _inputs(**case)
    r = fresh_node.route(q, k, v)
    assert r.startswith("python: ") and reason in r, r
    assert fresh_node.attention(q, k, v, False, None) is None


def test_other_gpus_and_cpu_tensors_go_to_the_python_function(fresh_node, monkeypatch):
    q, k, v = _inputs()
    monkeypatch.setattr(stage8, "wgmma_here", lambda: False)
    assert "compute capability 9.0" in fresh_node.route(q, k, v)
    plain = [t.as_subclass(torch.Tensor) for t in (q, k, v)]  # CPU tensors
    assert "CUDA" in fresh_node.route(*plain)
    assert fresh_node.route(q, k, torch.zeros(3)).startswith("python: ")
    assert fresh_node.route("q", k, v).startswith("python: ")  # not a tensor: the stages' own error later


def test_the_switch_forces_the_python_function(fresh_node, monkeypatch):
    q, k, v = _inputs()
    monkeypatch.setenv("FA_AUTOGRAD_NODE", "0")
    monkeypatch.setattr(autograd_node, "_plan", lambda *a: pytest.fail("planned with FA_AUTOGRAD_NODE=0"))
    assert fresh_node.route(q, k, v) == "python: FA_AUTOGRAD_NODE=0"
    assert fresh_node.attention(q, k, v, False, None) is None
    monkeypatch.setenv("FA_AUTOGRAD_NODE", "1")
    assert fresh_node.enabled()


def test_an_extension_that_does_not_build_warns_once_and_the_python_function_runs(fresh_node, monkeypatch):
    """A failed build (no g++, no ninja, ...): one warning naming why and the fallback, never an
    exception; later layouts fall back without trying again."""
    tries = []

    def fails():
        tries.append(1)
        raise RuntimeError("Ninja is required to load C++ extensions")
    monkeypatch.setattr(autograd_node, "_load", fails)
    q, k, v = _inputs()
    with pytest.warns(RuntimeWarning, match=r"did not build \(RuntimeError: Ninja is required.*Python autograd\.Function"):
        assert fresh_node.attention(q, k, v, False, None) is None
    assert "did not build" in fresh_node.route(q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q2, k2, v2 = _inputs(D=128)
        assert fresh_node.attention(q2, k2, v2, "top_left", 0.5) is None
    assert tries == [1]


def test_a_plan_attaches_the_node_and_a_misaligned_pointer_does_not(fresh_node, monkeypatch):
    """With a plan: stage 6's forward with lse, grad mode off, then attach(out, q, k, v, lse,
    plan); a pointer off 16 bytes takes the Python Function (stage 8 would refuse it)."""
    calls = []
    plan = object()
    monkeypatch.setattr(autograd_node, "_make_plan", lambda *a: plan)

    class Ext:
        @staticmethod
        def attach(*args):
            calls.append(("attach", args))

        @staticmethod
        def forward(*args):  # a plan without stage 6's forward in C++
            return None
    monkeypatch.setattr(autograd_node, "_extension", Ext)

    def forward(q, k, v, *, causal, scale, lse):
        calls.append(("forward", torch.is_grad_enabled(), causal, scale, tuple(lse.shape), lse.dtype))
        return torch.zeros(q.shape, dtype=q.dtype)
    monkeypatch.setattr(stage6, "attention", forward)
    q, k, v = _inputs()
    assert fresh_node.route(q, k, v) == "node"
    out = fresh_node.attention(q, k, v, "bottom_right", 0.25)
    assert calls[0] == ("forward", False, "bottom_right", 0.25, (1, 4, 20), torch.float32)
    assert torch.is_grad_enabled()
    name, (o, *saved, lse, p) = calls[1]
    assert name == "attach" and o is out and saved == [q, k, v] and p is plan and lse.shape == (1, 4, 20)
    base = torch.zeros(1 * 4 * 20 * 64 + 1, dtype=torch.bfloat16)
    odd = base[1:].view(1, 4, 20, 64).as_subclass(_OnGpu).requires_grad_()
    assert fresh_node.route(odd, k, v).startswith("python: a pointer not 16-byte aligned")
    assert fresh_node.attention(odd, k, v, False, None) is None


def test_a_plan_with_the_forward_launches_it_in_cpp_unless_switched_off(fresh_node, monkeypatch):
    """Where the plan holds stage 6's forward, forward(plan, q, k, v) makes the output (the node
    attached in C++) and stage 6's Python call does not run; FA_NODE_FORWARD=0, or the extension
    saying None (another stream), runs stage 6's Python call and attach as before."""
    plan, made, calls = object(), torch.zeros(1, 4, 20, 64), []
    monkeypatch.setattr(autograd_node, "_make_plan", lambda *a: plan)

    class Ext:
        answer = made

        @staticmethod
        def forward(p, q, k, v):
            calls.append(("cpp", p, q, k, v))
            return Ext.answer

        @staticmethod
        def attach(*args):
            calls.append(("attach",))
    monkeypatch.setattr(autograd_node, "_extension", Ext)
    monkeypatch.setattr(stage6, "attention", lambda q, k, v, **kw: calls.append(("python",)) or torch.zeros(q.shape))
    q, k, v = _inputs()
    assert fresh_node.attention(q, k, v, False, None) is made and calls == [("cpp", plan, q, k, v)]
    calls.clear()
    Ext.answer = None
    fresh_node.attention(q, k, v, False, None)
    assert [c[0] for c in calls] == ["cpp", "python", "attach"]
    calls.clear()
    monkeypatch.setenv("FA_NODE_FORWARD", "0")
    fresh_node.attention(q, k, v, False, None)
    assert [c[0] for c in calls] == ["python", "attach"]


def test_stages_autograd_routes_forward_6_without_options_to_the_node(monkeypatch):
    """stages.autograd.attention asks the node only for forward 6 with gradients wanted, no
    options and not deterministic, after SDPA's keywords and attn_mask are mapped; anything else,
    or the node saying None, is the Python Function exactly as before."""
    from torch.nn.attention.bias import causal_lower_right
    asked, python = [], []
    answer = {"out": None}

    def node(q, k, v, causal, scale):
        asked.append((causal, scale))
        return answer["out"]
    monkeypatch.setattr(autograd_node, "attention", node)
    monkeypatch.setattr(stage8, "with_grad", lambda fwd, q, k, v, *, causal, scale, deterministic:
                        python.append((causal, scale) + ((deterministic,) if deterministic else ())) or "py")
    monkeypatch.setattr(stage6, "attention", lambda *a, **kw: "stage6 alone")
    q, k, v = make_qkv(1, 2, 10, 64, Sk=12, dtype=torch.float16, device="cpu")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    assert autograd.attention(*leaves, forward=6, is_causal=True, scale=0.5) == "py"
    assert asked == [(True, 0.5)] and python == [(True, 0.5)]  # the node said None
    answer["out"] = "node"
    assert autograd.attention(*leaves, attn_mask=causal_lower_right(10, 12)) == "node"
    assert asked[-1] == ("bottom_right", None) and len(python) == 1
    asked.clear()
    assert autograd.attention(*leaves, forward=6, tiles=(128, 64)) == "py"  # stage 6's options
    assert autograd.attention(*leaves, forward=5) == "py"
    assert autograd.attention(*leaves, forward=6, deterministic=True) == "py"  # the Python Function's dQ pass
    assert python[-1] == (False, None, True)
    assert autograd.attention(q, k, v, forward=6) == "stage6 alone"  # no gradients wanted
    with torch.no_grad():
        assert autograd.attention(*leaves, forward=6) == "stage6 alone"
    assert asked == []


def test_the_build_goes_to_the_kernel_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FA_CACHE_DIR", str(tmp_path))
    d = autograd_node.build_directory()
    assert d.is_dir() and d.parent == tmp_path / "torch_extensions" and torch.__version__ in d.name


def test_a_killed_builds_lock_is_cleared_and_a_live_one_kept(tmp_path):
    """torch's load() waits forever on its folder's lock file: one older than any build (a build
    killed midway) is removed, a fresh one (a build running in another process) is not."""
    import time
    lock = tmp_path / "lock"
    lock.touch()
    autograd_node._clear_stale_lock(tmp_path)
    assert lock.exists()
    old = time.time() - autograd_node.STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    autograd_node._clear_stale_lock(tmp_path)
    assert not lock.exists()
    autograd_node._clear_stale_lock(tmp_path)  # no lock: nothing to do


def test_the_build_is_announced_as_compiles_are(monkeypatch, tmp_path, capsys):
    """One line to stderr (as lib.nvrtc's _compiling: FA_COMPILE_PROGRESS=1 forces it, 0 silences it)."""
    monkeypatch.setenv("FA_COMPILE_PROGRESS", "1")
    autograd_node._building(tmp_path)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "building stage 8's C++ autograd node (once" in err and str(tmp_path) in err
    monkeypatch.setenv("FA_COMPILE_PROGRESS", "0")
    autograd_node._building(tmp_path)
    assert capsys.readouterr().err == ""


def test_stage8s_sources_do_not_include_the_node():
    """The node is training plumbing beside stage 8, not part of its recorded sources (its hash)."""
    assert "stages/stage8_node.cpp" not in stage8.INFO.sources
    assert "stages/autograd_node.py" not in stage8.INFO.sources


# --------------------------------------------------------------------------------------------
# The extension, built with the host's compiler (about 30-60 s on two cores, once; then cached)

def _tma_rule(t: torch.Tensor, rows: int):
    """lib/tma.tensor_map's parameters as cuda.core's _from_tiled passes them to the driver:
    strides of size-1 dimensions replaced by 8·(numel + 1) elements, the last stride 1, a uint16
    view; dimensions, boxes reversed (innermost first); byte strides of all but the innermost."""
    strides = [st if n > 1 else 8 * (t.numel() + 1) for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    shape, box = list(t.shape), [1, 1, rows, 64]
    byte_strides = [s * 2 for s in strides]
    return (shape[::-1], [byte_strides[2 - i] for i in range(3)], box[::-1], [1, 1, 1, 1])


@needs_toolchain
def test_the_node_builds_and_is_wired_as_the_python_path_expects():
    ext = autograd_node.extension()
    assert ext is not None, autograd_node.BUILD["error"]
    assert ext.node_pointer() in ("std::shared_ptr", "c10::intrusive_ptr")
    # tensor-map parameters: lib/tma's rule, several layouts
    for t in (torch.empty(2, 4, 130, 64, dtype=torch.bfloat16), torch.empty(1, 8, 512, 128, dtype=torch.float16),
              torch.empty(2, 130, 4, 64, dtype=torch.bfloat16).transpose(1, 2),  # [B, S, H, D] storage
              torch.empty(1, 1, 200, 128, dtype=torch.bfloat16)):                # size-1 batch and head
        got = tuple(list(x) for x in ext.map_params(t, stage8.DQ_ROWS))
        assert got == tuple(list(x) for x in _tma_rule(t, stage8.DQ_ROWS)), (t.shape, t.stride())
    # argument words: the scalars' bits, slots and maps left for the call
    plan = ext.Plan()
    K, S = ext.KINDS, ext.SLOTS
    args = [(K["slot"], S["dout"]), (K["map"], 0)] + autograd_node._scalars(
        (np.int32(-7), np.int64(1 << 40), np.float32(0.125)), K)
    plan.add_launch("test", 0, [3], [256], 0, args)
    assert plan.words(0) == [0, 0, struct.unpack("<I", struct.pack("<i", -7))[0], 1 << 40,
                             struct.unpack("<I", struct.pack("<f", 0.125))[0]]
    with pytest.raises(TypeError, match="scalar argument of type float"):
        autograd_node._scalars((0.5,), K)
    # the autograd wiring, on CPU tensors: grad_fn the node, edges to q's, k's and v's leaves
    q, k, v = (torch.randn(1, 2, 8, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        out = torch.empty_like(q)
    ext.attach(out, q, k, v, torch.empty(1, 2, 8), plan)
    fn = out.grad_fn
    assert fn.name() == autograd_node.NODE_NAME and out.requires_grad
    assert [type(f).__name__ for f, _ in fn.next_functions] == ["AccumulateGrad"] * 3
    assert all(f.variable is t for (f, _), t in zip(fn.next_functions, (q, k, v)))
    # its backward here (no driver; or, on a GPU machine, a plan with no context): a clear error
    with pytest.raises(RuntimeError, match=r"stage 8's C\+\+ autograd node \(stages/stage8_node\.cpp\)"):
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    # nothing kept alive: the node and its saved tensors die with the output (no cycle through out)
    with torch.no_grad():
        out2 = torch.empty_like(q)
    lse2 = torch.empty(1, 2, 8)
    ext.attach(out2, q, k, v, lse2, plan)
    gone = weakref.ref(lse2)
    del lse2, out2
    gc.collect()
    assert gone() is None, "the node's saved lse outlived its output: a reference cycle?"


# --------------------------------------------------------------------------------------------
# On an H100/H200: the node's gradients

# (B, H, H_kv, Sq, Sk, D, causal, dtype, layout)
NODE_CASES = [
    (2, 4, 2, 130, 200, 64, False, torch.bfloat16, "bhsd"),
    (2, 4, 2, 130, 200, 128, "top_left", torch.float16, "bhsd"),
    (2, 4, 2, 200, 130, 64, "bottom_right", torch.bfloat16, "bhsd"),  # rows that see no key
    (1, 8, 1, 77, 300, 128, "bottom_right", torch.bfloat16, "bhsd"),  # MQA
    (2, 6, 2, 239, 61, 64, True, torch.float16, "bshd"),              # [B, S, H, D] views
    (1, 4, 4, 333, 333, 128, False, torch.bfloat16, "bshd"),
    (1, 8, 8, 512, 512, 64, False, torch.bfloat16, "bhsd"),           # the latency shape
]


def _node_and_python(monkeypatch, q, k, v, dout, **kw):
    """(out, grads, grad_fn name) through the node, then with FA_AUTOGRAD_NODE=0."""
    got = []
    for switch in ("1", "0"):
        monkeypatch.setenv("FA_AUTOGRAD_NODE", switch)
        out = autograd.attention(q, k, v, forward=6, **kw)
        got.append((out, torch.autograd.grad(out, (q, k, v), dout), out.grad_fn.name()))
    monkeypatch.delenv("FA_AUTOGRAD_NODE")
    return got


@gpu
@hopper
@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: "B{}-H{}/{}-Sq{}-Sk{}-D{}-{}-{}-{}".format(
    *c[:6], c[6], str(c[7])[6:], c[8]))
def test_node_gradients_match_reference_and_the_python_function(case, seed, monkeypatch):
    from lib.reference import check_gradients
    B, H, Hk, Sq, Sk, D, causal, dtype, layout = case
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, seed=seed)
    if layout == "bshd":  # [B, S, H, D] storage seen as [B, H, S, D], and a strided dO
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        dout = torch.randn(B, Sq, H, D, device="cuda", dtype=dtype).transpose(1, 2)
    else:
        dout = torch.randn(q.shape, device="cuda", dtype=dtype)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    assert autograd_node.route(*leaves, causal) == "node"
    (out, grads, name), (out_py, grads_py, name_py) = _node_and_python(monkeypatch, *leaves, dout, causal=causal)
    assert name == autograd_node.NODE_NAME and name_py != name
    label = f"{case} seed {seed}"
    # stage 6's forward launched in C++ (its output the same bits as stage 6's Python call's, below)
    reasons = {r for key, r in autograd_node.FORWARD_REASONS.items()
               if key[:6] == (leaves[0].shape, leaves[0].stride(), dtype, leaves[0].device, k.shape, leaves[1].stride())}
    assert reasons == {"C++"}, f"{label}: {reasons}"
    for n, c in check_gradients(grads, q, k, v, dout, causal=causal).items():
        assert c.passed, f"{label}: {n} {c.summary()}"
    assert torch.equal(out, out_py), label
    assert torch.equal(grads[1], grads_py[1]) and torch.equal(grads[2], grads_py[2]), f"{label}: dK/dV bits differ"


@gpu
@hopper
def test_node_on_a_side_stream_and_with_retain_graph(seed, monkeypatch):
    from lib.reference import check_gradients
    q, k, v = make_qkv(2, 4, 130, 64, Sk=200, Hkv=2, dtype=torch.bfloat16, seed=seed)
    dout = torch.randn_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    ext = autograd_node.extension()
    with torch.cuda.stream(side):
        assert ext.current_stream(torch.cuda.current_device()) == side.cuda_stream
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        (out, grads, name), (_, grads_py, _) = _node_and_python(monkeypatch, *leaves, dout, causal=True)
    side.synchronize()
    assert name == autograd_node.NODE_NAME
    for n, c in check_gradients(grads, q, k, v, dout, causal=True).items():
        assert c.passed, f"side stream seed {seed}: {n} {c.summary()}"
    assert torch.equal(grads[1], grads_py[1]) and torch.equal(grads[2], grads_py[2])
    # retain_graph: twice the same dK, dV; then the saved tensors are released
    out = autograd.attention(*leaves, forward=6)
    g1 = torch.autograd.grad(out, leaves, dout, retain_graph=True)
    g2 = torch.autograd.grad(out, leaves, dout)
    assert torch.equal(g1[1], g2[1]) and torch.equal(g1[2], g2[2])
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(out, leaves, dout)


@gpu
@hopper
def test_node_is_differentiable_once(seed):
    """create_graph=True: the gradients come back; differentiating them again raises, as the
    Python Function's once_differentiable does (never a silently missing term)."""
    q, k, v = make_qkv(1, 2, 40, 64, dtype=torch.float16, seed=seed)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = autograd.attention(*leaves, forward=6)
    assert out.grad_fn.name() == autograd_node.NODE_NAME
    dout = torch.randn_like(out).requires_grad_(True)
    (g,) = torch.autograd.grad(out, leaves[0], dout, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        g.sum().backward()


@gpu
@hopper
def test_bad_inputs_get_the_same_error_on_both_paths(monkeypatch):
    """A bad input is the stages' own error whichever path is on: the node takes no input its
    plan has not validated (the Python path's validation speaks)."""
    q, k, v = make_qkv(1, 2, 40, 64, dtype=torch.float16)
    base = torch.zeros(q.numel() + 1, dtype=q.dtype, device="cuda")
    odd = base[1:].view(q.shape).copy_(q)
    bad = {
        "non-finite scale": ((q, k, v), dict(scale=float("nan"))),
        "k of another dtype": ((q, k.bfloat16(), v), {}),
        "misaligned q": ((odd, k, v), {}),
        "mismatched head dim": ((q, k[..., :32].contiguous(), v), {}),
        "bad causal": ((q, k, v), dict(causal="sideways")),
    }
    for label, (tensors, kw) in bad.items():
        errors = []
        for switch in ("1", "0"):
            monkeypatch.setenv("FA_AUTOGRAD_NODE", switch)
            leaves = [t.detach().requires_grad_(True) for t in tensors]
            try:
                out = autograd.attention(*leaves, forward=6, **kw)
                out.backward(torch.randn_like(out))
                errors.append(None)
            except Exception as e:  # noqa: BLE001
                errors.append((type(e), str(e)))
        assert errors[0] == errors[1], f"{label}: {errors}"
        if label != "misaligned q":
            assert errors[0] is not None, label


@pytest.mark.parametrize("variant", [{"window": (8, 0)}, {"softcap": 30.0}, {"sinks": "tensor"}])
@pytest.mark.parametrize("packed", [False, True], ids=["batch", "varlen"])
def test_model_variants_with_gradients_go_to_the_python_function(variant, packed, monkeypatch):
    """Stage 6's window, softcap and sinks train through stage 8's Python Function (branch
    bwd-variants), never the C++ node, which takes the plain case only: with gradients wanted the
    node is not asked, and the variants reach the Function (checked before any launch, on the CPU)."""
    from stages import autograd, autograd_node, stage8
    q, k, v = (torch.randn(1, 2, 8, 64, requires_grad=True) for _ in range(3))
    if "sinks" in variant:
        variant = {"sinks": torch.zeros(2)}
    seen = []

    def no_node(*a, **kw):
        raise AssertionError("the C++ node was asked for a call with model variants")

    class Stop(Exception):
        pass

    def fake_with_grad(forward, q, k, v, **kw):
        seen.append(kw)
        raise Stop
    monkeypatch.setattr(autograd_node, "attention", no_node)
    monkeypatch.setattr(stage8, "with_grad", fake_with_grad)
    if packed:
        cu = torch.tensor([0, 8], dtype=torch.int32)
        calls = []

        def fake_apply(*args):
            calls.append(args)
            raise Stop
        monkeypatch.setattr(autograd, "validate_varlen", lambda *a, **kw: type("C", (), {"n_seqs": 1})())
        monkeypatch.setattr(autograd._PackedAttention, "apply", fake_apply)
        with pytest.raises(Stop):
            autograd.attention_varlen(*(t[0].transpose(0, 1) for t in (q, k, v)), cu, cu, 8, 8, **variant)
        sinks, variants = calls[0][3], calls[0][9]  # _PackedAttention.apply(q, k, v, sinks, ..., variants, deterministic)
        name = next(iter(variant))
        assert (sinks is variant["sinks"]) if name == "sinks" else variants[name] == variant[name]
    else:
        with pytest.raises(Stop):
            autograd.attention(q, k, v, causal=True, **variant)
        name = next(iter(variant))
        assert seen[0][name] is variant[name]
