//! Code generation: loop-nest IR to Cranelift IR to native code.
//!
//! Each [`Kernel`] becomes one function `extern "C" fn(args: *const *mut f32, lo: i64,
//! hi: i64)`: `args` points to one buffer pointer per kernel argument; a parallel kernel
//! runs trips `lo..hi` of its top-level loop (others ignore them). No data is embedded in
//! code. Addresses are pointer induction variables: every (buffer, loop terms) pair used
//! in a loop is a pointer carried by the loop and bumped by a constant each trip, so no
//! address arithmetic is left in inner loops but those bumps. Loads
//! from read-only arguments are marked `readonly + notrap + can_move` so Cranelift may
//! hoist and fold them; loops test at the top; `max(x, 0)` is emitted as the
//! NaN-propagating select pattern (`x < 0 ? 0 : x`); `fma` becomes
//! `fmul + fadd` when the target lacks AVX+FMA (never the `fmaf` libcall).
//!
//! The rooms: this file holds the target description, the ISA flags and the compile
//! driver (check, link the conv-tile routines of the chosen [`TileIsa`], compile on
//! worker threads, finalize); `translate` turns one kernel into a Cranelift function;
//! `code_memory` owns the executable pages and hands out entry points (its module doc
//! states why that is sound).

use cranelift_codegen::isa::{OwnedTargetIsa, TargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module as _};
use smelt_ir::loops::{BlockedDepthwiseRow, ConvTile, DepthwiseRow, Kernel, Stmt};

mod code_memory;
mod translate;

use translate::{
    build_function, conv_tile_signature, kernel_signature, prefetch_rows_signature,
    row_routine_signature, RecordData, PREFETCH_ROWS_ID, ROW_ROUTINES_ID,
};

use crate::microkernels::{self, RowRoutine, TileIsa, ROUTINES, ROW_ROUTINES};
use crate::Error;
pub use code_memory::CompiledKernels;

/// The instruction-set features code generation depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetDesc {
    /// SSE4.1 (rounding, blends).
    pub has_sse41: bool,
    /// AVX (VEX encodings, unaligned memory operands).
    pub has_avx: bool,
    /// AVX2.
    pub has_avx2: bool,
    /// FMA3.
    pub has_fma: bool,
    /// The instruction set whose conv-tile routines [`Stmt::ConvTile`] calls link to
    /// (`None`: a kernel with such a call is refused).
    pub tiles: Option<TileIsa>,
}

impl TargetDesc {
    /// A fixed x86-64 description (AVX2 + FMA and its conv-tile routines, like the
    /// development machines), for snapshot tests that must not depend on the host's CPUID.
    pub fn fixed_avx2_fma() -> TargetDesc {
        TargetDesc {
            has_sse41: true,
            has_avx: true,
            has_avx2: true,
            has_fma: true,
            tiles: Some(TileIsa::Avx2),
        }
    }

    /// The host's features (CPUID), with no conv-tile routines (they are a choice of
    /// the compilation: [`CodegenOptions::tiles`]), or an error on hosts other than x86-64.
    pub fn host() -> Result<TargetDesc, Error> {
        Ok(Self::of_isa(host_isa(false, Effort::Quick)?.as_ref()))
    }

    /// The features `isa` was built with (no conv-tile routines).
    fn of_isa(isa: &dyn TargetIsa) -> TargetDesc {
        let flag = |name: &str| {
            isa.isa_flags()
                .iter()
                .any(|v| v.name == name && v.as_bool() == Some(true))
        };
        TargetDesc {
            has_sse41: flag("has_sse41"),
            has_avx: flag("has_avx"),
            has_avx2: flag("has_avx2"),
            has_fma: flag("has_fma"),
            tiles: None,
        }
    }

    /// Whether `fma` compiles to one fused instruction (VEX-encoded FMA3 needs AVX too).
    pub fn fused_fma(&self) -> bool {
        self.has_avx && self.has_fma
    }
}

/// How much work Cranelift spends on a function: which of its passes run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Effort {
    /// The mid-end optimizer (GVN, LICM, constant folding, redundant loads) and the
    /// backtracking register allocator.
    Optimized,
    /// The backtracking register allocator, no mid-end optimizer.
    Allocated,
    /// The single-pass register allocator, no mid-end optimizer.
    Quick,
}

