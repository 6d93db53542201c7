//! smelt-passes: transformations of smelt's IR — e-graph fusion, constant folding,
//! dead-code elimination — and lowering of functions to loop-nest kernels.

#![warn(missing_docs)]

pub mod fusion;
pub mod lower;
