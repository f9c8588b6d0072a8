"""Plain `pytest` picks the mode itself: real kernels on a GPU, numba's simulator and offline
compilation without one (tiny shapes, fast)."""
import os
import random
import threading
import time

import pytest

import lib  # noqa: F401  (decides the mode before numba is imported)
from lib.simulator import HAS_GPU

gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
cpu_only = pytest.mark.skipif(HAS_GPU, reason="CPU-mode behaviour")


def pytest_report_header(config):
    from lib.simulator import banner
    return banner()


# A first run compiles its kernels (lib.nvrtc: NVRTC, on the CPU, cached on disk by source and
# defines), which is most of what makes it slower than the next: said before the first test,
# counted after the last. FIRST_RUN: what the README's test command compiled with an empty cache
# and how long it took, first and again, on a 2-core machine without a GPU
# (docs/install-and-costs.md has the runs).
FIRST_RUN = {"builds": 230, "minutes": 7, "again": 4}
_cache = {}


def pytest_collection_finish(session):
    from lib import nvrtc
    d = nvrtc.cache_dir()
    _cache.update(dir=d, cubins=len(list(d.glob("*.cubin"))), t0=time.perf_counter())
    _start_compiling_ahead(session)
    if _cache["cubins"] == 0 and not HAS_GPU:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_line(f"The kernel cache ({d}) is empty: the whole suite compiles about "
                          f"{FIRST_RUN['builds']} CUDA kernels with NVRTC as it goes (a first run "
                          f"took {FIRST_RUN['minutes']} minutes on 2 CPU cores, a second one "
                          f"{FIRST_RUN['again']}); later runs reuse them.")


def pytest_terminal_summary(terminalreporter):
    from lib import nvrtc
    if not _cache or not _cache["dir"].is_dir():
        return
    new = len(list(_cache["dir"].glob("*.cubin"))) - _cache["cubins"]
    n, s = nvrtc.COMPILES["count"], nvrtc.COMPILES["seconds"]
    if new > 0:  # (a warm run's few compiles are the cache tests' own, in scratch caches)
        elapsed = time.perf_counter() - _cache["t0"]
        others = f", and {new - n} in notebooks and scripts" if new > n else ""
        terminalreporter.write_line(
            f"NVRTC compiled {n} kernels here ({s:.0f} s of compiling; the run took "
            f"{elapsed:.0f} s){others}; they are cached in {_cache['dir']} for the next run.")


# --------------------------------------------------------------------------------------------
# Which builds a run compiles. NVRTC and ptxas take 0.3-9 s of one CPU core per build, and the
# compile tests over every combination of a kernel's compile-time switches made the suite ask
# for 257 distinct builds: on a 2-core machine with an empty kernel cache the first run took 22
# minutes, the next 9 (9c19d2d, the machine shared). So without a GPU, a test over compile-time
# switches (head dim × dtype × schedule × each define ...) compiles a covering subset of its
# cases: every value of every switch in at least one build, plus the builds the stage ships
# (keep=). A value
# whose code breaks the compile, or the test's checks, still fails the CPU run; what the subset
# leaves out is two values meeting in one build. The full cross product runs where a GPU is
# present (HAS_GPU: the GPU session's pytest) and wherever FA_ALL_BUILDS=1 is set, e.g. after
# editing a kernel, before recording. Tests marked cpu_only (they read ptxas's log, which NVRTC
# on the H100 machine has handed back empty) never run on a GPU: their other builds compile and
# run there in the reference tests, and their ptxas/SASS checks take FA_ALL_BUILDS=1.
ALL_BUILDS = HAS_GPU or os.environ.get("FA_ALL_BUILDS", "0") not in ("", "0")
NOT_THIS_BUILD = ("CPU run: one build per switch value (tests/conftest.py, covering); "
                  "every build on a GPU or with FA_ALL_BUILDS=1")