/// The effort for kernels that do more than call routines, when conv tiles are
/// `tiles`'s routines (see [`compile`]).
fn effort_beside(tiles: Option<TileIsa>) -> Effort {
    match tiles {
        Some(_) => Effort::Allocated,
        None => Effort::Optimized,
    }
}

/// The effort [`compile`] spends on `kernel`.
fn effort_for(kernel: &Kernel, tiles: Option<TileIsa>) -> Effort {
    match only_calls(&kernel.body) {
        true => Effort::Quick,
        false => effort_beside(tiles),
    }
}

/// Cranelift's flags for functions compiled with `effort`.
fn shared_flags(verify: bool, effort: Effort) -> Result<settings::Flags, Error> {
    let mut b = settings::builder();
    let set = |b: &mut settings::Builder, k: &str, v: &str| {
        b.set(k, v)
            .map_err(|e| Error::Unsupported(format!("cranelift flag {k}={v}: {e}")))
    };
    let optimized = effort == Effort::Optimized;
    set(
        &mut b,
        "opt_level",
        if optimized { "speed" } else { "none" },
    )?;
    set(
        &mut b,
        "enable_verifier",
        if verify { "true" } else { "false" },
    )?;
    if effort == Effort::Quick {
        set(&mut b, "regalloc_algorithm", "single_pass")?;
    }
    set(&mut b, "use_colocated_libcalls", "false")?;
    set(&mut b, "is_pic", "false")?;
    // kernels with local buffers have frames of several pages: touch each page in order
    // so a frame can never step over a thread's guard page
    set(&mut b, "enable_probestack", "true")?;
    set(&mut b, "probestack_strategy", "inline")?;
    Ok(settings::Flags::new(b))
}

/// The host ISA with flags from CPUID; only x86-64 is supported.
fn host_isa(verify: bool, effort: Effort) -> Result<OwnedTargetIsa, Error> {
    if !cfg!(target_arch = "x86_64") {
        return Err(Error::Unsupported(format!(
            "unsupported target: the JIT supports x86-64 hosts only, this host is {}",
            std::env::consts::ARCH
        )));
    }
    let builder = cranelift_native::builder()
        .map_err(|e| Error::Unsupported(format!("unsupported target: {e}")))?;
    builder
        .finish(shared_flags(verify, effort)?)
        .map_err(|e| Error::Unsupported(format!("unsupported target: {e}")))
}

/// Options of code generation.
#[derive(Clone, Copy, Debug, Default)]
pub struct CodegenOptions {
    /// Run Cranelift's IR verifier on every function (≈36% more compile time; on in tests).
    pub verify: bool,
    /// Threads compiling functions in parallel; 0 means one per core.
    pub threads: usize,
    /// The instruction set whose conv-tile routines calls link to (`None`: a kernel
    /// calling one is refused); compiling fails when the host's CPU does not run it.
    pub tiles: Option<TileIsa>,
}

/// A compiled kernel: `args` points to one valid buffer pointer per kernel argument; a
/// parallel kernel runs trips `lo..hi` of its top-level loop (clamped to its trip count),
/// any other kernel runs whole whatever `lo` and `hi` are. It returns 0, or the
/// [`Fault`](smelt_ir::loops::Fault) that ended it early (a parallel kernel never faults:
/// the checker refuses one that could).
pub type KernelFn = unsafe extern "C" fn(args: *const *mut u8, lo: i64, hi: i64) -> i32;

