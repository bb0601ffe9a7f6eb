#!/usr/bin/env bash
# Runs the `flashnext serve` tests (pytest, with the `openai` package as the client) against a built binary.
# Creates the project venv .venv when missing and installs openai, pytest, requests and jsonschema into it; starts nothing
# global: each test module starts its own server on a free loopback port and stops it.
#   tests/server/run.sh [pytest args]      (binary: $FLASHNEXT_BIN, default ${BUILD_DIR:-build}/flashnext)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import openai, pytest, requests, jsonschema" 2>/dev/null; then
  .venv/bin/pip install --quiet openai pytest requests jsonschema
fi
export FLASHNEXT_BIN="${FLASHNEXT_BIN:-$root/${BUILD_DIR:-build}/flashnext}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests/server "$@"
