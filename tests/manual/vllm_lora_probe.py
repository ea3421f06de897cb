"""Does vLLM's own LoRA path answer on the CPU backend, in process? (Not a test: a probe, run by hand.)

    .venv-vllm/bin/python tests/manual/vllm_lora_probe.py [adapters/sidecar]

Loads the registry's qwen2.5-coder-0.5b with ``enable_lora=True`` and times one greedy request of 8 tokens on the
base, then two with the shipped adapter as a ``LoRARequest``; a hang ends the probe after 240 s with every thread's
stack (faulthandler). The sidecar's vLLM engine does not need this path (it runs the adapter merged into its base:
``runtime/sidecar/lora.py``); this probe tells whether vLLM's LoRA itself answers here.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from pathlib import Path

faulthandler.dump_traceback_later(240, exit=True)
for key, value in {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "2",
                   "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(key, value)

from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

adapter = str(Path(sys.argv[1] if len(sys.argv) > 1 else "adapters/sidecar").resolve())
model = Path.home() / ".cache/ooospec/models/qwen2.5-coder-0.5b/hf"
t0 = time.perf_counter()
llm = LLM(model=str(model), dtype="bfloat16", max_model_len=2048, enable_lora=True, max_lora_rank=16, max_loras=1,
          seed=0)
print(f"init {time.perf_counter() - t0:.1f} s", flush=True)
params = SamplingParams(temperature=0.0, max_tokens=8)
for name, lora in (("base", None), ("lora", LoRARequest("sidecar", 1, adapter)),
                   ("lora again", LoRARequest("sidecar", 1, adapter))):
    t0 = time.perf_counter()
    out = llm.generate(["def add(a, b):"], params, lora_request=lora, use_tqdm=False)
    print(f"{name}: {time.perf_counter() - t0:.2f} s {out[0].outputs[0].text!r}", flush=True)