def _leaves(value, path=()):
    """(path, value) for every scalar in a case, tuples, lists and dicts opened up: a case's
    switches and their values."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _leaves(v, path + (i,))
    else:
        yield path, value


def covering(cases, switches=None, keep=None) -> list[int]:
    """Indices of the cases a CPU run compiles: those `keep(case)` names, then, greedily, the
    case that adds most (switch, value) pairs not yet compiled (of equals the one whose values
    were compiled least, then the first), until every pair of any case is in one. `switches(case)`
    gives a case's pairs (default: its leaves, so a tuple (D, dtype, schedule) is three switches);
    cases a GPU or FA_ALL_BUILDS=1 run compiles in full."""
    cases = list(cases)
    if ALL_BUILDS:
        return list(range(len(cases)))
    pairs = [set(switches(c) if switches else _leaves(c)) for c in cases]
    chosen = [i for i, c in enumerate(cases) if keep and keep(c)]
    count: dict = {}
    for i in chosen:
        for p in pairs[i]:
            count[p] = count.get(p, 0) + 1
    while True:
        best = min(range(len(cases)), key=lambda i: (-len(pairs[i] - count.keys()),
                                                     sum(count.get(p, 0) for p in pairs[i]), i))
        if not pairs[best] - count.keys():
            return sorted(chosen)
        chosen.append(best)
        for p in pairs[best]:
            count[p] = count.get(p, 0) + 1


def compile_subset(cases, switches=None, keep=None) -> list:
    """The cases of a loop inside one test that this run compiles (covering)."""
    cases = list(cases)
    return [cases[i] for i in covering(cases, switches, keep)]


def compile_cases(argnames: str, cases, *, ids=None, switches=None, keep=None, build=None):
    """pytest.mark.parametrize over compile-time switches: every case is listed, those outside
    the covering subset skipped with the reason (NOT_THIS_BUILD). `switches` and `keep` take a
    case as parametrize passes it (one value, or a tuple for several argnames); `build`, called
    with the argnames as keywords, compiles a case's builds (prebuild)."""
    cases = list(cases)
    on = set(covering(cases, switches, keep))
    single = "," not in argnames
    params = [pytest.param(*((c,) if single else c),
                           marks=() if i in on else pytest.mark.skip(reason=NOT_THIS_BUILD))
              for i, c in enumerate(cases)]
    cases_mark = pytest.mark.parametrize(argnames, params, ids=ids)
    return cases_mark if build is None else lambda test: prebuild(build)(cases_mark(test))


# --------------------------------------------------------------------------------------------
# Compiling ahead. pytest runs tests on one core, and NVRTC and cuobjdump run without holding
# Python's lock: so on a machine without a GPU a second thread compiles and disassembles the
# builds of the tests marked prebuild, from the last such test backwards, while the first thread
# runs the tests in order. A test whose builds that thread has begun waits for them; one it has
# not reached yet compiles its own: the two meet in the middle, each having compiled part. Off
# with FA_PREBUILD=0, under pytest-xdist (its workers share the cores already) and with one core.
def prebuild(fn):
    """Mark a test whose builds fn(**its parameters) compiles: Compiled objects, or dicts or
    lists of them, which are disassembled too (lib.sass caches the listing)."""
    return pytest.mark.prebuild.with_args(fn)


_ahead: dict = {}  # nodeid -> {"state": pending | running | done | taken, "fn", "kw", "done"}
_ahead_lock = threading.Lock()
_ahead_stop = threading.Event()


def pytest_configure(config):
    config.addinivalue_line("markers", "prebuild(fn): the builds fn compiles, made ahead on a CPU")


def _start_compiling_ahead(session):
    if (HAS_GPU or session.config.option.collectonly or os.environ.get("FA_PREBUILD") == "0"
            or os.environ.get("PYTEST_XDIST_WORKER") or (os.cpu_count() or 1) < 2):
        return
    order = []
    for item in session.items:
        mark = item.get_closest_marker("prebuild")
        skipped = any(m.name == "skip" or (m.name == "skipif" and m.args and m.args[0] is True)
                      for m in item.iter_markers())
        if mark and not skipped:
            cs = getattr(item, "callspec", None)
            _ahead[item.nodeid] = {"state": "pending", "fn": mark.args[0],
                                   "kw": dict(cs.params) if cs else {}, "done": threading.Event()}
            order.append(item.nodeid)
    if order:
        # Imports first, here: two threads importing cuda.core at once can see it half made
        # ("cannot import name 'Program' from 'cuda.core.cu13'", seen with a test's first compile).
        from cuda.core import Program, ProgramOptions  # noqa: F401
        from lib import nvrtc, sass
        nvrtc.nvrtc_version(), nvrtc.include_dirs(), sass.tool("cuobjdump"), sass.tool("nvdisasm")
        notebooks = any(".ipynb" in item.nodeid for item in session.items)
        if notebooks:
            import lib.notebook  # noqa: F401  (imported here too, for the same reason)
        threading.Thread(target=_compile_ahead, args=(order, notebooks), daemon=True).start()


