#!/usr/bin/env bash
# The test command: sets up what the tests need (a pinned Python venv for the ONNX
# peers and test data), then builds once in the release profile and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-python.sh
export SMELT_PYTHON="$PWD/.venv/bin/python"
cargo test --release --workspace "$@"
