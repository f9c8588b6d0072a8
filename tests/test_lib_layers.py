"""lib/ in layers (issue 24, item 6): a module imports only from its own layer or the ones below,
and nothing inside lib/ imports in a circle. Every import counts, the ones inside functions too:
a lazy import still ties the two modules together."""
import ast
from pathlib import Path

LIB = Path(__file__).resolve().parent.parent / "lib"
# bottom to top: kernel plumbing, measurement, presentation, the main job
LAYERS = [
    {"__init__", "simulator", "inputs", "nvrtc", "tma", "reference", "fp8"},
    {"timing", "microbench", "sass", "results", "ncu"},
    {"plots_common", "plots_stage6", "plots_journey", "plots_early", "plots_backward", "plots", "shape_map", "hf",
     "hf_masks", "hf_models",
     "notebook_common", "notebook_sass", "notebook_stage34", "notebook_ideas", "notebook_journey",
     "notebook_backward", "notebook_fp8", "notebook_run", "prose", "prose_stage6", "prose_early",
     "notebook"},
    {"bench", "one_call"},
]


def lib_imports() -> dict[str, set[str]]:
    out = {}
    for path in sorted(LIB.glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("lib."):
                    deps.add(node.module.split(".")[1])
                elif node.module == "lib":
                    deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("lib."))
        out[path.stem] = deps - {path.stem}
    return out


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if module in layer)


def test_every_module_has_a_layer():
    assert set(lib_imports()) == set().union(*LAYERS)


def test_imports_only_go_down():
    up = [f"lib.{m} ({layer_of(m)}) imports lib.{d} ({layer_of(d)})"
          for m, deps in lib_imports().items() for d in deps if layer_of(d) > layer_of(m)]
    assert not up, "\n".join(up)


def test_no_import_cycle():
    graph = lib_imports()

    def cycle_from(start):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return path + [start]
                if nxt not in path:
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [" → ".join(c) for c in map(cycle_from, graph) if c]
    assert not cycles, "\n".join(cycles)


def test_presentation_is_split():
    """The plotting and notebook helpers in modules a reader can hold in mind: none over 600
    lines (lib/notebook.py was 1,900 and lib/plots.py 850 before they were split by topic)."""
    long = {p.name: n for pattern in ("notebook*.py", "plots*.py") for p in LIB.glob(pattern)
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


STAGES = LIB.parent / "stages"


def stage_imports() -> dict[str, set[str]]:
    """Module name -> the stages/ modules it imports (every import, lazy ones too)."""
    out = {}
    for path in sorted(STAGES.glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "stages":
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stages."):
                deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("stages."))
        out[path.stem] = deps - {path.stem}
    return out


def test_stages_import_only_stages_below_them():
    """A stage reads top to bottom without the ones above it (issue 49, item 2): stage N imports
    stage M only for M < N (stage 7 takes stage 6's planning, stage 8 its forward from stage 5),
    training is composed in stages/autograd.py, which no stage imports."""
    up = []
    for m, deps in stage_imports().items():
        for d in deps:
            if m.startswith("stage") and d.startswith("stage"):
                if int(d[5]) >= int(m[5]) and d[:6] != m[:6]:
                    up.append(f"stages/{m}.py imports stages/{d}.py")
            elif d == "autograd":
                up.append(f"stages/{m}.py imports stages/autograd.py (training is composed above the stages)")
    assert not up, up
    assert stage_imports()["autograd"] >= {"stage5", "stage6", "stage8"}

