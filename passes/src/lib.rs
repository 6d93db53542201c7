//! smelt-passes: transformations of smelt's IR — e-graph fusion, constant folding,
//! dead-code elimination, activation layouts — and lowering of functions to loop-nest kernels.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod blocks;
pub mod const_fold;
pub mod dce;
pub mod fusion;
pub mod layout;
pub mod lower;
pub mod manager;
mod parallel;
pub mod scaled_rows;

pub use fusion::{fuse_func, FusionOptions, FusionPass, FusionReport};
pub use manager::{
    pass_by_name, pass_by_name_with, Pass, PassContext, PassError, PassManager, DEFAULT_PIPELINE,
    PASS_NAMES,
};
