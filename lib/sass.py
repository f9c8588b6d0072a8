"""What the hardware runs, read without a GPU: SASS from cuobjdump, its instruction mix,
and each kernel's registers, stack, local and shared memory.

CUDA C++ stages compile with NVRTC (lib.nvrtc). numba stages compile to PTX with numba's own
compiler (in a subprocess, since this process may hold numba's simulator instead) and PTX to
a cubin with cuda.core; both paths end in the same cubin tools.
"""
from __future__ import annotations

import collections
import gzip
import hashlib
import math
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    """Path of a CUDA binary utility (cuobjdump, nvdisasm): pip wheel, CUDA_HOME or PATH."""
    try:
        import cuda.pathfinder as pf
        p = pf.find_nvidia_binary_utility(name)
        if p:
            return p
    except Exception:
        pass
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for p in (Path(home) / "bin" / name, shutil.which(name)):
        if p and Path(p).exists():
            return str(p)
    raise RuntimeError(f"{name} not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "
                       "(both are project dependencies) or set CUDA_HOME")


def _cuobjdump(cubin: bytes, *flags) -> str:
    """cuobjdump's output for a cubin, kept beside the cubins (lib.nvrtc's cache) by the cubin's
    sha256, the flags and the tool: disassembling takes 0.4-1.3 s a build on a CPU, and the tests,
    the notebooks and lib.bench read the same builds many times over."""
    exe = Path(tool("cuobjdump"))
    tools = [(str(p), p.stat().st_size, p.stat().st_mtime_ns)
             for p in (exe, Path(tool("nvdisasm")))]
    key = hashlib.sha256(cubin + repr((flags, tools)).encode()).hexdigest()[:24]
    with _dump_lock:
        if key in _dumped:
            return _dumped[key]
    from lib.nvrtc import cache_dir
    path = cache_dir() / f"{key}.dump.gz"
    try:
        text = gzip.decompress(path.read_bytes()).decode()
    except (OSError, EOFError, ValueError):  # not there yet, or cut short: dump it again
        text = _run_cuobjdump(exe, cubin, flags)
        tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(gzip.compress(text.encode(), compresslevel=1))
        tmp.replace(path)  # atomic, as the cubins: a concurrent reader never sees half a file
    with _dump_lock:
        if len(_dumped) > 8:  # a listing can be megabytes: keep the last few only
            _dumped.pop(next(iter(_dumped)))
        _dumped[key] = text
    return text


_dumped: dict = {}
_dump_lock = threading.Lock()


def _run_cuobjdump(exe: Path, cubin: bytes, flags) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        env = dict(os.environ)
        env["PATH"] = str(Path(tool("nvdisasm")).parent) + os.pathsep + env.get("PATH", "")
        r = subprocess.run([str(exe), *flags, f.name], capture_output=True, text=True,
                           env=env)
    if r.returncode:
        raise RuntimeError(f"cuobjdump {' '.join(flags)} failed: {r.stderr.strip()}")
    return r.stdout


def sass_text(cubin: bytes) -> str:
    return _cuobjdump(cubin, "-sass")


_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)",
                    re.M)


def instruction_mix(sass: str, full: bool = False) -> collections.Counter:
    """Opcode counts of a SASS listing: 'HMMA', 'FFMA', 'LDG', ... (full=True keeps the
    modifiers: 'HMMA.16816.F32')."""
    return collections.Counter(m.group(1) + (m.group(2) if full else "")
                               for m in _INSTR.finditer(sass))


_RES = re.compile(r"Function ([^\s:]+):\s*\n\s*(.*)")


def resource_usage(cubin: bytes) -> dict:
    """{kernel: {'REG': n, 'STACK': bytes, 'SHARED': bytes, 'LOCAL': bytes, ...}}."""
    out = {}
    for name, fields in _RES.findall(_cuobjdump(cubin, "--dump-resource-usage")):
        out[name] = {k: int(v) for k, v in re.findall(r"([A-Z_\[\]0-9]+):(\d+)", fields)}
    return out


