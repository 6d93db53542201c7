//! The runtime: `Executable` (code, weights, memory plan) and its checked `run`.
//!
//! The runtime owns and runs executables; it does not make them: the compile driver
//! ([`crate::driver`], behind [`Executable::compile`] and [`crate::compile`]) lowers,
//! generates code and plans memory, then hands the pieces to the runtime to assemble.
//! An [`Executable`] is immutable from then on: it owns the native code
//! (freed on drop), the weights and constants the kernels read, and the memory plan of
//! the temporaries. Scratch memory belongs to a run: [`Executable::run_with`] uses a
//! caller's [`Workspace`] and allocates nothing; [`Executable::run`] borrows a workspace
//! from a pool (one per concurrent caller, reused), so one executable serves many
//! threads without locking around the computation. Intra-op threads come from a
//! process-wide pool ([`pool`]) that splits parallel kernels over output tiles only.

mod batch;
mod elements;
mod entry;
mod pool;

pub(crate) use elements::copy_common_box;
pub use elements::{Elements, ElementsMut};

use std::sync::{Arc, Mutex};

use smelt_ir::diag::Location;
use smelt_ir::loops::Kernel;
use smelt_ir::{AlignedBuf, Func, Layout, Module, Op, Tensor, TensorData, TensorType, Value};
use smelt_passes::lower::{self, BufferKind, MemoryPlan, Program};

use crate::codegen::{CompiledKernels, KernelFn};
use crate::microkernels::TileIsa;
use crate::Error;

/// Time and work of one kernel call in a profiled run ([`Executable::run_profiled`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelProfile {
    /// The kernel's name, e.g. `conv2d_1x64x58x58_k3x3_...`.
    pub kernel: String,
    /// The op it computes, e.g. `fused(conv2d -> add, relu)`.
    pub op: String,
    /// The user's location of that op (file position, ONNX node name, or the fused list).
    pub loc: Location,
    /// Floating-point operations of the call (an FMA counts two).
    pub flops: u64,
    /// Bytes of the buffers the call reads and writes (each counted once).
    pub bytes: u64,
    /// Wall time of the call in nanoseconds.
    pub ns: u64,
}

/// One value a run computed, from [`Executable::run_keeping`].
#[derive(Clone, Debug, PartialEq)]
pub struct Intermediate {
    /// Index of the instruction that computed it in the function's body: the number the
    /// IR text prints (`%7 = conv2d ...` is instruction 7).
    pub inst: usize,
    /// The value in the compiled function ([`Func::inst_value`] of `inst`: parameters
    /// come first, so this is `inst` plus the number of parameters).
    pub value: Value,
    /// The op's mnemonic, e.g. `conv2d` or `fused`.
    pub op: &'static str,
    /// Where the op came from: file:line:col, ONNX node name, or the merged list of a
    /// fused op.
    pub loc: Location,
    /// The value, in row-major order whatever layout the kernels used (its `ty` has the
    /// value's shape and the row-major layout).
    pub tensor: Tensor,
}

/// Where a non-constant value of the function lives after a run (keep-intermediates only).
struct KeptValue {
    value: Value,
    inst: usize,
    op: &'static str,
    loc: Location,
    ty: TensorType,
    src: Source,
}

/// Name and type of an input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The parameter or result name.
    pub name: String,
    /// Shape, element type and layout.
    pub ty: TensorType,
}

impl TensorInfo {
    /// Number of elements (of its element type) a buffer for this tensor holds: its
    /// storage length.
    pub fn len(&self) -> usize {
        self.ty.storage_len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a kernel argument's storage is at run time.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The caller's i-th input slice.
    Input(usize),
    /// The i-th owned constant (module weight or lowering constant).
    Constant(usize),
    /// Elements `offset..` of the run's arena.
    Arena(usize),
    /// The caller's i-th output slice: the kernel computing a result writes it in place
    /// (no copy after the run).
    Output(usize),
    /// The workspace's `i64` holding the run's valid rows (see
    /// [`Executable::padded_rows`]).
    ValidRows,
}

struct ExecStep {
    kernel: KernelFn,
    args: Vec<Source>,
    /// Trips of the top-level loop when the kernel may be split across threads and is
    /// big enough to gain from it.
    split: Option<i64>,
    /// Trips of the top-level loop of a parallel kernel (called whole as `0..trips`).
    trips: i64,
    /// Whether a call may end with a fault status (then its copies run one by one).
    can_fault: bool,
    /// Index into `Executable::step_info`.
    info: usize,
}

/// What a step computes, for profiles.
struct StepInfo {
    kernel: String,
    /// The kernel's index in [`Executable::kernels`].
    index: usize,
    op: String,
    loc: Location,
    flops: u64,
    bytes: u64,
}

/// Kernels doing less work than this (flops + bytes) run on the calling thread alone:
/// waking helpers costs a few microseconds.
pub(super) const MIN_SPLIT_WORK: u64 = 1 << 18;

/// Milliseconds spent compiling, by stage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CompileTimes {
    /// Lowering to loop IR (including kernel checks) and memory planning, and the wait
    /// for weight packing that code generation did not hide.
    pub lower_ms: f64,
    /// Cranelift: building, optimizing and emitting every kernel.
    pub codegen_ms: f64,
    /// The whole of [`Executable::compile`].
    pub total_ms: f64,
}

