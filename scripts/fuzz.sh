#!/usr/bin/env bash
# Runs smelt's fuzz targets (fuzz/, cargo-fuzz + libFuzzer) for a bounded time each, on
# the stable toolchain: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z flags, `-s none`
# skips the sanitizer (which needs a nightly std), `-a` turns on debug assertions and
# overflow checks. Seeds come from the committed corpus (fuzz/corpus-min/) and the test
# cases; new inputs go to fuzz/corpus/<target>/ (git-ignored), crashes to
# fuzz/artifacts/<target>/. See fuzz/README.md.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 30 s, every target)
#
# Exits non-zero when a target finds a crash or a property violation.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(parse_tir import_onnx load_rules differential)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
cd fuzz
cargo fuzz build -s none -a
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    seeds=("corpus-min/$t")
    case $t in
        parse_tir) seeds+=("$root/tests/cases/parse" "$root/tests/cases/errors" "$root/tests/cases/fusion") ;;
        load_rules) seeds+=("$root/passes/rules") ;;
    esac
    echo "== $t: ${seconds}s"
    log="target/fuzz-$t.log"
    set +e
    cargo fuzz run "$t" -s none -a "corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 -max_len=65536 \
        -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    grep -E '^(#[0-9]+[[:space:]]+DONE|stat::(number_of_executed_units|peak_rss_mb|new_units_added))' "$log" || true
    if [ $rc -ne 0 ]; then
        grep -E -A3 'panicked|ERROR: libFuzzer|Test unit written|SUMMARY' "$log" | head -40 >&2 || true
        echo "== $t FAILED (exit $rc): log fuzz/$log, input in fuzz/artifacts/$t/" >&2
        status=1
    fi
done
exit $status
