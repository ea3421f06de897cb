"""``ooospec sidecar predict`` and ``serve`` (through :func:`launch_sidecar`) on a tiny adapter saved in the test."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from ooospec import cli
from ooospec.runtime import schemas
from ooospec.runtime.formats import hermes
from ooospec.runtime.sidecar import engines
from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar import protocol as sw
from ooospec.runtime.sidecar.client import SidecarClient
from ooospec.runtime.sidecar.gate_decision import query_name
from ooospec.runtime.sidecar.process import health, launch_sidecar
from ooospec.runtime.sidecar.wave import Sidecar
from ooospec.sidecar_cli import cost_line, predict_records
from tests.pipelines.sidecar_tiny import byte_tokenizer, save_tiny_base, tiny_llama
from tests.runtime.sidecar_servers import MESSAGES
from tests.runtime.sidecar_servers import TOOLS as SERVER_TOOLS

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
                             "block_tokens", "cached_tokens", "index_s", "functions", "answers"]
        assert row["cached_tokens"] == 0 < row["block_tokens"]            # no cache unless asked
        wave = sp.build_wave(rec["messages"], rec["tools"], with_direct_call=True)
        assert row["n_queries"] == len(wave.queries) == len(row["answers"])
        assert list(row["answers"]) == [query_name(q) for q in wave.queries]
        assert row["index_s"] is None and row["functions"] is None
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
    from ooospec.runtime.agent.session import PrefixCache

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


# ------------------------------------------------------------------------------------------ function-first, no model

NEWS = {"type": "function", "function": {"name": "get_news", "parameters": {
    "type": "object", "properties": {"topic": {"type": "string"}}}}}
TOOLS = [*SERVER_TOOLS, NEWS]
ANSWERS = {"Query: tool index": "0", "Query: get_weather.city": '"Paris"', "Query: get_weather.unit": '"kelvin"',
           "Query: get_news.topic": '"rain"', "Query: get_time.tz": '"UTC"',
           "Query: call": '{"name":"get_weather","arguments":{"city":"Lyon"}}'}


class FakeSidecar:
    """Answers each query by its line, 0.5 s a wave; ``top`` is the index answer's first token's top logprobs."""

    layout = sp.LAYOUT_VERSION

    def __init__(self, top=None):
        self.top, self.waves, self.kwargs = top, [], []

    def answer(self, wave, **kw):
        self.waves.append(wave)
        self.kwargs.append(kw)
        top = [[self.top]] if kw.get("logprobs") and self.top is not None else None
        return SimpleNamespace(answers=[ANSWERS.get(q.text.strip(), "null") for q in wave.queries], wave_s=0.5,
                               prefill_s=0.375, decode_s=0.125, block_tokens=100,
                               cached_tokens=90 if len(self.waves) > 1 else 0, top_logprobs=top)


def test_predict_function_first_asks_the_candidates_arguments_only():
    sidecar = FakeSidecar({"0": math.log(0.6), " 2": math.log(0.3), "1": math.log(0.05)})
    [row] = predict_records(sidecar, [{"id": "r", "messages": MESSAGES, "tools": TOOLS}], wave="function-first",
                            top_k=3, min_prob=0.1)
    assert sidecar.kwargs == [{"logprobs": 5, "max_new_tokens": 1}, {}]
    assert sidecar.waves == [sw.index_wave(MESSAGES, TOOLS),
                             sw.argument_wave(MESSAGES, TOOLS, ["get_weather", "get_news"], with_direct_call=True)]
    assert row == {"id": "r", "call": {"name": "get_weather", "arguments": {"city": "Paris"}},   # kelvin: no enum
                   "direct_call": {"name": "get_weather", "arguments": {"city": "Lyon"}},
                   "wave_s": 1.0, "prefill_s": 0.75, "decode_s": 0.25, "n_queries": 5, "block_tokens": 200,
                   "cached_tokens": 90, "index_s": 0.5, "functions": ["get_weather", "get_news"],
                   "answers": {"index": "0", "get_weather.city": '"Paris"', "get_weather.unit": '"kelvin"',
                               "get_news.topic": '"rain"', "call": ANSWERS["Query: call"]}}
    assert cost_line([row]) == "median prefill 0.750 s, wave 1.000 s, block 200 tokens, 45% of them cached (1 records)"


@pytest.mark.parametrize("top_k, top, functions", [(1, {"2": -0.1}, ["get_weather"]),     # no logprobs asked
                                                   (2, None, ["get_weather"]),            # none given
                                                   (2, "garbage", ["get_weather"])])
def test_predict_function_first_falls_back_to_the_greedy_function(top_k, top, functions):
    sidecar = FakeSidecar(top)
    [row] = predict_records(sidecar, [{"id": "r", "messages": MESSAGES, "tools": TOOLS}], wave="function-first",
                            top_k=top_k)
    assert row["functions"] == functions and list(row["answers"]) == ["index", "get_weather.city",
                                                                      "get_weather.unit", "call"]
    assert sidecar.kwargs[0] == {"logprobs": 5 if top_k > 1 else 0, "max_new_tokens": 1}


def test_predict_cli_passes_wave_and_engine(monkeypatch, tmp_path, capsys):
    made = []

    def from_adapter(adapter, **kw):
        made.append(kw)
        return FakeSidecar()

    monkeypatch.setattr(engines, "load_sidecar", from_adapter)
    out = tmp_path / "p.jsonl"
    base = ["sidecar", "predict", "--adapter", str(tmp_path), "--dataset", str(RECORDS), "--out", str(out),
            "--limit", "2"]
    assert cli.main([*base, "--wave", "function-first", "--engine", "llama.cpp", "--top-k", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["index_s"] == 0.5 and len(r["functions"]) == 1 for r in rows)
    assert cli.main(base) == 0
    assert made == [{"threads": None, "dtype": "auto", "engine": engine, "gpu_memory": None}
                    for engine in ("llama.cpp", "auto")]
    assert "median prefill" in capsys.readouterr().out
    for bad in (["--top-k", "0"], ["--min-prob", "2"]):
        with pytest.raises(SystemExit, match="top_k|min_prob"):
            cli.main([*base, "--wave", "function-first", *bad])


def test_serve_cli_passes_the_engine(monkeypatch):
    from ooospec.runtime.serve import sidecar_app

    calls = []
    monkeypatch.setattr(sidecar_app, "serve", lambda adapter, **kw: calls.append(kw))
    assert cli.main(["sidecar", "serve", "--engine", "llama.cpp", "--no-calibrate"]) == 0
    assert cli.main(["sidecar", "serve"]) == 0
    assert cli.main(["sidecar", "serve", "--engine", "vllm", "--gpu-memory", "0.15"]) == 0
    assert [(c["engine"], c["gpu_memory"]) for c in calls] == [("llama.cpp", None), ("auto", None), ("vllm", 0.15)]


def test_a_gpu_share_outside_0_1_is_refused_before_anything_loads():
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="gpu_memory"):
            engines.load_sidecar(None, engine="vllm", gpu_memory=bad)


def test_the_cli_offers_the_runtimes_engines():
    from ooospec import sidecar_cli
    from ooospec.runtime.sidecar.engines import ENGINE_CHOICES

    assert sidecar_cli.ENGINE_CHOICES is ENGINE_CHOICES       # one spelling, read by the CLI without torch


def test_predict_function_first_on_the_tiny_adapter(adapter, tmp_path):
    out = tmp_path / "p.jsonl"
    assert cli.main(["sidecar", "predict", "--adapter", str(adapter), "--dataset", str(RECORDS), "--out", str(out),
                     "--threads", "1", "--limit", "2", "--wave", "function-first", "--top-k", "3",
                     "--min-prob", "0"]) == 0
    records = [json.loads(line) for line in RECORDS.read_text().splitlines()][:2]
    for row, rec in zip((json.loads(line) for line in out.read_text().splitlines()), records):
        names = [schemas.tool_name(t) for t in rec["tools"]]
        second = sw.argument_wave(rec["messages"], rec["tools"], row["functions"], with_direct_call=True)
        assert 0 < row["index_s"] <= row["wave_s"] == pytest.approx(row["prefill_s"] + row["decode_s"])
        assert set(row["functions"]) <= set(names) and len(row["functions"]) <= 3
        assert list(row["answers"]) == ["index", *(query_name(q) for q in second.queries)]
        assert row["n_queries"] == 1 + len(second.queries)
        assert len(row["answers"]["index"].encode()) <= 4            # one byte a token: the index wave's 4 tokens
        assert row["call"] is None or row["call"]["name"] == row["functions"][0]
