#!/usr/bin/env bash
# Time the README's first command as a new user meets it: a fresh clone of this checkout, empty pip / llama.cpp-wheel
# / model caches (HOME and OOOSPEC_CACHE point at empty folders). Run it with the cores otherwise idle:
#   bash tests/manual/fresh_first_command.sh [WORKDIR]        (WORKDIR default /tmp/fresh-first; deleted first)
# $OOOSPEC_DATASETS, when set, is kept (a local copy of the raw datasets instead of their 54 MiB download).
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=${1:-/tmp/fresh-first}
rm -rf "$ROOT"; mkdir -p "$ROOT/home"
git clone -q "$SRC" "$ROOT/repo"
cd "$ROOT/repo"
export HOME="$ROOT/home" OOOSPEC_CACHE="$ROOT/home/.cache/ooospec"
lscpu | grep -E "Model name"; lscpu | grep -o -E 'amx_bf16|avx512_bf16|avx512_vnni|avx2' | sort -u | tr '\n' ' '; echo
CMD=$(awk '/^# 1\. set up/{f=1;next} f&&/^#/{next} f&&/^$/{exit} f{printf "%s ", $0}' README.md | sed 's/\\ / /g')
echo "first command: $CMD"
start=$(date +%s)
bash -c "$CMD"
rc=$?
echo "FIRST_COMMAND rc=$rc seconds=$(( $(date +%s) - start ))"
