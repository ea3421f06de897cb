"""Issue 22, pipeline half: every reader of record JSONL rejects a bad line naming ``file:line`` and the field,
and normalize checks the teacher's calls with the bounded schema path (a backtracking pattern or a ``$ref``
cycle rejects the trace instead of hanging or crashing the stage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ooospec.eval.agent import replay as agent_replay
from ooospec.eval.bench import data as bench_data
from ooospec.pipelines import dedupe, eval_sidecar, expand_slots, normalize, teacher
from ooospec.pipelines import records as R

FIXTURE = Path(__file__).parents[1] / "fixtures" / "train_records.jsonl"
GOOD = json.loads(FIXTURE.read_text().splitlines()[0])
USER = [{"role": "user", "content": "Check this string."}]

# name -> (the bad record, a word of the message that names the field)
BAD = {
    "missing_messages": ({k: v for k, v in GOOD.items() if k != "messages"}, "'messages'"),
    "integer_id": ({**GOOD, "id": 7}, "id:"),
    "string_messages": ({**GOOD, "messages": "hi"}, "messages:"),
    "empty_messages": ({**GOOD, "messages": []}, "messages:"),
    "message_without_content": ({**GOOD, "messages": [{"role": "user"}]}, "messages[0].content"),
    "tools_not_a_list": ({**GOOD, "tools": {"f": 1}}, "tools:"),
    "not_json": ('{"id": "x", "messages": [', "not valid JSON"),
}


def _write(path: Path, bad) -> Path:
    """A good record on line 1, a blank line 2, the bad one on line 3."""
    line = bad if isinstance(bad, str) else json.dumps(bad)
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n")
    return path


def _readers(tmp_path: Path) -> dict:
    """Every stage / command entry that reads a records file, called on ``path`` (default params: fail)."""
    return {
        "dedupe": lambda p: dedupe.run(dedupe.DedupeParams(), p, tmp_path / "dd", metrics_path=tmp_path / "d.json",
                                       cards_dir=None, ingest_metrics=None),
        "teacher": lambda p: teacher.run(teacher.TeacherParams(), p, tmp_path / "t.jsonl", metrics_path=None),
        "normalize": lambda p: normalize.run(normalize.NormalizeParams(), p, _traces(tmp_path, [GOOD]),
                                             tmp_path / "n.jsonl", tmp_path / "nr.jsonl", metrics_path=None,
                                             card_path=None),
        "expand_slots": lambda p: expand_slots.run(expand_slots.ExpandSlotsParams(), p, tmp_path / "a.jsonl",
                                                   tmp_path / "b.jsonl", None, None),
        "bench": lambda p: bench_data.load_examples(p),
        "agent_bench": lambda p: agent_replay.load_dialogues(p),
    }


def _traces(tmp_path: Path, records: list[dict], calls: list[list[dict]] | None = None) -> Path:
    """Hermes traces of ``calls`` (default: each record's gold calls)."""
    path = tmp_path / "traces.jsonl"
    rows = [{"id": r["id"], "backend": "gold", "model": "gold", "format": "hermes",
             "text": "".join('<tool_call>\n' + json.dumps(c) + '\n</tool_call>' for c in cs)}
            for r, cs in zip(records, calls or [r["calls"] for r in records])]
    R.write_jsonl(path, rows)
    return path


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("reader", ["dedupe", "teacher", "normalize", "expand_slots", "bench", "agent_bench"])
def test_every_reader_names_the_file_line_and_field(tmp_path, reader, kind):
    bad, field = BAD[kind]
    path = _write(tmp_path / "records.jsonl", bad)
    with pytest.raises(ValueError) as e:
        _readers(tmp_path)[reader](path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:3: ") and field in msg and "\n" not in msg, msg


def test_skip_reports_counts_and_the_stage_goes_on(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), json.dumps(BAD["empty_messages"][0] | {"id": "x/y/1"}),
                               json.dumps(BAD["integer_id"][0]), json.dumps(GOOD)]) + "\n")
    stats = expand_slots.run(expand_slots.ExpandSlotsParams(on_reject="skip"), path, tmp_path / "a.jsonl",
                             tmp_path / "b.jsonl", None, None)
    assert stats["input"]["num_read"] == 1 and stats["input"]["num_bad"] == 3
    assert stats["input"]["bad_by_reason"] == {"duplicate_id": 1, "malformed_record": 2}
    assert stats["input"]["bad_examples"][0].startswith(f"{path}:2: record 'x/y/1': malformed_record: messages:")
    t = teacher.run(teacher.TeacherParams(on_reject="skip"), path, tmp_path / "t.jsonl", metrics_path=None)
    assert t["num_traces"] == 1 and t["input"]["num_bad"] == 3
    d = dedupe.run(dedupe.DedupeParams(on_reject="skip"), path, tmp_path / "dd", metrics_path=tmp_path / "d.json",
                   cards_dir=None, ingest_metrics=None)
    assert d["input"]["num_bad"] == 3
    rows, skipped = eval_sidecar.rows_from_records(path)    # eval_sidecar skips and counts bad benchmark records
    assert skipped == 3 and {r["record_id"] for r in rows} == {GOOD["id"]}


