"""Would int8 linear layers make the sidecar's wave cheaper without changing its answers? (pytest does not collect
this; it needs ``pip install torchao==0.18.0`` for the weight-only variant)::

    dvc repro expand_slots                      # data/slots/heldout.jsonl (and data/dedupe/train.jsonl)
    python tests/manual/sidecar_int8.py --n 30 [--adapter adapters/sidecar] [--threads 2]

Answers the first call of ``--n`` heldout requests (sorted ids) with the adapter in bf16 (the reference), then with
int8 weight-only linear layers (torchao ``Int8WeightOnlyConfig`` on the bf16 model, the head kept) and with torch's
dynamic int8 quantization (int8 weights and activations, fp32 model), and prints per variant the median wave and
prefill seconds and the share of answers equal to bf16's. The project keeps a variant only at >= 99% equal answers
and a cheaper wave.
"""

from __future__ import annotations

import argparse
import json
import statistics
import warnings

import torch

from ooospec.runtime.sidecar import prompts as sp
from ooospec.runtime.sidecar.wave import Sidecar

VARIANTS = ("bf16", "bf16+int8-weight-only", "fp32+int8-dynamic")


def load(variant: str, adapter: str, threads: int) -> Sidecar:
    sc = Sidecar.from_adapter(adapter, threads=threads, dtype="fp32" if variant.startswith("fp32") else "bf16")
    if variant == "bf16+int8-weight-only":
        from torchao.quantization import Int8WeightOnlyConfig, quantize_

        quantize_(sc.model, Int8WeightOnlyConfig(),
                  filter_fn=lambda m, name: isinstance(m, torch.nn.Linear) and "lm_head" not in name)
    elif variant == "fp32+int8-dynamic":
        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # torch.ao.quantization is deprecated
            sc.model.model = quantize_dynamic(sc.model.model, {torch.nn.Linear}, dtype=torch.qint8)
    return sc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heldout", default="data/slots/heldout.jsonl")
    ap.add_argument("--records", default="data/dedupe/train.jsonl")
    ap.add_argument("--adapter", default="adapters/sidecar")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with open(args.heldout, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    ids = sorted({r["record_id"] for r in rows if r["id"].endswith("#0")})[: args.n]
    wanted, recs = set(ids), {}
    with open(args.records, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["id"] in wanted:
                recs[rec["id"]] = rec
    recs = [recs[i] for i in ids]
    answers: dict[str, list[list[str]]] = {}
    for variant in VARIANTS:
        sc = load(variant, args.adapter, args.threads)
        sc.answer(sp.build_wave(recs[0]["messages"], recs[0]["tools"], layout=sc.layout))   # warm-up
        waves, prefills, answers[variant] = [], [], []
        for rec in recs:
            res = sc.answer(sp.build_wave(rec["messages"], rec["tools"], layout=sc.layout))
            answers[variant].append(res.answers)
            waves.append(res.wave_s)
            prefills.append(res.prefill_s)
        ref = answers[VARIANTS[0]]
        same = sum(a == b for ra, va in zip(ref, answers[variant]) for a, b in zip(ra, va))
        total = sum(map(len, ref))
        print(f"{variant}: {len(recs)} heldout requests, median wave {statistics.median(waves):.3f} s, prefill "
              f"{statistics.median(prefills):.3f} s; {same}/{total} answers equal to bf16 ({same / total:.1%})",
              flush=True)


if __name__ == "__main__":
    main()
