"""The transfer report is built from the stage's JSON and nothing else: every table cell of ``transfer.md`` is
checked here against the fixture's values, independently of the report code's own column definitions.

The fixture (``tests/fixtures/transfer_results.json``) is a real smoke run of the stage, trimmed: two targets
(smollm2-135m, qwen2.5-coder-0.5b) x two benchmarks, 1-2 examples per cell, the tiny test sidecar adapter.
"""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path

import pytest

from ooospec.eval.transfer import html as transfer_html
from ooospec.eval.transfer import notes as transfer_notes
from ooospec.eval.transfer import report as R
from ooospec.eval.transfer import tables as transfer_tables

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "transfer_results.json"


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def md(results) -> str:
    return R.markdown(results)


def md_tables(text: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """``{title: (headers, rows)}`` of every ``### title`` followed by a Markdown table."""
    out, title, lines = {}, None, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("### "):
            title = line[4:]
        elif line.startswith("| ") and title is not None and title not in out:
            block = []
            for row in lines[i:]:
                if not row.startswith("|"):
                    break
                block.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)[1:-1]])
            out[title] = (block[0], block[2:])
    return out


def pct(x):
    return "-" if x is None else f"{x:.0%}"


def cell_of(results, target, bench):
    (c,) = [c for c in results["cells"] if c["target"] == target and Path(c["benchmark"]).stem == bench]
    return c


def test_fixture_is_what_the_tests_say(results):
    assert list(results["targets"]) == ["qwen2.5-coder-0.5b", "smollm2-135m"] and len(results["cells"]) == 4


def test_a_method_a_cell_did_not_run_shows_a_dash(results):
    partial = copy.deepcopy(results)
    partial["cells"][0]["methods"].pop("hf-pld")
    partial["cells"][0]["methods_run"].remove("hf-pld")
    headers, rows = md_tables(R.markdown(partial))["Speedup vs AR (ratio of mean times)"]
    assert rows[0][headers.index("hf-pld")] == "-" and rows[1][headers.index("hf-pld")] != "-"


def test_headline_speedups_equal_the_json(results, md):
    headers, rows = md_tables(md)["Speedup vs AR (ratio of mean times)"]
    assert headers[:3] == ["target", "benchmark", "n"] and len(rows) == len(results["cells"])
    for row in rows:
        c = cell_of(results, row[0], row[1])
        assert row[2] == str(c["methods"]["ar"]["n"])
        for header, text in zip(headers[3:], row[3:]):
            method = header.split(" (")[0]
            s = c["methods"].get(method)
            assert text == ("-" if s is None else f"{s['speedup']:.2f}x"), (row[:2], method)


def test_median_and_interval_equal_the_json(results, md):
    headers, rows = md_tables(md)["Median per-example speedup [bootstrap 95% interval]"]
    for row in rows:
        c = cell_of(results, row[0], row[1])
        for header, text in zip(headers[2:], row[2:]):
            s = c["methods"].get(header.split(" (")[0])
            if s is None:
                assert text == "-"
                continue
            lo, hi = s["speedup_median_ci"]
            assert text == f"{s['speedup_median']:.2f}x [{lo:.2f}, {hi:.2f}]"


def test_call_table_equals_the_json(results, md):
    _, rows = md_tables(md)["Calls vs gold: the target's own and the sidecar's"]
    for row in rows:
        c = cell_of(results, row[0], row[1])
        own = c["methods"]["ar"]["call"]
        side = (c["methods"].get("ooospec", {}).get("hints") or {}).get("sidecar_call") or {}
        assert row[2:] == [str(own["n"]), pct(own["parsed"]), pct(own["name"]), pct(own["call"]),
                           pct(side.get("parsed")), pct(side.get("call"))]


def test_hint_table_equals_the_json(results, md):
    headers, rows = md_tables(md)["Sidecar hints (method ooospec)"]
    for row in rows:
        h = cell_of(results, row[0], row[1])["methods"]["ooospec"]["hints"]
        got = dict(zip(headers, row))
        assert got["requests"] == str(h["n"])
        assert got["ready before 1st tree"] == pct(h["ready_before_first_tree"])
        assert got["ready before end"] == pct(h["ready_before_end"])
        assert got["used"] == pct(h["used"])
        assert got["wave median s"] == ("-" if h["median_wave_s"] is None else f"{h['median_wave_s']:.2f}")
        assert got["target-side ms (mean)"] == f"{h['mean_target_sidecar_s'] * 1e3:.1f}"


def test_gain_table_equals_the_json(results, md):
    _, rows = md_tables(md)["Hint gain per cell (over toolspec)"]
    assert len(rows) == len(results["cells"])

    def over_toolspec(c, m):
        ms = c["methods"]
        return "-" if m not in ms or "toolspec" not in ms else f"{ms['toolspec']['mean_s'] / ms[m]['mean_s']:.2f}x"

    for row in rows:
        c = cell_of(results, row[0], row[1])
        assert row[2:] == [over_toolspec(c, "ooospec"), over_toolspec(c, "ooospec-gold")]
    assert any(r[2] != "-" for r in rows)


def test_target_table_equals_the_json(results, md):
    headers, rows = md_tables(md)["Per target, pooled over its benchmarks"]
    assert [r[0] for r in rows] == results["params"]["targets"]
    for row in rows:
        info, s = results["targets"][row[0]]["info"], results["targets"][row[0]]["summary"]
        got = dict(zip(headers, row))
        assert got["family"] == info["model_type"] and got["chat template"] == info["chat_template"]
        assert got["own call right"] == pct(s["call"]["call"])
        assert got["toolspec vs AR"] == f"{s['speedup']['toolspec']:.2f}x"
        assert got["hint gain (ooospec / toolspec)"] == f"{s['ooospec_gain']:.2f}x"
        assert got["ceiling (gold / toolspec)"] == f"{s['ooospec-gold_gain']:.2f}x"


