//! smelt: a fusion compiler for neural-network inference — text IR or ONNX in,
//! e-graph fusion, Cranelift JIT, an `Executable` out.

#![warn(missing_docs)]

pub use smelt_ir as ir;
pub use smelt_passes as passes;

/// Every error smelt's library returns; each variant maps to one C status code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed or ill-typed IR (text or built in code): diagnostics with locations.
    #[error("{0}")]
    Ir(#[from] smelt_ir::Diagnostics),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// Invalid argument to the API: wrong input count, shape, or buffer length.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The host or an op is not supported yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl From<smelt_ir::Diagnostic> for Error {
    fn from(d: smelt_ir::Diagnostic) -> Self {
        Error::Ir(d.into())
    }
}

pub mod codegen;
pub mod models;
pub mod npy;
pub mod onnx;
pub mod runtime;
