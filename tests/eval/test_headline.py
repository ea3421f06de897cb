"""The README's results table: generated from the committed vLLM cells, never hand-edited."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ooospec.eval.vllm import headline

ROOT = Path(__file__).resolve().parents[2]


def summary(mean_s: float, n: int = 30, exact: float = 1.0, near: int = 0, defects: int = 0, **extra) -> dict:
    return {"n": n, "mean_s": mean_s, "exact_rate": exact, "near_ties": near, "defects": defects, **extra}


def cell(methods: dict, **env) -> dict:
    return {"target": "/cache/models/qwen2.5-coder-1.5b", "dataset": "apibank-l1", "order": list(methods),
            "methods": methods, "env": {"cpu": {"model": "AMD EPYC 9R14", "flags": ["avx2", "avx512f", "avx512_bf16"]},
                                        "threads": 2, "dtype": "bfloat16", **env}}


def test_the_readme_block_is_the_generated_table():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split(headline.BEGIN, 1)[1].split(headline.END, 1)[0].strip("\n")
    assert block == headline.block(ROOT, by="target"), "stale: python -m ooospec.eval.vllm.headline --write README.md"
    assert len(block.splitlines()) < 60


def test_the_transfer_reports_cells_are_every_session_s_generated_table():
    text = (ROOT / headline.ALL_CELLS_MD).read_text(encoding="utf-8")
    assert text == headline.block(ROOT, headline.CELLS) + "\n", \
        f"stale: python -m ooospec.eval.vllm.headline --all --out {headline.ALL_CELLS_MD}"
    assert len(headline.load_cells(ROOT, headline.CELLS)) > len(headline.load_cells(ROOT))


def test_a_row_holds_the_ratios_of_its_cell():
    row = headline.row(cell({"vllm": summary(6.0), "toolspec": summary(2.0, exact=0.9, near=3),
                             "ooospec": summary(2.5), "ooospec-dedicated": summary(1.6, defects=1),
                             "ooospec-oracle": summary(1.5), "llama.cpp": summary(4.0)}))
    assert row[:6] == ["epyc-avx512bf16, 2 threads", "bf16", "cold", "qwen2.5-coder-1.5b", "apibank-l1", 30]
    assert row[6:] == ["6.00", "3.00x", "2.00x", "0.80x shared", "1.25x", "4.00x", "117/120 · 3 · 1", "sidecar loses"]


def test_the_best_real_deployment_prefers_the_paired_ratio():
    methods = {"toolspec": summary(2.0), "ooospec": summary(2.2),
               "ooospec-wave-first": summary(1.9, paired_vs_toolspec=1.43)}
    assert headline.best_real(methods) == "1.43x wave-first"
    assert headline.best_real({"toolspec": summary(2.0)}) == "-"
    assert headline.verdict(methods) == "sidecar pays"
    assert headline.verdict({"toolspec": summary(2.0)}) == "toolspec only"
    assert headline.verdict({"toolspec": summary(2.0), "ooospec": summary(2.02)}) == "even"
    # the gate sent no wave: both arms drafted as toolspec, so a 1.10x paired ratio is noise, not a sidecar that pays
    idle = {"toolspec": summary(2.5), "ooospec-wave-first": summary(2.9, paired_vs_toolspec=1.10, waves_sent=0)}
    assert headline.best_real(idle) == "1.10x wave-first (0 waves)" and headline.verdict(idle) == "even (no wave)"
    # neither gate sent a wave: the paired ratio is shown, not the larger unpaired noise of the shared engine
    both = {**idle, "ooospec": summary(2.0, sidecar_waves=0)}
    assert headline.best_real(both) == "1.10x wave-first (0 waves)"
    # a deployment that sent waves comes first, even below a no-wave one's ratio
    sent = {**both, "ooospec": summary(2.6, sidecar_waves=3)}
    assert headline.best_real(sent) == "0.96x shared" and headline.verdict(sent) == "even"


def test_a_target_s_cells_merge_into_one_row_over_all_their_requests():
    one = cell({"vllm": summary(6.0), "toolspec": summary(2.0, exact=0.9, near=3),
                "ooospec-wave-first": summary(2.0, paired_toolspec_mean_s=2.2, paired_vs_toolspec=1.1, waves_sent=4),
                "llama.cpp": summary(4.0)}, warm_tools=True)
    two = {**cell({"vllm": summary(2.0, n=10), "toolspec": summary(1.0, n=10, defects=1),
                   "ooospec-wave-first": summary(1.0, n=10, paired_toolspec_mean_s=0.8, waves_sent=0)},
                  warm_tools=True), "dataset": "bfcl-simple-python"}
    cold = cell({"vllm": summary(5.0), "toolspec": summary(2.5)})
    merged, alone = headline.by_target([one, two, cold])
    assert alone is cold and merged["dataset"] == "apibank, bfcl"
    assert set(merged["methods"]) == {"vllm", "toolspec", "ooospec-wave-first"}     # llama.cpp ran in one only
    m = merged["methods"]
    assert m["vllm"]["n"] == 40 and m["vllm"]["mean_s"] == pytest.approx((30 * 6.0 + 10 * 2.0) / 40)
    assert (m["toolspec"]["near_ties"], m["toolspec"]["defects"]) == (3, 1)
    assert m["toolspec"]["exact_rate"] == pytest.approx(37 / 40)
    # the paired ratio: total toolspec-arm seconds over total wave-first seconds, not a mean of the two ratios
    assert m["ooospec-wave-first"]["paired_vs_toolspec"] == pytest.approx((30 * 2.2 + 10 * 0.8) / (30 * 2.0 + 10 * 1.0))
    assert m["ooospec-wave-first"]["waves_sent"] == 4
    row = headline.row(merged)
    assert row[4:7] == ["apibank, bfcl", 40, "5.00"] and row[7] == f"{200 / 70:.2f}x"
    # cells of another folder (another session) never merge with these
    assert len(headline.by_target([{**one, "source": "a"}, {**two, "source": "b"}])) == 2


def test_the_run_to_run_spread_compares_toolspec_on_two_engines():
    paired = cell({"vllm": summary(6.0), "toolspec": summary(2.0),
                   "ooospec-wave-first": summary(2.0, paired_toolspec_mean_s=2.5)})
    assert headline.engine_noise([cell({"toolspec": summary(2.0)})]) is None
    assert "moved by 20%-20% (median 20%) over 1 cells" in headline.engine_noise([paired])
    assert "run-to-run spread" in headline.findings([paired])


def test_quantized_weights_are_named_by_their_scheme():
    assert headline.weights({"dtype": "bfloat16", "quantization": {"scheme": "w8a8-rtn"}}) == "w8a8-rtn"
    assert headline.weights({"dtype": "float32"}) == "fp32"


def test_write_replaces_only_the_block(tmp_path, monkeypatch):
    (tmp_path / "eval/reports/transfer/vllm-full/epyc-avx512bf16").mkdir(parents=True)  # a folder of the README's cells
    (tmp_path / "eval/reports/transfer/vllm-full/epyc-avx512bf16/qwen2.5-coder-1.5b_apibank-l1_cold.json").write_text(
        json.dumps(cell({"vllm": summary(6.0), "toolspec": summary(2.0)})))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{headline.BEGIN}\nOLD-BLOCK\n{headline.END}\n\nafter\n")
    assert headline.main(["--root", str(tmp_path), "--write", str(readme)]) == 0
    text = readme.read_text()
    assert "OLD-BLOCK" not in text and text.endswith("after\n")
    assert "| epyc-avx512bf16, 2 threads | bf16 | cold |" in text
    assert "- `toolspec` x vLLM plain: 3.00-3.00x (median 3.00x) over 1 cells" in text      # the findings follow
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="no results block"):
        headline.main(["--root", str(tmp_path), "--write", str(readme)])