/// Compiles `kernels` for the host on `opts.threads` threads (0: all cores). Each kernel
/// is checked first ([`Kernel::check`]). Functions compile to machine code independently
/// on worker threads (a `JITModule` is not `Sync`); the module then takes their bytes.
pub fn compile(kernels: &[Kernel], opts: &CodegenOptions) -> Result<CompiledKernels, Error> {
    // Where convolutions and products call the micro-kernels, the kernels' own code is
    // data movement, elementwise maps and address arithmetic that the translator
    // already emits folded and hoisted: Cranelift's mid-end optimizer changed no
    // kernel's run time measurably (per-kernel profiles of ResNet-50, DBNet, YOLO;
    // BERT, ViT and MobileNetV3 whole) but was 15% of code generation (YOLO 6.9 → 6.1
    // ms, DBNet 10.3 → 9.0). The portable path's conv tiles are Cranelift code, which
    // it does speed up (ResNet-18 with `--kernels cranelift` 47.7 → 55.6 ms without
    // it): there every kernel is optimized. benches/RESULTS.md, session 31.
    let isa = host_isa(opts.verify, effort_beside(opts.tiles))?;
    // A kernel that only loops around routine calls spends its run time in the routines:
    // its own code is address arithmetic, which the single-pass register allocator
    // handles as well as the backtracking one, in a fraction of the time (code
    // generation YOLO 14.5 → 11.4 ms, MobileNetV3-small 10.2 → 7.0, ResNet-50
    // 10.1 → 7.0), and which needs no mid-end optimizer either (YOLO's code generation
    // 9.0 → 8.0 ms more); run times unchanged: benches/RESULTS.md.
    let quick_isa = host_isa(opts.verify, Effort::Quick)?;
    // the host's features as the ISA just built read them (no third detection)
    let target = TargetDesc {
        tiles: opts.tiles,
        ..TargetDesc::of_isa(isa.as_ref())
    };
    if let Some(tiles) = opts.tiles.filter(|t| !t.host_has()) {
        return Err(Error::Unsupported(format!(
            "the {} conv-tile routines need a CPU feature this host lacks",
            tiles.name()
        )));
    }
    for k in kernels {
        k.check().map_err(Error::Unsupported)?;
        check_calls(k, &target)?;
    }
    let mut builder = JITBuilder::with_isa(isa.clone(), cranelift_module::default_libcall_names());
    for r in &ROUTINES {
        builder.symbol(r.symbol, r.entry());
    }
    for (kind, isa, symbol) in ROW_ROUTINES {
        builder.symbol(symbol, kind.entry(isa));
    }
    let prefetch_rows: microkernels::PrefetchRowsFn = microkernels::prefetch_rows;
    builder.symbol(
        microkernels::PREFETCH_ROWS_SYMBOL,
        prefetch_rows as *const u8,
    );
    let mut module = JITModule::new(builder);
    // the routines first, so their ids are their indices in ROUTINES (CLIF text names
    // them the same way without a module)
    let routine_sig = conv_tile_signature(isa.as_ref());
    for (i, r) in ROUTINES.iter().enumerate() {
        let id = module
            .declare_function(r.symbol, Linkage::Import, &routine_sig)
            .map_err(|e| Error::Unsupported(format!("declaring {}: {e}", r.symbol)))?;
        if id.as_u32() as usize != i {
            return Err(Error::Unsupported(format!(
                "{} was declared as function {}, not {i}",
                r.symbol,
                id.as_u32()
            )));
        }
    }
    let id = module
        .declare_function(
            microkernels::PREFETCH_ROWS_SYMBOL,
            Linkage::Import,
            &prefetch_rows_signature(isa.as_ref()),
        )
        .map_err(|e| Error::Unsupported(format!("declaring the prefetch helper: {e}")))?;
    if id.as_u32() as usize != PREFETCH_ROWS_ID {
        return Err(Error::Unsupported(format!(
            "the prefetch helper was declared as function {}, not {PREFETCH_ROWS_ID}",
            id.as_u32()
        )));
    }
    for (i, (kind, _, symbol)) in ROW_ROUTINES.into_iter().enumerate() {
        let sig = row_routine_signature(kind, isa.as_ref());
        let id = module
            .declare_function(symbol, Linkage::Import, &sig)
            .map_err(|e| Error::Unsupported(format!("declaring {symbol}: {e}")))?;
        if id.as_u32() as usize != ROW_ROUTINES_ID + i {
            return Err(Error::Unsupported(format!(
                "{symbol} was declared as function {}, not {}",
                id.as_u32(),
                ROW_ROUTINES_ID + i
            )));
        }
    }
    // every call's record, a read-only data object the module keeps with the code
    let records = RecordData::collect(kernels, |bytes| {
        let failed = |e: cranelift_module::ModuleError| {
            Error::Unsupported(format!("defining a routine's call record: {e}"))
        };
        let id = module
            .declare_anonymous_data(false, false)
            .map_err(failed)?;
        let mut data = cranelift_module::DataDescription::new();
        data.define(bytes.into_boxed_slice());
        // the records' words are `i64`s
        data.set_align(8);
        module.define_data(id, &data).map_err(failed)?;
        Ok::<_, Error>(id.as_u32())
    })?;
    let ids = kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            code_memory::declare_kernel(&mut module, &format!("k{i}"), isa.as_ref())
                .map_err(|e| codegen_error(k, e))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    }
    .clamp(1, kernels.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let worker = || -> Vec<(usize, Result<MachineCode, Error>)> {
        let mut fctx = FunctionBuilderContext::new();
        // one Cranelift context per thread: its analyses' and the register allocator's
        // memory are reused from kernel to kernel instead of allocated afresh
        let mut cx = cranelift_codegen::Context::new();
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(k) = kernels.get(i) else { break };
            done.push((
                i,
                machine_code(
                    k,
                    &target,
                    match effort_for(k, opts.tiles) {
                        Effort::Quick => quick_isa.as_ref(),
                        _ => isa.as_ref(),
                    },
                    &records,
                    &mut fctx,
                    &mut cx,
                    ids[i].func_id(),
                ),
            ));
        }
        done
    };
    let mut results: Vec<Option<Result<MachineCode, Error>>> =
        (0..kernels.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(worker)).collect();
        let mut all = worker();
        for h in helpers {
            match h.join() {
                Ok(v) => all.extend(v),
                Err(_) => all.push((
                    usize::MAX,
                    Err(Error::Unsupported(
                        "a code generation thread panicked".into(),
                    )),
                )),
            }
        }
        for (i, r) in all {
            match results.get_mut(i) {
                Some(slot) => *slot = Some(r),
                None => results.push(Some(r)),
            }
        }
    });
    let mut sizes = Vec::with_capacity(kernels.len());
    for (i, r) in results.into_iter().enumerate() {
        let code =
            r.ok_or_else(|| Error::Unsupported(format!("kernel {i} was not compiled")))??;
        sizes.push(code.bytes.len());
        let id = ids
            .get(i)
            .ok_or_else(|| Error::Unsupported("a code generation thread failed".into()))?
            .func_id();
        module
            .define_function_bytes(id, code.align, &code.bytes, &code.relocs)
            .map_err(|e| codegen_error(&kernels[i], e))?;
    }
    let compiled = CompiledKernels::finalize(module, &ids)?;
    if std::env::var_os("SMELT_PERF_MAP").is_some() {
        write_perf_map(kernels, compiled.entries(), &sizes);
    }
    Ok(compiled)
}

