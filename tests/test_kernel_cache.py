"""The cubin cache (lib.nvrtc) must never hand back code compiled from an older header: its key
covers every local header a source reaches, however deeply included (issue 53). And a stage's
recorded sources (INFO.sources, hashed by the freshness test) must cover the same headers, so
that a record goes stale when any header it compiled from changes."""
import shutil
from pathlib import Path

import pytest

import stages
from lib import nvrtc

STAGES_DIR = nvrtc.ROOT / "stages"


def _scratch_stages(tmp_path: Path) -> Path:
    """A scratch copy of stages/ (its .cu and .cuh files), as a contributor's edited tree."""
    d = tmp_path / "stages"
    d.mkdir()
    for p in list(STAGES_DIR.glob("*.cu")) + list(STAGES_DIR.glob("*.cuh")):
        shutil.copy(p, d / p.name)
    return d


def test_headers_are_followed_through_other_headers():
    # stage6.cu names hopper.cuh, which names attention.cuh: both are reached
    names = [p.name for p in nvrtc.local_headers((STAGES_DIR / "stage6.cu").read_text())]
    assert {"hopper.cuh", "attention.cuh", "pdl.cuh", "work_queue.cuh"} <= set(names)
    assert names.index("hopper.cuh") < names.index("attention.cuh")  # in the order reached
    # stage7.cu reaches attention.cuh two levels down: fp8.cuh -> hopper.cuh -> attention.cuh
    names7 = {p.name for p in nvrtc.local_headers((STAGES_DIR / "stage7.cu").read_text())}
    assert {"fp8.cuh", "hopper.cuh", "attention.cuh"} <= names7
    # CUDA's own headers (<mma.h>, <cuda_fp8.h>) are not local and not followed
    assert all(p.parent == STAGES_DIR for p in nvrtc.local_headers(
        (STAGES_DIR / "stage7_quantize.cu").read_text()))


@pytest.mark.parametrize("source, nested", [("stage6.cu", "attention.cuh"),
                                            ("stage7.cu", "attention.cuh"),
                                            ("stage7.cu", "hopper.cuh"),
                                            ("stage8_wgmma.cu", "attention.cuh")])
def test_editing_a_nested_header_changes_the_key(tmp_path, source, nested):
    d = _scratch_stages(tmp_path)
    text = (d / source).read_text()
    assert f'#include "{nested}"' not in text  # reached only through another header
    key = lambda: nvrtc.cache_key(text, arch="sm_90a", defines={"HEAD_DIM": 64}, dirs=[d])  # noqa: E731
    before = key()
    assert before == key()  # the same tree gives the same key
    h = d / nested
    h.write_text(h.read_text() + "\n// an edit\n#define EDITED_BY_THE_TEST 1\n")
    assert key() != before
    # and a header no source reaches does not move the key
    after = key()
    (d / "unrelated.cuh").write_text("#define UNRELATED 1\n")
    assert key() == after


def test_compile_recompiles_after_a_nested_header_edit(tmp_path, monkeypatch):
    """End to end: a kernel includes outer.cuh, which includes inner.cuh; after an edit of
    inner.cuh compile_cuda must not serve the old cubin from its disk cache."""
    monkeypatch.setenv("FA_CACHE_DIR", str(tmp_path / "cache"))
    hdr = tmp_path / "headers"
    hdr.mkdir()
    monkeypatch.setattr(nvrtc, "HEADER_DIRS", (hdr,))
    (hdr / "outer.cuh").write_text('#pragma once\n#include "inner.cuh"\n')
    (hdr / "inner.cuh").write_text("#pragma once\n#define VALUE 1.5f\n")
    source = ('#include "outer.cuh"\n'
              'extern "C" __global__ void k(float* out) { out[threadIdx.x] = VALUE * threadIdx.x; }\n')
    first = nvrtc.compile_cuda(source, arch="sm_80", name="k.cu")
    again = nvrtc.compile_cuda(source, arch="sm_80", name="k.cu")
    assert again.key == first.key and again.cubin == first.cubin  # from the cache
    (hdr / "inner.cuh").write_text("#pragma once\n#define VALUE 2.5f\n")
    edited = nvrtc.compile_cuda(source, arch="sm_80", name="k.cu")
    assert edited.key != first.key
    assert edited.cubin != first.cubin  # compiled anew from the edited header


@pytest.mark.parametrize("number", [n for n in stages.NUMBERS + stages.BEYOND
                                    if stages.get(n).INFO.backend == "nvrtc"])
def test_recorded_sources_cover_every_header_compiled(number):
    """A stage's INFO.sources (what its record's sha256 covers) include every local header its
    .cu files reach, so editing any of them makes its record stale (tests/test_freshness.py)."""
    info = stages.get(number).INFO
    listed = set(info.sources)
    for rel in info.sources:
        if rel.endswith(".cu"):
            for h in nvrtc.local_headers((nvrtc.ROOT / rel).read_text()):
                rel_h = h.relative_to(nvrtc.ROOT).as_posix()
                assert rel_h in listed, f"stage {number}: {rel} reaches {rel_h}, not in INFO.sources"
