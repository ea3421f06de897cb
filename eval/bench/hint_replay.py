"""Replay hint banks against the target's own output: how much of a call the hints could draft, without timing.

A bench report (``ooospec bench ... --out X.json``) keeps every method's output tokens. This module replays the hint
drafter's suffix matching over the ``ar`` output of each request (the target's greedy text) with the bank of one
hint source, as if every hint proposal were verified in full:

    i = 0
    while i < len(output):
        n, candidates = bank.lookup(output[:i])        # the longest suffix (7 down to 1) found in the views
        a = max(common prefix of c and output[i:] for c in candidates)
        i += a + 1                                     # a accepted hint tokens + the target's own next token

So it measures the views and the suffix matching alone (how far a hint source COULD carry the target), apart from
the tree policy and the forward costs that decide how much of it a real run verifies; ``ooospec bench`` reports what
a run got. Sources, per request:

* ``oracle``: the call the target wrote (parsed from the ``ar`` text, the ceiling of any sidecar);
* ``gold``: the dataset's call (from the ``ooospec-gold`` rows' ``hints.call``);
* ``real``: the sidecar's call (from the ``ooospec`` rows' ``hints.call``), where that run had one.

The replay starts at the first output token with no prompt before it (a run also matches the prompt's last tokens,
so its first step can differ). Usage::

    python -m ooospec.eval.bench.hint_replay eval/reports/cpu/engine/hints_ceiling_05b_epyc/*.json \\
        [--views format,compact,spaced,pretty,arguments] [--out replay.md]
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ooospec.reporting import md_table
from ooospec.runtime.drafters.hints import HintBank, render_views, tokenize_views
from ooospec.runtime.methods import BASELINE, GOLD, HINT_SOURCES, ORACLE, SIDECAR, hint_method
from ooospec.runtime.tokens import common_prefix_len

logger = logging.getLogger(__name__)

SOURCES = tuple(h.label for h in HINT_SOURCES.values())     # oracle, gold, real (the sidecar's)
MATCH_BUCKETS = ((1, 1), (2, 3), (4, 7))      # suffix lengths reported together


@dataclass
class Replay:
    """One request's replay (see the module docstring)."""

    output_tokens: int
    steps: int = 0
    proposals: list[tuple[int, int]] = field(default_factory=list)    # (suffix length n, tokens accepted)

    @property
    def accepted(self) -> int:
        return sum(a for _, a in self.proposals)


def replay(output: Sequence[int], bank: HintBank | None, max_len: int = 16, max_candidates: int = 3) -> Replay:
    """Walk ``output`` as the drafter would see it, every proposal verified in full (module docstring).

    ``replay([5, 6, 7, 8], HintBank({"v": [5, 6, 7, 8]}))``: step 1 at i=0 has no suffix (no proposal), commits
    5; step 2 matches ``[5]`` and drafts ``[6, 7, 8]``, all accepted: 2 steps, one proposal ``(1, 3)``.
    """
    out = Replay(output_tokens=len(output))
    i = 0
    while i < len(output):
        out.steps += 1
        n, cands = bank.lookup(output[:i], max_len=max_len, max_candidates=max_candidates) if bank else (0, [])
        a = max((common_prefix_len(c, output[i:]) for c in cands), default=0)
        if cands:
            out.proposals.append((n, a))
        i += a + 1
    return out


def bank_of(calls: Sequence[Mapping], fmt, tokenizer, views: Sequence[str] | None) -> HintBank | None:
    """The bank of ``calls`` with only the named views (all of :func:`render_views` when None); None for no call."""
    if not calls:
        return None
    texts: dict[str, str] = {}
    for i, call in enumerate(calls):
        for name, text in render_views(call, fmt).items():
            if views is None or name in views:
                texts[name if i == 0 else f"{name}#{i}"] = text
    return HintBank(tokenize_views(texts, tokenizer))


def source_calls(rows: Mapping[str, Mapping], fmt, tokenizer) -> dict[str, list[dict] | None]:
    """``{source: calls or None (the report has no such rows)}`` for one request's rows ``{method: row}``."""
    ar = rows[BASELINE]
    out: dict[str, list[dict] | None] = {
        HINT_SOURCES[ORACLE].label: fmt.parse_calls(tokenizer.decode(ar["tokens"], skip_special_tokens=False))}
    for source in (GOLD, SIDECAR):
        hints = (rows.get(hint_method(source)) or {}).get("hints")
        out[HINT_SOURCES[source].label] = None if hints is None else ([hints["call"]] if hints.get("call") else [])
    return out


