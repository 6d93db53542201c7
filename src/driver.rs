//! The compile driver: the one place where a module becomes an [`Executable`].
//!
//! The pipeline, in order:
//!
//! 1. **passes** ([`optimize`]): the default pipeline (`fusion, const_fold, dce`) or one
//!    named in [`OptimizeOptions::passes`], with the fusion switches and extra rules of
//!    [`OptimizeOptions::fusion`];
//! 2. **layout** ([`smelt_passes::layout::assign_layouts`]): activations in channel blocks
//!    where the kernels chosen for this host compute on them ([`CompileOptions::layouts`]);
//! 3. **lower** ([`smelt_passes::lower`]): every op to a checked loop-nest kernel;
//! 4. **codegen** ([`crate::codegen`]): Cranelift, while lowering still packs weights;
//! 5. **memory plan** ([`smelt_passes::lower::plan_memory`]): offsets of the temporaries;
//!
//! and then the runtime assembles the [`Executable`] from the pieces. Steps 2–5 need the
//! kernel choice (the host's micro-kernels), which is why they run here and not as
//! passes. The command line, the Rust API ([`compile`], [`compile_file`]), the C API and
//! `smelt verify` all call this module; nothing else orchestrates a compile.
//!
//! Entry points, from most to least complete: [`compile_file`] (load, with pinned input
//! shapes, then compile), [`compile`] (an in-memory module through every step), and the
//! two halves on their own for callers that need the module in between: [`optimize`]
//! (step 1) and [`Executable::compile`] (steps 2–5).

use std::path::Path;
use std::time::Instant;

use smelt_ir::Module;
use smelt_passes::fusion::FusionOptions;
use smelt_passes::lower;
use smelt_passes::{PassContext, PassManager};

use crate::codegen::{self, CodegenOptions};
use crate::microkernels::TileIsa;
use crate::runtime::{CompileTimes, Executable};
use crate::{Error, LoadOptions};

/// Everything [`compile`] and [`compile_file`] take: how to read the model, how to
/// optimize it, how to compile it.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Pinned input shapes (ONNX) and the interface errors are spelled for; used by
    /// [`compile_file`] as it loads the model. [`compile`] gets a module whose shapes
    /// are already fixed, and refuses pinned shapes rather than ignore them.
    pub load: LoadOptions,
    /// The pass pipeline, fusion switches and rules.
    pub optimize: OptimizeOptions,
    /// Threads, kernels, conv algorithm, layouts.
    pub compile: CompileOptions,
}

/// How to optimize a module before compiling it (step 1 of the pipeline).
#[derive(Clone, Debug, Default)]
pub struct OptimizeOptions {
    /// Pass pipeline by name; `None` runs the default (`fusion, const_fold, dce`).
    pub passes: Option<Vec<String>>,
    /// Options of the fusion pass (rule switches, extra rules, limits, `enabled: false`
    /// for `--no-fuse`).
    pub fusion: FusionOptions,
}

/// A callback given each pass's name and the module after it (for `--print-ir-after-all`).
pub type DumpFn<'a> = &'a mut dyn FnMut(&str, &Module);

/// Loads the model at `path` with `opts.load` ([`crate::load_model`]), then compiles it
/// like [`compile`]. Returns the executable of its entry function and the passes'
/// report (warnings, fusion reports, time per pass).
pub fn compile_file(path: &Path, opts: &Options) -> Result<(Executable, PassContext), Error> {
    let module = crate::load_model(path, &opts.load)?;
    compile_loaded(&module, opts)
}

/// Optimizes a copy of `module` with `opts.optimize` and compiles its entry function
/// with `opts.compile`: every step of the pipeline. Returns the executable and the
/// passes' report (warnings, fusion reports, time per pass).
///
/// `opts.load.input_shapes` must be empty: a module's shapes were fixed when it was
/// loaded (pin them with [`compile_file`] or [`crate::load_model`]).
pub fn compile(module: &Module, opts: &Options) -> Result<(Executable, PassContext), Error> {
    if !opts.load.input_shapes.is_empty() {
        return Err(Error::InvalidArgument(
            "input shapes are pinned as a model is loaded, and this module is already \
             loaded: pin them with compile_file or load_model"
                .into(),
        ));
    }
    compile_loaded(module, opts)
}

fn compile_loaded(module: &Module, opts: &Options) -> Result<(Executable, PassContext), Error> {
    let mut optimized = module.clone();
    let cx = optimize(&mut optimized, &opts.optimize, None)?;
    let exe = Executable::compile(&optimized, None, &opts.compile)?;
    Ok((exe, cx))
}

