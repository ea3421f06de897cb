# Sourced by cpu_matrix.sh, cpu_quantized.sh and transfer_cells.sh: one llama.cpp greedy cell (`ooospec bench`, main venv), skipped
# when its JSON exists, written via .partial so an interrupted run leaves no finished-looking file.
#   llamacpp_cell TARGET BENCH CELL LIMIT [--warm-tools]      (BENCH_DIR, when set: the benchmarks' folder)
# (LLAMACPP_METHODS: the llama.cpp peers to run, default llama.cpp greedy; cpu_quantized.sh adds llama.cpp-pld)
llamacpp_cell() {
  local t=$1 b=$2 cell=$3 limit=$4 warm=${5:-}
  [ -f "$cell.llamacpp.json" ] && return 0
  .venv/bin/ooospec bench --target "$t" --backend llama.cpp --dataset "$b" ${BENCH_DIR:+--benchmark-dir "$BENCH_DIR"} \
    --limit "$limit" --methods "${LLAMACPP_METHODS:-llama.cpp}" \
    --threads 2 --max-new-tokens 128 --no-roofline $warm --out "$cell.llamacpp.json.partial" || return
  mv "$cell.llamacpp.json.partial" "$cell.llamacpp.json"
}