/// Appends each kernel's address range and name to `/tmp/perf-PID.map`, where `perf
/// report` looks up symbols of JIT code (profiling aid, on when `SMELT_PERF_MAP` is set;
/// a failed write only loses names in the profile).
fn write_perf_map(kernels: &[Kernel], fns: &[KernelFn], sizes: &[usize]) {
    use std::io::Write;
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    else {
        return;
    };
    let mut text = String::new();
    for ((k, f), size) in kernels.iter().zip(fns).zip(sizes) {
        text.push_str(&format!("{:x} {size:x} {}\n", *f as usize, k.name));
    }
    let _ = file.write_all(text.as_bytes());
}

/// One function's machine code, ready for `define_function_bytes`.
struct MachineCode {
    bytes: Vec<u8>,
    align: u64,
    relocs: Vec<cranelift_module::ModuleReloc>,
}

fn machine_code(
    k: &Kernel,
    target: &TargetDesc,
    isa: &dyn TargetIsa,
    records: &RecordData,
    fctx: &mut FunctionBuilderContext,
    ctx: &mut cranelift_codegen::Context,
    id: cranelift_module::FuncId,
) -> Result<MachineCode, Error> {
    ctx.clear();
    ctx.func = build_function(k, target, isa, records, fctx);
    ctx.compile(isa, &mut Default::default())
        .map_err(|e| codegen_error(k, format!("{:?}", e.inner)))?;
    let code = ctx
        .compiled_code()
        .ok_or_else(|| codegen_error(k, "no machine code"))?;
    let align = (code.buffer.alignment as u64)
        .max(isa.function_alignment().minimum as u64)
        .max(isa.symbol_alignment());
    let bytes = code.code_buffer().to_vec();
    let relocs = code
        .buffer
        .relocs()
        .iter()
        .map(|r| cranelift_module::ModuleReloc::from_mach_reloc(r, &ctx.func, id))
        .collect();
    Ok(MachineCode {
        bytes,
        align,
        relocs,
    })
}

