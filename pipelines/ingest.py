"""DVC stage ``ingest``: raw tool-calling datasets -> one record format, with every reject accounted for.

    python -m ooospec.pipelines.ingest data/ingest            # reads params.yaml: ingest
    ooospec ingest data/ingest --write-lock                   # re-pin the raw files after pointing at new data

1. Finds the raw files (``ingest.source``: a folder, or ``auto`` = ``$OOOSPEC_DATASETS`` / ``../shared/datasets``, else
   the download cache, else a download from the pinned commits; :mod:`ooospec.pipelines.sources.fetch`) and checks
   every raw file of the selected sources against the committed sha256 lock (``pipelines/sources.lock.json``);
   a missing or changed file stops the stage with the list of offending paths.
2. Runs each source parser (``pipelines/sources/<name>.py``), then each of your own sources
   (``ingest.user_sources``: call logs and JSON-lines conversations, Hugging Face datasets in the xlam, hermes,
   glaive or OpenAI chat layouts; :mod:`ooospec.pipelines.sources.user`), validates every record (tools are JSON
   Schema, gold calls validate against their tool), and writes ``records.jsonl`` and ``rejects.jsonl`` (both sorted
   by id), ``metrics/ingest.json`` (counts per source, split and reject reason) and the data card
   ``data_cards/ingest.md``.

A record that fails is never dropped silently: it goes to the rejects file with its reason and detail (a user
source's names the file and line, or the dataset row, and the field). With ``on_reject: fail`` any reject fails the
stage; with ``skip`` (default) the stage fails only when a source rejects more than ``max_reject_fraction`` of its
items (a parser that broke on new data should not pass quietly). A user source has its own ``on_reject`` and
``max_reject_fraction``. A stage that fails writes its rejects and metrics (to read why) but no ``records.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from ooospec.pipelines import sources as source_registry
from ooospec.pipelines.params import add_path_arguments, as_dict, load_section, module_main
from ooospec.pipelines.records import (
    Reject,
    sha256_file,
    validate_record,
    write_json,
    write_jsonl,
)
from ooospec.pipelines.sources import user as user_sources
from ooospec.pipelines.sources.user import SourceUnavailable, UserSource

LOCK_FILE = Path(__file__).with_name("sources.lock.json")


@dataclass(frozen=True)
class IngestParams:
    source: str = "auto"    # a folder holding <source>/raw/..., or auto: local folder, cache, else download
    mirror: str | None = None    # base URL of the download (default GitHub's raw files), laid out <owner>/<repo>/...
    sources: tuple[str, ...] = ("apibank", "toolalpaca", "bfcl", "sealtools", "glaive", "toolrl")
    on_reject: str = "skip"                      # skip | fail
    max_reject_fraction: float = 0.05            # per source, when on_reject == skip
    max_reject_fraction_by_source: dict = field(default_factory=dict)   # overrides, e.g. {toolalpaca: 0.12}
    user_sources: tuple[UserSource, ...] = ()    # your own data (pipelines/sources/user.py)

    def __post_init__(self):
        if self.on_reject not in ("skip", "fail"):
            raise ValueError(f"ingest.on_reject must be 'skip' or 'fail', got {self.on_reject!r}")
        unknown = sorted(set(self.sources) - set(source_registry.SOURCES))
        if unknown:
            raise ValueError(f"ingest.sources: unknown source(s) {unknown}; known: {sorted(source_registry.SOURCES)}")
        names = [u.name for u in self.user_sources]
        if len(set(names)) != len(names):
            raise ValueError(f"ingest.user_sources: names must be unique, got {names}")


class LockMismatch(RuntimeError):
    pass


# ---------------------------------------------------------------- sha256 lock

def raw_files(root: Path, name: str) -> list[Path]:
    folder = root / source_registry.SOURCES[name][1]
    return sorted(p for p in folder.rglob("*") if p.is_file())


def compute_lock(root: Path, names: list[str]) -> dict[str, str]:
    lock = {}
    for name in names:
        for p in raw_files(root, name):
            lock[p.relative_to(root).as_posix()] = sha256_file(p)
    return dict(sorted(lock.items()))


def check_lock(root: Path, names: list[str], lock: dict[str, str]) -> None:
    """Raise LockMismatch naming every missing, changed or unpinned file of the selected sources."""
    if not root.is_dir():
        raise LockMismatch(f"ingest.source {str(root)!r} is not a folder (expected <source>/raw/... below it)")
    prefixes = tuple(source_registry.SOURCES[n][1] + "/" for n in names)
    wanted = {k: v for k, v in lock.items() if k.startswith(prefixes)}
    found = compute_lock(root, names)
    missing = sorted(set(wanted) - set(found))
    changed = sorted(k for k in set(wanted) & set(found) if wanted[k] != found[k])
    unpinned = sorted(set(found) - set(wanted))
    if missing or changed or unpinned:
        lines = [f"raw data under {root} does not match {LOCK_FILE.name}:"]
        lines += [f"  missing:  {k}" for k in missing[:20]]
        lines += [f"  changed:  {k} (sha256 {found[k][:12]}… != locked {wanted[k][:12]}…)" for k in changed[:20]]
        lines += [f"  unpinned: {k}" for k in unpinned[:20]]
        lines.append("If you pointed ingest.source at your own checkout on purpose, re-pin it with "
                     "`ooospec ingest data/ingest --write-lock` and commit the lock.")
        raise LockMismatch("\n".join(lines))


# ---------------------------------------------------------------- the stage

def raw_root(params: IngestParams, names: list[str], lock: dict[str, str]) -> Path:
    """The folder to read (``ingest.source``, or ``auto`` resolved: :mod:`ooospec.pipelines.sources.fetch`)."""
    from ooospec.pipelines.sources.fetch import SourceError, resolve_source, selected
    from ooospec.runtime.paths import cache_dir

    files = selected(lock, (source_registry.SOURCES[n][1] for n in names))
    try:
        return resolve_source(params.source, files, cache=cache_dir() / "datasets", mirror=params.mirror)
    except SourceError as e:
        raise LockMismatch(str(e)) from None


def ingest_source(name: str, folder: Path) -> tuple[list[dict], list[dict], dict]:
    """Parse one built-in source's ``folder`` and validate every record: ``(records, rejects, stats)``."""
    mod = source_registry.load(name)
    return collect(name, mod.parse(folder), getattr(mod, "LICENSE", "?"), getattr(mod, "UPSTREAM", "?"))