@dataclass
class Inspection:
    """One compiled kernel module as the hardware sees it."""

    arch: str
    resources: dict                   # per kernel, from cuobjdump
    mix: collections.Counter          # opcode counts over the whole cubin
    sass: str = field(repr=False)
    ptxas: dict = field(default_factory=dict)  # per kernel, from ptxas -v when available

    def table(self, top: int = 12) -> str:
        lines = [f"arch {self.arch}"]
        for k, r in self.resources.items():
            p = self.ptxas.get(k, {})
            spill = (f", spills {p['spill_stores']} B stored / {p['spill_loads']} B loaded"
                     if p else "")
            lines.append(f"{k}: {r.get('REG', 0)} registers, {r.get('SHARED', 0)} B shared "
                         "(static, plus what the system reserves per block), "
                         f"{r.get('STACK', 0)} B stack, {r.get('LOCAL', 0)} B local{spill}")
        total = sum(self.mix.values())
        lines.append(f"instruction mix ({total} SASS instructions):")
        for op, n in self.mix.most_common(top):
            lines.append(f"  {op:<8} {n:5d}  {100 * n / total:5.1f}%")
        return "\n".join(lines)


def inspect_cubin(cubin: bytes, arch: str, ptxas: dict | None = None) -> Inspection:
    sass = sass_text(cubin)
    return Inspection(arch, resource_usage(cubin), instruction_mix(sass), sass, ptxas or {})


# --------------------------------------------------------------------------------------------
# numba kernels

def numba_cubin(module: str, kernel: str, signature: str, cc=(9, 0)) -> bytes:
    """Compile `module.kernel` (a @cuda.jit kernel) for compute capability cc to a cubin,
    without a GPU. Runs numba's real compiler in a subprocess, since this process may have
    the simulator in place of numba.cuda."""
    code = (
        "import sys, json, importlib;"
        "from numba import cuda;"
        f"m = importlib.import_module({module!r});"
        f"ptx, _ = cuda.compile_ptx(getattr(m, {kernel!r}).py_func, {signature!r}, cc={tuple(cc)!r});"
        "sys.stdout.write(ptx)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", FA_NUMBA_COMPILE_ONLY="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    if r.returncode:
        raise RuntimeError(f"numba could not compile {module}.{kernel}:\n{r.stderr[-3000:]}")
    from cuda.core import Program, ProgramOptions
    arch = f"sm_{cc[0]}{cc[1]}"
    return Program(r.stdout, "ptx", ProgramOptions(arch=arch)).compile("cubin").code


def inspect_stage(n: int, arch: str = "sm_90a", dtype=None, head_dim: int = 64
                  ) -> dict[str, Inspection]:
    """Compile stage n for `arch` without a GPU and inspect every kernel module it has:
    {module name: Inspection}. numba stages list (kernel, signature) in
    INFO.extra['numba_kernels']; CUDA C++ stages provide compile_for(arch, dtype, head_dim)
    (dtype None: float16)."""
    import stages
    mod = stages.get(n)
    out = {}
    if mod.INFO.backend == "numba":
        cc = tuple(int(c) for c in re.match(r"sm_(\d)(\d+)", arch).groups())
        numba_arch = f"sm_{cc[0]}{cc[1]}"  # numba emits no arch-specific ('a') code
        for kernel, sig in mod.INFO.extra["numba_kernels"].items():
            ins = inspect_cubin(numba_cubin(mod.__name__, kernel, sig, cc), numba_arch)
            # keep the kernel (under its Python name), not numba's mangled name or the
            # runtime's helper routines
            ins.resources = {kernel: r for name, r in ins.resources.items() if kernel in name}
            out[kernel] = ins
    else:
        import torch
        for name, compiled in mod.compile_for(arch, dtype or torch.float16, head_dim).items():
            out[name] = inspect_cubin(compiled.cubin, arch, compiled.resource_usage())
    return out


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        description="Compile a stage offline and show what the hardware runs (registers, "
                    "spills, instruction mix), with the NVRTC this process loads. ptxas's "
                    "choices change between versions: to see what the H100 machine's NVRTC 13.0 "
                    "makes of a CUDA C++ stage, download that wheel (pip download "
                    "nvidia-cuda-nvrtc==13.0.88), unpack it, and run this with LD_PRELOAD set to "
                    "its nvidia/cu13/lib/libnvrtc.so.13 and LD_LIBRARY_PATH to that folder.")
    ap.add_argument("stage", type=int)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"],
                    help="CUDA C++ stages")
    ap.add_argument("--head-dim", type=int, default=64, choices=[64, 128],
                    help="CUDA C++ stages")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import torch
    result = inspect_stage(a.stage, a.arch, getattr(torch, a.dtype), a.head_dim)
    if a.json:
        print(json.dumps({k: {"arch": v.arch, "resources": v.resources, "mix": dict(v.mix)}
                          for k, v in result.items()}, indent=1))
    else:
        from lib.nvrtc import nvrtc_version
        print(f"NVRTC {nvrtc_version()}")
        for name, ins in result.items():
            print(f"== {name}\n{ins.table()}")


