#!/usr/bin/env bash
# The job queues (issue 12), measured on the release binaries:
#
#  (a) submissions: `levee-jobs-bench submit`, CLIENTS concurrent clients in
#      a closed loop on POST /v1/jobs for DURATION after a 1 s warm-up;
#      submissions/s and the gateway's (and redis-server's) CPU per
#      submission from /proc/<pid>/stat. Three stores, interleaved over
#      ROUNDS rounds (memory, redis, redis-always, memory, ...), each case a
#      fresh gateway (and Redis) so every case starts from an empty queue:
#        memory        the in-process store (no LEVEE_REDIS_URL)
#        redis         redis-server --appendonly no (nothing fsynced)
#        redis-always  redis-server --appendonly yes --appendfsync always
#      The workers are held back (the key's tier allows one job an hour), so
#      the CPU is the submissions' alone; submissions themselves are never
#      rate limited. Of the rounds, the one with the lowest gateway CPU per
#      submission is reported (the least disturbed), as in issue 9.
#  (b) end to end: `levee-jobs-bench e2e`, one job at a time on an idle
#      queue (built-in retrieval and answerer, no simulator): submit, poll
#      GET /v1/jobs/{id} every 5 ms until succeeded, E2E_JOBS jobs after 5
#      warm-up jobs; memory and redis, with the default `poll_interval`
#      (50 ms) and with `poll_interval = "5ms"`.
#  (c) Redis memory per queued job: workers held back, FILL_JOBS jobs
#      submitted, (used_memory after - before) / FILL_JOBS from
#      `redis-cli info memory`, plus MEMORY USAGE of one job's hash and of
#      the tenant's stream.
#
#   benches/jobs/bench.sh                 # CLIENTS=16 DURATION=10s ROUNDS=2
#   CLIENTS=32 DURATION=5s benches/jobs/bench.sh
#
# Environment: CLIENTS (16), DURATION (10s), ROUNDS (2), E2E_JOBS (200),
# FILL_JOBS (10000), ONLY (a space-separated subset of: submit e2e memory),
# JSON=FILE (every raw result, one JSON object a line).
#
# Starts its own levee and redis-server processes on free loopback ports
# and kills only those PIDs; all traffic goes to 127.0.0.1 and every
# measurement has a fixed length or count. Prints Markdown to stdout.
set -euo pipefail
clients=${CLIENTS:-16}; secs=${DURATION:-10s}; rounds=${ROUNDS:-2}
e2e_jobs=${E2E_JOBS:-200}; fill_jobs=${FILL_JOBS:-10000}
only=${ONLY:-submit e2e memory}
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d); pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

cd "$root"
cargo build --release -q -p levee-chaos --bin levee-jobs-bench >&2
cargo build --release -q --bin levee >&2
levee=$root/target/release/levee
bench=$root/target/release/levee-jobs-bench
command -v redis-server >/dev/null || { echo "redis-server is needed" >&2; exit 1; }
results=$dir/results.jsonl; : >"$results"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The API key and its hash.
key="bench_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
sha=$(printf %s "$key" | sha256sum | cut -d' ' -f1)

# config FILE LIMIT WINDOW POLL: a gateway config whose key's tier allows
# LIMIT requests per WINDOW (the workers' admission), jobs polled every POLL.
config() {
  cat >"$1" <<TOML
[identity]
[[identity.api_keys]]
id = "bench"
sha256 = "$sha"
tenant = "bench"
tier = "BENCH"

[ratelimit.tiers.BENCH]
limits = [{ limit = $2, window = "$3" }]
[ratelimit.tiers.PUBLIC_IP]
limits = [{ limit = 100000000, window = "1m" }]
[ratelimit.tiers.INTERNAL_IP]
limits = [{ limit = 100000000, window = "1m" }]

[jobs]
max_queued_jobs = 1000000
poll_interval = "$4"
TOML
}

# start_redis NAME [ARGS...]: sets redis_pid, redis_port.
start_redis() {
  local name=$1; shift
  redis_port=$(free_port)
  mkdir -p "$dir/$name"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --dir "$dir/$name" \
    --daemonize no "$@" >"$dir/$name.redis.log" 2>&1 &
  redis_pid=$!; pids+=("$redis_pid")
  for _ in $(seq 100); do
    redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.1
  done
  echo "redis-server did not start; its log:" >&2; cat "$dir/$name.redis.log" >&2; return 1
}

