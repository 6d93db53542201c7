#!/usr/bin/env bash
# Creates .venv with the pinned Python packages the tests and benchmarks use.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ] || ! cmp -s scripts/requirements.txt .venv/requirements.installed; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
    cp scripts/requirements.txt .venv/requirements.installed
fi