if __name__ == "__main__":
    main()


# --------------------------------------------------------------------------------------------
# one kernel's K/V loop, read from its SASS (the stage 5 notebook's per-tile counts)

_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)"
                   r"((?:\.[A-Z0-9_]+)*)([^;]*);", re.M)


def function_text(sass: str, kernel: str) -> str:
    """The part of a cuobjdump SASS listing that holds the kernel named `kernel`, or else the
    first whose name contains it (a module may hold several: "rate_f16" must not find
    "rate_f16x2" when both are there)."""
    parts = sass.split("Function : ")[1:]
    names = [p.split("\n", 1)[0].strip() for p in parts]
    body = next((p for p, n in zip(parts, names) if n == kernel), None)
    body = body or next((p for p, n in zip(parts, names) if kernel in n), None)
    if body is None:
        raise ValueError(f"no function named like {kernel!r} in the listing")
    return body


def listing(sass: str, kernel: str) -> list[dict]:
    """[{addr, pred, op, full, text}] of `kernel` (a substring of its name) in a SASS listing:
    address, whether predicated, opcode, opcode with modifiers, the instruction's text."""
    return [dict(addr=int(a, 16), pred=bool(p), op=op, full=op + mods, text=op + mods + rest)
            for a, p, op, mods, rest in _LINE.findall(function_text(sass, kernel))]


def branch_target(x: dict) -> int | None:
    """The address a BRA of `listing` jumps to (None for other instructions)."""
    m = re.search(r"0x([0-9a-f]+)\s*$", x["text"].strip())
    return int(m.group(1), 16) if m else None


def backward_branches(instrs: list[dict]) -> list[tuple[int, int]]:
    """(target, address) of each branch of a `listing` that jumps back: a loop over those
    addresses."""
    return [(branch_target(x), x["addr"]) for x in instrs if x["op"] == "BRA"
            and branch_target(x) is not None and branch_target(x) < x["addr"]]


