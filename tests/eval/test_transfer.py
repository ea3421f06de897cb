"""The ``transfer`` stage end to end on a tiny random Qwen2 saved as a local folder (no downloads, fp32), its
resumable cells, and its params section."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from ooospec.eval.bench import harness, hint_sources
from ooospec.eval.bench import methods as bench_methods
from ooospec.eval.transfer import cell as transfer_cell
from ooospec.eval.transfer import params as transfer_params
from ooospec.eval.transfer import stage as transfer
from ooospec.pipelines.params import from_dict, load_section
from ooospec.pipelines.records import write_jsonl
from ooospec.runtime.formats import detect_format
from tests.eval.test_bench import byte_tokenizer, tiny_qwen2, toy_records

METHODS = ("pld", "hf-pld", "hf-assisted", "toolspec", "ooospec-gold")


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_target")
    tiny_qwen2().save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def toy_benchmark(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "toy.jsonl"
    write_jsonl(path, toy_records())
    return path


def params_for(target: Path, benchmark: Path, **kw) -> transfer_params.TransferParams:
    base = {"targets": (str(target),), "benchmarks": (str(benchmark),), "methods": METHODS, "limit": 2,
            "max_new_tokens": 16, "dtype": "fp32", "threads": 1, "roofline": False, "report_to": "none",
            "bootstrap_resamples": 200}
    return transfer_params.TransferParams(**{**base, **kw})


@pytest.fixture(scope="module")
def stage(tiny_target, toy_benchmark, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("stage")
    params = params_for(tiny_target, toy_benchmark)
    results = transfer.run(params, out / "data", out / "report", out / "metrics.json")
    return out, params, results


# ------------------------------------------------------------------------------------------ the stage


def test_stage_writes_every_output(stage):
    out, _, results = stage
    for rel in ("report/transfer.json", "report/transfer.md", "report/transfer.html", "report/speedup.png",
                "report/plots/speedup.json", "metrics.json"):
        assert (out / rel).is_file(), rel
    assert json.loads((out / "report/transfer.json").read_text()) == results
    json.dumps(results, allow_nan=False)
    cells = list((out / "data/cells").rglob("*.json"))
    assert len(cells) == 1 and cells[0].name == "toy.json"


def test_reports_rebuilt_from_the_json_are_byte_identical(stage, tmp_path):
    """The reports depend on the stage's JSON only (and deterministically): rebuilt from the file they match."""
    from ooospec.eval.transfer import report as transfer_report

    out, _, _ = stage
    saved = json.loads((out / "report/transfer.json").read_text())
    transfer_report.write_reports(saved, tmp_path)
    for name in ("transfer.md", "transfer.html", "speedup.png", "plots/speedup.json"):
        assert (tmp_path / name).read_bytes() == (out / "report" / name).read_bytes(), name


def test_cell_has_every_method_but_hf_assisted(stage, tiny_target):
    _, _, results = stage
    (cell,) = results["cells"]
    assert cell["methods_run"] == ["ar", "hf-greedy", "pld", "hf-pld", "toolspec", "ooospec-gold"]
    assert any("hf-assisted left out" in n for n in cell["notes"])
    for name, s in cell["methods"].items():
        assert s["n"] == 2 and s["exact_rate"] == 1.0, name          # fp32: every method is exact
        lo, hi = s["speedup_median_ci"]
        assert lo <= s["speedup_median"] <= hi
        assert set(s["call"]) == {"n", "parsed", "name", "call"}
    assert all("tokens" not in r and "text" not in r for r in cell["examples"])
    assert all(len(r["step_s"]) == r["forwards"] for r in cell["examples"] if r["method"] == "toolspec")


def test_target_summary_and_metrics(stage):
    out, _, results = stage
    summary = results["targets"][next(iter(results["targets"]))]["summary"]
    assert summary["examples"] == 2 and summary["speedup"]["ar"] == pytest.approx(1.0)
    assert summary["ooospec-gold_gain"] == pytest.approx(summary["mean_s"]["toolspec"]
                                                         / summary["mean_s"]["ooospec-gold"])
    m = json.loads((out / "metrics.json").read_text())
    (key,) = m["cells"]
    assert key.endswith("/toy") and m["cells"][key]["toolspec"]["speedup"] == \
        results["cells"][0]["methods"]["toolspec"]["speedup"]


def test_rerun_of_a_complete_cell_measures_nothing(stage, monkeypatch):
    out, params, results = stage
    monkeypatch.setattr(harness, "run_bench", lambda *a, **k: pytest.fail("a complete cell was measured again"))
    monkeypatch.setattr("ooospec.runtime.backends.models.load_target", lambda *a, **k: pytest.fail("target loaded"))
    again = transfer.run(params, out / "data", out / "report2", out / "metrics2.json")
    assert again["cells"][0]["examples"] == results["cells"][0]["examples"]


