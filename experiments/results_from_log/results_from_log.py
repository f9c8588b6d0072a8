"""Rebuild results/<gpu>.json from the printed logs of a GPU session, when the JSON that the
session wrote did not come back (it happened on 2026-11-23: the device copy of the tree was
overwritten by the next command's sync before results/ was fetched; the logs, kept outside
the tree, survived). Only what the logs print goes in, at the precision printed; every value
that is derived rather than printed says so in a field next to it. Entries the logs do not
cover (the ceilings, the tile sweep of stages 4 and 5) are kept from the previous file with
their own provenance.

    python experiments/results_from_log/results_from_log.py results/logs/2026-11-23-c896d87 --commit c896d87 \\
        [--timeline results/logs/2026-11-23-c896d87/stage6_timeline.json]
"""
import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import stages  # noqa: E402
from lib import results as R  # noqa: E402
from lib.bench import STANDARD_SHAPES  # noqa: E402
from lib.reference import attention_flops  # noqa: E402

NUM = r"([\d,]+\.?\d*(?:e[-+]?\d+)?)"
PROGRESS = re.compile(rf"^\[stage (\d+)\] B(\d+) H(\d+) S(\d+) D(\d+) (\w+) (full|causal): (?:skipped, (.*)|"
                      rf"{NUM} µs \({NUM} TFLOPS\), {NUM}x SDPA(?:, host {NUM} µs/call \(SDPA {NUM}\))?, (pass|FAIL))")
TABLE = re.compile(rf"^\| (\d+) \| B(\d+) H(\d+) S(\d+) D(\d+) \| (\w+) \| (yes|no) \| {NUM} \| [^|]+ \| [^|]+ \| "
                   rf"{NUM}×(†?) \| {NUM}×(†?) \| ([\d.e+-]+) \| (pass|\*\*FAIL\*\*) \|$")
HOST = re.compile(rf"^\| (\d+) \| B(\d+) H(\d+) S(\d+) D(\d+) \| (\w+) \| (yes|no) \| {NUM} \| {NUM} \| {NUM} \| {NUM} \|$")
OWN = re.compile(rf"^† stage (\d+), B(\d+) H(\d+) S(\d+) D(\d+) (\w+) (full|causal): its own SDPA (default|flash) time, {NUM} µs")
S6_SHAPE = re.compile(rf"^B(\d+) H(\d+) S(\d+) D(\d+) (\w+) (full|causal): SDPA default {NUM} µs .*FLASH {NUM} µs")
S6_ROW = re.compile(rf"^  (\w+) +(.+?) +{NUM} µs +{NUM} TFLOPS +{NUM}× SDPA +{NUM}× FLASH (pass|FAIL)")


def f(x: str) -> float:
    return float(x.replace(",", ""))


def bench_rows(text: str) -> list[dict]:
    standard = {(B, H, S, D) for _, B, H, S, D in STANDARD_SHAPES}
    rows, by_key = [], {}
    for line in text.splitlines():
        m = PROGRESS.match(line)
        if not m:
            continue
        n, B, H, S, D = (int(x) for x in m.group(1, 2, 3, 4, 5))
        causal = m.group(7) == "causal"
        suite = "standard" if (B, H, S, D) in standard else "sweep"
        key = (n, B, H, S, D, m.group(6), causal, suite)
        if key in by_key:  # a shape that is both standard and in the sweep: the second is the sweep
            key = key[:-1] + ("sweep",)
            suite = "sweep"
        r = {"stage": n, "suite": suite, "B": B, "H": H, "Sq": S, "Sk": S, "D": D, "dtype": m.group(6),
             "causal": causal}
        if m.group(8):
            r["skipped"] = m.group(8)
        else:
            us = f(m.group(9))
            r.update(us=us, tflops=f(m.group(10)), passed=m.group(14) == "pass",
                     sdpa_ratio_printed=f(m.group(11)),
                     # the row's own SDPA time, from its printed ratio (two or three digits)
                     sdpa_us=us * f(m.group(11)), sdpa_us_from="the row's printed ratio")
            if m.group(12):
                r.update(host_us=f(m.group(12)), sdpa_host_us=f(m.group(13)))
        by_key[key] = r
        rows.append(r)
    # The standard rows' table: the ratios against the run's median SDPA time per shape (three
    # digits) give that median; a † row's own time is printed below the table.
    index = {(r["stage"], r["B"], r["H"], r["Sq"], r["D"], r["dtype"], r["causal"]): r
             for r in rows if r["suite"] == "standard"}
    for line in text.splitlines():
        if m := TABLE.match(line):
            k = (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                 m.group(6), m.group(7) == "yes")
            r = index.get(k)
            if r and "skipped" not in r:
                r.update(max_abs_err=float(m.group(13)),
                         sdpa_us=r["us"] * f(m.group(9)), sdpa_flash_us=r["us"] * f(m.group(11)),
                         sdpa_us_from="the run's median SDPA time at this shape (the printed table's ratio)")
        elif m := HOST.match(line):
            k = (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                 m.group(6), m.group(7) == "yes")
            if k in index:
                index[k].update(host_us=f(m.group(8)), host_gpu_us=f(m.group(9)),
                                sdpa_host_us=f(m.group(10)), sdpa_host_gpu_us=f(m.group(11)))
        elif m := OWN.match(line):
            k = (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                 m.group(6), m.group(7) == "causal")
            if k in index:
                index[k]["sdpa_own_us" if m.group(8) == "default" else "sdpa_flash_own_us"] = f(m.group(9))
    for r in rows:
        if "us" in r:
            fl = attention_flops(r["B"], r["H"], r["Sq"], r["Sk"], r["D"], r["causal"])
            r["sdpa_tflops"] = fl / r["sdpa_us"] / 1e6
            if "sdpa_flash_us" in r:
                r["sdpa_flash_tflops"] = fl / r["sdpa_flash_us"] / 1e6
    return rows


