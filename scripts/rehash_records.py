"""Move a results file's source hashes to lib.results.stage_sha256's code-only form (comments,
docstrings and blank lines left out), without a GPU and without trusting anything unchecked: for
every hash the file holds (each stage's own, and those of the extra records: tiles, stage5_ideas,
stage6, shape_map), the sources are read as the record's commit had them (git show), the hash
records carried until then (whole files, raw_sha256 below) is computed from them and must
equal the stored one — only then is the stored hash replaced by the code-only hash of those same
sources. A hash that does not check out (a record made from uncommitted sources, say) is left as
it was and listed. Run from the repository root:

    python scripts/rehash_records.py [results/<gpu>.json]      # prints what it did, writes the file
"""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import stages  # noqa: E402
from lib import results as R  # noqa: E402

EXTRAS = {"stage6": (6,), "shape_map": (6,), "tiles": None, "stage5_ideas": None}  # None: a {stage: hash} dict


def raw_sha256(info, read) -> str:
    """The hash records carried before 2026-11-24 (whole files, comments included): used only to
    check that an earlier commit's sources are the ones a record was made from."""
    h = hashlib.sha256()
    for rel in info.sources:
        h.update(rel.encode() + b"\0" + read(rel).encode() + b"\0")
    return h.hexdigest()


def reader(commit: str):
    def read(rel: str) -> str:
        return subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=R.ROOT, capture_output=True,
                              text=True, check=True).stdout
    return read


def rehash(stored: str, n: int, commit: str) -> tuple[str, str]:
    """(new hash, what happened) for stage n's hash `stored` from a record made at `commit`."""
    info = stages.get(n).INFO
    try:
        read = reader(commit)
        if raw_sha256(info, read) != stored:
            return stored, f"kept: the sources at {commit} do not give the stored hash"
        return R.stage_sha256(info, read), f"code-only hash of the sources at {commit}"
    except subprocess.CalledProcessError as e:
        return stored, f"kept: {e.stderr.strip()[:120]}"


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    data = R.load(path)
    path = Path(data.pop("_path"))
    if data.get("sha256_form") == "code-only":
        print(f"{path}: hashes are code-only already")
        return 0
    for n, st in data["stages"].items():
        st["sha256"], what = rehash(st["sha256"], int(n), st.get("commit", data["env"]["commit"]))
        print(f"stages.{n}: {what}")
    for key, numbers in EXTRAS.items():
        rec = data.get(key)
        if not rec:
            continue
        commit = rec["env"]["commit"]
        if numbers:
            rec["sha256"], what = rehash(rec["sha256"], numbers[0], commit)
            print(f"{key}: {what}")
        else:
            for n in list(rec["sha256"]):
                rec["sha256"][n], what = rehash(rec["sha256"][n], int(n), commit)
                print(f"{key}.{n}: {what}")
    for n, p in data.get("pending_rerecord", {}).items():
        print(f"pending_rerecord.{n}: kept (declared against the working tree of its time)")
    data["sha256_form"] = "code-only"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