fn codegen_error(k: &Kernel, e: impl std::fmt::Display) -> Error {
    Error::Unsupported(format!("code generation of kernel {} failed: {e}", k.name))
}

/// Refuses a kernel whose native calls `target` has no routine for: no tile ISA chosen,
/// or none of its conv-tile routines computes that many lanes.
fn check_calls(k: &Kernel, target: &TargetDesc) -> Result<(), Error> {
    for call in calls_of(&k.body) {
        let Some(isa) = target.tiles else {
            return Err(Error::Unsupported(format!(
                "kernel {} calls a {} routine, but no micro-kernel instruction set was chosen",
                k.name,
                call.kind()
            )));
        };
        let Call::Tile(t) = call else { continue };
        if isa.routine(t.lanes).is_none() {
            return Err(Error::Unsupported(format!(
                "kernel {} calls a conv tile of {} lanes, which the {} routines do not compute",
                k.name,
                t.lanes,
                isa.name()
            )));
        }
    }
    Ok(())
}

/// One call of a native routine, by its shape record.
#[derive(Clone, Copy)]
enum Call {
    /// A conv-tile routine.
    Tile(ConvTile),
    /// A row routine, with its record when it takes one (a depthwise row's shape).
    Row(RowRoutine, Option<RowRecord>),
}

/// The shape record a row routine reads through a pointer: a `repr(C)` struct of `i64`
/// words, written to a stack slot once at function entry per distinct shape.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum RowRecord {
    /// A depthwise row's.
    Depthwise(DepthwiseRow),
    /// A blocked depthwise row's.
    Blocked(BlockedDepthwiseRow),
}

impl RowRecord {
    /// The record's words in memory order.
    fn words(&self) -> Vec<i64> {
        match self {
            RowRecord::Depthwise(r) => r.words().to_vec(),
            RowRecord::Blocked(r) => r.words().to_vec(),
        }
    }
}

impl Call {
    /// What the routine is, for messages.
    fn kind(&self) -> &'static str {
        match self {
            Call::Tile(_) => "conv-tile",
            Call::Row(kind, _) => kind.name(),
        }
    }
}

/// Whether `stmts` compute nothing themselves: loops around routine calls and
/// prefetches only.
fn only_calls(stmts: &[Stmt]) -> bool {
    stmts.iter().all(|s| match s {
        Stmt::Loop { body, .. } => only_calls(body),
        Stmt::Assign { .. } | Stmt::Store { .. } => false,
        _ => true,
    })
}

/// The shape of every native routine call in `stmts`, in order, with repeats.
fn calls_of(stmts: &[Stmt]) -> Vec<Call> {
    fn walk(stmts: &[Stmt], found: &mut Vec<Call>) {
        for s in stmts {
            match s {
                Stmt::Loop { body, .. } => walk(body, found),
                Stmt::ConvTile { tile, .. } => found.push(Call::Tile(*tile)),
                Stmt::DepthwiseRow { row, .. } => found.push(Call::Row(
                    RowRoutine::Depthwise,
                    Some(RowRecord::Depthwise(*row)),
                )),
                Stmt::BlockedDepthwiseRow { row, .. } => found.push(Call::Row(
                    RowRoutine::BlockedDepthwise,
                    Some(RowRecord::Blocked(*row)),
                )),
                Stmt::SoftmaxRow { .. } => found.push(Call::Row(RowRoutine::Softmax, None)),
                Stmt::ActivationRows { act, .. } => {
                    found.push(Call::Row(RowRoutine::Activation(*act), None))
                }
                Stmt::StoreRows { act, .. } => found.push(Call::Row(RowRoutine::Store(*act), None)),
                Stmt::StorePlanes { act, .. } => {
                    found.push(Call::Row(RowRoutine::Planes(*act), None))
                }
                Stmt::WinogradOutputRow { .. } => {
                    found.push(Call::Row(RowRoutine::WinogradOutput, None))
                }
                Stmt::WinogradInputRow { .. } => {
                    found.push(Call::Row(RowRoutine::WinogradInput, None))
                }
                Stmt::Assign { .. } | Stmt::Store { .. } | Stmt::Prefetch { .. } => {}
            }
        }
    }
    let mut found = Vec::new();
    walk(stmts, &mut found);
    found
}