/// Scratch memory for one run at a time: the arena of temporaries and the argument
/// pointer array. Make one with [`Executable::workspace`]; reuse it across runs.
pub struct Workspace {
    /// The arena: 64-byte aligned, and from 4 MiB on a fresh mapping advised to use
    /// 2 MiB pages (`AlignedBuf::zeroed`): a new workspace (a run of more copies of the
    /// batch, a new calling thread) costs no memset of its arena, and a run streaming its
    /// activations through it misses the TLB less.
    arena: AlignedBuf,
    /// Kernel argument pointers, as addresses (a `usize` has a pointer's size and alignment).
    ptrs: Vec<usize>,
    /// Each output's address and byte length for the run in progress (kept here so a run
    /// allocates nothing).
    outs: Vec<(usize, usize)>,
    /// The run's valid rows, which kernels stopping there read (written at the start of
    /// every run).
    valid_rows: i64,
}

impl Workspace {
    fn new(arena_len: usize, max_args: usize, outputs: usize) -> Workspace {
        Workspace {
            arena: AlignedBuf::zeroed(arena_len.saturating_mul(4)),
            ptrs: vec![0; max_args],
            outs: vec![(0, 0); outputs],
            valid_rows: 0,
        }
    }

    fn arena_len(&self) -> usize {
        self.arena.len_bytes() / 4
    }

    /// Whether it is big enough for runs of `exe` in the way `run` says.
    fn holds(&self, exe: &Executable, run: CopiesRun) -> bool {
        self.arena_len() >= exe.arena_len.saturating_mul(run.arenas())
            && self.ptrs.len() >= exe.arg_slots(run)
            && self.outs.len() >= exe.outputs.len()
    }
}

/// How a run of one or more copies of an executable's batch goes, which decides the
/// workspace it needs ([`Executable::copies_run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopiesRun {
    /// One copy: each step's argument array written in turn into one array.
    Single,
    /// Step by step, each step once per copy (split over the threads within the step),
    /// every copy in its own arena.
    ByStep {
        /// Copies of the batch.
        copies: usize,
    },
    /// Each copy's whole step sequence on one thread, the copies shared between the
    /// threads; a copy runs in one of `arenas` arenas: one per thread at once when every
    /// batched result is written in place (a thread's next copy reuses its arena, warm
    /// in its cache), else one per copy (copy `r` in arena `r`, where the results
    /// computed in the arena are copied out after the run).
    Whole {
        /// Copies of the batch.
        copies: usize,
        /// Arenas the copies run in.
        arenas: usize,
    },
}

impl CopiesRun {
    /// Arenas the run's workspace holds.
    pub(crate) fn arenas(self) -> usize {
        match self {
            CopiesRun::Single => 1,
            CopiesRun::ByStep { copies } => copies,
            CopiesRun::Whole { arenas, .. } => arenas,
        }
    }
}

/// A compiled function, ready to run many times from many threads.
pub struct Executable {
    steps: Vec<ExecStep>,
    constants: Vec<Arc<AlignedBuf>>,
    inputs: Vec<TensorInfo>,
    outputs: Vec<(TensorInfo, Source)>,
    arena_len: usize,
    /// See [`Executable::padded_rows`].
    padded_rows: Option<usize>,
    max_args: usize,
    pool: Mutex<Vec<Workspace>>,
    /// The process's pool and how many threads (the caller included) a run may use.
    threads: Option<(&'static pool::ThreadPool, usize)>,
    step_info: Vec<StepInfo>,
    times: CompileTimes,
    /// The call sequence of `--dump-loops` ([`lower::Program::dump_steps`]); the kernels'
    /// text is printed from `kernels` on demand into `loops_text` (printing every kernel
    /// took ≈ 0.4 ms of each compile).
    steps_text: String,
    loops_text: std::sync::OnceLock<String>,
    /// The loop IR of every distinct kernel, in compile order (for `--dump-clif`).
    kernels: Vec<Kernel>,
    /// The instruction set whose conv-tile routines the kernels call, if any.
    tiles: Option<TileIsa>,
    /// Every computed value and its memory, when compiled with `keep_intermediates`
    /// (otherwise buffers are reused and a value may be overwritten before the run ends).
    kept: Option<Vec<KeptValue>>,
    /// What deciding whether a batch may run in copies reads of the program.
    flow: batch::BatchFlow,
    /// Which inputs, results and steps hold the batch, once runs of several copies of
    /// the compiled batch are allowed ([`Executable::allow_batch_copies`]).
    copies: Option<batch::BatchCopies>,
    /// The memory budget the module was compiled under and the bytes its weights hold:
    /// a run of copies needs an arena per copy or per thread, checked against it.
    budget: (u64, u64),
    /// Dropped last: the code the step function pointers point into.
    code: CompiledKernels,
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("inputs", &self.inputs)
            .field("steps", &self.steps.len())
            .field("kernels", &self.code.len())
            .field("arena_len", &self.arena_len)
            .finish()
    }
}