@dataclass
class Summary:
    """Replays of one (benchmark, source, view set)."""

    requests: int = 0
    with_call: int = 0                 # requests whose source had a call
    output_tokens: int = 0
    steps: int = 0
    accepted: int = 0
    by_match: dict[int, list[int]] = field(default_factory=lambda: {b: [0, 0, 0] for b in range(len(MATCH_BUCKETS))})

    def add(self, r: Replay, has_call: bool) -> None:
        self.requests += 1
        self.with_call += has_call
        self.output_tokens += r.output_tokens
        self.steps += r.steps
        self.accepted += r.accepted
        for n, a in r.proposals:
            b = next(i for i, (lo, hi) in enumerate(MATCH_BUCKETS) if lo <= n <= hi)
            cell = self.by_match[b]
            cell[0] += 1                # proposals
            cell[1] += a > 0            # first token accepted
            cell[2] += a                # tokens accepted

    def row(self) -> dict:
        per = {}
        for b, (lo, hi) in enumerate(MATCH_BUCKETS):
            n, first, acc = self.by_match[b]
            per[f"{lo}-{hi}" if lo != hi else str(lo)] = {"proposals": n,
                                                         "first_token_rate": first / n if n else None,
                                                         "tokens_per_proposal": acc / n if n else None}
        return {"requests": self.requests, "with_call": self.with_call,
                "accepted_per_request": self.accepted / self.requests if self.requests else 0.0,
                "tokens_per_step": self.output_tokens / self.steps if self.steps else 1.0, "by_match": per}


def load_rows(path: Path) -> tuple[dict, dict[str, dict[str, dict]]]:
    """``(config, {example id: {method: row}})`` of one bench report; ids in the report's order."""
    report = json.loads(Path(path).read_text())
    if not isinstance(report, dict) or "examples" not in report or "config" not in report:
        raise ValueError(f"{path}: not a bench report (no 'config' / 'examples'; write one with ooospec bench --out)")
    by_id: dict[str, dict[str, dict]] = {}
    for row in report["examples"]:
        by_id.setdefault(row["id"], {})[row["method"]] = row
    return report["config"], by_id


def replay_report(path: Path, tokenizer, fmt, view_sets: Mapping[str, Sequence[str] | None],
                  progress: Callable | None = None) -> dict[str, dict[str, dict]]:
    """``{view set: {source: Summary.row()}}`` over the requests of one report that have an ``ar`` row."""
    _, by_id = load_rows(path)
    sums = {vs: {s: Summary() for s in SOURCES} for vs in view_sets}
    items = [rows for rows in by_id.values() if BASELINE in rows]
    for rows in (progress(items) if progress else items):
        calls = source_calls(rows, fmt, tokenizer)
        for vs, views in view_sets.items():
            for source, cs in calls.items():
                if cs is None:
                    continue
                sums[vs][source].add(replay(rows[BASELINE]["tokens"], bank_of(cs, fmt, tokenizer, views)), bool(cs))
    return {vs: {s: m.row() for s, m in per.items() if m.requests} for vs, per in sums.items()}


def to_markdown(results: Mapping[str, Mapping[str, Mapping[str, dict]]], command: str) -> str:
    """One table: per benchmark and view set, each source's accepted hint tokens per request and tokens per step."""
    rows = []
    for bench, per_views in results.items():
        for vs, per_source in per_views.items():
            for source, row in per_source.items():
                rates = " / ".join("-" if c["first_token_rate"] is None else f"{c['first_token_rate']:.2f}"
                                   for c in row["by_match"].values())
                rows.append([f"`{bench}`", vs, source, f"{row['requests']} ({row['with_call']})",
                             f"{row['accepted_per_request']:.1f}", f"{row['tokens_per_step']:.2f}", rates])
    table = md_table(["benchmark", "views", "source", "requests (with a call)", "hint tokens per request",
                      "tokens per step", "first-token rate by suffix length 1 / 2-3 / 4-7"], rows,
                     align="lllrrrl")
    return f"Hint replay (no timing; every proposal verified in full). Regenerate: `{command}`\n\n{table}\n"


BASE_VIEWS = ("format", "compact", "spaced", "pretty", "arguments")     # the views before pretty_inline and mixed


def main(argv: list[str] | None = None) -> int:
    import shlex
    import sys

    from tqdm import tqdm

    from ooospec.runtime.backends.models import gguf_path_of, gguf_tokenizer
    from ooospec.runtime.formats import get_format

    p = argparse.ArgumentParser(prog="python -m ooospec.eval.bench.hint_replay", description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="+", type=Path, help=f"bench JSON reports with {BASELINE!r} rows")
    p.add_argument("--views", default=None,
                   help="comma-separated view names to compare against all views (default: the base set "
                        + ",".join(BASE_VIEWS) + ")")
    p.add_argument("--out", type=Path, help="write the markdown table (and a .json beside it)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    subset = tuple(args.views.split(",")) if args.views else BASE_VIEWS
    view_sets = {"subset": subset, "all": None}
    results: dict[str, dict] = {}
    tokenizers: dict[str, object] = {}
    for path in args.reports:
        config, _ = load_rows(path)
        target = config["target"]
        if target not in tokenizers:
            tokenizers[target] = gguf_tokenizer(gguf_path_of(target))
        fmt = get_format(config["format"])
        name = f"{config['dataset']} ({target})"
        results[name] = replay_report(path, tokenizers[target], fmt, view_sets,
                                      progress=lambda it, n=name: tqdm(it, desc=n, leave=False))
    command = "python -m ooospec.eval.bench.hint_replay " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    md = to_markdown(results, command).replace("| subset |", f"| {','.join(subset)} |")
    print(md)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
