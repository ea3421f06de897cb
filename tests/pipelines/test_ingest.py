"""The ingest stage: lock checks, validation, rejects with reasons and counts, determinism."""

import json
import types

import pytest

from ooospec.pipelines import ingest
from ooospec.pipelines import records as R
from ooospec.pipelines import sources as source_registry

PARAMS = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def _fake_parse(root):
    assert (root / "data.txt").exists()
    tools = [R.tool("search", "Search the web", PARAMS)]
    msgs = [{"role": "user", "content": "find cats"}]
    yield R.make_record("fake", "test", "b", tools, msgs, [R.call("search", {"q": "cats"})])
    yield R.make_record("fake", "test", "a", tools, msgs, [R.call("search", {"q": 3})])          # schema violation
    yield R.make_record("fake", "test", "c", tools, msgs, [R.call("browse", {"q": "cats"})])     # unknown tool
    yield R.Reject("fake", "test", "d", "unparseable_call", "fake.json#4: `[search(q=']`")
    yield R.make_record("fake", "train", "e", tools, msgs, [R.call("search", {"q": "dogs"})])


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    raw = tmp_path / "datasets" / "fake" / "raw"
    raw.mkdir(parents=True)
    (raw / "data.txt").write_text("hello")
    mod = types.SimpleNamespace(SOURCE="fake", LICENSE="MIT", UPSTREAM="me/fake@0000", parse=_fake_parse)
    monkeypatch.setitem(source_registry.SOURCES, "fake", ("fake_module", "fake/raw"))
    monkeypatch.setattr(source_registry, "load", lambda name: mod)
    return tmp_path / "datasets"


def _run(fake_source, tmp_path, out="out", **kw):
    params = ingest.IngestParams(source=str(fake_source), sources=("fake",), max_reject_fraction=1.0, **kw)
    lock = ingest.compute_lock(fake_source, ["fake"])
    return ingest.run(params, tmp_path / out, metrics_path=tmp_path / out / "m.json",
                      card_path=tmp_path / out / "card.md", lock=lock)


def test_rejects_have_reasons_and_counts(fake_source, tmp_path):
    stats = _run(fake_source, tmp_path)
    s = stats["sources"]["fake"]
    assert s["parsed"] == 2 and s["rejected"] == 3
    assert s["rejects_by_reason"] == {"call_schema_violation": 1, "call_unknown_tool": 1, "unparseable_call": 1}
    assert s["splits"]["test"]["rejected:call_unknown_tool"] == 1
    rejects = list(R.read_jsonl(tmp_path / "out" / "rejects.jsonl"))
    assert [r["id"] for r in rejects] == ["fake/test/a", "fake/test/c", "fake/test/d"]   # sorted, nothing lost
    recs = list(R.read_jsonl(tmp_path / "out" / "records.jsonl"))
    assert [r["id"] for r in recs] == ["fake/test/b", "fake/train/e"]
    card = (tmp_path / "out" / "card.md").read_text()
    assert "| fake | 2 | 3 |" in card and "call_unknown_tool" in card


def test_output_is_byte_identical_across_runs(fake_source, tmp_path):
    _run(fake_source, tmp_path, "one")
    _run(fake_source, tmp_path, "two")
    for name in ("records.jsonl", "rejects.jsonl", "m.json", "card.md"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_on_reject_fail_and_max_fraction(fake_source, tmp_path):
    lock = ingest.compute_lock(fake_source, ["fake"])
    for params in (ingest.IngestParams(source=str(fake_source), sources=("fake",), on_reject="fail"),
                   ingest.IngestParams(source=str(fake_source), sources=("fake",), max_reject_fraction=0.5)):
        with pytest.raises(SystemExit, match="fake"):
            ingest.run(params, tmp_path / "o", metrics_path=tmp_path / "o" / "m.json", card_path=None, lock=lock)
        assert (tmp_path / "o" / "rejects.jsonl").exists()     # outputs are written before failing


def test_lock_mismatch_names_the_files(fake_source, tmp_path):
    lock = ingest.compute_lock(fake_source, ["fake"])
    (fake_source / "fake" / "raw" / "data.txt").write_text("tampered")
    (fake_source / "fake" / "raw" / "new.txt").write_text("x")
    with pytest.raises(ingest.LockMismatch) as e:
        ingest.check_lock(fake_source, ["fake"], lock)
    msg = str(e.value)
    assert "changed:  fake/raw/data.txt" in msg and "unpinned: fake/raw/new.txt" in msg
    with pytest.raises(ingest.LockMismatch, match="missing:  fake/raw/gone.txt"):
        ingest.check_lock(fake_source, ["fake"], {**ingest.compute_lock(fake_source, ["fake"]),
                                                  "fake/raw/gone.txt": "0" * 64})
    with pytest.raises(ingest.LockMismatch, match="not a folder"):
        ingest.check_lock(fake_source / "nope", ["fake"], lock)


def test_params_reject_unknown_values():
    with pytest.raises(ValueError, match="on_reject"):
        ingest.IngestParams(on_reject="ignore")
    with pytest.raises(ValueError, match="unknown source"):
        ingest.IngestParams(sources=("apibank", "imaginary"))


def test_committed_lock_covers_every_source():
    lock = json.loads(ingest.LOCK_FILE.read_text())
    for name, (_, folder) in source_registry.SOURCES.items():
        assert any(k.startswith(folder + "/") for k in lock), name
    assert all(len(v) == 64 for v in lock.values())