impl Executable {
    /// Makes the executable the compile driver ([`crate::driver`]) built: `program`
    /// lowered from `module`, its memory `plan`, the generated `code`, and `keep` the
    /// function when every intermediate stays readable. `threads` is the run's thread
    /// request (checked against [`crate::MAX_THREADS`] by the driver; 0: one per core),
    /// `tiles` the conv-tile instruction set the code calls.
    pub(crate) fn assemble(
        module: &Module,
        program: &Program,
        plan: &MemoryPlan,
        code: CompiledKernels,
        keep: Option<&Func>,
        threads: usize,
        tiles: Option<TileIsa>,
    ) -> Result<Executable, Error> {
        let mut constants = Vec::new();
        let mut sources = Vec::with_capacity(program.buffers.len());
        // Weights only lowering read (a conv's weights, once packed) are not kept: the
        // executable would otherwise hold every model weight twice.
        // (With intermediates kept, every value stays readable.)
        let mut used = vec![keep.is_some(); program.buffers.len()];
        let referenced = program.steps.iter().flat_map(|s| &s.args);
        for id in referenced.chain(program.outputs.iter().map(|p| &p.buffer)) {
            used[id.0 as usize] = true;
        }
        for (i, b) in program.buffers.iter().enumerate() {
            let src = match &b.kind {
                BufferKind::Input(k) => Source::Input(*k),
                BufferKind::Weight(_) | BufferKind::Constant(_) if !used[i] => {
                    // no step and no output refers to it, so no pointer to it is ever
                    // made: an empty placeholder keeps the buffer numbering
                    constants.push(Arc::new(AlignedBuf::zeroed(0)));
                    sources.push(Source::Constant(constants.len() - 1));
                    continue;
                }
                BufferKind::Weight(id) => {
                    let w = module.weights.get(*id).ok_or_else(|| {
                        Error::InvalidArgument(format!("weight {} does not exist", id.0))
                    })?;
                    // a window of an ONNX file is copied, not kept with the whole file
                    constants.push(AlignedBuf::detached(&w.data));
                    Source::Constant(constants.len() - 1)
                }
                BufferKind::Constant(data) => {
                    constants.push(data.clone());
                    Source::Constant(constants.len() - 1)
                }
                BufferKind::ValidRows => Source::ValidRows,
                BufferKind::Temp => Source::Arena(plan.offsets[i].ok_or_else(|| {
                    Error::Unsupported(format!("temporary {} has no place in memory", b.name))
                })?),
                BufferKind::Within { parent, .. } => {
                    // the kernels writing it were proven against its length only: it must
                    // lie inside its parent (which lies inside its own, or the arena)
                    let placed = |k: usize| {
                        let words = program.buffers.get(k)?.bytes().div_ceil(4);
                        plan.offsets
                            .get(k)
                            .copied()
                            .flatten()
                            .map(|o| (o, o + words))
                    };
                    match (placed(i), placed(parent.0 as usize)) {
                        (Some((lo, hi)), Some((plo, phi))) if plo <= lo && hi <= phi => {
                            Source::Arena(lo)
                        }
                        _ => {
                            return Err(Error::Unsupported(format!(
                                "temporary {} is not placed inside its parent",
                                b.name
                            )))
                        }
                    }
                }
            };
            // Constants must hold at least the bytes the kernels were proven against.
            if let Source::Constant(c) = src {
                if constants[c].len_bytes() < b.bytes() {
                    return Err(Error::Unsupported(format!(
                        "constant {} holds {} bytes, kernels need {}",
                        b.name,
                        constants[c].len_bytes(),
                        b.bytes()
                    )));
                }
            }
            sources.push(src);
        }
        // A result computed into a temporary of its own (not returned twice, not kept
        // for `run_keeping`, neither placed inside another temporary nor holding one) is
        // written straight into the caller's output slice.
        if keep.is_none() {
            let mut shares_space = vec![false; program.buffers.len()];
            for (i, b) in program.buffers.iter().enumerate() {
                if let BufferKind::Within { parent, .. } = b.kind {
                    shares_space[i] = true;
                    shares_space[parent.0 as usize] = true;
                }
            }
            for (i, p) in program.outputs.iter().enumerate() {
                let b = p.buffer.0 as usize;
                let once = program
                    .outputs
                    .iter()
                    .filter(|q| q.buffer == p.buffer)
                    .count()
                    == 1;
                if once && !shares_space[b] && matches!(sources[b], Source::Arena(_)) {
                    if program.buffers[b].len > p.ty.storage_len() {
                        return Err(Error::Unsupported(format!(
                            "result {} needs {} elements, its buffer {}",
                            p.name,
                            p.ty.storage_len(),
                            program.buffers[b].len
                        )));
                    }
                    sources[b] = Source::Output(i);
                }
            }
        }
        let steps = program
            .steps
            .iter()
            .map(|s| {
                let kernel = code.get(s.kernel).ok_or_else(|| {
                    Error::Unsupported(format!("kernel {} was not compiled", s.kernel))
                })?;
                let k = &program.kernels[s.kernel];
                let trips = k.parallel_trips().unwrap_or(1).max(1);
                let work = k.flops() + k.bytes();
                Ok(ExecStep {
                    kernel,
                    args: s.args.iter().map(|b| sources[b.0 as usize]).collect(),
                    split: (trips > 1 && work >= MIN_SPLIT_WORK).then_some(trips),
                    trips,
                    can_fault: k.can_fault(),
                    info: 0,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let mut steps = steps;
        let mut step_info = Vec::with_capacity(steps.len());
        for (i, (step, s)) in steps.iter_mut().zip(&program.steps).enumerate() {
            let k = &program.kernels[s.kernel];
            step.info = i;
            step_info.push(StepInfo {
                kernel: k.name.clone(),
                index: s.kernel,
                op: s.op.clone(),
                loc: s.loc.clone(),
                // a run that gives no valid rows computes the compiled length's
                flops: k.flops_at(program.padded_rows.map(|rows| rows as i64)),
                bytes: k.bytes(),
            });
        }
        let max_args = steps.iter().map(|s| s.args.len()).max().unwrap_or(0);
        let kept = match keep {
            None => None,
            Some(func) => Some(kept_values(func, program, &sources)?),
        };
        let flow = batch::BatchFlow::of(program, keep.is_some());
        let info = |p: &lower::Port| TensorInfo {
            name: p.name.clone(),
            ty: p.ty.clone(),
        };
        Ok(Executable {
            steps,
            constants,
            inputs: program.inputs.iter().map(info).collect(),
            outputs: program
                .outputs
                .iter()
                .map(|p| (info(p), sources[p.buffer.0 as usize]))
                .collect(),
            arena_len: plan.arena_len,
            padded_rows: program.padded_rows,
            max_args,
            pool: Mutex::new(Vec::new()),
            threads: run_threads(threads),
            step_info,
            times: CompileTimes::default(),
            steps_text: program.dump_steps(),
            loops_text: std::sync::OnceLock::new(),
            kernels: program.kernels.clone(),
            tiles,
            kept,
            flow,
            copies: None,
            budget: (module.weights.memory_budget(), module.weights.bytes()),
            code,
        })
    }

    /// Lets runs of this executable take any multiple of the batch it was compiled for
    /// (see [`batch`](self::batch)): input `i` holds the batch along its leading axis
    /// exactly when `batched_inputs[i]`. The caller vouches that the model computes each
    /// element of the batch on its own. The error says why copies cannot run.
    pub(crate) fn allow_batch_copies(&mut self, batched_inputs: &[bool]) -> Result<(), String> {
        if batched_inputs.len() != self.inputs.len() {
            return Err(format!(
                "{} inputs, {} batch flags",
                self.inputs.len(),
                batched_inputs.len()
            ));
        }
        let leading = |info: &TensorInfo| info.ty.dims.first().copied();
        let batched = self.inputs.iter().zip(batched_inputs).filter(|(_, &b)| b);
        let mut sizes = batched.map(|(info, _)| leading(info));
        let batch = match sizes.next() {
            Some(Some(size)) if size > 0 => size,
            _ => return Err("no input holds a batch along its leading axis".into()),
        };
        if sizes.any(|s| s != Some(batch)) {
            return Err("the batched inputs differ in their leading size".into());
        }
        let copies = self.flow.copies(&self.kernels, batch, batched_inputs)?;
        // each copy of a batched buffer is memory of its own; a constant has one copy
        // (nothing writes a constant, so none holds the batch: checked, since copies
        // sharing a buffer they write would race)
        for (step, moves) in self.steps.iter().zip(&copies.steps) {
            let moved = step.args.iter().zip(moves.iter().flatten());
            if moved
                .filter(|(_, &m)| m)
                .any(|(src, _)| matches!(src, Source::Constant(_) | Source::ValidRows))
            {
                return Err(format!(
                    "step {} moves a constant from copy to copy",
                    self.step_info[step.info].kernel
                ));
            }
        }
        let results = self
            .outputs
            .iter()
            .map(|(info, _)| info)
            .zip(&copies.outputs);
        for (info, _) in results.filter(|(_, &b)| b) {
            if leading(info) != Some(batch) || info.ty.layout != Layout::RowMajor {
                return Err(format!(
                    "result {} is {}, not a row-major batch of {batch}",
                    info.name, info.ty
                ));
            }
        }
        self.copies = Some(copies);
        Ok(())
    }

    /// The batch this executable was compiled for and which results hold it, when runs
    /// of any multiple of it are allowed ([`Executable::allow_batch_copies`]).
    pub(crate) fn batch_copies(&self) -> Option<(usize, &[bool])> {
        self.copies.as_ref().map(|c| (c.batch, &c.outputs[..]))
    }

    /// The results' types in a run of `copies` copies of the compiled batch (allowed by
    /// [`Executable::allow_batch_copies`] when more than 1): a batched result's leading
    /// size `copies` times its compiled one.
    pub(crate) fn output_types(&self, copies: usize) -> Vec<TensorType> {
        self.outputs
            .iter()
            .enumerate()
            .map(|(k, (o, _))| {
                let mut ty = o.ty.clone();
                if copies > 1 && self.copies.as_ref().is_some_and(|c| c.outputs[k]) {
                    ty.dims[0] *= copies;
                }
                ty
            })
            .collect()
    }

    /// Runs a batch of `copies` times the batch this executable was compiled for
    /// (allowed by [`Executable::allow_batch_copies`]): each batched input and result
    /// holds `copies` of its compiled length, one after another, the others their own
    /// length. A workspace for that many copies is borrowed from the pool.
    /// With `valid_rows`, kernels that stop at a run's valid rows stop there
    /// ([`Executable::padded_rows`]).
    pub(crate) fn run_copies_into(
        &self,
        copies: usize,
        valid_rows: Option<usize>,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        let mut ws = self.pooled_workspace(self.copies_run(copies, false))?;
        let result = self.run_steps_of(copies, valid_rows, inputs, outputs, &mut ws, None);
        self.return_workspace(ws);
        result
    }

    /// The length along a padded sequence axis this executable was compiled at, when
    /// some of its kernels stop at a run's valid length and clear the rows past it
    /// (compiled for a sequence bucket by [`DynamicExecutable`](crate::DynamicExecutable),
    /// which passes each run's length); a run that gives none computes every row.
    pub fn padded_rows(&self) -> Option<usize> {
        self.padded_rows
    }

    /// Records how long compiling took (the driver measures; the executable reports).
    pub(crate) fn set_compile_times(&mut self, times: CompileTimes) {
        self.times = times;
    }

    /// The instruction set whose conv-tile routines the kernels call (`None`: Cranelift
    /// code only), for describing the target of [`Executable::kernels`].
    pub fn tile_isa(&self) -> Option<TileIsa> {
        self.tiles
    }

    /// The inputs, in call order.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.inputs
    }

    /// The outputs, in result order.
    pub fn outputs(&self) -> impl ExactSizeIterator<Item = &TensorInfo> {
        self.outputs.iter().map(|(i, _)| i)
    }

    /// Time spent compiling, by stage.
    pub fn compile_times(&self) -> CompileTimes {
        self.times
    }

    /// The loop IR of every distinct kernel this executable runs, as compiled.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// Number of distinct kernels (each compiled once) and of kernel calls per run.
    pub fn kernel_counts(&self) -> (usize, usize) {
        (self.code.len(), self.steps.len())
    }

    /// Floating-point operations one run executes (an FMA counts two): the sum over its
    /// kernel calls of what their loop nests compute, so a Winograd convolution counts
    /// its transforms and its smaller product, not the direct convolution's count.
    pub fn executed_flops(&self) -> u64 {
        self.step_info.iter().map(|s| s.flops).sum()
    }

    /// [`Executable::executed_flops`] of a run of `valid_rows` valid rows
    /// ([`Executable::run_valid_rows_into`]): the loops that stop there counted up to
    /// where they stop. The same as `executed_flops` without padded rows.
    pub fn executed_flops_at(&self, valid_rows: usize) -> u64 {
        self.step_info
            .iter()
            .map(|s| self.step_flops(s, Some(valid_rows)))
            .sum()
    }

    /// The flops of one call of a step, at `valid_rows` when it is given and some loops
    /// stop there, else at the compiled length.
    fn step_flops(&self, step: &StepInfo, valid_rows: Option<usize>) -> u64 {
        match (valid_rows, self.padded_rows) {
            (Some(rows), Some(_)) => {
                let extent = i64::try_from(rows).unwrap_or(i64::MAX);
                self.kernels
                    .get(step.index)
                    .map_or(step.flops, |k| k.flops_at(Some(extent)))
            }
            _ => step.flops,
        }
    }

    /// Bytes of scratch memory one run uses (the arena of temporaries).
    pub fn arena_bytes(&self) -> usize {
        self.arena_len * 4
    }

    /// Bytes of scratch memory a run of `copies` copies of the compiled batch uses (in a
    /// dynamic executable's chunks; not timed step by step): an arena per copy, or per
    /// thread where the copies run whole in one arena per thread.
    pub fn copies_arena_bytes(&self, copies: usize) -> usize {
        self.arena_bytes()
            .saturating_mul(self.copies_run(copies, false).arenas())
    }

    /// Bytes of constant data the executable holds: the weights its kernels read as
    /// stored, and what lowering computed (packed weights, transformed weights, tables).
    pub fn constant_bytes(&self) -> usize {
        self.constants.iter().map(|c| c.as_bytes().len()).sum()
    }

    /// The loop IR of every kernel and the call sequence (`--dump-loops`).
    pub fn dump_loops(&self) -> &str {
        self.loops_text
            .get_or_init(|| lower::kernels_text(&self.kernels) + &self.steps_text)
    }

    /// How a run of `copies` copies of the batch goes (timed step by step when
    /// `profiled`): with two or more threads, when every step touches the batch and no
    /// step is timed, each copy runs whole on one thread (see [`CopiesRun::Whole`]);
    /// otherwise step by step.
    pub(crate) fn copies_run(&self, copies: usize, profiled: bool) -> CopiesRun {
        match (copies, &self.copies, self.threads) {
            (0 | 1, _, _) => CopiesRun::Single,
            (_, Some(plan), Some((_, threads)))
                if threads >= 2 && !profiled && plan.steps.iter().all(Option::is_some) =>
            {
                CopiesRun::Whole {
                    copies,
                    arenas: match self.results_in_place(plan) {
                        true => threads.min(copies),
                        false => copies,
                    },
                }
            }
            _ => CopiesRun::ByStep { copies },
        }
    }

    /// Whether every result holding the batch is written in place by its kernel (none
    /// is copied out of the arena after the run).
    fn results_in_place(&self, plan: &batch::BatchCopies) -> bool {
        self.outputs
            .iter()
            .zip(&plan.outputs)
            .all(|((_, src), &batched)| !batched || matches!(src, Source::Output(_)))
    }

    /// Whether a run of any number of copies of the batch (not timed) holds one arena
    /// per thread, not one per copy: its memory and its cache footprint do not grow
    /// with the copies, so a batch need not be split into runs that fit the cache.
    pub(crate) fn copies_share_arenas(&self) -> bool {
        // asked for more copies than any run has threads: fewer arenas than copies means
        // one per thread (`copies_run` is the one place that decides)
        matches!(
            self.copies_run(usize::MAX, false),
            CopiesRun::Whole { copies, arenas } if arenas < copies
        )
    }

    /// A workspace for runs going as `run` says from the pool, or a new one when every
    /// pooled one is in use or too small.
    fn pooled_workspace(&self, run: CopiesRun) -> Result<Workspace, Error> {
        let arenas = run.arenas();
        if arenas > 1 {
            let (budget, weights) = self.budget;
            let bytes = (self.arena_bytes() as u64).saturating_mul(arenas as u64);
            let what = format!("the run-time arenas of {arenas} copies of the batch");
            smelt_ir::budget::check(&what, bytes, weights, budget)
                .map_err(Error::InvalidArgument)?;
        }
        let pooled = self
            .pool
            .lock()
            .map_err(|_| Error::Unsupported("workspace pool poisoned".into()))?
            .pop();
        Ok(match pooled {
            Some(ws) if ws.holds(self, run) => ws,
            _ => self.workspace_for(run),
        })
    }

    /// Gives a workspace back to the pool for the next run.
    fn return_workspace(&self, ws: Workspace) {
        if let Ok(mut pool) = self.pool.lock() {
            pool.push(ws);
        }
    }

    /// A fresh workspace for [`Executable::run_with`].
    pub fn workspace(&self) -> Workspace {
        self.workspace_for(CopiesRun::Single)
    }

    /// A fresh workspace for runs going as `run` says: its arenas and argument slots.
    fn workspace_for(&self, run: CopiesRun) -> Workspace {
        Workspace::new(
            self.arena_len.saturating_mul(run.arenas()),
            self.arg_slots(run),
            self.outputs.len(),
        )
    }

    /// Argument slots a workspace for runs going as `run` says holds: one array for a
    /// single copy; one per copy for a run step by step; for whole copies, every step's
    /// array three times over (the addresses of copy 0 in arena 0, and the bytes each
    /// argument moves per copy and per arena) and once more per arena (the arrays of the
    /// copy running in it).
    fn arg_slots(&self, run: CopiesRun) -> usize {
        let steps = self.steps.len().saturating_mul(self.max_args);
        match run {
            CopiesRun::Single => self.max_args,
            CopiesRun::ByStep { copies } => copies.saturating_mul(self.max_args),
            CopiesRun::Whole { arenas, .. } => steps.saturating_mul(arenas.saturating_add(3)),
        }
    }

    /// Runs on host tensors; checks each input's count, shape and layout. Borrows a
    /// workspace from the executable's pool, so concurrent callers do not contend.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        self.run_tensors(inputs, None, None, None)
    }

    /// Like [`Executable::run`], and also returns the value of every instruction of the
    /// function but constants, in definition order, each named by its IR value and
    /// location and converted to row-major order. Only for executables compiled with
    /// [`CompileOptions::keep_intermediates`](crate::CompileOptions::keep_intermediates) (an `InvalidArgument` error otherwise): only
    /// then does every value keep its own memory until the run ends.
    pub fn run_keeping(
        &self,
        inputs: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<Intermediate>), Error> {
        if self.kept.is_none() {
            return Err(Error::InvalidArgument(
                "intermediates are kept only by executables compiled with keep_intermediates"
                    .into(),
            ));
        }
        let mut values = Vec::new();
        let outs = self.run_tensors(inputs, None, None, Some(&mut values))?;
        Ok((outs, values))
    }

    /// Like [`Executable::run`], and times every kernel call: one [`KernelProfile`] per
    /// call, in execution order.
    pub fn run_profiled(
        &self,
        inputs: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<KernelProfile>), Error> {
        self.run_profiled_valid_rows(None, inputs)
    }

    /// [`Executable::run_profiled`] of inputs holding `valid_rows` valid rows, as
    /// [`Executable::run_valid_rows_into`] runs them (`None`: every row).
    pub fn run_profiled_valid_rows(
        &self,
        valid_rows: Option<usize>,
        inputs: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<KernelProfile>), Error> {
        let mut times = Vec::with_capacity(self.steps.len());
        let outs = self.run_tensors(inputs, valid_rows, Some(&mut times), None)?;
        let profile = self
            .steps
            .iter()
            .zip(times)
            .map(|(s, ns)| {
                let i = &self.step_info[s.info];
                KernelProfile {
                    kernel: i.kernel.clone(),
                    op: i.op.clone(),
                    loc: i.loc.clone(),
                    flops: self.step_flops(i, valid_rows),
                    bytes: i.bytes,
                    ns,
                }
            })
            .collect();
        Ok((outs, profile))
    }

    fn run_tensors(
        &self,
        inputs: &[Tensor],
        valid_rows: Option<usize>,
        times: Option<&mut Vec<u64>>,
        keeping: Option<&mut Vec<Intermediate>>,
    ) -> Result<Vec<Tensor>, Error> {
        if inputs.len() != self.inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                inputs.len()
            )));
        }
        let copies = self.copies_of(inputs)?;
        let mut outs: Vec<Tensor> = self
            .output_types(copies)
            .iter()
            .map(Tensor::zeros)
            .collect();
        let ins: Vec<Elements> = inputs.iter().map(|t| Elements::of(&t.data)).collect();
        let mut ws = self.pooled_workspace(self.copies_run(copies, times.is_some()))?;
        let result = {
            let mut out_slices: Vec<ElementsMut> = outs
                .iter_mut()
                .map(|t| ElementsMut::of(&mut t.data))
                .collect();
            self.run_steps_of(copies, valid_rows, &ins, &mut out_slices, &mut ws, times)
        };
        // Read the kept values before the workspace goes back to the pool.
        let kept_values: Result<(), Error> = match (&result, keeping, &self.kept) {
            (Ok(()), Some(values), Some(kept)) => {
                let arena: &[u8] = ws.arena.as_bytes();
                kept.iter().try_for_each(|k| {
                    let n = k.ty.storage_len() * k.ty.dtype.size_bytes();
                    let owned;
                    let bytes: &[u8] = match k.src {
                        Source::Input(i) => {
                            owned = inputs[i].data.to_le_bytes();
                            &owned
                        }
                        Source::Constant(c) => self.constants[c].as_bytes(),
                        Source::Arena(off) => arena.get(off * 4..).unwrap_or_default(),
                        // no value is held there
                        Source::ValidRows => &[],
                        Source::Output(i) => {
                            owned = outs[i].data.to_le_bytes();
                            &owned
                        }
                    };
                    let data = bytes
                        .get(..n)
                        .and_then(|b| TensorData::from_le_bytes(k.ty.dtype, b))
                        .ok_or_else(|| {
                            Error::Unsupported(format!(
                                "kept value %{} has no {} bytes of {}",
                                k.value.0, n, k.ty.dtype
                            ))
                        })?;
                    let stored = Tensor {
                        ty: k.ty.clone(),
                        data,
                    };
                    values.push(Intermediate {
                        value: k.value,
                        inst: k.inst,
                        op: k.op,
                        loc: k.loc.clone(),
                        tensor: stored.to_layout(Layout::RowMajor),
                    });
                    Ok(())
                })
            }
            _ => Ok(()),
        };
        self.return_workspace(ws);
        result?;
        kept_values?;
        Ok(outs)
    }

    /// How many copies of the compiled batch `inputs` hold: 1 when each input has its
    /// declared type; `n` when runs in copies are allowed and every batched input holds
    /// `n` times its compiled batch along its leading axis (the rest of its type as
    /// declared) and every other input has its declared type.
    fn copies_of(&self, inputs: &[Tensor]) -> Result<usize, Error> {
        let mut copies = None;
        for (i, (t, info)) in inputs.iter().zip(&self.inputs).enumerate() {
            if t.ty == info.ty {
                if self.copies.as_ref().is_some_and(|c| c.inputs[i]) {
                    copies.get_or_insert(1);
                }
                continue;
            }
            let batch = self
                .copies
                .as_ref()
                .filter(|c| c.inputs[i])
                .map(|c| c.batch);
            let fits = batch.and_then(|batch| {
                let (lead, rest) = t.ty.dims.split_first()?;
                let same_rest = rest == &info.ty.dims[1..]
                    && t.ty.dtype == info.ty.dtype
                    && t.ty.layout == info.ty.layout;
                (same_rest && *lead > 0 && lead % batch == 0).then_some(lead / batch)
            });
            match (fits, copies) {
                (Some(n), None) => copies = Some(n),
                (Some(n), Some(m)) if n == m => {}
                (Some(_), Some(_)) => {
                    return Err(Error::InvalidArgument(format!(
                        "input %{} has batch {}, another batched input a different one",
                        info.name, t.ty.dims[0]
                    )))
                }
                (None, _) => {
                    let what = match batch {
                        Some(b) => format!(" (or a multiple of {b} along dimension 0)"),
                        None => String::new(),
                    };
                    return Err(Error::InvalidArgument(format!(
                        "input %{} must be {}{what}, got {}",
                        info.name, info.ty, t.ty
                    )));
                }
            }
        }
        Ok(copies.unwrap_or(1))
    }

    /// Runs on caller-owned buffers without allocating: `inputs[i]` and `outputs[i]` hold
    /// exactly the element type and storage length of the i-th input and output
    /// ([`TensorInfo::len`]); `ws` comes from [`Executable::workspace`] (of this
    /// executable or one with at least as much scratch). `&[f32]` and `&mut [f32]`
    /// convert with `.into()`.
    pub fn run_with(
        &self,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
        ws: &mut Workspace,
    ) -> Result<(), Error> {
        self.run_steps(inputs, outputs, ws, None)
    }

    /// Like [`Executable::run_into`], for inputs holding a sequence of `valid_rows`
    /// positions padded to the length this executable was compiled at
    /// ([`Executable::padded_rows`]) as its padding analysis assumed (each input's
    /// padded positions zero): the products that may stop at the valid rows do, and
    /// clear the rows past them, so a result's positions past `valid_rows` hold zeros or
    /// computed values — only its first `valid_rows` positions are the model's. More
    /// valid rows than the compiled length is an error; an executable without padded
    /// rows ignores them.
    pub fn run_valid_rows_into(
        &self,
        valid_rows: usize,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        self.run_copies_into(1, Some(valid_rows), inputs, outputs)
    }

    /// Like [`Executable::run_with`], with a workspace borrowed from the executable's
    /// pool (made on first use), so the caller needs none.
    pub fn run_into(
        &self,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        let mut ws = self.pooled_workspace(CopiesRun::Single)?;
        let result = self.run_steps(inputs, outputs, &mut ws, None);
        self.return_workspace(ws);
        result
    }
}