/// Runs the pass pipeline (step 1) on `module` in place; `dump(pass, module)` is called
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

/// Options of the back half of the pipeline ([`Executable::compile`]): layouts, lowering,
/// code generation, the memory plan and the threads of a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompileOptions {
    /// Run Cranelift's verifier on every generated function (on in tests).
    pub verify: bool,
    /// Give every intermediate its own memory (no reuse), for verification and profiling;
    /// [`Executable::run_keeping`] then returns every value a run computed.
    pub keep_intermediates: bool,
    /// Threads per run (the calling thread included); 0 means one per core. More than
    /// the machine's cores count as one per core (the process has one pool of a worker
    /// per core but one, shared by every executable; a run that finds it busy with
    /// another executable's kernel runs that kernel on its own thread); above
    /// [`MAX_THREADS`] compiling is an `InvalidArgument` error. Outputs are bit-identical
    /// for every count. Kernels compile on every core whatever it is.
    pub threads: usize,
    /// How 3×3 stride-1 convolutions are computed (Winograd where it wins, by default).
    pub conv: lower::ConvAlgorithm,
    /// Which code computes GEMM-shaped conv tiles (the best the host runs, by default).
    pub kernels: Kernels,
    /// How activations are laid out between kernels (channel blocks where they pay, by
    /// default).
    pub layouts: Layouts,
}

/// How activations are laid out in memory between kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layouts {
    /// Channel blocks (NCHW16c) between pointwise convs where every writer and reader
    /// computes on them ([`smelt_passes::layout`]; only with a micro-kernel), row-major
    /// elsewhere.
    #[default]
    Auto,
    /// Row-major (NCHW) everywhere, e.g. for A/B measurements.
    RowMajor,
}

impl Layouts {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Layouts::Auto => "auto",
            Layouts::RowMajor => "row-major",
        }
    }
}

/// The most threads a compile option may ask for ([`CompileOptions::threads`]); runs use
/// at most one per core in any case.
pub const MAX_THREADS: usize = 1024;

/// Which code computes GEMM-shaped conv tiles (1×1 and direct convolutions, Winograd's
/// batched products): Cranelift's f32x4 loops, or a native micro-kernel that JIT code
/// calls before it applies the fused epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kernels {
    /// The widest micro-kernel the host's CPU runs (AVX-512, else AVX2 + FMA), else
    /// Cranelift code.
    #[default]
    Auto,
    /// Only Cranelift-generated code: the portable path.
    Cranelift,
    /// The AVX2 + FMA micro-kernel (compiling fails on a host without them).
    Avx2,
    /// The AVX-512F micro-kernels: 32 output channels per call, 16 where a group has
    /// no multiple of 32 (compiling fails on a host without AVX-512F).
    Avx512,
}

impl Kernels {
    /// The instruction set whose conv-tile routines tiles call (`None`: Cranelift code
    /// only): for `Auto`, the widest this host runs. On AVX-512, tiles are 32 channels per
    /// call where a group has a multiple of 32, else 16 (lowering picks the routine).
    pub fn tile_isa(self) -> Option<TileIsa> {
        match self {
            Kernels::Auto => TileIsa::ALL.into_iter().find(|isa| isa.host_has()),
            Kernels::Cranelift => None,
            Kernels::Avx2 => Some(TileIsa::Avx2),
            Kernels::Avx512 => Some(TileIsa::Avx512),
        }
    }

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kernels::Auto => "auto",
            Kernels::Cranelift => "cranelift",
            Kernels::Avx2 => "avx2",
            Kernels::Avx512 => "avx512",
        }
    }
}

impl Executable {
    /// Compiles the function `func_name` of `module` (or its entry function when `None`)
    /// as it is — steps 2–5 of the pipeline: layouts, lowering with a check of every
    /// kernel, Cranelift, the memory plan — and has the runtime assemble the result.
    /// Run [`optimize`] before (or use [`compile`]) to get fused kernels.
    pub fn compile(
        module: &Module,
        func_name: Option<&str>,
        opts: &CompileOptions,
    ) -> Result<Executable, Error> {
        Self::compile_func(module, func_name, (None, None), opts)
    }

