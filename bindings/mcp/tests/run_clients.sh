#!/usr/bin/env bash
# C-MCP-1 / C-MCP-3 with the official MCP Python client.
#
# Usage: bindings/mcp/tests/run_clients.sh /path/to/abhyasa
#
# Creates a throwaway venv, installs the pinned client, and drives the
# given (already built) `abhyasa` binary over stdio in both eras. Builds
# nothing itself. Exits non-zero on any failure.
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 /path/to/abhyasa" >&2
    exit 2
fi
binary=$1
if [ ! -x "$binary" ]; then
    echo "$0: $binary is not an executable (build it first: cargo build -p abhyasa)" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

venv=$(mktemp -d "${TMPDIR:-/tmp}/abhyasa-mcp-venv.XXXXXX")
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==2.3.0"
"$venv/bin/python" "$here/mcp_clients.py" "$binary"
