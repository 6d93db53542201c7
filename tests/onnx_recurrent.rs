//! Exporter-style recurrent models whose batch entries have their own lengths
//! (`sequence_lens`): a bidirectional LSTM with peepholes and initial states and a reverse
//! GRU with `linear_before_reset` and an entry of length 0, through `smelt run` (the fused
//! JIT) and `smelt verify`, against onnxruntime — the states past each entry's length kept,
//! its outputs zero, the reverse direction starting at the entry's own last step.
//!
//! Data: `scripts/make_recurrent_models.py` writes it to `target/onnx-tests/recurrent`;
//! this test runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-5;

fn data_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "recurrent",
            "make_recurrent_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 recurrent 1",
        )
    })
    .clone()
}

#[test]
fn a_bidirectional_lstm_over_entries_of_their_own_lengths_matches_onnxruntime() {
    common::run_matches_onnxruntime(&data_dir().join("lstm_ragged"), "y", MAX_RELATIVE);
}

#[test]
fn a_reverse_gru_over_entries_of_their_own_lengths_matches_onnxruntime() {
    common::run_matches_onnxruntime(&data_dir().join("gru_ragged"), "y", MAX_RELATIVE);
}
