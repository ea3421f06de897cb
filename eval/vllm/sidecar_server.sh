# Sourced by the bench scripts here: start_sidecar BIN LOG PORT [ooospec sidecar serve ARGS...] starts a sidecar server
# from BIN (a venv's bin folder) in the background, logs to LOG, stops it when the script exits, and returns once
# its /health answers (exits when the server dies first, or after 900 s).
start_sidecar() {
  local bin=$1 log=$2 port=$3
  shift 3
  "$bin/ooospec" sidecar serve --port "$port" "$@" > "$log" 2>&1 &
  SIDECAR_PID=$!
  trap 'kill $SIDECAR_PID 2>/dev/null; wait $SIDECAR_PID 2>/dev/null || true' EXIT
  for _ in $(seq 900); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
    kill -0 $SIDECAR_PID 2>/dev/null || { echo "the sidecar server exited; see $log" >&2; exit 1; }
    sleep 1
  done
  echo "the sidecar server did not answer http://127.0.0.1:$port/health in 900 s; see $log" >&2
  exit 1
}