# ------------------------------------------------------------------------------------------ resuming


def _cell_inputs(tiny_target, limit):
    from ooospec.runtime.backends.models import load_target

    model, tok = load_target(str(tiny_target), dtype="fp32")
    fmt = detect_format(tok)
    records = sorted(toy_records(), key=lambda r: r["id"])[:limit]
    return model, tok, fmt, records


def _measure(model, tok, fmt, fail_on: str | None = None):
    def measure(todo, on_example):
        factories, _ = bench_methods.build_methods(["toolspec"], model, tok,
                                                   eos_token_ids=bench_methods.eos_ids(model, tok))
        if fail_on is not None:
            inner = factories["toolspec"]

            def crashing():
                fn = inner()

                def run(prompt, ctx):
                    if ctx.record.get("id") == fail_on:
                        raise KeyboardInterrupt("stopped")
                    return fn(prompt, ctx)
                return run
            factories["toolspec"] = crashing
        return harness.run_bench(model, tok, todo, factories, fmt=fmt, max_new_tokens=12, progress=False,
                               on_example=on_example)
    return measure


KEY = {"methods": ["ar", "hf-greedy", "toolspec"], "code": "x"}


def test_a_crash_loses_only_the_example_in_flight(tiny_target, tmp_path):
    model, tok, fmt, records = _cell_inputs(tiny_target, 3)
    path = tmp_path / "cell.json"
    with pytest.raises(KeyboardInterrupt):
        transfer_cell.run_cell(path, KEY, records, _measure(model, tok, fmt, fail_on=records[1]["id"]),
                               header={"env": {}}, fmt=fmt, seed=0, num_resamples=50)
    stored = json.loads(path.read_text())
    assert stored["partial"] and transfer_cell.done_ids(stored["examples"], KEY["methods"]) == {records[0]["id"]}
    first = [r for r in stored["examples"] if r["id"] == records[0]["id"]]

    seen = []
    measure = _measure(model, tok, fmt)
    cell = transfer_cell.run_cell(path, KEY, records, lambda todo, cb: seen.append([r["id"] for r in todo])
                                  or measure(todo, cb), header={"env": {}}, fmt=fmt, seed=0, num_resamples=50)
    assert seen == [[r["id"] for r in records[1:]]]           # the done example is not run again
    assert not cell["partial"] and len(cell["sessions"]) == 2
    assert [r for r in cell["examples"] if r["id"] == records[0]["id"]] == first
    assert cell["methods"]["toolspec"]["n"] == 3


def test_other_settings_start_the_cell_over_and_a_larger_limit_extends_it(tiny_target, tmp_path):
    model, tok, fmt, records = _cell_inputs(tiny_target, 3)
    path = tmp_path / "cell.json"
    transfer_cell.run_cell(path, KEY, records[:1], _measure(model, tok, fmt), header={"env": {}}, fmt=fmt, seed=0,
                           num_resamples=50)
    seen = []
    measure = _measure(model, tok, fmt)

    def spy(todo, cb):
        seen.append(len(todo))
        return measure(todo, cb)
    transfer_cell.run_cell(path, KEY, records[:2], spy, header={"env": {}}, fmt=fmt, seed=0, num_resamples=50)
    transfer_cell.run_cell(path, {**KEY, "code": "y"}, records[:2], spy, header={"env": {}}, fmt=fmt, seed=0,
                           num_resamples=50)
    assert seen == [1, 2]


# ------------------------------------------------------------------------------------------ params


def test_committed_params_section_loads_and_full_set_applies():
    path = Path(__file__).parents[2] / "params.yaml"
    default = load_section(transfer_params.TransferParams, "transfer", path)
    assert default == transfer_params.TransferParams()   # the dataclass defaults are params.yaml's matrix
    raw = yaml.safe_load(path.read_text())["transfer"]
    full = from_dict(transfer_params.TransferParams, {**raw, **transfer_params.FULL}, "transfer")
    assert len(full.targets) == 4 and len(full.benchmarks) == 6
    # the named params set is exactly the default section with FULL's keys replaced
    assert transfer_params.load_params(path.parent / transfer_params.FULL_PARAMS) == full
    doc = " ".join(transfer.__doc__.replace("\\\n", " ").split())
    assert transfer_params.full_command() in doc
    # the warm set is the full set with the toolbox cached, less hf-pld and hf-assisted (they cannot start from a
    # cached prefix)
    warm = transfer_params.load_params(path.parent / transfer_params.WARM_PARAMS)
    cold_only = {"hf-pld", "hf-assisted"}
    methods = tuple(m for m in full.methods if m not in cold_only)
    assert cold_only <= set(full.methods) and len(methods) == len(full.methods) - 2
    assert warm == dataclasses.replace(full, warm_tools=True, methods=methods)
    assert not full.warm_tools and full.sidecar_gate
    header = " ".join((path.parent / transfer_params.WARM_PARAMS).read_text().replace("\\\n#", " ").split())
    assert transfer_params.named_command(transfer_params.WARM_PARAMS) in header


