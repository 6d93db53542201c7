//! smelt: a fusion compiler for neural-network inference — text IR or ONNX in,
//! e-graph fusion, Cranelift JIT, an `Executable` out.

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
use smelt_passes::fusion::FusionOptions;
use smelt_passes::{PassContext, PassManager};

pub use runtime::{
    CompileOptions, Executable, Kernels, Layouts, TensorInfo, Workspace, MAX_THREADS,
};
pub use smelt_ir::{Tensor, TensorType};
pub use smelt_passes::lower::ConvAlgorithm;

/// How to optimize a module before compiling it.
#[derive(Clone, Debug, Default)]
pub struct OptimizeOptions {
    /// Pass pipeline by name; `None` runs the default (`fusion, const_fold, dce`).
    pub passes: Option<Vec<String>>,
    /// Options of the fusion pass (rule switches, limits, `enabled: false` for `--no-fuse`).
    pub fusion: FusionOptions,
}

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
    /// Shapes pinning the dynamic dimensions of graph inputs, by input name (ONNX).
    pub input_shapes: std::collections::BTreeMap<String, Vec<usize>>,
    /// Who is asking, for the spelling of options in error messages (the CLI and the C
    /// API set it; Rust callers keep the default).
    pub interface: Interface,
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
            return onnx::import_file(path, &import);
        }
        #[cfg(not(feature = "onnx"))]
        return Err(Error::Unsupported(format!(
            "{}: smelt was built without the `onnx` feature",
            path.display()
        )));
    }
    if !opts.input_shapes.is_empty() {
        return Err(Error::InvalidArgument(
            "input shapes can only be pinned for ONNX models; .tir shapes are static".into(),
        ));
    }
    let parse = smelt_ir::text::ParseOptions {
        allowed_root: opts.allowed_root.clone(),
        memory_budget: opts.memory_budget,
    };
    Ok(smelt_ir::text::parse_file_with(path, &parse)?)
}

/// A callback given each pass's name and the module after it (for `--print-ir-after-all`).
pub type DumpFn<'a> = &'a mut dyn FnMut(&str, &Module);

/// Runs the optimization pipeline on `module` in place; `dump(pass, module)` is called
/// after each pass.
pub fn optimize(
    module: &mut Module,
    opts: &OptimizeOptions,
    dump: Option<DumpFn<'_>>,
) -> Result<PassContext, Error> {
    let mut pm = match &opts.passes {
        Some(names) => PassManager::from_names(names, &opts.fusion)?,
        None => PassManager::default_pipeline(&opts.fusion),
    };
    if let Some(dump) = dump {
        pm.set_dump(dump);
    }
    let mut cx = PassContext::default();
    pm.run(module, &mut cx)?;
    Ok(cx)
}

/// Optimizes a copy of `module` with the default pipeline and compiles its entry function.
pub fn compile(
    module: &Module,
    opts: &OptimizeOptions,
) -> Result<(Executable, PassContext), Error> {
    let mut optimized = module.clone();
    let cx = optimize(&mut optimized, opts, None)?;
    let exe = Executable::compile(&optimized, None, &CompileOptions::default())?;
    Ok((exe, cx))
}
