#!/usr/bin/env bash
# CPU per request of the gateway, read from /proc/<pid>/stat, over a fixed
# wrk run on loopback. Compares two binaries in the same session, case by
# case, interleaved (A, B, A, B …) so machine noise hits both alike.
#
#   benches/http/cpu.sh BEFORE_BIN AFTER_BIN [SECONDS] [ROUNDS]
#
# Cases: /health with no limiter; /health behind the Redis limiter
# (exempt_paths = [], limit far above the load) for each algorithm; a chat
# refused by an open LLM breaker (forced open through the admin API); the
# embedded chat (built-in retrieval and answerer).
#
# Starts its own redis-server on a free port and kills only the processes it
# started (by PID). Traffic goes to 127.0.0.1 only and stops by itself.
set -euo pipefail
before=$(realpath "$1"); after=$(realpath "$2")
secs=${3:-8}; rounds=${4:-2}
dir=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
hz=$(getconf CLK_TCK)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$dir/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done

cat >"$dir/chat.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"message":"What is the PTO policy?","user_id":"u1","thread_id":"t1"}'
LUA

config() { # case -> toml
  local case=$1
  case $case in
    health) printf '[ratelimit]\nenabled = false\n' ;;
    limited-*)
      printf '[redis]\nurl = "redis://127.0.0.1:%s/"\n[ratelimit]\nstore = "redis"\nexempt_paths = []\nalgorithm = "%s"\n' "$rport" "${case#limited-}"
      printf '[ratelimit.tiers.PUBLIC_IP]\nlimits = [{ limit = 100000000, window = "1m" }]\n' ;;
    breaker-open)
      # An LLM URL makes a breaker exist; the admin API forces it open.
      printf '[llm]\nurl = "http://127.0.0.1:9/v1"\n[ratelimit]\nenabled = false\n' ;;
    chat) printf '[ratelimit]\nenabled = false\n' ;;
  esac
}

run_case() { # bin case -> "us_per_req req_per_s"
  local bin=$1 case=$2 port; port=$(free_port)
  config "$case" >"$dir/$case.toml"
  LEVEE_LISTEN="127.0.0.1:$port" LEVEE_ADMIN_TOKEN=bench LEVEE_LOG=warn \
    "$bin" serve --config "$dir/$case.toml" >"$dir/levee.log" 2>&1 &
  local pid=$!; pids+=($pid)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  local url="http://127.0.0.1:$port/health" script=()
  case $case in
    breaker-open)
      curl -sf -X POST -H 'authorization: Bearer bench' "http://127.0.0.1:$port/admin/breakers/llm/force_open" >/dev/null
      url="http://127.0.0.1:$port/v1/chat"; script=(-s "$dir/chat.lua") ;;
    chat) url="http://127.0.0.1:$port/v1/chat"; script=(-s "$dir/chat.lua") ;;
  esac
  wrk -t2 -c64 -d1s "${script[@]}" "$url" >/dev/null 2>&1 # warm-up
  local t0; t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
  local out; out=$(wrk -t2 -c64 -d"${secs}s" "${script[@]}" "$url")
  local t1; t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  local n; n=$(echo "$out" | awk '/requests in/ {print $1}')
  local non2xx; non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
  local rps; rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  awk -v t0="$t0" -v t1="$t1" -v hz="$hz" -v n="$n" -v rps="$rps" -v bad="${non2xx:-0}" \
    'BEGIN { printf "%.1f %.0f %d %d\n", (t1-t0)/hz*1e6/n, rps, n, bad }'
}

cases=(health limited-gcra limited-sliding_log limited-sliding_window limited-fixed_window breaker-open chat)
[ -n "${CASES:-}" ] && read -r -a cases <<<"$CASES"
echo "| case | before µs/req | after µs/req | after/before | before req/s | after req/s | requests (before, after) | non-2xx (before, after) |"
echo "|---|---|---|---|---|---|---|---|"
for case in "${cases[@]}"; do
  bs=(); as=()
  for _ in $(seq "$rounds"); do
    bs+=("$(run_case "$before" "$case")"); as+=("$(run_case "$after" "$case")")
  done
  # Median-free with 2 rounds: report the lower CPU figure of each (the
  # least disturbed run) and its throughput.
  b=$(printf '%s\n' "${bs[@]}" | sort -n | head -1); a=$(printf '%s\n' "${as[@]}" | sort -n | head -1)
  read -r bu br bn bx <<<"$b"; read -r au ar an ax <<<"$a"
  awk -v c="$case" -v bu="$bu" -v au="$au" -v br="$br" -v ar="$ar" -v bn="$bn" -v an="$an" -v bx="$bx" -v ax="$ax" \
    'BEGIN { printf "| %s | %.1f | %.1f | %.2f | %d | %d | %d, %d | %d, %d |\n", c, bu, au, au/bu, br, ar, bn, an, bx, ax }'
done
