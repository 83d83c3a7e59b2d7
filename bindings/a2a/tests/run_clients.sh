#!/usr/bin/env bash
# Runs the official a2a-sdk client (pinned) and plain httpx against the A2A
# receiver example. Usage:
#   bindings/a2a/tests/run_clients.sh [PATH/TO/a2a_receiver]
# Without an argument it builds the example (dev profile) first. Creates a
# throwaway venv, installs the pins, exits non-zero on any failed check.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
bin="${1:-}"
if [[ -z "$bin" ]]; then
  cargo build -q -p abhyasa-a2a --example a2a_receiver --manifest-path "$root/Cargo.toml"
  bin="$root/target/debug/examples/a2a_receiver"
fi
[[ -x "$bin" ]] || { echo "not an executable: $bin" >&2; exit 2; }
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check 'a2a-sdk==1.3.0'
"$venv/bin/python" "$here/a2a_clients.py" "$bin"
