"""generate() in a real model with each serving stage, against SDPA's (issue 22).

The tiny random Llama of lib.hf (GQA: 4 query heads, 2 K/V heads, head dim 64) generates 64 tokens
greedily for a batch of 4 prompts of 5, 37, 128 and 300 tokens, left-padded, with the static and
the dynamic cache, once with SDPA and once with each stage (lib.hf.compare_generate): the padded
batch reaches the stages as packed sequences (attention_varlen), the cache offset as bottom-right
causal. Each row says whether the tokens are SDPA's (but at SDPA's own near ties), the largest
logit error teacher-forced on SDPA's tokens against a float64 run, and the wall time per
generated token of both, in interleaved rounds (medians).

    python scripts/generate_record.py            # print the table
    python scripts/generate_record.py --record   # and store under "generate" in results/<gpu>.json
    python scripts/generate_record.py --models --record   # the models with stage 6's variants
        (tiny Mistral, Gemma 2 at head dims 64 and 256, Gemma 3, gpt-oss: lib.hf.tiny_model, random
        weights, no download; stage 6 against SDPA, or eager where transformers has no SDPA path),
        stored under "generate_models"
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import stages  # noqa: E402
from lib import hf  # noqa: E402
from lib import results as R  # noqa: E402

STAGES = (5, 6)  # the stages with packed sequences (INFO.varlen)
# --models: (kind, head dim) of lib.hf.tiny_model, through stage 6 (the one stage with the variants).
# Gemma 2's softcap is 1.0 (at its real 50 random weights never reach it, and the rows would not
# test it); the sliding windows are 8 keys, so that the prompts and the cache run past them.
MODELS = (("mistral", 64), ("gemma2", 64), ("gemma2", 256), ("gemma3", 128), ("gpt_oss", 64))
DTYPES = ("float16", "bfloat16")


def failing(rows: list[dict], label) -> list[dict]:
    """The rows whose tokens or logits failed, each printed with what failed."""
    bad = [r for r in rows if not (r["tokens_equal"] and r["logits_ok"])]
    for r in bad:
        print(f"{label(r)} {r['dtype']} {r['cache']}: tokens_equal {r['tokens_equal']}, "
              f"logits {r['max_logit_err']:.2e} against {r['bound']:.2e}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, nargs="+", default=list(STAGES))
    ap.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (median)")
    ap.add_argument("--record", action="store_true", help='store under "generate" in results/<gpu>.json')
    ap.add_argument("--models", action="store_true", help="the tiny Mistral, Gemma 2/3 and gpt-oss "
                    'through stage 6 instead, stored under "generate_models"')
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("generate_record.py times generate() on a GPU; none here")
        return 3
    if a.models:
        return models(a)
    names = hf.register(a.stages)
    env = R.capture_env()
    rows = []
    for dtype in a.dtype:
        res = hf.compare_generate(names, dtype=getattr(torch, dtype), device="cuda", rounds=a.rounds)
        print(hf.generate_table(res), flush=True)
        for r in res:
            rows.append({**r.as_row(), "stage": int(r.stage.removeprefix(hf.PREFIX))})
    bad = failing(rows, lambda r: f"stage {r['stage']}")
    if a.record:
        path = R.save_extra(env["gpu"], "generate", {
            "env": env, "sha256": {str(n): R.stage_sha256(stages.get(n).INFO) for n in a.stages},
            "model": "lib.hf.tiny_llama: hidden 256, 4 heads / 2 K/V heads, head dim 64, 2 layers",
            "prompts": [5, 37, 128, 300], "new_tokens": 64, "rounds": a.rounds, "rows": rows})
        print(f"recorded in {path}" + (" (with failing rows)" if bad else ""))
    return 1 if bad else 0


def models(a) -> int:
    """generate() in the tiny models with the variants (MODELS), stage 6 against the baseline."""
    (name,) = hf.register([6])
    env = R.capture_env()
    rows = []
    for kind, head_dim in MODELS:
        for dtype in a.dtype:
            model = hf.tiny_model(kind, getattr(torch, dtype), "cuda", head_dim=head_dim, softcap=1.0)
            res = hf.compare_generate([name], dtype=getattr(torch, dtype), device="cuda", rounds=a.rounds,
                                      model=model)
            print(f"{kind} D{head_dim}\n" + hf.generate_table(res), flush=True)
            rows += [{**r.as_row(), "stage": 6, "model": kind, "head_dim": head_dim,
                      "baseline": hf.baseline(model)} for r in res]
            del model
    bad = failing(rows, lambda r: f"{r['model']} D{r['head_dim']}")
    if a.record:
        path = R.save_extra(env["gpu"], "generate_models", {
            "env": env, "sha256": {"6": R.stage_sha256(stages.get(6).INFO)},
            "model": "lib.hf.tiny_model(kind, head_dim=..., softcap=1.0): hidden 256, 4 heads / 2 K/V "
                     "heads, 2 layers, sliding windows of 8 keys, random weights",
            "prompts": [5, 37, 128, 300], "new_tokens": 64, "rounds": a.rounds, "rows": rows})
        print(f"recorded in {path}" + (" (with failing rows)" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
