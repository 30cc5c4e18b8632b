#!/usr/bin/env bash
# Latency the gateway adds in front of an OpenAI-compatible LLM, measured the
# way TensorZero and LiteLLM publish it: the same open-loop schedule of chat
# completions sent straight to the upstream simulator and through
# `levee serve` to that same simulator, interleaved (direct, gateway, direct,
# gateway) at fixed rates, in one run. Prints a Markdown table to stdout.
#
#   benches/openai/overhead.sh [RATES] [DURATION]
#   benches/openai/overhead.sh 500,1000,2000 10s      # the defaults
#   benches/openai/overhead.sh --rates 500,1000 --duration 5s
#
# Environment: STREAM=0 skips streaming (on by default), WARMUP (2s),
# JSON=FILE also writes levee-overhead's JSON there, LLM_MAX_CONCURRENT
# (1024) the gateway's LLM bulkhead and so its fair-queue capacity,
# CONNECTIONS (100) the most requests in flight per target (0: unbounded).
#
# The simulator answers instantly (no added latency, unlimited capacity).
# The gateway runs without Redis: its rate limits sit on the in-process
# store, far above the load, so every request pays for the limiter but none
# is rate limited. The LLM bulkhead (and with it the fair queue's capacity,
# which defaults to it) is raised from 32 to LLM_MAX_CONCURRENT: the
# simulator has no capacity limit, and on a small shared machine a stall of
# the load generator or the gateway of a few tens of ms puts more than
# 32 + 64 (the per-tenant queue) streams in flight at 2,000 req/s, so the
# default refuses some with 429 `tenant_queue_full` -- the protection
# working, not overhead. LLM_MAX_CONCURRENT=32 measures the defaults.
# Everything else (breaker, retries, fair queue, limiter) keeps its
# defaults, and what it refuses shows in the errors column.
#
# Starts both processes on free loopback ports, kills only those two PIDs
# on exit; traffic goes to 127.0.0.1 only and stops by itself.
#
# The client keeps at most CONNECTIONS requests in flight per target (a
# request whose time has come waits for a free connection, and the wait
# counts in its latency), like wrk2's -c. Unbounded, a stall of some tens
# of ms (this machine is shared) makes the client open hundreds of
# connections at once; the gateway's and the simulator's listen backlog is
# 128 (`ss -ltn`: Send-Q), the excess SYNs are dropped (TcpExtListenOverflows)
# and each costs its request a 1 s SYN retransmission, which piles up
# streams until the fair queue refuses them. CONNECTIONS=0 shows it.
set -euo pipefail
rates=500,1000,2000; secs=10s
if [[ ${1:-} == --* ]]; then # also: --rates R --duration D
  while [ $# -gt 0 ]; do
    case $1 in
      --rates) rates=$2; shift 2 ;;
      --duration) secs=$2; shift 2 ;;
      *) echo "usage: $0 [RATES] [DURATION] | [--rates R] [--duration D]" >&2; exit 2 ;;
    esac
  done
else
  rates=${1:-$rates}; secs=${2:-$secs}
fi
warmup=${WARMUP:-2s}; stream=${STREAM:-1}; llm_max=${LLM_MAX_CONCURRENT:-1024}
connections=${CONNECTIONS:-100}
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

cd "$root"
cargo build --release -q -p levee-chaos --bin levee-upstream-sim --bin levee-overhead >&2
cargo build --release -q --bin levee >&2
sim=$root/target/release/levee-upstream-sim
levee=$root/target/release/levee
overhead=$root/target/release/levee-overhead

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_up() { # url name pid
  for _ in $(seq 100); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$3" 2>/dev/null || { echo "$2 exited; its log:" >&2; cat "$dir/$2.log" >&2; return 1; }
    sleep 0.1
  done
  echo "$2 did not answer $1 within 10s; its log:" >&2; cat "$dir/$2.log" >&2; return 1
}

sport=$(free_port)
"$sim" --listen "127.0.0.1:$sport" >"$dir/sim.log" 2>&1 &
sim_pid=$!; pids+=("$sim_pid")
wait_up "http://127.0.0.1:$sport/healthz" sim "$sim_pid"

# Limits on the embedded store, far above the load (loopback may resolve to
# either anonymous tier, so both are raised).
cat >"$dir/levee.toml" <<TOML
[resilience.llm.bulkhead]
max_concurrent = $llm_max
[ratelimit]
store = "memory"
[ratelimit.tiers.PUBLIC_IP]
limits = [{ limit = 100000000, window = "1m" }]
[ratelimit.tiers.INTERNAL_IP]
limits = [{ limit = 100000000, window = "1m" }]
TOML

gport=$(free_port)
LEVEE_LISTEN="127.0.0.1:$gport" LEVEE_LLM_URL="http://127.0.0.1:$sport/v1" LEVEE_LOG=warn \
  "$levee" serve --config "$dir/levee.toml" >"$dir/levee.log" 2>&1 &
gw_pid=$!; pids+=("$gw_pid")
wait_up "http://127.0.0.1:$gport/health" levee "$gw_pid"

args=(--direct "http://127.0.0.1:$sport/v1" --gateway "http://127.0.0.1:$gport/v1"
      --rates "$rates" --duration "$secs" --warmup "$warmup" --gateway-pid "$gw_pid"
      --connections "$connections")
[ "$stream" != 0 ] && args+=(--stream)
[ -n "${JSON:-}" ] && args+=(--json "$JSON")
echo "levee-overhead ${args[*]}" >&2
if ! "$overhead" "${args[@]}"; then
  echo "levee-overhead failed; gateway log:" >&2; tail -n 20 "$dir/levee.log" >&2
  exit 1
fi
