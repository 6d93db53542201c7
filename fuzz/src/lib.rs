//! smelt's fuzzing support: the properties the fuzz targets check and the random graph
//! generator of the differential target. `tests/fuzz_corpus.rs` includes both modules
//! by path to replay the committed corpus without libFuzzer.

pub mod checks;
pub mod graph_gen;