def ingest_user_source(spec: UserSource) -> tuple[list[dict], list[dict], dict]:
    """:func:`ingest_source` for one of ``ingest.user_sources``; raises SourceUnavailable when it cannot be read."""
    records, rejects, stats = collect(spec.name, user_sources.parse(spec), spec.license, spec.upstream)
    stats["user"] = {"kind": spec.kind, "schema": spec.schema, "path": spec.path, "revision": spec.revision,
                     "heldout_fraction": spec.heldout_fraction}
    return records, rejects, stats


def collect(name: str, items, license_: str, upstream: str) -> tuple[list[dict], list[dict], dict]:
    """Validate what a parser yields: ``(records, rejects, stats)``, in parser order.

    A record that fails :func:`records.validate_record`, or repeats an id, becomes a reject with that reason.
    """
    records, rejects = [], []
    per_split: dict[str, Counter] = defaultdict(Counter)
    reasons: Counter = Counter()
    seen_ids: set[str] = set()
    for item in tqdm(items, desc=f"ingest {name}", unit="rec", leave=False):
        if isinstance(item, Reject):
            rej = item.to_json()
        else:
            bad = validate_record(item)
            if bad is None and item["id"] in seen_ids:
                bad = ("duplicate_id", f"id {item['id']!r} produced twice by the parser")
            if bad is None:
                seen_ids.add(item["id"])
                records.append(item)
                per_split[item["split"]]["parsed"] += 1
                continue
            rej = Reject(name, item.get("split", "?"), item.get("id", "?").split("/", 2)[-1],
                         bad[0], bad[1], raw=item).to_json()
        rejects.append(rej)
        per_split[rej["split"]]["rejected"] += 1
        per_split[rej["split"]][f"rejected:{rej['reason']}"] += 1
        reasons[rej["reason"]] += 1
    parsed = sum(c["parsed"] for c in per_split.values())
    rejected = sum(reasons.values())
    stats = {
        "parsed": parsed, "rejected": rejected, "reject_fraction": round(rejected / max(1, parsed + rejected), 4),
        "rejects_by_reason": dict(sorted(reasons.items())),
        "splits": {s: dict(sorted(c.items())) for s, c in sorted(per_split.items())},
        "license": license_, "upstream": upstream,
    }
    return records, rejects, stats