stop() { # PID: ends one of ours and forgets it (its PID may be reused)
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do if [ "$p" != "$1" ]; then keep+=("$p"); fi; done
  pids=("${keep[@]}")
}

# start_levee NAME CONFIG [REDIS_PORT]: sets gw_pid, gw_url.
start_levee() {
  local name=$1 cfg=$2 rport=${3:-} port
  port=$(free_port)
  if [ -n "$rport" ]; then
    LEVEE_REDIS_URL="redis://127.0.0.1:$rport" LEVEE_LISTEN="127.0.0.1:$port" LEVEE_LOG=warn \
      "$levee" serve --config "$cfg" >"$dir/$name.levee.log" 2>&1 &
  else
    env -u LEVEE_REDIS_URL LEVEE_LISTEN="127.0.0.1:$port" LEVEE_LOG=warn \
      "$levee" serve --config "$cfg" >"$dir/$name.levee.log" 2>&1 &
  fi
  gw_pid=$!; pids+=("$gw_pid")
  gw_url="http://127.0.0.1:$port"
  for _ in $(seq 100); do
    curl -sf "$gw_url/health" >/dev/null 2>&1 && return 0
    kill -0 "$gw_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "levee ($name) did not come up; its log:" >&2; cat "$dir/$name.levee.log" >&2; return 1
}

# store_up STORE: starts the store (if any) for STORE, sets rport.
store_up() {
  rport=; redis_pid=
  case $1 in
    memory) ;;
    redis) start_redis "$1-$RANDOM" --appendonly no; rport=$redis_port ;;
    redis-always) start_redis "$1-$RANDOM" --appendonly yes --appendfsync always; rport=$redis_port ;;
  esac
}

record() { # LABEL... : tags the JSON on stdin and appends it
  python3 -c 'import json,sys
tags=dict(a.split("=",1) for a in sys.argv[1:])
for line in sys.stdin:
    d=json.loads(line); d.update(tags); print(json.dumps(d))' "$@" >>"$results"
}

echo "key tier BENCH, $clients clients, $secs per run, $rounds rounds" >&2

if [[ " $only " == *" submit "* ]]; then
  config "$dir/held.toml" 1 1h 50ms
  for round in $(seq "$rounds"); do
    for store in memory redis redis-always; do
      echo "submit: $store, round $round/$rounds" >&2
      store_up "$store"
      start_levee "submit-$store-$round" "$dir/held.toml" "$rport"
      extra=(); if [ -n "$redis_pid" ]; then extra=(--redis-pid "$redis_pid"); fi
      "$bench" submit --url "$gw_url" --key "$key" --clients "$clients" --duration "$secs" \
        --gateway-pid "$gw_pid" "${extra[@]}" | record store="$store" round="$round"
      stop "$gw_pid"; if [ -n "$redis_pid" ]; then stop "$redis_pid"; fi
      sleep 1
    done
  done
fi

if [[ " $only " == *" e2e "* ]]; then
  for poll in 50ms 5ms; do
    config "$dir/open-$poll.toml" 100000000 1m "$poll"
    for store in memory redis; do
      echo "e2e: $store, poll_interval $poll" >&2
      store_up "$store"
      start_levee "e2e-$store-$poll" "$dir/open-$poll.toml" "$rport"
      "$bench" e2e --url "$gw_url" --key "$key" --jobs "$e2e_jobs" --poll 5ms \
        | record store="$store" poll_interval="$poll"
      stop "$gw_pid"; if [ -n "$redis_pid" ]; then stop "$redis_pid"; fi
    done
  done
fi

