"""Is a vllm-bench mismatch the drafter's doing or the engine's own numerics? (pytest does not collect this; it needs
.venv-vllm)::

    .venv-vllm/bin/python tests/manual/vllm_mismatch_probe.py CELL.json MODEL_DIR RECORD_ID

For one request where a drafting method's tokens part from vLLM plain's, the same engine with no drafter computes the
first differing position four ways: plain's own output scored in one prefill forward (``prompt_logprobs``), and
greedy decoding resumed after prefilling the prefix up to 0, 4 and 16 tokens before that position. If any of them
picks the drafting method's token, plain's choice there depends on how the prefix was batched, whatever drafts:
the engine's batch-shape numerics, not the drafter, made the difference. Prints one ``PROBE {...}`` JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(cell: str, model: str, rid: str) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from ooospec.eval.bench.data import load_examples, prompt_ids_of
    from ooospec.runtime.backends.hardware import vllm_cpu_env
    from ooospec.runtime.formats import detect_format
    from ooospec.runtime.paths import resolve_benchmark

    vllm_cpu_env(2)
    data = json.loads(Path(cell).read_text())
    rows = {(e["method"], e["record_id"]): e for e in data["examples"]}
    plain = rows[("vllm", rid)]
    other = next(e for (m, r), e in rows.items() if r == rid and m != "vllm" and not e.get("exact", True))
    tok = AutoTokenizer.from_pretrained(model)
    record = next(r for r in load_examples(resolve_benchmark(data["dataset"], None)) if r["id"] == rid)
    prompt = prompt_ids_of(record, tok, detect_format(tok))
    a, b = plain["tokens"], other["tokens"]
    pos = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
    llm = LLM(model=model, tokenizer=model, dtype="bfloat16", max_model_len=4096, enable_prefix_caching=False,
              max_num_seqs=1, seed=0)

    def top2(logprobs) -> dict:
        return {tok.decode([k]): round(v.logprob, 4) for k, v in logprobs.items()}

    out = {"position": pos, "plain_token": tok.decode([a[pos]]), "method": other["method"],
           "method_token": tok.decode([b[pos]])}
    scored = llm.generate([TokensPrompt(prompt_token_ids=prompt + a[:pos + 1])],
                          SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    out["one_forward_at_pos"] = top2(scored.prompt_logprobs[len(prompt) + pos])
    for cut in (pos, pos - 4, pos - 16):
        done = llm.generate([TokensPrompt(prompt_token_ids=prompt + a[:cut])],
                            SamplingParams(temperature=0, max_tokens=pos - cut + 1, logprobs=2), use_tqdm=False)[0]
        out[f"prefill_to_{cut}_then_decode"] = top2(done.outputs[0].logprobs[-1])
    return out


if __name__ == "__main__":
    print("PROBE", json.dumps(main(*sys.argv[1:4]), ensure_ascii=False))
