"""``ooospec sidecar predict`` and ``serve`` (through :func:`launch_sidecar`) on a tiny adapter saved in the test."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from ooospec import cli
from ooospec.runtime import sidecar_prompts as sp
from ooospec.runtime.formats import hermes
from ooospec.runtime.sidecar import Sidecar
from ooospec.runtime.sidecar_client import SidecarClient
from ooospec.runtime.sidecar_process import health, launch_sidecar
from ooospec.sidecar_cli import predict_records
from tests.pipelines.sidecar_tiny import byte_tokenizer, save_tiny_base, tiny_llama

RECORDS = Path(__file__).resolve().parent / "fixtures" / "train_records.jsonl"


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    """A LoRA adapter folder (non-identity init) on a tiny Llama base, with sidecar.json and the tokenizer."""
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("sidecar")
    base = save_tiny_base(root / "base")
    model = get_peft_model(tiny_llama(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                    init_lora_weights=False))
    out = root / "adapter"
    model.save_pretrained(out)
    byte_tokenizer().save_pretrained(out)
    (out / "sidecar.json").write_text(json.dumps({"layout_version": sp.LAYOUT_VERSION, "base": str(base)}))
    return out


def test_predict_writes_one_row_per_record(adapter, tmp_path, monkeypatch):
    bench = tmp_path / "data" / "dedupe" / "eval"
    bench.mkdir(parents=True)
    shutil.copy(RECORDS, bench / "tiny-bench.jsonl")
    monkeypatch.chdir(tmp_path)                        # a benchmark name resolves under data/dedupe/eval
    out = tmp_path / "preds" / "p.jsonl"
    assert cli.main(["sidecar", "predict", "--adapter", str(adapter), "--dataset", "tiny-bench", "--out", str(out),
                     "--threads", "1", "--limit", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    records = [json.loads(line) for line in RECORDS.read_text().splitlines()][:2]
    assert [r["id"] for r in rows] == [r["id"] for r in records]
    for row, rec in zip(rows, records):
        assert list(row) == ["id", "call", "direct_call", "wave_s", "prefill_s", "decode_s", "n_queries",
                             "block_tokens", "cached_tokens"]
        assert row["cached_tokens"] == 0 < row["block_tokens"]            # no cache unless asked
        assert row["n_queries"] == len(sp.build_wave(rec["messages"], rec["tools"], with_direct_call=True).queries)
        assert row["wave_s"] == pytest.approx(row["prefill_s"] + row["decode_s"])
        for call in (row["call"], row["direct_call"]):
            assert call is None or set(call) == {"name", "arguments"}
    again = list(predict_records(Sidecar.from_adapter(adapter, threads=1), records))
    assert [(r["call"], r["direct_call"]) for r in again] == [(r["call"], r["direct_call"]) for r in rows]


def test_predict_with_warm_tools_starts_each_wave_from_its_toolbox(adapter, tmp_path, capsys):
    records = [json.loads(line) for line in RECORDS.read_text().splitlines()][:3]
    tools_first = shutil.copytree(adapter, tmp_path / "tools_first")
    meta = json.loads((tools_first / "sidecar.json").read_text())
    (tools_first / "sidecar.json").write_text(json.dumps({**meta, "layout_version": 3}))
    adapter = tools_first
    sidecar = Sidecar.from_adapter(adapter, threads=1)
    assert sidecar.layout == 3
    cold = list(predict_records(sidecar, records))
    from ooospec.runtime.session import PrefixCache

    sidecar.prefix_cache = PrefixCache(max_tokens=50_000)
    warm = list(predict_records(sidecar, records, warm_tools=True))
    assert [(r["call"], r["direct_call"]) for r in warm] == [(r["call"], r["direct_call"]) for r in cold]
    tok = byte_tokenizer()
    for row, rec in zip(warm, records):   # the toolbox block (no turn yet) is what every wave starts from
        toolbox = sp.shared_block([], rec["tools"], layout=3)
        block = sp.shared_block(rec["messages"], rec["tools"], layout=3)
        shared = len(tok(os.path.commonprefix([toolbox, block]), add_special_tokens=False)["input_ids"])
        assert row["block_tokens"] > row["cached_tokens"] >= shared - 1 > 0
    out = tmp_path / "p.jsonl"
    assert cli.main(["sidecar", "predict", "--adapter", str(adapter), "--dataset", str(RECORDS), "--out", str(out),
                     "--threads", "1", "--limit", "2", "--prefix-cache-tokens", "4096", "--warm-tools"]) == 0
    assert "median prefill" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--warm-tools"):
        cli.main(["sidecar", "predict", "--adapter", str(adapter), "--dataset", str(RECORDS), "--out", str(out),
                  "--warm-tools"])


def test_predict_names_a_missing_dataset(adapter, tmp_path):
    with pytest.raises(SystemExit, match="no-such-bench"):
        cli.main(["sidecar", "predict", "--adapter", str(adapter), "--dataset", "no-such-bench",
                  "--out", str(tmp_path / "p.jsonl")])


@pytest.mark.slow
def test_launch_serves_the_adapter_and_stops(adapter, tmp_path):
    rec = json.loads(RECORDS.read_text().splitlines()[0])
    with launch_sidecar(adapter, threads=1, cpus=[0], startup_timeout=180, log_path=tmp_path / "s.log") as proc:
        h = health(proc.url)
        assert (h["layout_version"], h["threads"]) == (sp.LAYOUT_VERSION, 1)
        if os.sched_getaffinity(0) == set(range(os.cpu_count())):   # no outside pin (a taskset loop) overrides ours
            assert h["cpus"] == [0]
        req = SidecarClient(proc.url, max_tokens=6).submit(rec["messages"], rec["tools"], fmt=hermes,
                                                             tokenizer=byte_tokenizer())
        req.wait(120)
        st = req.stats()
        # the server answers exactly what the same adapter answers in process (greedy, fp32, 6 tokens per slot)
        in_process = Sidecar.from_adapter(adapter, threads=1, max_new_tokens=6)
        expected, _ = in_process.predict(rec["messages"], rec["tools"])
        if expected is None:
            assert (st.error, st.call) == ("no_call", None), (st.error_detail, proc.log_tail())
        else:
            assert (st.error, st.call) == (None, expected), (st.error_detail, proc.log_tail())
        assert st.server["shared_block"] and st.server["n_forwards"] <= 6
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal (exit status -15)
    assert proc.popen.returncode in (0, -signal.SIGTERM) and health(proc.url) is None
    assert "Traceback" not in proc.log_tail(100_000)
