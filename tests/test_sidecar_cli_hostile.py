"""Issue 22: ``ooospec sidecar predict --dataset`` on bad input, and the sidecar answer join on missing answers.

No model is loaded: a bad dataset line must stop the command before the sidecar loads, and the prediction loop is
replaced by one that fails midway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ooospec import cli, sidecar_cli
from ooospec.runtime.sidecar import engines
from ooospec.runtime.sidecar import prompts as sp

RECORDS = Path(__file__).resolve().parent / "fixtures" / "train_records.jsonl"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}}]


def _no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the sidecar must not load for a bad dataset")
    monkeypatch.setattr(engines, "load_sidecar", refuse)


@pytest.mark.parametrize("line, field", [
    ('{"id": "x", "messages": [', "not valid JSON"),
    (json.dumps({"id": "x"}), "'source'"),
    ("[1, 2]", "JSON object"),
])
def test_a_malformed_line_is_one_line_naming_file_and_line(tmp_path, monkeypatch, capsys, line, field):
    _no_model(monkeypatch)
    data = tmp_path / "d.jsonl"
    data.write_text(RECORDS.read_text().splitlines()[0] + "\n" + line + "\n")
    out = tmp_path / "p.jsonl"
    with pytest.raises(SystemExit) as e:
        cli.main(["sidecar", "predict", "--dataset", str(data), "--out", str(out)])
    msg = str(e.value.code)
    assert f"{data}:2: " in msg and field in msg and "\n" not in msg, msg
    assert "Traceback" not in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [data]            # neither predictions nor a .partial file


def test_a_failure_midway_leaves_nothing_partial(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "load_sidecar", lambda *a, **k: object())

    def predict_then_fail(sidecar, records, *options, **kw):
        yield {"id": records[0]["id"]}
        raise RuntimeError("the model broke")

    monkeypatch.setattr(sidecar_cli, "predict_records", predict_then_fail)
    out = tmp_path / "p.jsonl"
    with pytest.raises(RuntimeError, match="the model broke"):
        cli.main(["sidecar", "predict", "--dataset", str(RECORDS), "--out", str(out)])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("index", [None, 0, 1.5, [0], {"i": 0}, b"0"])
def test_join_slots_treats_a_missing_or_non_text_index_as_unusable(index):
    assert sp.join_slots(TOOLS, index, {("f", "a"): '"x"'}) is None


def test_join_slots_drops_non_text_argument_and_direct_answers():
    call = sp.join_slots(TOOLS, "0", {("f", "a"): None, ("f", "b"): 3}, direct_call_text=None)
    assert call == {"name": "f", "arguments": {}}
    call = sp.join_slots(TOOLS, "0", {("f", "a"): '"x"', ("f", "b"): "3"}, direct_call_text=["junk"])
    assert call == {"name": "f", "arguments": {"a": "x", "b": 3}, "direct_call": None}
    assert sp.checked_direct_call(TOOLS, None) is None
    for parse in (sp.parse_argument_value, sp.parse_direct_call, sp.parse_function_index):
        with pytest.raises(ValueError, match="must be a string"):
            parse(None)
