#!/usr/bin/env bash
# Heap allocations per request on the route behind the Redis limiter,
# counted by valgrind's DHAT (which sees the system allocator only: build
# the "after" binary with `--no-default-features` to leave mimalloc out).
#
#   benches/http/allocs.sh BEFORE_BIN AFTER_BIN
#
# Each binary runs twice under DHAT, serving N1 and then N2 requests from
# one keep-alive connection (wrk -c1, bounded by count through its Lua
# script); (blocks(N2) - blocks(N1)) / (N2 - N1) is the per-request figure,
# free of start-up allocations. Starts its own redis-server on a free port
# and kills only what it started.
set -euo pipefail
before=$(realpath "$1"); after=$(realpath "$2")
n1=${N1:-300}; n2=${N2:-1300}
dir=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$dir/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
printf '[redis]\nurl = "redis://127.0.0.1:%s/"\n[ratelimit]\nstore = "redis"\nexempt_paths = []\nalgorithm = "gcra"\n[ratelimit.tiers.PUBLIC_IP]\nlimits = [{ limit = 100000000, window = "1m" }]\n' "$rport" >"$dir/levee.toml"

blocks() { # bin n -> total blocks allocated
  local bin=$1 n=$2 port; port=$(free_port)
  LEVEE_LISTEN="127.0.0.1:$port" LEVEE_LOG=warn valgrind --tool=dhat --dhat-out-file="$dir/dhat.out" \
    "$bin" serve --config "$dir/levee.toml" >"$dir/levee.log" 2>"$dir/valgrind.log" &
  local pid=$!; pids+=($pid)
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
  cat >"$dir/count.lua" <<LUA
local n = 0
request = function()
  n = n + 1
  if n > $n then wrk.thread:stop() end
  return wrk.format("GET", "/health")
end
LUA
  wrk -t1 -c1 -d120s -s "$dir/count.lua" "http://127.0.0.1:$port/health" >/dev/null 2>&1 || true
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  grep -oE 'Total: +[0-9,]+ bytes in [0-9,]+ blocks' "$dir/valgrind.log" | grep -oE '[0-9,]+ blocks' | tr -d ', blocks'
}

echo "| binary | blocks at N1=$n1 | blocks at N2=$n2 | allocations per request |"
echo "|---|---|---|---|"
for bin in "$before" "$after"; do
  a=$(blocks "$bin" "$n1"); b=$(blocks "$bin" "$n2")
  awk -v bin="$(basename "$(dirname "$(dirname "$(dirname "$bin")")")")/$(basename "$bin")" -v a="$a" -v b="$b" -v n1="$n1" -v n2="$n2" \
    'BEGIN { printf "| %s | %d | %d | %.1f |\n", bin, a, b, (b-a)/(n2-n1) }'
done