def _notebook_builds():
    """The offline compiles the notebooks make most of (their cells call these: stage 5's
    variants and tile choices, stage 4's tile choices, stage 6's schedules and model features;
    most of the kernels they compile), made on the second core once the tests' own builds are done, so that
    nbval, which runs the notebooks last and one at a time, finds them in the kernel cache."""
    import torch

    import stages.stage4 as s4
    import stages.stage5 as s5
    import stages.stage6 as s6
    from lib import notebook as nb
    yield nb.stage5_variant_sass
    yield lambda: nb.stage6_schedule_sass(s6.ARCH)
    for D in (64, 128):
        for t in s4.CHOICES:
            yield lambda D=D, t=t: nb.ptxas_of(s4, D, t)
        for t in (None, *s5.CHOICES):
            yield lambda D=D, t=t: s5.compile_for("sm_90a", torch.float16, D, t, True)
    # the model-features notebook (stage6c): each switch's MUFU count, and head dims 96 and 256
    for D in (64, 128):
        for kw in ({}, {"softcap": 1}, {"softcap": 2}, {"sinks": True}):
            yield lambda D=D, kw=kw: s6.compile_for(s6.ARCH, torch.bfloat16, D, **kw)
    for D in (96, 256):
        yield lambda D=D: s6.compile_for(s6.ARCH, torch.bfloat16, D)


def _compile_ahead(order, notebooks=False):
    from lib import nvrtc, sass
    for nodeid in reversed(order):
        job = _ahead[nodeid]
        with _ahead_lock:
            if job["state"] != "pending" or _ahead_stop.is_set():
                break  # the tests have come this far: the rest is theirs
            job["state"] = "running"
        try:
            todo = [job["fn"](**job["kw"])]
            while todo:
                x = todo.pop()
                if isinstance(x, nvrtc.Compiled):
                    sass.sass_text(x.cubin)
                elif isinstance(x, dict):
                    todo.extend(x.values())
                elif isinstance(x, (list, tuple)):
                    todo.extend(x)
        except Exception:  # the test compiles it again and reports what is wrong
            pass
        finally:
            job["state"] = "done"
            job["done"].set()
    for build in (_notebook_builds() if notebooks else ()):
        if _ahead_stop.is_set():
            return
        try:
            build()
        except Exception:  # the notebook compiles it again and shows what is wrong
            pass


@pytest.fixture(autouse=True)
def _compiled_ahead(request):
    job = _ahead.get(request.node.nodeid)
    if job is not None:
        with _ahead_lock:
            if job["state"] == "pending":
                job["state"] = "taken"  # not begun: this test compiles its own
        if job["state"] == "running":
            job["done"].wait()


def pytest_sessionfinish(session):
    _ahead_stop.set()


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


# `python3 <script> ...` as the tests that check a script's refusals run it, from an interpreter
# that has imported torch already: the import is 2 s of every start on a CPU (26 scripts' refusals
# took 70 s of a 9-minute run). A server process imports torch and numpy once and forks a child
# per script, which runs it as `python3` would (sys.argv, sys.path[0] the script's folder,
# __name__ "__main__", an uncaught exception printed with its traceback and exit status 1);
# lib, numba and the script's own imports are fresh in every child.
_SCRIPT_SERVER = r"""
import json, os, runpy, sys, traceback
import numpy, torch
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(req["cwd"])
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, req["out"]), (2, req["err"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            module = req["argv"][1] if req["argv"][0] == "-m" else None  # python3 -m MODULE ARGS
            sys.argv = req["argv"][1:] if module else req["argv"]
            sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(sys.argv[0]))
            try:
                if module:
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(sys.argv[0], run_name="__main__")
                code = 0
            except SystemExit as e:
                code = 0 if e.code is None else e.code
                if not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
            except BaseException:
                traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])), flush=True)
"""


