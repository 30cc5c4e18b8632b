#!/usr/bin/env bash
# Runs Levee's whole test suite, installing what it needs first.
#
#   ./scripts/test.sh            every test of every crate in the workspace
#   ./scripts/test.sh ratelimit  extra arguments go to `cargo test`
#
# Needs: the Rust toolchain. Installs (Debian/Ubuntu, apt-get) if missing:
# redis-server (integration and chaos tests start their own on free ports),
# prometheus + promtool (the telemetry tests run their own Prometheus on a
# free port and check every shipped Prometheus config). Makes the Python
# virtualenv of the OpenAI SDK tests (scripts/py-venv.sh) and exports its
# python as LEVEE_TEST_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  need+=(prometheus)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "installing missing test dependencies: ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

LEVEE_TEST_PYTHON="$(./scripts/py-venv.sh | tail -n 1)"
export LEVEE_TEST_PYTHON

exec cargo test --workspace --all-targets "$@"
