#!/usr/bin/env bash
# Time the README's first command as a new user meets it: a fresh clone of this checkout, empty pip / llama.cpp-wheel
# / model caches (HOME and OOOSPEC_CACHE point at empty folders). Run it with the cores otherwise idle:
#   bash tests/manual/fresh_first_command.sh [WORKDIR]        (WORKDIR default /tmp/fresh-first; deleted first)
# Every output line is stamped with the seconds since the start. $OOOSPEC_DATASETS, when set, is kept (a local copy
# of the raw datasets instead of their 54 MiB download).
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${1:-/tmp/fresh-first}
rm -rf "$ROOT"; mkdir -p "$ROOT/home"
git clone -q "$SRC" "$ROOT/repo"
cd "$ROOT/repo"
# MEASURE_TRANSFER_VLLM=1: delete the clone's committed transfer_vllm cell, so the stage measures it as it does on any
# CPU but the one that measured it (there it keeps it)
[ -n "${MEASURE_TRANSFER_VLLM:-}" ] && rm -f eval/reports/transfer/vllm/*.json eval/reports/transfer/vllm/*.json.md
export HOME="$ROOT/home" OOOSPEC_CACHE="$ROOT/home/.cache/ooospec"
lscpu | grep -E "Model name"; lscpu | grep -o -E 'amx_bf16|avx512_bf16|avx512_vnni|avx2' | sort -u | tr '\n' ' '; echo
CMD=$(awk '/^# 1\. set up/{f=1;next} f&&/^#/{next} f&&/^$/{exit} f{printf "%s ", $0}' README.md | sed 's/\\ / /g')
echo "first command: $CMD"
start=$(date +%s)
# every line stamped with the seconds since the start, so the phases (pip, the llama.cpp build, vLLM's venv, each
# `dvc repro` stage) can be read off the log
bash -c "$CMD" 2>&1 | awk -v s="$start" '{ printf "[+%5ds] %s\n", systime() - s, $0; fflush() }'
rc=${PIPESTATUS[0]}
echo "FIRST_COMMAND rc=$rc seconds=$(( $(date +%s) - start ))"
