"""Move a results file's source hashes to the form lib.results.stage_sha256 computes today,
without a GPU and without trusting anything unchecked. The file's "sha256_form" says which form
its hashes have:

    (absent)       whole files, comments included (raw_sha256 below): records until 2026-11-24;
    "code-only"    code_only_v1_sha256 below: comments and docstrings left out, but with ast's docstring
                   columns (UTF-8 bytes) used as character indices, so that a docstring whose
                   closing line holds a non-ASCII character ("·", "≈", "→") was cut past its end
                   and took the next line's newline and indentation with it (lib/fp8.py and
                   stages 0, 1, 6, 7, 8 had such docstrings): records until 2026-11-26;
    "code-only-2"  lib.results.code_only today (those columns turned into characters).

For every hash the file holds (each stage's own; every extra record's: a string for one stage,
STAGE_OF says which, or a {stage: hash} dict; and a pending re-record's), the stage's sources are
read as the record's commit had them (git show), the hash of the file's form is computed from them
and must equal the stored one; only then is the stored hash replaced by today's hash of those same
sources. A hash that does not check out (a record made from uncommitted sources, say) is left as it
was and listed. Then, for every hash, whether it matched the working tree's sources before (under
its old form) and after (under today's): a record fresh before must be fresh after. A file already
in today's form is refused. Run from the repository root:

    python experiments/rehash_records/rehash_records.py [results/<gpu>.json]      # prints what it did, writes the file
"""
import functools
import hashlib
import json
import subprocess
import sys
from unittest import mock
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import stages  # noqa: E402
from lib import results as R  # noqa: E402

CURRENT = "code-only-2"  # the form lib.results.stage_sha256 computes today
# Extra records whose sha256 is one string: the stage their writer hashed (grep stage_sha256 in
# scripts/). Extra records with a {stage: hash} dict say their stages themselves.
STAGE_OF = {"stage6": 6, "shape_map": 6, "shape_map_partial": 6,  # stage6_schedules.py, shape_map.py
            "fp8_bench": 7, "fp8_tiles": 7, "fp8_waterfall": 7}  # scripts/fp8_*.py: stage7.INFO


def raw_sha256(info, read) -> str:
    """The hash records carried before 2026-11-24 (whole files, comments included)."""
    h = hashlib.sha256()
    for rel in info.sources:
        h.update(rel.encode() + b"\0" + read(rel).encode() + b"\0")
    return h.hexdigest()


def code_only_v1_sha256(info, read) -> str:
    """lib.results.stage_sha256 as it was until 2026-11-26: the same code, with ast's docstring
    columns (UTF-8 byte offsets) used as character indices, the one thing that changed."""
    with mock.patch.object(R, "_char_col", lambda line, byte_col: byte_col):
        return R.stage_sha256(info, read)


FORMS = {None: raw_sha256, "code-only": code_only_v1_sha256, CURRENT: R.stage_sha256}


@functools.lru_cache(maxsize=None)
def shown(commit: str, rel: str) -> str:
    return subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=R.ROOT, capture_output=True,
                          check=True).stdout.decode()


def worktree(rel: str) -> str:
    return (R.ROOT / rel).read_text(encoding="utf-8")


def hashes(data: dict):
    """(label, the dict holding it, its key, stage number or None, commit or None) for every
    source hash in a results file."""
    env_commit = data["env"].get("commit")
    for n, st in data["stages"].items():
        yield f"stages.{n}", st, "sha256", int(n), st.get("commit", env_commit)
    for key, rec in data.items():
        if key in ("env", "stages", "runs", "pending_rerecord") or not isinstance(rec, dict) \
                or "sha256" not in rec:
            continue
        commit = (rec.get("env") or {}).get("commit")
        if isinstance(rec["sha256"], dict):
            for n in rec["sha256"]:
                yield f"{key}.{n}", rec["sha256"], n, int(n), commit
        else:
            yield key, rec, "sha256", STAGE_OF.get(key), commit
    for n, p in data.get("pending_rerecord", {}).items():
        # declared against the working tree: that is the commit's only when it was clean
        yield f"pending_rerecord.{n}", p, "sha256", int(n), p.get("declared_at")


def rehash(stored: str, n: int | None, commit: str | None, form) -> tuple[str, str]:
    """(new hash, what happened) for stage n's hash `stored` of form `form`, made at `commit`."""
    if n is None:
        return stored, "kept: which stage it hashes is unknown (add its key to STAGE_OF)"
    if not commit or commit.endswith("-dirty"):
        return stored, f"kept: made from uncommitted sources ({commit})"
    info = stages.get(n).INFO
    read = functools.partial(shown, commit)
    try:
        if FORMS[form](info, read) != stored:
            return stored, f"kept: the sources at {commit} do not give the stored hash"
        new = R.stage_sha256(info, read)
    except subprocess.CalledProcessError as e:
        return stored, f"kept: {e.stderr.decode().strip()[:120]}"
    return new, ("moved" if new != stored else "unchanged") + f" (sources at {commit})"


def main() -> int:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    data = R.load(path)
    path = Path(data.pop("_path"))
    form = data.get("sha256_form")
    if form == CURRENT:
        print(f"{path}: hashes are in the {CURRENT} form already; refusing to rehash them again")
        return 1
    if form not in FORMS:
        print(f"{path}: unknown sha256_form {form!r}")
        return 1
    rows, counts = [], {"moved": 0, "unchanged": 0, "kept": 0}
    for label, holder, key, n, commit in hashes(data):
        stored = holder[key]
        holder[key], what = rehash(stored, n, commit, form)
        counts[what.split()[0].rstrip(":")] += 1
        print(f"{label}: {what}")
        if n is not None:  # fresh: the stored hash is the working tree's, in the hash's own form
            info = stages.get(n).INFO
            rows.append((label, n, stored == FORMS[form](info, worktree),
                         holder[key] == R.stage_sha256(info, worktree)))
    data["sha256_form"] = CURRENT
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}: {counts['moved']} hashes moved, {counts['unchanged']} unchanged, "
          f"{counts['kept']} kept")
    print(f"\n| record | stage | fresh before ({form}) | fresh after ({CURRENT}) |\n|---|---|---|---|")
    for label, n, before, after in rows:
        print(f"| {label} | {n} | {'yes' if before else 'no'} | {'yes' if after else 'no'}"
              f"{'' if before == after else ' **changed**'} |")
    changed = [label for label, _, before, after in rows if before != after]
    if changed:
        print(f"freshness changed for {', '.join(changed)}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