def reject_failure(params: IngestParams, name: str, rejected: int, frac: float) -> str | None:
    """Why a source's rejects fail the stage (``on_reject``, ``max_reject_fraction``; a user source's own), or None."""
    user = {u.name: u for u in params.user_sources}.get(name)
    on_reject = user.on_reject if user else params.on_reject
    limit = user.max_reject_fraction if user else params.max_reject_fraction_by_source.get(
        name, params.max_reject_fraction)
    if on_reject == "fail" and rejected:
        return f"{name}: {rejected} rejects (on_reject=fail)"
    if frac > limit:
        return f"{name}: reject fraction {frac:.1%} > max_reject_fraction {limit:.1%}"
    return None


def report(name: str, st: dict) -> None:
    parsed, rejected, reasons = st["parsed"], st["rejected"], st["rejects_by_reason"]
    frac = rejected / max(1, parsed + rejected)
    print(f"ingest {name:<11} parsed {parsed:>6}  rejected {rejected:>5} ({frac:.1%})"
          + (f"  {reasons}" if reasons else ""), file=sys.stderr)


def run(params: IngestParams, out_dir: Path, *, metrics_path: Path, card_path: Path | None,
        lock: dict[str, str] | None = None, check: bool = True) -> dict:
    names = list(params.sources)
    lock = json.loads(LOCK_FILE.read_text()) if lock is None else lock
    parsed_sources = []
    if names:
        root = raw_root(params, names, lock)
        if check:
            check_lock(root, names, lock)
        parsed_sources += [(name, lambda n=name: ingest_source(n, root / source_registry.SOURCES[n][1]))
                           for name in names]
    parsed_sources += [(u.name, lambda u=u: ingest_user_source(u)) for u in params.user_sources]

    records: list[dict] = []
    rejects: list[dict] = []
    stats: dict = {"sources": {}}
    failures = []
    for name, parse in parsed_sources:
        recs, rejs, st = parse()
        records += recs
        rejects += rejs
        stats["sources"][name] = st
        report(name, st)
        frac = st["rejected"] / max(1, st["parsed"] + st["rejected"])
        if (failure := reject_failure(params, name, st["rejected"], frac)) is not None:
            failures.append(failure)

    records.sort(key=lambda r: r["id"])
    rejects.sort(key=lambda r: (r["id"], r["reason"]))
    stats["total"] = {"records": len(records), "rejects": len(rejects)}
    stats["params"] = as_dict(params)
    out_dir = Path(out_dir)
    write_jsonl(out_dir / "rejects.jsonl", rejects)
    write_json(metrics_path, stats)
    if failures:    # no records file: a failed stage leaves nothing a later stage could take for its output
        (out_dir / "records.jsonl").unlink(missing_ok=True)
        raise SystemExit("ingest failed:\n  " + "\n  ".join(failures) + f"\n(see {out_dir / 'rejects.jsonl'})")
    write_jsonl(out_dir / "records.jsonl", records)
    if card_path is not None:
        from ooospec.pipelines.data_cards import ingest_card
        ingest_card(stats, card_path)
    return stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_path_arguments(p, {"out_dir": "folder for records.jsonl and rejects.jsonl"},
                       metrics="metrics/ingest.json", card="data_cards/ingest.md")
    p.add_argument("--write-lock", action="store_true",
                   help="re-pin the sha256 of every raw file of the selected sources, then stop")


def run_cli(args: argparse.Namespace) -> int:
    try:
        params = load_section(IngestParams, "ingest", args.params)
    except ValueError as e:
        print(f"error: {args.params}: {e}", file=sys.stderr)
        return 2
    if args.write_lock:
        if params.source == "auto":
            raise SystemExit("--write-lock pins the files of a folder you name: set ingest.source to it first")
        lock = compute_lock(Path(params.source), list(params.sources))
        LOCK_FILE.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
        print(f"pinned {len(lock)} files in {LOCK_FILE}")
        return 0
    try:
        run(params, args.out_dir, metrics_path=args.metrics, card_path=args.card)
    except (LockMismatch, SourceUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return module_main("ooospec.pipelines.ingest", __doc__, add_arguments, run_cli, argv)


if __name__ == "__main__":
    sys.exit(main())