def test_gate_and_warm_toolbox_reach_the_harness(monkeypatch):
    """``sidecar_gate`` and ``warm_tools`` go to the sidecar's hint options, every cell's measurement and the key."""
    seen = {}
    monkeypatch.setattr(hint_sources, "start_hints", lambda options, threads: seen.setdefault("options", options)
                        and (None, "hints"))
    monkeypatch.setattr(harness, "run_bench", lambda *a, **kw: seen.setdefault("run_bench", kw))
    params = transfer_params.TransferParams(sidecar_gate=True, warm_tools=True)
    assert transfer.SidecarServer(params, bench_threads=2).hints == "hints"
    assert seen["options"].sidecar_gate and seen["options"].warm_tools
    loaded = transfer.LoadedTarget(None, None, None, {}, {"roofline": None}, {})
    loaded.measure(params, [], on_example=None, settle=None)
    assert seen["run_bench"]["warm_tools"] is True
    machine = {"dtype": "fp32", "threads": 2, "cpu": "x"}
    cold_key = transfer.cell_key(dataclasses.replace(params, warm_tools=False, sidecar_gate=False), "t", "b",
                                 ["ar", "ooospec"], machine, {"weights": "w"}, "c")
    warm_key = transfer.cell_key(params, "t", "b", ["ar", "ooospec"], machine, {"weights": "w"}, "c")
    assert warm_key["warm_tools"] and warm_key["sidecar"]["gate"] and cold_key != warm_key


def test_regenerate_command_names_only_what_differs():
    assert transfer_params.regenerate_command(transfer_params.TransferParams()) == "dvc repro transfer"
    p = dataclasses.replace(transfer_params.TransferParams(), limit=3, resume=False)
    assert transfer_params.regenerate_command(p) == "dvc exp run transfer -S transfer.limit=3 -S transfer.resume=false"


@pytest.mark.parametrize("bad, match", [({"methods": ["nope"]}, "unknown"), ({"limit": 0}, "limit"),
                                        ({"colour": 1}, "unknown key"), ({"assistants": {"a": 1}}, "assistants")])
def test_bad_params_are_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        from_dict(transfer_params.TransferParams, bad, "transfer")


def test_ooospec_without_an_adapter_says_what_to_do(tiny_target, toy_benchmark, tmp_path):
    params = params_for(tiny_target, toy_benchmark, methods=("ooospec",), sidecar_adapter=str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match="transfer.sidecar_adapter"):
        transfer.run(params, tmp_path / "d", tmp_path / "r", tmp_path / "m.json")


def test_slug():
    assert transfer.slug("Qwen/Qwen2.5-0.5B") == "Qwen_Qwen2.5-0.5B"
    assert transfer.slug("qwen2.5-coder-0.5b") == "qwen2.5-coder-0.5b"


def test_hf_assisted_runs_where_a_draft_model_is_named(tiny_target, toy_benchmark, tmp_path):
    params = params_for(tiny_target, toy_benchmark, methods=("hf-assisted",), limit=1,
                        assistants={str(tiny_target): str(tiny_target)})
    results = transfer.run(params, tmp_path / "d", tmp_path / "r", tmp_path / "m.json")
    (cell,) = results["cells"]
    assert cell["methods_run"] == ["ar", "hf-greedy", "hf-assisted"] and cell["notes"] == []
    assert cell["methods"]["hf-assisted"]["exact_rate"] == 1.0


def test_a_warm_toolbox_leaves_the_hf_drafting_peers_out_and_the_named_sets_load():
    params = params_for(Path("t"), Path("b.jsonl"), methods=("toolspec", "hf-pld", "hf-assisted"),
                        assistants={"t": "d"})
    assert transfer.target_methods(params, "t") == (["ar", "hf-greedy", "toolspec", "hf-pld", "hf-assisted"], [])
    methods, notes = transfer.target_methods(dataclasses.replace(params, warm_tools=True), "t")
    assert methods == ["ar", "hf-greedy", "toolspec"]
    assert [n.split()[0] for n in notes] == ["hf-pld", "hf-assisted"] and all("cached prefix" in n for n in notes)
    root = Path(__file__).resolve().parents[2]
    for name, folder in transfer_params.NAMED_SETS.items():       # every named set loads and names its folders
        p = transfer_params.load_params(root / name)
        assert p.warm_tools == (folder == "warm") and f"data/transfer-{folder} " in transfer_params.named_command(name)
