#!/usr/bin/env bash
# Creates (once) the Python virtualenv the OpenAI SDK compatibility tests
# use, at ${CARGO_TARGET_DIR:-target}/py-venv, with tests/sdk/requirements.txt
# installed; reinstalls only when that file changes (a hash stamp in the
# venv). Prints the venv's python path as its last stdout line; everything
# else goes to stderr.
#
#   ./scripts/py-venv.sh          → /abs/path/target/py-venv/bin/python
#
# Installs Debian's python3 and python3-venv (apt-get, with sudo when not
# root) if python3 is missing or has no working `venv` / `ensurepip`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

target="${CARGO_TARGET_DIR:-target}"
case "$target" in
  /*) ;;
  *) target="$root/$target" ;;
esac
venv="$target/py-venv"
python="$venv/bin/python"
requirements="$root/tests/sdk/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [ -x "$python" ] && "$python" -c 'import sys' >/dev/null 2>&1 \
  && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$python"
  exit 0
fi

if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "py-venv: installing python3-venv (no python3, or no venv/ensurepip)" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-venv >/dev/null
fi

# A venv that lost its interpreter (python upgraded, half-made) is remade.
if ! { [ -x "$python" ] && "$python" -m pip --version >/dev/null 2>&1; }; then
  rm -rf "$venv"
  mkdir -p "$target"
  python3 -m venv "$venv" >&2
fi

rm -f "$stamp"
"$python" -m pip install --quiet --disable-pip-version-check \
  -r "$requirements" >&2
echo "$want" >"$stamp"
echo "$python"