class ScriptRun:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture(scope="session")
def run_script(tmp_path_factory):
    """run_script([script, *args], cwd=..., timeout=...) -> .returncode, .stdout, .stderr, as
    subprocess.run([sys.executable, script, *args]) gives them (see _SCRIPT_SERVER)."""
    import json
    import select
    import subprocess
    import sys
    server = subprocess.Popen([sys.executable, "-c", _SCRIPT_SERVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    d = tmp_path_factory.mktemp("scripts")

    def run(argv, *, cwd, timeout=120):
        out, err = d / "out", d / "err"
        server.stdin.write(json.dumps({"argv": [str(a) for a in argv], "cwd": str(cwd),
                                       "out": str(out), "err": str(err)}) + "\n")
        server.stdin.flush()
        if not select.select([server.stdout], [], [], timeout)[0]:
            server.kill()
            raise subprocess.TimeoutExpired(argv, timeout)
        return ScriptRun(json.loads(server.stdout.readline()), out.read_text(), err.read_text())

    yield run
    server.stdin.close()
    server.wait(timeout=30)


@pytest.fixture
def seed():
    """A fresh seed per test, printed on failure so a case can be replayed."""
    return random.SystemRandom().randrange(2**31)


def assert_no_local_memory(compiled, kernels, label=""):
    """No spills and no stack in `kernels` of a Compiled build, read from ptxas's report; where
    NVRTC handed back a good cubin with an empty log (seen on the H100 and the H200 under
    pytest-xdist, with the second core compiling ahead), from the cubin itself (cuobjdump):
    spilled registers live in local memory, so LOCAL and STACK must be 0. Returns the ptxas
    report ({} when it was empty)."""
    usage = compiled.resource_usage()
    if not usage:
        from lib.sass import resource_usage
        cub = resource_usage(compiled.cubin)
        for kern in kernels:
            assert kern in cub, (label, kern, sorted(cub))
            assert cub[kern]["LOCAL"] == 0 and cub[kern]["STACK"] == 0, (label, kern, cub[kern])
        return usage
    for kern in kernels:
        assert kern in usage, (label, kern, sorted(usage), compiled.log[-1500:])
        u = usage[kern]
        assert u["spill_stores"] == 0 and u["spill_loads"] == 0 and u["stack_bytes"] == 0, (label, kern, u)
    return usage


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


def captured(call):
    """call() captured in a CUDA graph after one run on the side stream that captures, outside the
    capture (compiles, plans and allocations happen there, as torch's docs ask): (graph, its output)."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out


def assert_graph_replays(call, qkv, new_inputs, *, causal, label):
    """`call(q, k, v)` captured into a CUDA graph (compiled and planned first on the stream that
    captures, outside the capture), then replayed on each set of `new_inputs` copied into the
    static q, k, v: every replay's output, NaN-poisoned before it, against the reference."""
    import math

    import torch

    from lib.reference import check_output
    q, k, v = qkv
    graph, out = captured(lambda: call(q, k, v))
    for i, new in enumerate(new_inputs):
        for t, x in zip((q, k, v), new):
            t.copy_(x)
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        c = check_output(out, q, k, v, causal=causal)
        assert c.passed, f"{label}, replay {i}: {c.summary()}"


def stub_stage6_launcher(monkeypatch, record_map):
    """Stage 6's launcher with its GPU parts stubbed, for CPU tests of what a call would launch:
    returns (launched, boxes, cfgs), filled as calls run: each launch's (kernel, config, params),
    each copy-engine map as record_map(tensor, rows) describes it (an e4m3 map as ("e4m3", shape,
    dtype, rows)), and each new plan's build config."""
    import stages.stage6 as s6
    from lib import inputs
    launched, boxes, cfgs = [], [], []
    monkeypatch.setattr(s6, "_plans", {})
    monkeypatch.setattr(s6, "_check_arch", lambda q: None)
    monkeypatch.setattr(s6, "_kernel", lambda dtype, D, cfg: cfgs.append(cfg) or ("kernel", "combine"))
    monkeypatch.setattr(s6, "_sm_count", lambda d: 132)
    monkeypatch.setattr(s6, "_queue", lambda plan, device: 0)
    monkeypatch.setattr(s6, "_partials", lambda plan, device: (1111, 2222, 0))
    monkeypatch.setattr(s6, "tensor_map", lambda t, rows: boxes.append(record_map(t, rows)) or object())
    monkeypatch.setattr(s6, "fp8_map", lambda t, rows: boxes.append(("e4m3", tuple(t.shape), t.dtype, rows)) or object())
    monkeypatch.setattr(s6, "validate_cached", lambda *a, **kw: inputs.validate(*a, **kw, check_device=False))
    monkeypatch.setattr(inputs, "check_machine", lambda info, q=None: None)
    monkeypatch.setattr(inputs, "check_devices", lambda info, *t: None)
    monkeypatch.setattr(s6.nvrtc, "launch_prepared", lambda kernel, config, params: launched.append((kernel, config, params)))
    return launched, boxes, cfgs


def assert_sass_as_source(now, source: str | None, D: int, dt: str, defines, what: str):
    """A stage 6 build `now` compiles to the SASS that stage 6's `source` (an older commit's
    stages/stage6.cu, `what` names it) compiles to with the same defines, byte for byte; skipped
    where git or that commit is not available."""
    import torch

    import stages.stage6 as s6
    from lib import nvrtc
    from lib.sass import sass_text
    if source is None:
        pytest.skip(f"git or {what} not available here")
    before = nvrtc.compile_cuda(source, arch=s6.ARCH, name="stage6.cu",
                                defines=nvrtc.stage_defines(getattr(torch, dt), D, dict(defines)))
    assert sass_text(now.cubin) == sass_text(before.cubin), f"D{D} {dt} {dict(defines)}"
