//! smelt-ir: the tensor IR of the smelt fusion compiler — types, the op table, weights,
//! functions, diagnostics, the text form, the verifier, the reference interpreter and
//! the loop-nest IR that lowering produces and code generation consumes.

#![warn(missing_docs)]
// unsafe code lives in one module, `aligned_memory`, with its invariant stated there
#![deny(unsafe_code)]

mod aligned_memory;

pub mod batch;
pub mod budget;
pub mod builder;
pub mod diag;
pub mod files;
pub mod graph;
pub mod half;
pub mod interp;
pub mod loops;
pub mod op;
pub mod padding;
pub mod symbolic;
pub mod tensor;
pub mod text;
pub mod types;
pub mod verify;
pub mod weights;

pub use diag::{Diagnostic, Diagnostics, Location, Severity};
pub use graph::{Func, FuncResult, Inst, Module, Param, Value};
pub use op::{BinaryOp, FusedOp, Op, PostOp, UnaryOp};
pub use tensor::{ErrorStats, Tensor, TensorData};
pub use types::{DType, Layout, TensorType, F32};
pub use weights::{
    AlignedBuf, ConstantSlab, Derivation, Weight, WeightId, WeightOrigin, WeightStore,
};