if [[ " $only " == *" memory "* ]]; then
  echo "memory: $fill_jobs queued jobs in redis" >&2
  config "$dir/held.toml" 1 1h 50ms
  store_up redis
  start_levee memory "$dir/held.toml" "$rport"
  # One job first: the stream, its group and the tenant set exist before
  # the "before" reading, and the one job the workers admit has run.
  "$bench" fill --url "$gw_url" --key "$key" --jobs 1 --clients 1 >/dev/null
  sleep 1.5
  used() { redis-cli -p "$rport" info memory | tr -d '\r' | awk -F: '$1=="used_memory"{print $2}'; }
  before=$(used)
  "$bench" fill --url "$gw_url" --key "$key" --jobs "$fill_jobs" --clients "$clients" >"$dir/fill.json"
  sleep 1.5
  after=$(used)
  stream_bytes=$(redis-cli -p "$rport" memory usage "levee:jobs:{bench}:stream" samples 0)
  one_job=$(redis-cli -p "$rport" --scan --pattern 'levee:jobs:{bench}:job:*' | awk 'NR==1')
  job_bytes=$(redis-cli -p "$rport" memory usage "$one_job" samples 0)
  payload=$(( $(redis-cli -p "$rport" hstrlen "$one_job" body) + $(redis-cli -p "$rport" hstrlen "$one_job" submitter) ))
  keys=$(redis-cli -p "$rport" dbsize)
  xlen=$(redis-cli -p "$rport" xlen "levee:jobs:{bench}:stream")
  python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
d.update(used_before=int(sys.argv[2]), used_after=int(sys.argv[3]), stream_bytes=int(sys.argv[4]),
         job_hash_bytes=int(sys.argv[5]), payload_bytes=int(sys.argv[6]), keys=int(sys.argv[7]),
         xlen=int(sys.argv[8]))
print(json.dumps(d))' "$dir/fill.json" "$before" "$after" "$stream_bytes" "$job_bytes" \
    "$payload" "$keys" "$xlen" | record store=redis
  stop "$gw_pid"; stop "$redis_pid"
fi

if [ -n "${JSON:-}" ]; then cp "$results" "$JSON"; fi

python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
sub = [r for r in rows if r["measure"] == "submit"]
if sub:
    best = {}
    for r in sub:
        k = r["store"]
        if k not in best or (r["gateway_cpu_us_per_submission"] or 1e9) < (best[k]["gateway_cpu_us_per_submission"] or 1e9):
            best[k] = r
    base = best.get("memory")
    print("| store | submissions/s | vs memory | gateway CPU µs/submission | redis CPU µs/submission | latency p50 ms | p99 ms | errors | first → last second (/s) | all rounds (submissions/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in ["memory", "redis", "redis-always"]:
        if k not in best: continue
        r = best[k]
        ratio = r["rate"] / base["rate"] if base else float("nan")
        rcpu = r["redis_cpu_us_per_submission"]
        ps = r["per_second"]
        allr = ", ".join(f'{x["rate"]:.0f}' for x in sub if x["store"] == k)
        errs = sum(r["errors"].values())
        print(f'| {k} | {r["rate"]:.0f} | {ratio:.2f} | {r["gateway_cpu_us_per_submission"]:.1f} | '
              f'{"-" if rcpu is None else f"{rcpu:.1f}"} | {r["latency_ms"]["p50_ms"]:.2f} | {r["latency_ms"]["p99_ms"]:.2f} | '
              f'{errs} | {ps[0]} → {ps[-1]} | {allr} |')
    print()
e2e = [r for r in rows if r["measure"] == "e2e"]
if e2e:
    print("| store | poll_interval | jobs | end to end p50 ms | p99 ms | queued p50 ms | queued p99 ms | running p50 ms | running p99 ms | polls/job |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in e2e:
        t, q, x = r["total_ms"], r["queued_ms"], r["running_ms"]
        print(f'| {r["store"]} | {r["poll_interval"]} | {r["jobs"]} | {t["p50_ms"]:.1f} | {t["p99_ms"]:.1f} | '
              f'{q["p50_ms"]:.0f} | {q["p99_ms"]:.0f} | {x["p50_ms"]:.0f} | {x["p99_ms"]:.0f} | {r["polls_per_job"]:.1f} |')
    print()
mem = [r for r in rows if r["measure"] == "fill"]
for r in mem:
    n = r["accepted"]
    per = (r["used_after"] - r["used_before"]) / max(n, 1)
    print("| jobs queued | used_memory before | after | bytes per queued job | one job's hash (MEMORY USAGE) | stream / job | body + submitter bytes | keys | XLEN | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f'| {n} | {r["used_before"]} | {r["used_after"]} | {per:.0f} | {r["job_hash_bytes"]} | '
          f'{r["stream_bytes"] / max(r["xlen"], 1):.0f} | {r["payload_bytes"]} | {r["keys"]} | {r["xlen"]} | {sum(r["errors"].values())} |')
PY