def test_cell_tables_equal_the_json(results, md):
    tables = md_tables(md)
    for c in results["cells"]:
        headers, rows = tables[f"{c['target']} on {Path(c['benchmark']).stem}"]
        assert len(rows) == len(c["methods_run"])
        for row, method in zip(rows, c["methods_run"]):
            s, got = c["methods"][method], dict(zip(headers, row))
            assert got["n"] == str(s["n"]) and got["mean s"] == f"{s['mean_s']:.2f}"
            assert got["speedup (mean)"] == f"{s['speedup']:.2f}x"
            assert got["#MAT"] == f"{s['mat']:.2f}" and got["exact vs AR"] == pct(s["exact_rate"])
            assert got["near-ties"] == str(s["near_ties"]) and got["defects"] == str(s["defects"])


def test_html_shows_the_same_tables_and_is_self_contained(results):
    page = transfer_html.html_page(results, {"speedup": "<svg></svg>"})
    for table in transfer_tables.tables(results):
        for row in table.rows:
            for cell in row:
                assert f">{html.escape(cell.text)}</td>" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert "<svg></svg>" in page


def test_honest_notes_come_from_the_numbers(results):
    notes = {t: (verdict, reasons) for t, verdict, reasons in transfer_notes.transfer_notes(results)}
    s = results["targets"]["smollm2-135m"]["summary"]
    verdict, reasons = notes["smollm2-135m"]
    assert verdict.startswith("Hints help little") and f"{s['ooospec_gain']:.2f}x over toolspec" in verdict
    assert any(r.startswith("a weak caller") and f"{s['call']['call']:.0%}" in r for r in reasons)
    assert any("no tool support" in r for r in reasons)                  # SmolLM2's template has no tools
    qwen = notes["qwen2.5-coder-0.5b"][1]
    assert any("tokenizer differs from the sidecar's" in r for r in qwen)   # a SmolLM2 sidecar, a Qwen target

    better = copy.deepcopy(results)
    better["targets"]["smollm2-135m"]["summary"]["ooospec_gain"] = 1.5
    verdict, reasons = {t: (v, r) for t, v, r in transfer_notes.transfer_notes(better)}["smollm2-135m"]
    assert verdict.startswith("Hints help:") and "1.50x over toolspec" in verdict

    gated = copy.deepcopy(results)       # a gate that skipped every wave: no "seldom arrive", the gate says why
    h = gated["targets"]["smollm2-135m"]["summary"]["hints"]
    h.update(ready_before_end=0.0, wave_decisions={"skip": h["n"], "index": 0, "slots": 0})
    reasons = {t: r for t, _, r in transfer_notes.transfer_notes(gated)}["smollm2-135m"]
    assert any(r.startswith(f"the wave gate skipped {h['n']} of {h['n']} waves") for r in reasons)
    assert not any(r.startswith("hints seldom arrive") for r in reasons)


def test_write_reports(results, tmp_path):
    paths = R.write_reports(results, tmp_path)
    assert {p.name for p in paths} == {"transfer.md", "transfer.html", "speedup.png", "speedup.json"}
    page = (tmp_path / "transfer.html").read_text()
    assert page.count("<svg") >= 3          # the figures are inline
    rows = json.loads((tmp_path / "plots" / "speedup.json").read_text())
    want = {(c["target"], Path(c["benchmark"]).stem, m): s["speedup"]
            for c in results["cells"] for m, s in c["methods"].items() if m != "ar"}
    assert {(r["target"], r["benchmark"], r["method"]): r["speedup"] for r in rows} == want


def test_wandb_run_logs_the_report_tables(results, tmp_path, monkeypatch):
    """W&B gets the same Table objects as the documents (disabled mode: the calls run, nothing is written)."""
    pytest.importorskip("wandb")
    from ooospec.eval.transfer import stage as transfer

    monkeypatch.setenv("WANDB_MODE", "disabled")
    logged = {}
    import wandb

    real_init = wandb.init

    def spy_init(**kw):
        run = real_init(**kw)
        monkeypatch.setattr(run, "log", lambda d, **k: logged.update(d))
        return run
    monkeypatch.setattr(wandb, "init", spy_init)
    R.write_reports(results, tmp_path)
    transfer.log_wandb(results, tmp_path / "wandb", tmp_path)
    for table in transfer_tables.tables(results):
        assert logged[f"transfer/{table.slug}"].columns == table.headers
    assert "transfer/report" in logged and "transfer/speedup_plot" in logged


def test_regenerate_commands_name_the_run_and_its_own_report_folder(results):
    default = {**results, "command": "dvc repro transfer",
               "full_command": "python -m ooospec.eval.transfer data/transfer-full eval/reports/transfer/full "
                               "metrics/transfer-full.json --params eval/transfer/full.yaml"}
    md = R.markdown(default)
    assert "Regenerate: `dvc repro transfer`; the full matrix: `python -m ooospec.eval.transfer" in md
    assert "ooospec transfer-report eval/reports/transfer/transfer.json" in transfer_html.html_page(default, {})
    full = {**default, "command": default["full_command"]}
    md = R.markdown(full)
    assert md.count(full["full_command"]) == 1 and "Regenerate (this is the full matrix)" in md
    page = transfer_html.html_page(full, {})
    assert page.count(full["full_command"]) == 1
    rebuild = "ooospec transfer-report eval/reports/transfer/full/transfer.json --out-dir eval/reports/transfer/full"
    assert rebuild in page