/// The Cranelift IR of `kernel` for `target`, as text (before optimization); the input of
/// `--dump-clif` and the CLIF snapshots. Deterministic for a fixed target description.
pub fn clif_text(kernel: &Kernel, target: &TargetDesc) -> Result<String, Error> {
    let isa = fixed_isa(target, effort_for(kernel, target.tiles))?;
    check_calls(kernel, target)?;
    let mut fctx = FunctionBuilderContext::new();
    let records = RecordData::numbered(kernel);
    let func = build_function(kernel, target, isa.as_ref(), &records, &mut fctx);
    cranelift_codegen::verifier::verify_function(&func, isa.as_ref())
        .map_err(|e| codegen_error(kernel, e))?;
    Ok(format!("{}{}", records.comments(), func.display()))
}

/// The machine code of `kernel` for `target`, disassembled (Cranelift's VCode text), for
/// checking register allocation (spills) by eye.
pub fn disassemble(kernel: &Kernel, target: &TargetDesc) -> Result<String, Error> {
    let isa = fixed_isa(target, effort_for(kernel, target.tiles))?;
    check_calls(kernel, target)?;
    let mut fctx = FunctionBuilderContext::new();
    let records = RecordData::numbered(kernel);
    let mut ctx = cranelift_codegen::Context::for_function(build_function(
        kernel,
        target,
        isa.as_ref(),
        &records,
        &mut fctx,
    ));
    ctx.set_disasm(true);
    let code = ctx
        .compile(isa.as_ref(), &mut Default::default())
        .map_err(|e| codegen_error(kernel, format!("{:?}", e.inner)))?;
    Ok(code.vcode.clone().unwrap_or_default())
}