/// The process's pool and how many threads (the caller included) a run asking for
/// `threads` uses: more threads than cores add no speed, since the shared pool has one
/// worker per core but one and a run takes at most `threads - 1` of them. `None` when a
/// run stays on its calling thread.
fn run_threads(threads: usize) -> Option<(&'static pool::ThreadPool, usize)> {
    pool::ThreadPool::shared()
        .map(|pool| {
            let n = match threads {
                0 => pool.participants(),
                n => n.min(pool.participants()),
            };
            (pool, n)
        })
        .filter(|&(_, n)| n > 1)
}

/// The memory of every non-constant value of `func`, in definition order. Buffer lengths
/// were checked against the types at lowering, so reading `storage_len` elements is in
/// bounds (checked again here, since a wrong read would be a silent wrong answer).
fn kept_values(
    func: &Func,
    program: &Program,
    sources: &[Source],
) -> Result<Vec<KeptValue>, Error> {
    let mut kept = Vec::new();
    for (i, inst) in func.insts.iter().enumerate() {
        if matches!(inst.op, Op::Const(_)) {
            continue;
        }
        let value = func.inst_value(i);
        let buffer = program
            .values
            .get(value.index())
            .filter(|b| program.buffers[b.0 as usize].len >= inst.ty.storage_len())
            .ok_or_else(|| {
                Error::Unsupported(format!("lowering kept no buffer for value %{}", value.0))
            })?;
        kept.push(KeptValue {
            value,
            inst: i,
            op: inst.op.name(),
            loc: inst.loc.clone(),
            ty: inst.ty.clone(),
            src: sources[buffer.0 as usize],
        });
    }
    Ok(kept)
}

// Executables are shared across threads: everything they hold is immutable after
// compile, the code owner is behind a mutex, and per-run state lives in workspaces.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Executable>();
};