def test_load_records_reports_every_bad_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\n".join([json.dumps(GOOD).encode(), b"\xff{}", b"[1]", json.dumps(GOOD).encode(),
                                 json.dumps({**GOOD, "calls": []}).encode(), b"  "]) + b"\n")
    read = R.load_records(path, "skip")
    assert read.rows == [GOOD]
    assert [(b.line, b.reason) for b in read.bad] == [(2, "malformed_record"), (3, "malformed_record"),
                                                      (4, "duplicate_id"), (5, "no_gold_call")]
    with pytest.raises(ValueError, match=r"r\.jsonl:2: malformed_record: not UTF-8.*and 3 more bad line"):
        R.load_records(path)
    with pytest.raises(ValueError, match="on_reject"):
        R.load_records(path, "ignore")


def test_normalize_checks_trace_fields(tmp_path):
    records = tmp_path / "records.jsonl"
    R.write_jsonl(records, [GOOD])
    traces = _traces(tmp_path, [GOOD])
    row = json.loads(traces.read_text())
    for bad, field in [({k: v for k, v in row.items() if k != "text"}, "text:"), ({**row, "text": None}, "text:"),
                       ({**row, "format": ["hermes"]}, "format:"), ({**row, "id": 3}, "id:")]:
        traces.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ValueError) as e:
            normalize.run(normalize.NormalizeParams(), records, traces, tmp_path / "o.jsonl", tmp_path / "r.jsonl",
                          metrics_path=None, card_path=None)
        assert str(e.value).startswith(f"{traces}:1: ") and field in str(e.value), str(e.value)


# ------------------------------------------------------------------------ normalize: the bounded schema path

def _tool_record(lid: str, parameters: dict, gold: dict) -> dict:
    return R.make_record("t", "train", lid, [R.tool("f", "", parameters)], USER, [R.call("f", gold)])


PATTERN = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)+$"}}}
NESTED_PLUS = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
CYCLE = {"type": "object", "properties": {"s": {"$ref": "#/$defs/A"}},
         "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}
PLAIN = {"type": "object", "properties": {"s": {"type": "string"}}}

HOSTILE = [  # (record, the teacher's arguments): each record passes ingest; only the teacher's value is hostile
    (_tool_record("pattern", PATTERN, {"s": "aaaa"}), {"s": "a" * 40 + "!"}),
    (_tool_record("plus", NESTED_PLUS, {"s": "aaaa"}), {"s": "a" * 40 + "!"}),
    (_tool_record("cycle", CYCLE, {}), {"s": "x"}),
    (_tool_record("plain", PLAIN, {"s": "x"}), {"s": "y"}),
]


def test_hostile_teacher_calls_pass_ingest_validation():
    assert all(R.validate_record(rec) is None for rec, _ in HOSTILE)


def _normalize_script(tmp_path: Path) -> str:
    records = tmp_path / "records.jsonl"
    R.write_jsonl(records, [rec for rec, _ in HOSTILE])
    traces = _traces(tmp_path, [rec for rec, _ in HOSTILE], [[R.call("f", args)] for _, args in HOSTILE])
    return f"""
import json, time
from pathlib import Path
from ooospec.pipelines import normalize
t0 = time.perf_counter()
normalize.run(normalize.NormalizeParams(), Path({str(records)!r}), Path({str(traces)!r}),
              Path({str(tmp_path / 'calls.jsonl')!r}), Path({str(tmp_path / 'rejects.jsonl')!r}),
              metrics_path=None, card_path=None)
print(json.dumps({{"seconds": time.perf_counter() - t0}}))
"""


def test_normalize_rejects_hostile_schemas_in_bounded_time(tmp_path):
    # a subprocess: Python's re (the old path) cannot be interrupted, so a regression must not hang the suite
    out = subprocess.run([sys.executable, "-c", _normalize_script(tmp_path)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    seconds = json.loads(out.stdout.strip().splitlines()[-1])["seconds"]
    assert seconds < 10, seconds          # one pattern budget (0.2 s) + the cycle; the old path hung > 240 s
    rejects = {r["id"]: r for r in R.read_jsonl(tmp_path / "rejects.jsonl")}
    assert rejects["t/train/pattern"]["reason"] == normalize.UNCHECKABLE_SCHEMA
    assert "^(a|aa)+$" in rejects["t/train/pattern"]["detail"]
    # the bounded engine decides ^(a+)+$ at once: a plain schema violation, not a hang
    assert rejects["t/train/plus"]["reason"] == normalize.SCHEMA_VIOLATION
    assert rejects["t/train/cycle"]["reason"] == normalize.UNCHECKABLE_SCHEMA
    assert "recursion" in rejects["t/train/cycle"]["detail"]
    assert [r["id"] for r in R.read_jsonl(tmp_path / "calls.jsonl")] == ["t/train/plain"]   # the stage went on

