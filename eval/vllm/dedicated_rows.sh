#!/usr/bin/env bash
# The sidecar's two deployments on one CPU box, inside vLLM: `ooospec` (the sidecar server shares the target's cores)
# and `ooospec-dedicated` (EMULATED: each request's wave is timed alone on the same server first, then vLLM runs the
# target with that wave's hints released at the measured latency: a device of its own as fast as this CPU), beside
# vLLM plain and `toolspec`, with the toolbox warm (prefix caching on, each request's system + tools block cached in
# vLLM and in the sidecar) or, CACHE=cold, cold (prefix caching off; the sidecar forgets every block before each wave).
# `ooospec`'s waves go through the proposer's wave gate for the shared deployment (GATE=off sends every wave).
# METHODS may add `ooospec-wave-first` (REAL on the same cores: each request's wave first, inside its time, then the
# target with its hints; GATE other than off gates its waves at the client) and ADD="--add --paired" times each of its
# requests as `toolspec` on the same engine too (eval/reports/vllm/wave-first/); WARMUP=N lets its gate learn from N
# untimed requests first (a seeded random N of those after the LIMIT timed ones).
# ENGINE picks the sidecar server's engine (transformers, or vllm: served from .venv-vllm; then keep `ooospec` out of
# METHODS: two vLLM engines spinning on the same 2 cores measure nothing but the contention).
# BENCH_DIR reads BENCHES from another folder than data/dedupe/eval (your own held-out requests: data/own_toolbox/dedupe/eval, eval/reports/own-calls/).
#   bash eval/vllm/dedicated_rows.sh   # TARGETS / BENCHES / BENCH_DIR / LIMIT / WAVE / GATE / WARMUP / ADAPTER / OUT / METHODS / ENGINE / CACHE
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-eval/reports/vllm/dedicated}
TARGETS=${TARGETS:-"qwen2.5-coder-0.5b qwen2.5-coder-1.5b"}
BENCHES=${BENCHES:-"apibank-l1"}
LIMIT=${LIMIT:-30}
WAVE=${WAVE:-function-first}
PORT=${PORT:-8765}
THREADS=${THREADS:-2}
ADAPTER=${ADAPTER:-adapters/sidecar}
GATE=${GATE:-shared}
METHODS=${METHODS:-vllm,toolspec,ooospec,ooospec-dedicated}
ENGINE=${ENGINE:-transformers}
CACHE=${CACHE:-warm}
case "$CACHE" in
  warm) CACHE_FLAG=--warm-tools ;;
  cold) CACHE_FLAG= ;;
  *) echo "CACHE must be warm or cold, got $CACHE" >&2; exit 1 ;;
esac
SIDECAR_VENV=.venv
[ "$ENGINE" = vllm ] && SIDECAR_VENV=.venv-vllm
WARMUP=${WARMUP:-0}
WARMUP_FLAG=
[ "$WARMUP" != 0 ] && WARMUP_FLAG="--gate-warmup $WARMUP"
ADD=${ADD:-}                   # ADD=--add: only METHODS, added to (replacing in) an existing results file
BENCH_DIR_FLAG=
[ -n "${BENCH_DIR:-}" ] && BENCH_DIR_FLAG="--benchmark-dir $BENCH_DIR"
mkdir -p "$OUT"
if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then
  echo "port $PORT already serves something (an earlier sidecar still shutting down?): stop it or set PORT" >&2
  exit 1
fi
source eval/vllm/sidecar_server.sh
start_sidecar "$SIDECAR_VENV/bin" "$OUT/sidecar_server.log" "$PORT" --adapter "$ADAPTER" --threads "$THREADS" --dtype "${SIDECAR_DTYPE:-auto}" \
  --engine "$ENGINE"
curl -sf "http://127.0.0.1:$PORT/health"; echo
for t in $TARGETS; do
  for b in $BENCHES; do
    .venv-vllm/bin/ooospec vllm-bench --target "$t" --dataset "$b" $BENCH_DIR_FLAG --limit "$LIMIT" $CACHE_FLAG \
      --methods "$METHODS" $ADD --sidecar-url "http://127.0.0.1:$PORT" --sidecar-gate "$GATE" $WARMUP_FLAG \
      --sidecar-wave "$WAVE" --threads "$THREADS" --max-new-tokens 128 --out "$OUT/${t}_${b}_${CACHE}.json"
  done
done
echo DEDICATED_ROWS_DONE
