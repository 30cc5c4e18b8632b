#!/usr/bin/env bash
# Builds every fuzz target (fuzz/, cargo-fuzz + libFuzzer) and runs each on
# its committed corpus for a while; fails on any crash, leak, timeout or
# broken invariant.
#
#   ./scripts/fuzz.sh              30 s per target (what CI runs)
#   ./scripts/fuzz.sh 600          10 minutes per target
#   ./scripts/fuzz.sh 60 sse config   only these targets
#
# Needs the nightly toolchain and cargo-fuzz; installs them if missing.
# New inputs go to a scratch directory, never into fuzz/corpus/ (merge
# them with `cargo +nightly fuzz cmin`, README "Fuzzing"). Logs: fuzz/logs/,
# crashing inputs: fuzz/artifacts/<target>/ (both gitignored). Run it
# under `nice -n 19` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
# A target dir of its own, so the sanitizer build never shares (or waits
# on the lock of) the main workspace's: fuzz/target, or a `fuzz` folder
# beside a CARGO_TARGET_DIR the caller keeps (CI's cache), so a clean clone
# does not rebuild every dependency with AddressSanitizer (~10 min).
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="$CARGO_TARGET_DIR/fuzz"
else
  export CARGO_TARGET_DIR="$PWD/target"
fi

secs="${1:-30}"
shift || true

if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

# -a: debug assertions and overflow checks on, as in the tests. `run`
# must get the same flags as `build`, or it rebuilds.
echo "== building ${#targets[@]} fuzz targets"
cargo +nightly fuzz build -a

mkdir -p logs
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
summary=()
for t in "${targets[@]}"; do
  dict=()
  [ -f "dict/$t.dict" ] && dict=("-dict=dict/$t.dict")
  mkdir -p "$scratch/$t" "corpus/$t"
  log="logs/$t.log"
  echo "== $t: ${secs}s"
  rc=0
  # The first corpus dir receives new inputs: the scratch one.
  cargo +nightly fuzz run -a "$t" "$scratch/$t" "corpus/$t" -- \
    -max_total_time="$secs" -timeout=10 -print_final_stats=1 "${dict[@]}" \
    >"$log" 2>&1 || rc=$?
  done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")"
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    echo "!! $t failed (exit $rc); the end of $log:"
    tail -n 40 "$log"
    summary+=("$(printf '%-16s FAILED (exit %s), see fuzz/%s and fuzz/artifacts/%s/' "$t" "$rc" "$log" "$t")")
  else
    summary+=("$(printf '%-16s execs %-10s exec/s %-7s cov %-6s ft %-6s' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}")")
  fi
done

echo "== fuzz summary (${secs}s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found crashes in: ${failed[*]}" >&2
  exit 1
fi
