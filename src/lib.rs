//! smelt: a fusion compiler for neural-network inference — text IR or ONNX in,
//! e-graph fusion, Cranelift JIT, an `Executable` out.
//!
//! Load a model ([`load_model`] reads `.onnx` or `.tir`; here one is built in code),
//! compile it once with [`compile`] — the whole pipeline of the [`driver`]: passes,
//! layouts, lowering, Cranelift, memory plan — and run it from any number of threads:
//!
//! ```
//! use smelt::ir::{interp, Tensor};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // conv3x3 -> batch norm -> add -> relu on 8 channels of 6x6, seeded weights
//! let model = smelt::models::residual_tail(8, 6, 1)?;
//!
//! // every option has a default: fusion on, one thread per core, the host's kernels
//! let mut opts = smelt::Options::default();
//! opts.compile.threads = 2;
//! opts.optimize.fusion.enabled = true; // false: every op its own kernel (--no-fuse)
//! let (exe, report) = smelt::compile(&model, &opts)?;
//! assert!(!report.fusion_reports.is_empty()); // what fused, and why it stopped
//!
//! // one zero tensor per input, in call order
//! let inputs: Vec<Tensor> = exe.inputs().iter().map(|i| Tensor::zeros(&i.ty)).collect();
//! let outputs = exe.run(&inputs)?;
//!
//! // the reference interpreter on the unoptimized model agrees
//! let want = interp::run(&model, model.entry().unwrap(), &inputs)?;
//! assert_eq!(outputs.len(), want.len());
//! assert_eq!(outputs[0].ty, want[0].ty);
//! # Ok(())
//! # }
//! ```
//!
//! Errors are [`Error`]s, never panics; the library prints nothing. The C API is
//! [`capi`] (header `include/smelt.h`).

#![warn(missing_docs)]
// `unsafe` lives in four modules, each stating the invariant that makes it sound: the C
// API boundary (`capi`), JIT code memory (`codegen::code_memory`), the JIT entry and its
// thread pool (`runtime::entry`, `runtime::pool`) and the micro-kernel intrinsics
// (`microkernels`). Everywhere else it is refused.
#![deny(unsafe_code)]

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
    /// An ONNX model that is malformed or uses what smelt does not support: diagnostics
    /// naming the node, op type and opset.
    #[error("{0}")]
    Onnx(smelt_ir::Diagnostics),
    /// A pass failed or left the module invalid.
    #[error("{0}")]
    Pass(#[from] smelt_passes::PassError),
    /// The host or an op is not supported yet.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl From<smelt_ir::Diagnostic> for Error {
    fn from(d: smelt_ir::Diagnostic) -> Self {
        Error::Ir(d.into())
    }
}

pub mod capi;
pub mod codegen;
pub mod driver;
#[cfg(feature = "onnx")]
pub mod dynamic;
pub mod microkernels;
pub mod models;
pub mod npy;
#[cfg(feature = "onnx")]
pub mod onnx;
mod quiet;
pub mod runtime;
pub mod verify;

use std::path::Path;

use smelt_ir::Module;

pub use driver::{
    compile, compile_file, optimize, CompileOptions, DumpFn, Kernels, Layouts, OptimizeOptions,
    Options, MAX_THREADS,
};
#[cfg(feature = "onnx")]
pub use dynamic::{DynamicExecutable, DynamicOptions, RunPlan};
pub use runtime::{Executable, TensorInfo, Workspace};
pub use smelt_ir::{Tensor, TensorType};
pub use smelt_passes::lower::ConvAlgorithm;

/// The interface a caller reaches smelt through, so that an error asking for an option
/// spells it the caller's way: the CLI's `--shape x=1x3x224x224`, the Rust field
/// `ImportOptions::input_shapes`, or the C field `SmeltOptions.input_shapes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Interface {
    /// The Rust API (`smelt::onnx::ImportOptions`, `smelt::LoadOptions`): the default.
    #[default]
    Rust,
    /// The `smelt` command line.
    Cli,
    /// The C API (`include/smelt.h`).
    C,
}

/// How to read a model file.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Shapes pinning the dynamic dimensions of graph inputs, by input name: an ONNX
    /// model's dynamic dims, or the symbolic sizes of a `.tir` model (its entry function
    /// specialized at them, [`smelt_ir::symbolic::specialize`]).
    pub input_shapes: std::collections::BTreeMap<String, Vec<usize>>,
    /// Who is asking, for the spelling of options in error messages (the CLI and the C
    /// API set it; Rust callers keep the default).
    pub interface: Interface,
    /// Keep an ONNX model's dynamic dimensions that `input_shapes` leaves unpinned as
    /// symbols ([`onnx::import_file_symbolic`]) instead of refusing them. The module can
    /// be printed and optimized; it is specialized before it is compiled.
    pub symbolic: bool,
    /// One more folder the files a model names (`.tir` `external<...>` sidecars, ONNX
    /// external data) may be read from, besides the model file's own folder (after
    /// resolving symlinks). `None` (the default): only the model's folder.
    pub allowed_root: Option<std::path::PathBuf>,
    /// The memory budget in bytes for the model file, its weights and the constants
    /// folded at import or by const_fold (see [`smelt_ir::budget`]); `None`: the
    /// default, half the machine's memory (and half of `ulimit -v`, if set).
    pub memory_budget: Option<u64>,
}

/// Reads a model from a file: `.onnx` (with the `onnx` feature) or `.tir` text (with its
/// safetensors sidecar, if any). The module returned has been verified.
pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<Module, Error> {
    let is_onnx = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
    if is_onnx {
        #[cfg(feature = "onnx")]
        {
            let import = onnx::ImportOptions {
                input_shapes: opts.input_shapes.clone(),
                interface: opts.interface,
                allowed_root: opts.allowed_root.clone(),
                memory_budget: opts.memory_budget,
                ..onnx::ImportOptions::default()
            };
            return if opts.symbolic {
                onnx::import_file_symbolic(path, &import)
            } else {
                onnx::import_file(path, &import)
            };
        }
        #[cfg(not(feature = "onnx"))]
        return Err(Error::Unsupported(format!(
            "{}: smelt was built without the `onnx` feature",
            path.display()
        )));
    }
    let parse = smelt_ir::text::ParseOptions {
        allowed_root: opts.allowed_root.clone(),
        memory_budget: opts.memory_budget,
    };
    let module = smelt_ir::text::parse_file_with(path, &parse)?;
    if opts.input_shapes.is_empty() {
        return Ok(module);
    }
    // a .tir model's symbolic sizes (`tensor<Nx3xHxWxf32>`) are bound by the pinned
    // shapes; a pin of a known size must match it
    Ok(smelt_ir::symbolic::specialize(&module, &opts.input_shapes)?)
}