    /// [`Executable::compile`] of the entry function of `module`, a model at a padded
    /// sequence length, whose products stop at each run's valid length where `rows`
    /// lets them: `rows` is [`smelt_ir::padding::padded_rows`]'s analysis of this very
    /// function (against it at the shortest length it serves), which says whose rows
    /// past a valid length may hold anything finite (see
    /// [`smelt_passes::lower::LowerOptions::padded_rows`]; not applied when the layout
    /// pass rewrites the function, whose values `rows` numbers). Runs give the valid
    /// length with [`Executable::run_valid_rows_into`];
    /// [`DynamicExecutable`](crate::DynamicExecutable) does all of this for a model with
    /// a sequence length.
    pub fn compile_padded(
        module: &Module,
        rows: &smelt_ir::padding::PaddedRows,
        opts: &CompileOptions,
    ) -> Result<Executable, Error> {
        let rows = std::sync::Arc::new(rows.clone());
        Self::compile_func(module, None, (Some(rows), None), opts)
    }

    /// [`Executable::compile`] of `module`'s entry function, one of several compiles of
    /// the same model (a dynamic executable's buckets): packed weights are taken from
    /// and kept in `constants`, and with `rows` products stop at a run's valid rows
    /// ([`Executable::compile_padded`]).
    pub(crate) fn compile_sharing(
        module: &Module,
        rows: Option<&smelt_ir::padding::PaddedRows>,
        constants: &std::sync::Arc<lower::ConstantCache>,
        opts: &CompileOptions,
    ) -> Result<Executable, Error> {
        let rows = rows.map(|r| std::sync::Arc::new(r.clone()));
        Self::compile_func(module, None, (rows, Some(constants.clone())), opts)
    }

    fn compile_func(
        module: &Module,
        func_name: Option<&str>,
        (rows, constants): (
            Option<std::sync::Arc<smelt_ir::padding::PaddedRows>>,
            Option<std::sync::Arc<lower::ConstantCache>>,
        ),
        opts: &CompileOptions,
    ) -> Result<Executable, Error> {
        let start = Instant::now();
        let func = match func_name {
            Some(name) => module.func(name).ok_or_else(|| {
                Error::InvalidArgument(format!("the module has no function @{name}"))
            })?,
            None => module.entry().ok_or_else(|| {
                Error::InvalidArgument(
                    "the module has several functions and none is called @main; name one".into(),
                )
            })?,
        };
        if func.is_symbolic() {
            return Err(Error::InvalidArgument(
                smelt_ir::symbolic::needs_known_sizes("compiling", func),
            ));
        }
        if opts.threads > MAX_THREADS {
            return Err(Error::InvalidArgument(format!(
                "threads = {} is more than smelt's limit of {MAX_THREADS}",
                opts.threads
            )));
        }
        // the instruction set the conv tiles call, detected once: lowering sees its
        // routines, codegen links them, the executable remembers them for dumps
        let tiles = opts.kernels.tile_isa();
        let micro = tiles.map(TileIsa::target);
        // activation layouts depend on the kernels, so they are chosen here
        let laid_out = match opts.layouts {
            Layouts::Auto => smelt_passes::layout::assign_layouts(func, micro),
            Layouts::RowMajor => None,
        };
        let lower_opts = lower::LowerOptions {
            conv: opts.conv,
            micro,
            keep_every_value: opts.keep_intermediates,
            padded_rows: rows.filter(|_| laid_out.is_none() && !opts.keep_intermediates),
            constants,
        };
        let func = laid_out.as_ref().unwrap_or(func);
        // code generation runs while the weights are still being packed
        let mut lowered = start;
        let mut generated = start;
        let (program, code) = lower::lower_with_then(module, func, &lower_opts, |prog| {
            lowered = Instant::now();
            let code = codegen::compile(
                &prog.kernels,
                &CodegenOptions {
                    verify: opts.verify,
                    threads: 0,
                    tiles,
                },
            );
            generated = Instant::now();
            code
        })?;
        let code = code?;
        let plan = lower::plan_memory(&program, opts.keep_intermediates);
        // the arena is allocated per workspace, after this: budgeted with the weights
        let arena_bytes = (plan.arena_len as u64).saturating_mul(4);
        module
            .weights
            .check_room(
                &format!("the run-time arena of @{}", func.name),
                arena_bytes,
            )
            .map_err(|m| {
                Error::from(smelt_ir::Diagnostic::error(
                    "memory-budget",
                    m,
                    smelt_ir::Location::Unknown,
                ))
            })?;
        let packed = Instant::now();
        let keep = opts.keep_intermediates.then_some(func);
        let mut exe =
            Executable::assemble(module, &program, &plan, code, keep, opts.threads, tiles)?;
        exe.set_compile_times(CompileTimes {
            lower_ms: ms(lowered - start) + ms(packed - generated),
            codegen_ms: ms(generated - lowered),
            total_ms: ms(start.elapsed()),
        });
        Ok(exe)
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