/// An x86-64 ISA with exactly the features of `target` (verifier on), compiling with
/// `effort`.
fn fixed_isa(target: &TargetDesc, effort: Effort) -> Result<OwnedTargetIsa, Error> {
    let triple: target_lexicon::Triple = "x86_64-unknown-linux-gnu"
        .parse()
        .map_err(|e| Error::Unsupported(format!("target triple: {e}")))?;
    let mut b = cranelift_codegen::isa::lookup(triple)
        .map_err(|e| Error::Unsupported(format!("unsupported target: {e}")))?;
    let mut set = |name: &str, on: bool| {
        b.set(name, if on { "true" } else { "false" })
            .map_err(|e| Error::Unsupported(format!("ISA flag {name}: {e}")))
    };
    let sse = target.has_sse41;
    for f in ["has_sse3", "has_ssse3", "has_sse41"] {
        set(f, sse)?;
    }
    set("has_avx", target.has_avx)?;
    set("has_avx2", target.has_avx2)?;
    set("has_fma", target.has_fma)?;
    b.finish(shared_flags(true, effort)?)
        .map_err(|e| Error::Unsupported(format!("unsupported target: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ir::loops::{Affine, BufId, BufPtr, Expr, LoopVar, VarId, Width};

    fn looped(body: Vec<Stmt>) -> Stmt {
        Stmt::Loop {
            var: LoopVar(0),
            start: 0,
            end: 4,
            step: 1,
            limit: None,
            body,
        }
    }

    /// Loops limited at run time run exactly the iterations whose row is below the
    /// extent (or, with `from`, at or past it), for every extent from 0 past the
    /// loop's end: a prefix loop, a suffix loop of step 3, single iterations with
    /// constant rows, and a row reading the enclosing loop's variable.
    #[test]
    #[allow(unsafe_code)]
    fn limited_loops_run_the_iterations_their_rows_allow() {
        use smelt_ir::loops::{Access, KernelBuilder, LoopLimit};
        const N: i64 = 20;
        let mut kb = KernelBuilder::new("limited");
        let out = kb.arg("out", N as usize, Access::Write);
        let marks = kb.arg("marks", 4, Access::Write);
        let steps = kb.arg("steps", N as usize, Access::Write);
        let extent = kb.typed_arg("valid", smelt_ir::DType::I64, 1, Access::Read);
        let limit = |row: Affine, from: bool| Some(LoopLimit { extent, row, from });
        let one = || Expr::constant(1.0, Width::Scalar);
        // rows 4i..4i+4 for the blocks that start below the extent
        let block = Affine::var(kb.next_loop_var()).scale(4);
        kb.for_loop_limited(0, N / 4, 1, limit(block, false), |kb, i| {
            for l in 0..4 {
                let at = Affine::var(i).scale(4).plus(l);
                kb.store(out, at, one(), Width::Scalar);
            }
        });
        // rows at or past the extent, every third from 1
        let row = Affine::var(kb.next_loop_var());
        kb.for_loop_limited(1, N, 3, limit(row, true), |kb, r| {
            kb.store(steps, Affine::var(r), one(), Width::Scalar);
        });
        kb.for_loop_limited(0, 1, 1, limit(Affine::constant(7), false), |kb, _| {
            kb.store(marks, Affine::constant(0), one(), Width::Scalar);
        });
        kb.for_loop_limited(0, 1, 1, limit(Affine::constant(7), true), |kb, _| {
            kb.store(marks, Affine::constant(1), one(), Width::Scalar);
        });
        kb.for_loop(0, 2, 1, |kb, j| {
            let row = Affine::var(j).scale(10).plus(5);
            kb.for_loop_limited(0, 1, 1, limit(row, false), |kb, _| {
                kb.store(marks, Affine::var(j).plus(2), one(), Width::Scalar);
            });
        });
        let kernel = kb.finish();
        kernel.check().expect("a limited kernel checks");
        let opts = CodegenOptions {
            verify: true,
            threads: 1,
            tiles: None,
        };
        let code = compile(&[kernel], &opts).expect("compiles");
        let f = code.get(0).expect("one kernel");
        for x in 0..=N + 2 {
            let (mut o, mut m, mut st) =
                (vec![0f32; N as usize], [0f32; 4], vec![0f32; N as usize]);
            let mut valid = x;
            let mut args = [
                o.as_mut_ptr() as *mut u8,
                m.as_mut_ptr() as *mut u8,
                st.as_mut_ptr() as *mut u8,
                &mut valid as *mut i64 as *mut u8,
            ];
            // SAFETY: one live buffer per argument, of the declared lengths and types
            let status = unsafe { f(args.as_mut_ptr() as *const *mut u8, 0, 1) };
            assert_eq!(status, 0);
            let want_o: Vec<f32> = (0..N)
                .map(|r| f32::from(u8::from(4 * (r / 4) < x)))
                .collect();
            let want_st: Vec<f32> = (0..N)
                .map(|r| f32::from(u8::from(r % 3 == 1 && r >= x)))
                .collect();
            let want_m = [7 < x, 7 >= x, 5 < x, 15 < x].map(|b| f32::from(u8::from(b)));
            assert_eq!(o, want_o, "prefix blocks at extent {x}");
            assert_eq!(st, want_st, "suffix of step 3 at extent {x}");
            assert_eq!(m, want_m, "single iterations at extent {x}");
        }
    }

    /// Random limited loop pairs — an outer loop and an inner one whose row reads both
    /// variables (the outer's coefficient of any sign), with steps, starts, prefix and
    /// suffix limits — run exactly the iterations a direct evaluation of the rows
    /// allows, at every extent around the rows' range.
    #[test]
    #[allow(unsafe_code)]
    fn random_limited_loops_match_their_rows() {
        use smelt_ir::loops::{Access, KernelBuilder, LoopLimit};
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |lo: i64, hi: i64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            lo + (seed % (hi - lo + 1) as u64) as i64
        };
        let opts = CodegenOptions {
            verify: true,
            threads: 1,
            tiles: None,
        };
        for case in 0..24 {
            let (outer_end, outer_step) = (next(1, 4), next(1, 2));
            let (start, end, step) = (next(0, 3), next(4, 12), next(1, 3));
            let (a, b, c) = (next(0, 3), next(-3, 3), next(-4, 6));
            let from = next(0, 1) == 1;
            let width = end as usize;
            let mut kb = KernelBuilder::new("random_limited");
            let out = kb.arg("out", outer_end as usize * width, Access::Write);
            let extent = kb.typed_arg("valid", smelt_ir::DType::I64, 1, Access::Read);
            kb.for_loop(0, outer_end, outer_step, |kb, j| {
                let i = kb.next_loop_var();
                let row = Affine::var(i)
                    .scale(a)
                    .add(&Affine::var(j).scale(b))
                    .plus(c);
                let limit = Some(LoopLimit { extent, row, from });
                kb.for_loop_limited(start, end, step, limit, |kb, i| {
                    let at = Affine::var(j).scale(width as i64).add(&Affine::var(i));
                    kb.store(out, at, Expr::constant(1.0, Width::Scalar), Width::Scalar);
                });
            });
            let kernel = kb.finish();
            kernel.check().expect("a random limited kernel checks");
            let code = compile(&[kernel], &opts).expect("compiles");
            let f = code.get(0).expect("one kernel");
            for x in -4..=24i64 {
                let mut got = vec![0f32; outer_end as usize * width];
                let mut valid = x;
                let mut args = [
                    got.as_mut_ptr() as *mut u8,
                    &mut valid as *mut i64 as *mut u8,
                ];
                // SAFETY: one live buffer per argument, of the declared lengths and types
                let status = unsafe { f(args.as_mut_ptr() as *const *mut u8, 0, 1) };
                assert_eq!(status, 0);
                let mut want = vec![0f32; got.len()];
                for j in (0..outer_end).step_by(outer_step as usize) {
                    for i in (start..end).step_by(step as usize) {
                        if (a * i + b * j + c < x) != from {
                            want[j as usize * width + i as usize] = 1.0;
                        }
                    }
                }
                let shape = (outer_end, outer_step, start, end, step, a, b, c, from);
                assert_eq!(got, want, "case {case} {shape:?} at extent {x}");
            }
        }
    }

    /// A limit whose row falls as its loop's variable grows, or that reads its extent
    /// from a local buffer or a variable of no enclosing loop, is refused.
    #[test]
    fn limits_the_checker_cannot_prove_a_prefix_of_are_refused() {
        use smelt_ir::loops::{Access, KernelBuilder, LoopLimit};
        let build = |make: &dyn Fn(&mut KernelBuilder, BufId) -> LoopLimit| {
            let mut kb = KernelBuilder::new("limited");
            let out = kb.arg("out", 8, Access::Write);
            let extent = kb.typed_arg("valid", smelt_ir::DType::I64, 1, Access::Read);
            let limit = make(&mut kb, extent);
            kb.for_loop_limited(0, 8, 1, Some(limit), |kb, i| {
                kb.store(
                    out,
                    Affine::var(i),
                    Expr::constant(1.0, Width::Scalar),
                    Width::Scalar,
                );
            });
            kb.finish().check()
        };
        let falling = build(&|kb, extent| LoopLimit {
            extent,
            row: Affine::var(kb.next_loop_var()).scale(-1).plus(8),
            from: false,
        });
        assert!(falling.unwrap_err().contains("falls"));
        let local = build(&|kb, _| LoopLimit {
            extent: kb.local(1),
            row: Affine::var(kb.next_loop_var()),
            from: false,
        });
        assert!(local.unwrap_err().contains("local"));
        let stray = build(&|kb, extent| LoopLimit {
            extent,
            row: Affine::var(LoopVar(kb.next_loop_var().0 + 1)),
            from: false,
        });
        assert!(stray.unwrap_err().contains("not an enclosing"));
        let float = build(&|kb, _| LoopLimit {
            extent: kb.arg("f", 1, Access::Read),
            row: Affine::var(kb.next_loop_var()),
            from: false,
        });
        assert!(float.is_err());
        let fine = build(&|kb, extent| LoopLimit {
            extent,
            row: Affine::var(kb.next_loop_var()),
            from: true,
        });
        assert_eq!(fine, Ok(()));
    }

    /// Loops of prefetches (or calls) only take the quick allocator; one assignment
    /// anywhere inside makes the kernel compute, and it keeps the backtracking one.
    #[test]
    fn only_calls_sees_arithmetic_at_any_depth() {
        let prefetch = Stmt::Prefetch {
            at: BufPtr {
                buf: BufId(0),
                index: Affine::constant(0),
            },
            rows: 1,
            row_stride: 16,
            row_len: 16,
        };
        let assign = Stmt::Assign {
            dst: VarId(0),
            value: Expr::constant(1.0, Width::F32x4),
        };
        assert!(only_calls(&[]));
        assert!(only_calls(&[looped(vec![looped(vec![prefetch.clone()])])]));
        assert!(!only_calls(&[looped(vec![
            prefetch.clone(),
            looped(vec![assign.clone()])
        ])]));
        assert!(!only_calls(&[prefetch, assign]));
    }
}
