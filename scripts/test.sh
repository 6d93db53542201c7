#!/usr/bin/env bash
# The test command: sets up what the tests need (z3 for the rule proofs, a pinned Python
# venv for the ONNX peers and test data), then builds once in the release profile and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# the SMT solver behind `check-rules` proofs (their tests fail without it)
if ! command -v z3 >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then sudo=sudo; fi
    # a fresh machine may have no package lists yet
    $sudo apt-get install -y z3 || { $sudo apt-get update && $sudo apt-get install -y z3; }
fi
scripts/setup-python.sh
export SMELT_PYTHON="$PWD/.venv/bin/python"
cargo test --release --workspace "$@"