def stage6_rows(text: str) -> list[dict]:
    rows, shape = [], None
    for line in text.splitlines():
        if m := S6_SHAPE.match(line):
            shape = dict(B=int(m.group(1)), H=int(m.group(2)), S=int(m.group(3)), D=int(m.group(4)),
                         dtype=m.group(5), causal=m.group(6) == "causal", sdpa_us=f(m.group(7)),
                         sdpa_flash_us=f(m.group(8)))
        elif (m := S6_ROW.match(line)) and shape:
            import stages.stage6 as s6
            kind, label = m.group(1), m.group(2)
            rows.append({"kind": kind, "variant": label, **shape, "us": f(m.group(3)), "tflops": f(m.group(4)),
                         "passed": m.group(7) == "pass",
                         "default": kind == "schedule" and label == s6.default_schedule(shape["D"])})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("logs", type=Path, help="folder with bench.log, stage6.log, versions.txt, nvidia-smi.txt")
    ap.add_argument("--commit", required=True, help="the commit the session measured (FA_GIT_COMMIT)")
    ap.add_argument("--timeline", type=Path, help="stage6_timeline.json to store with the stage 6 rows")
    ap.add_argument("--previous", type=Path, help="the previous results file (default: the current one)")
    a = ap.parse_args()
    old = R.load(a.previous) if a.previous else (R.load() or {})
    smi = (a.logs / "nvidia-smi.txt").read_text()
    versions = (a.logs / "versions.txt").read_text().split()
    date = re.search(r"^\w{3} (\w{3}) +(\d+) (\d\d:\d\d):\d\d (\d{4})", smi, re.M)
    months = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()
    env = {"gpu": re.search(r"\|\s+\d+\s+(NVIDIA [^|]+?)\s+(?:On|Off)\s+\|", smi).group(1),
           "sm_count": 132 if "H100" in smi else None, "compute_capability": "9.0",
           "driver": re.search(r"Driver Version: ([\d.]+)", smi).group(1),
           "cuda": re.search(r"CUDA Version: ([\d.]+)", smi).group(1),
           "torch": versions[versions.index("torch") + 1], "numpy": versions[versions.index("numpy") + 1],
           "numba_cuda": versions[versions.index("numba-cuda") + 1],
           "nvrtc": old.get("env", {}).get("nvrtc", "13.0"),
           "commit": a.commit,
           "date": f"{date.group(4)}-{months.index(date.group(1)) + 1:02d}-{int(date.group(2)):02d} "
                   f"{date.group(3)} UTC",
           "recorded_from": f"the printed logs of scripts/gpu_session.sh ({a.logs.as_posix()}), rebuilt by "
                            "experiments/results_from_log/results_from_log.py: the JSON the session wrote was lost before it "
                            "was fetched. Not printed by the run, carried from the previous record of the "
                            "same GPU model and image: nvrtc, cuda_core, python, sm_count, memory_GiB, l2_MiB."}
    if old.get("env", {}).get("gpu") == env["gpu"]:
        for key in ("nvrtc", "cuda_core", "python", "sm_count", "memory_GiB", "l2_MiB"):
            if key in old["env"]:
                env[key] = old["env"][key]
    mods = stages.all_stages()
    data = {"env": env,
            "stages": {str(m.INFO.number): {**R.stage_entry(m.INFO), "commit": a.commit} for m in mods},
            "runs": bench_rows((a.logs / "bench.log").read_text())}
    # Not printed by the run: kept from the previous record, with where they come from.
    if old.get("ceilings"):
        data["ceilings"] = {**old["ceilings"], "recorded_at": old["env"].get("commit"),
                            "note": "from the previous record; this run's ceilings were not printed"}
    if old.get("tiles"):
        data["tiles"] = old["tiles"]
    s6 = {"env": env, "sha256": R.stage_sha256(stages.get(6).INFO),
          "rows": stage6_rows((a.logs / "stage6.log").read_text())}
    if a.timeline:
        tl = json.loads(a.timeline.read_text())
        s6["timeline"] = {**tl, "source": tl.get("source", a.timeline.as_posix())}
    data["stage6"] = s6
    path = R.results_path(env["gpu"])
    path.write_text(json.dumps(data, indent=1))
    n = sum(1 for r in data["runs"] if "us" in r)
    print(f"{path}: {len(data['runs'])} rows ({n} timed), {len(s6['rows'])} stage 6 rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