def kv_loop(sass: str, kernel: str = "attention_fused") -> dict:
    """The K/V loop of a kernel: the smallest loop (backward branch) holding HMMA. Returns
    {'body', 'common', 'regions', 'mix'}: its instructions, those outside the regions that
    predicated forward branches skip on most tiles, the regions ('mask': the one with the
    FSELs that set masked scores to −∞), and the opcode Counter of the common path."""
    L = listing(sass, kernel)
    loops = [(a, b) for a, b in backward_branches(L)
             if any(y["op"] == "HMMA" and a <= y["addr"] <= b for y in L)]
    lo, hi = min(loops, key=lambda ab: ab[1] - ab[0])
    body = [x for x in L if lo <= x["addr"] <= hi]
    regions = {}
    for x in body:
        t = branch_target(x) if x["op"] == "BRA" else None
        if t is None or not x["pred"] or t <= x["addr"] or t > hi + 16:
            continue
        inside = [y for y in body if x["addr"] < y["addr"] < t]
        ops = collections.Counter(y["op"] for y in inside)
        if ops["FSEL"] and not ops["HMMA"] and ops["FSEL"] > sum(
                y["op"] == "FSEL" for y in regions.get("mask", [])):  # s = −∞ where masked
            regions["mask"] = inside
    skipped = {y["addr"] for r in regions.values() for y in r}
    common = [y for y in body if y["addr"] not in skipped]
    return dict(body=body, common=common, regions=regions,
                mix=collections.Counter(y["op"] for y in common))


def exp2_fixups(instrs: list[dict]) -> int:
    """Instructions of exp2f()'s range fix-up among `instrs` (of `listing`): the FSETP test for
    inputs below −126, the predicated FMUL by 0.5 before MUFU.EX2 and the predicated squaring
    after it. ex2.approx.ftz compiles to a bare MUFU.EX2, with none of them."""
    n = 0
    for y in instrs:
        t = y["text"]
        if y["op"] == "FSETP" and "-126" in t:
            n += 1
        elif y["op"] == "FMUL" and y["pred"]:
            regs = re.findall(r"R\d+", t)
            n += t.rstrip().endswith("0.5") or (len(regs) == 3 and regs[1] == regs[2])
    return n


# --------------------------------------------------------------------------------------------
# occupancy from registers and shared memory (the notebooks' predictions)

HOPPER_SM = {"registers": 65536, "threads": 2048, "blocks": 32, "smem": 228 * 1024,
             "smem_reserved_per_block": 1024}  # per SM, compute capability 9.0


def occupancy(registers: int, threads: int, smem_bytes: int, sm: dict = HOPPER_SM):
    """Blocks of `threads` threads that fit on one SM, with `registers` per thread and
    `smem_bytes` of shared memory per block: registers are allocated in steps of 8 per
    thread and 256 per warp, and the runtime reserves smem_reserved_per_block per block.
    Returns (blocks, the limit that binds, {limit: blocks it allows})."""
    regs = math.ceil(registers / 8) * 8
    regs_per_block = math.ceil(regs * 32 / 256) * 256 * threads // 32
    limits = {"registers": sm["registers"] // regs_per_block,
              "shared memory": sm["smem"] // (smem_bytes + sm["smem_reserved_per_block"]),
              "threads": sm["threads"] // threads, "blocks": sm["blocks"]}
    blocks = min(limits.values())
    return blocks, min(limits, key=limits.get), limits


def innermost_loops(sass: str, kernel: str) -> list[dict]:
    """The innermost loops of `kernel` (a substring of its name) in a SASS listing: for each
    backward branch that jumps over no other loop, {'start', 'end' (addresses), 'sass' (its
    lines), 'mix' (opcode Counter)}. A loop body runs once per iteration, so its mix is close to
    what the hardware executes; the whole-kernel mix counts each instruction once."""
    body = function_text(sass, kernel)
    lines = [ln for ln in body.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    loops = []
    for i, ln in enumerate(lines):
        m = re.search(r"\bBRA\b[^;]*?0x([0-9a-f]+)\s*;", ln)
        if m and int(m.group(1), 16) < addr[i]:
            loops.append((int(m.group(1), 16), addr[i]))
    inner = [(a, b) for a, b in loops
             if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    out = []
    for a, b in sorted(inner):
        text = "\n".join(ln for ln, x in zip(lines, addr) if a <= x <= b)
        out.append({"start": a, "end": b, "sass": text, "mix": instruction_mix(text)})
    return out
