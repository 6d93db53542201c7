//! The loop-nest IR: kernels as loops over vector loads, stores, FMAs and epilogues.
//!
//! A [`Kernel`] is a function of buffer arguments (pointers to elements of one type
//! each — `f32`, `i64`, `i32` or `i1` — with a static length). Its body is a tree of
//! [`Stmt`]s: counted loops with constant bounds, assignments to register variables, and
//! stores. Values are [`Expr`] trees over loads at affine addresses, constants,
//! broadcasts, arithmetic, FMAs, comparisons, selects and casts, in scalar or vector
//! (`f32x4`) width for `f32` and scalar width for the integer types.
//!
//! Everything but one kind of address is static, so [`Kernel::check`] proves every access
//! of every load and store inside its buffer before any code runs: the runtime's safety
//! argument rests on it. The exception is [`Expr::LoadAt`], whose index is a value
//! computed at run time (a gather): it carries its own bound, which the checker proves
//! sufficient and the generated code tests before the load, returning a [`Fault`] status
//! instead of reading when the index is outside it. Integer division by zero is the
//! other fault; a kernel that can fault is never split across threads. Lowering (in smelt-passes) produces kernels; code generation (in smelt) turns them
//! into Cranelift IR. The printer (`Kernel`'s `Display`) is deterministic, for `--dump-loops`
//! and snapshot tests.
//!
//! The rooms: this file holds the IR's kernels, statements and buffers; `expr` its
//! addresses and value expressions; [`check`] the bounds checker (the safety
//! argument), `tile` the conv-tile micro-kernel contract, `print` the text form and
//! `builder` the [`KernelBuilder`].

use std::fmt;

use crate::types::DType;

mod builder;
pub mod check;
mod expr;
mod print;
mod tile;
pub mod winograd;

pub use builder::KernelBuilder;
pub use expr::{Affine, BinOp, CmpOp, Expr, ReduceOp, UnOp};
pub use tile::{
    BlockedDepthwiseRow, ConvTile, DepthwiseRow, TileRoutine, TileTarget, DEPTHWISE_MAX_TAPS,
};

/// A buffer a kernel accesses: a kernel argument (a pointer the caller passes, by index)
/// or a local scratch buffer of the call's own (on the stack, so every concurrent call
/// has its own), numbered from [`BufId::LOCAL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

impl BufId {
    /// The id of local buffer 0; local `i` is `LOCAL + i`.
    pub const LOCAL: u32 = 1 << 31;

    /// The index of the local buffer this id names, if it names one.
    pub fn local_index(self) -> Option<usize> {
        self.0.checked_sub(BufId::LOCAL).map(|i| i as usize)
    }
}

impl fmt::Display for BufId {
    /// `%3` for argument 3, `%local0` for local buffer 0.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.local_index() {
            Some(i) => write!(f, "%local{i}"),
            None => write!(f, "%{}", self.0),
        }
    }
}

/// A loop induction variable (an integer), in scope inside its loop's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoopVar(pub u32);

/// A register variable: assigned by [`Stmt::Assign`], read by [`Expr::Var`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub u32);

/// Width (and element type) of a register value: one `f32`, a vector of four, or one
/// integer or `i1` scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Width {
    /// One `f32`.
    Scalar,
    /// Four `f32` lanes (128 bits).
    F32x4,
    /// One `i64`.
    I64,
    /// One `i32`.
    I32,
    /// One `i1`, held as a byte 0 or 1.
    Bool,
    /// One `f16`, held as its 16 bits: only loaded, stored, selected and cast (to and
    /// from `f32`), never computed on.
    F16,
    /// One `bf16`, held as its 16 bits, like [`Width::F16`].
    BF16,
    /// One `i8`: like the 2-byte floats, only loaded, stored, selected and cast.
    I8,
    /// One `ui8`, storage only like [`Width::I8`].
    U8,
    /// One `i16`, storage only like [`Width::I8`].
    I16,
    /// One `ui16`, storage only like [`Width::I8`].
    U16,
}

impl Width {
    /// Number of lanes.
    pub fn lanes(self) -> usize {
        match self {
            Width::F32x4 => 4,
            _ => 1,
        }
    }

    /// The element type of each lane.
    pub fn dtype(self) -> DType {
        match self {
            Width::Scalar | Width::F32x4 => DType::F32,
            Width::I64 => DType::I64,
            Width::I32 => DType::I32,
            Width::Bool => DType::Bool,
            Width::F16 => DType::F16,
            Width::BF16 => DType::BF16,
            Width::I8 => DType::I8,
            Width::U8 => DType::U8,
            Width::I16 => DType::I16,
            Width::U16 => DType::U16,
        }
    }

    /// The scalar width of element type `dtype`.
    pub fn scalar(dtype: DType) -> Width {
        match dtype {
            DType::F32 => Width::Scalar,
            DType::I64 => Width::I64,
            DType::I32 => Width::I32,
            DType::Bool => Width::Bool,
            DType::F16 => Width::F16,
            DType::BF16 => Width::BF16,
            DType::I8 => Width::I8,
            DType::U8 => Width::U8,
            DType::I16 => Width::I16,
            DType::U16 => Width::U16,
        }
    }

    /// Whether the value is held in an integer register: an integer, `i1`, a narrow
    /// integer or a 2-byte float's bits (which [`Width::is_storage`] tells apart).
    pub fn is_integer(self) -> bool {
        self.dtype() != DType::F32
    }

    /// Whether the value is a 2-byte float's bits (`f16`, `bf16`): storage only.
    pub fn is_narrow_float(self) -> bool {
        matches!(self, Width::F16 | Width::BF16)
    }

    /// Whether the value is of a storage type (a 2-byte float's bits or a narrow
    /// integer): loaded, stored, selected and cast, never computed on or compared.
    pub fn is_storage(self) -> bool {
        self.dtype().is_storage()
    }

    fn name(self) -> &'static str {
        match self {
            Width::Scalar => "f32",
            Width::F32x4 => "f32x4",
            Width::I64 => "i64",
            Width::I32 => "i32",
            Width::Bool => "i1",
            Width::F16 => "f16",
            Width::BF16 => "bf16",
            Width::I8 => "i8",
            Width::U8 => "ui8",
            Width::I16 => "i16",
            Width::U16 => "ui16",
        }
    }
}

/// Why a kernel stopped before finishing: the status a faulting kernel returns (0 is
/// success). The runtime turns it into an error naming the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Fault {
    /// An [`Expr::LoadAt`] index was outside its bound.
    IndexOutOfRange = 1,
    /// An integer division by zero.
    DivisionByZero = 2,
}

impl Fault {
    /// The fault a kernel's status code means; `None` for 0 (success) and unknown codes.
    pub fn from_status(status: i32) -> Option<Fault> {
        match status {
            1 => Some(Fault::IndexOutOfRange),
            2 => Some(Fault::DivisionByZero),
            _ => None,
        }
    }

    /// What happened, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Fault::IndexOutOfRange => "an index is out of range",
            Fault::DivisionByZero => "an integer division by zero",
        }
    }
}

/// How a kernel uses an argument buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    /// Only read; nothing writes it while the kernel runs (loads may be moved freely).
    Read,
    /// Written (and possibly read back): outputs and scratch.
    Write,
}

/// One buffer argument of a kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelArg {
    /// A name for dumps (`x`, `w`, `out`, `residual`).
    pub name: String,
    /// Element type; every load and store of the buffer has this type.
    pub dtype: DType,
    /// Length in elements; every access is proven inside it.
    pub len: usize,
    /// Read-only or written.
    pub access: Access,
}

/// A buffer position passed to a micro-kernel: the pointer to element `index` of `buf`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufPtr {
    /// The buffer.
    pub buf: BufId,
    /// Element index the pointer points at.
    pub index: Affine,
}

impl fmt::Display for BufPtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "&{}[{}]", self.buf, self.index)
    }
}

/// The activation of a [`Stmt::ActivationRows`] call, each with its own native routine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowActivation {
    /// `silu(v) = v / (1 + e^−v)`.
    Silu,
    /// `sigmoid(v) = 1 / (1 + e^−v)`.
    Sigmoid,
    /// `gelu(v) = v/2 · (1 + erf(v/√2))`, erf by Abramowitz–Stegun 7.1.28 as the JIT
    /// epilogue computes it.
    Gelu,
}

impl RowActivation {
    /// The name in loop-IR dumps (`call silu_rows(...)`).
    pub fn name(self) -> &'static str {
        match self {
            RowActivation::Silu => "silu",
            RowActivation::Sigmoid => "sigmoid",
            RowActivation::Gelu => "gelu",
        }
    }
}

/// The activation of a [`Stmt::StoreRows`] call, each with its own native routine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreActivation {
    /// None: the value as summed.
    Identity,
    /// `max(v, 0)`, a NaN kept (as the JIT's `max` keeps one).
    Relu,
    /// Hard-swish, `v · min(max(fma(v, 1/6, 1/2), 0), 1)`: the JIT's expression, its
    /// `max` and `min` keeping a NaN and `v/6 + 1/2` one fused multiply-add.
    HardSwish,
}

impl StoreActivation {
    /// Every activation, in [`StoreActivation::index`] order.
    pub const ALL: [StoreActivation; 3] = [
        StoreActivation::Identity,
        StoreActivation::Relu,
        StoreActivation::HardSwish,
    ];

    /// The activation's number in the records routines read (0 identity, 1 ReLU, 2
    /// hard-swish).
    pub const fn index(self) -> i64 {
        match self {
            StoreActivation::Identity => 0,
            StoreActivation::Relu => 1,
            StoreActivation::HardSwish => 2,
        }
    }

    /// The activation numbered `index`, if any.
    pub fn from_index(index: i64) -> Option<StoreActivation> {
        usize::try_from(index)
            .ok()
            .and_then(|i| StoreActivation::ALL.get(i).copied())
    }

    /// The name in loop-IR dumps (`call store_relu_rows(...)`).
    pub fn name(self) -> &'static str {
        match self {
            StoreActivation::Identity => "store",
            StoreActivation::Relu => "store_relu",
            StoreActivation::HardSwish => "store_hardswish",
        }
    }
}

/// A run-time bound on a loop: of its iterations, only those whose `row` (an affine
/// function of the loop's variable and the enclosing loops') is below `extent` run (or,
/// with `from`, only those whose row is at or past it), `extent` the `i64` at element 0
/// of the kernel argument `extent`, which the runtime writes before each run (the valid
/// length of a padded sequence: a row block past it is not computed, and its rows are
/// cleared instead). The bounds proof covers every constant iteration, so any extent is
/// safe; the row never falls as the loop's variable grows and the loop starts at 0 or
/// later, so the iterations that run are a prefix (a suffix) of the constant ones.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LoopLimit {
    /// The `i64` argument holding the extent.
    pub extent: BufId,
    /// The iteration's row.
    pub row: Affine,
    /// Run the iterations at or past the extent instead of those below it.
    pub from: bool,
}

impl LoopLimit {
    /// The iterations whose `row` is below the extent in `extent`.
    pub fn below(extent: BufId, row: Affine) -> LoopLimit {
        LoopLimit {
            extent,
            row,
            from: false,
        }
    }

    /// The iterations whose `row` is at or past the extent in `extent`.
    pub fn at_or_past(extent: BufId, row: Affine) -> LoopLimit {
        LoopLimit {
            extent,
            row,
            from: true,
        }
    }
}

/// A statement of a kernel body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `for var = start; var < end; var += step { body }` with constant bounds, cut
    /// short at run time by its `limit` if it has one.
    Loop {
        /// The induction variable.
        var: LoopVar,
        /// First value.
        start: i64,
        /// Exclusive bound.
        end: i64,
        /// Positive increment.
        step: i64,
        /// A run-time bound on the iterations, within the constant ones.
        limit: Option<LoopLimit>,
        /// The loop body.
        body: Vec<Stmt>,
    },
    /// `dst = value`.
    Assign {
        /// The variable written.
        dst: VarId,
        /// The new value.
        value: Expr,
    },
    /// Stores `width.lanes()` consecutive elements of `value` into `buf` at `index`.
    Store {
        /// The buffer (a [`Access::Write`] argument).
        buf: BufId,
        /// Element index of the first lane.
        index: Affine,
        /// The value stored.
        value: Expr,
        /// How many lanes.
        width: Width,
    },
    /// A call of the conv-tile micro-kernel of `tile.lanes` lanes (the contract is
    /// [`ConvTile`]; code generation links the host's routine): reads `x` and `w`, writes
    /// `out`, and prefetches `tile.next_len` elements from `next` (what later
    /// calls will read: the next weight block, which would otherwise stream from memory
    /// in one burst at its first use). The run starts at `next`, or earlier where it
    /// would pass the buffer's end, so it is always inside the buffer.
    ConvTile {
        /// The input pointer.
        x: BufPtr,
        /// The packed weights pointer.
        w: BufPtr,
        /// The output pointer.
        out: BufPtr,
        /// Where the prefetched run starts, before the clamp to the buffer's end; present
        /// exactly when `tile.next_len > 0`.
        next: Option<BufPtr>,
        /// The finish's bias (`tile.lanes` elements), only with a `tile.finish`.
        bias: Option<BufPtr>,
        /// The finish's residual (read like `out`), only with a `tile.finish`.
        residual: Option<BufPtr>,
        /// The tile's shape.
        tile: ConvTile,
    },
    /// A call of the depthwise-row routine (the contract is [`DepthwiseRow`]; code
    /// generation links the host's routine, of the ISA the conv tiles use): reads `x`
    /// and `w`, writes `out`.
    DepthwiseRow {
        /// The input pointer.
        x: BufPtr,
        /// The weights pointer (the channel's `rows × taps` taps).
        w: BufPtr,
        /// The output pointer.
        out: BufPtr,
        /// The row's shape.
        row: DepthwiseRow,
    },
    /// A call of the blocked-depthwise-row routine (the contract is
    /// [`BlockedDepthwiseRow`]; code generation links the host's routine): reads `x`,
    /// `w` and `bias`, writes `out`.
    BlockedDepthwiseRow {
        /// The input pointer: column 0 of the first kernel row read.
        x: BufPtr,
        /// The weights pointer: tap 0 of the first kernel row read.
        w: BufPtr,
        /// The block's bias, if any.
        bias: Option<BufPtr>,
        /// The output pointer: the row's first pixel.
        out: BufPtr,
        /// The row's shape.
        row: BlockedDepthwiseRow,
    },
    /// A call of the softmax-row routine (code generation links the host's routine, of
    /// the ISA the conv tiles use): `out[i] = e^(x[i] − m) / Σ_j e^(x[j] − m)` for
    /// `i < len`, `m` the row's max (NaN in the row makes it all NaN); reads `x[0..len]`,
    /// writes `out[0..len]` (they may be the same run).
    SoftmaxRow {
        /// The row's input.
        x: BufPtr,
        /// The row's output.
        out: BufPtr,
        /// Elements of the row.
        len: i64,
    },
    /// A call of an activation-rows routine (code generation links the host's routine,
    /// of the ISA the conv tiles use), in place:
    /// `buf[p·lanes + l] = act(buf[p·lanes + l] + bias[l])` for `p < rows`, `l < lanes`
    /// (no bias: 0), `act` the [`RowActivation`]; `lanes` a positive multiple of 16. A
    /// conv tile's sums get their bias and a leading SiLU or sigmoid post-op on
    /// full-width vectors before the Cranelift epilogue.
    ActivationRows {
        /// The activation applied.
        act: RowActivation,
        /// The rows, read and written.
        buf: BufPtr,
        /// The bias, one per lane.
        bias: Option<BufPtr>,
        /// Rows.
        rows: i64,
        /// Elements per row.
        lanes: i64,
    },
    /// A call of a store-rows routine (code generation links the host's routine, of the
    /// ISA the conv tiles use): for `i < rows·lanes`,
    /// `out[i] = act(sums[i] + bias[i mod lanes] + residual[i])` (no bias, no residual:
    /// 0), added in that order, `act` the [`StoreActivation`]; `lanes` a positive
    /// multiple of 16. A conv tile's epilogue when its result is stored in channel
    /// blocks of 16, one block per tile: the sums leave the stack on full-width vectors,
    /// not Cranelift's f32x4.
    StoreRows {
        /// The activation applied last.
        act: StoreActivation,
        /// The sums, read.
        sums: BufPtr,
        /// The bias, one per lane.
        bias: Option<BufPtr>,
        /// A residual of the result's layout, read.
        residual: Option<BufPtr>,
        /// Where the results are written.
        out: BufPtr,
        /// Rows.
        rows: i64,
        /// Elements per row.
        lanes: i64,
    },
    /// A call of a store-planes routine (linked like [`Stmt::StoreRows`]'): for `p <
    /// pixels` and `c < channels`, `out[c·plane + p] = act(sums[p·lanes + c] + bias[c])`
    /// (no bias: 0); `0 ≤ channels ≤ lanes`, `lanes` a positive multiple of 16, `plane ≥
    /// pixels`. A conv tile's epilogue when its result is laid out by channel planes: the
    /// tile's `[pixel][lanes]` sums stored transposed by a native routine instead of
    /// Cranelift code per 4×4 block.
    StorePlanes {
        /// The activation applied last.
        act: StoreActivation,
        /// The sums, read.
        sums: BufPtr,
        /// The bias, one per channel.
        bias: Option<BufPtr>,
        /// Where channel 0's run of pixels is written.
        out: BufPtr,
        /// Pixels (rows of the sums).
        pixels: i64,
        /// Channels stored (the first of each row of the sums).
        channels: i64,
        /// Elements per row of the sums.
        lanes: i64,
        /// Elements from one channel's plane to the next in `out`.
        plane: i64,
    },
    /// A call of the Winograd input row routine (the contract is
    /// [`winograd::WinogradInputRow`]): one tile row of one block of 16 channels of a
    /// padded input in channel blocks, transformed into `v`.
    WinogradInputRow {
        /// The tile row's first input row, read.
        x: BufPtr,
        /// Plane 0, tile 0 of the block in the transformed input, written.
        v: BufPtr,
        /// The call's shape.
        row: winograd::WinogradInputRow,
    },
    /// A call of the Winograd output row routine (the contract is
    /// [`winograd::WinogradOutputRow`]): one tile row of one block of 16 channels of
    /// the transformed product `m`, transformed back and stored in channel blocks at
    /// `out`, sums only.
    WinogradOutputRow {
        /// The transformed product, read.
        m: BufPtr,
        /// Output row 0, column 0 of the block, written.
        out: BufPtr,
        /// The call's shape.
        row: winograd::WinogradOutputRow,
    },
    /// A hint that `rows` runs of `row_len` elements, `row_stride` apart from `at`, will
    /// be read soon: a native helper issues one cache-line prefetch per line (Cranelift
    /// has no prefetch instruction). Prefetches change no value and never fault; the
    /// checker still proves the runs inside the buffer.
    Prefetch {
        /// The first element of the first run.
        at: BufPtr,
        /// Runs.
        rows: i64,
        /// Elements from one run's start to the next.
        row_stride: i64,
        /// Elements per run.
        row_len: i64,
    },
}

/// Everything that determines a kernel's machine code: arguments, locals, variable
/// widths, loop variable count, body and parallelism ([`Kernel::signature`]).
pub type KernelSignature<'a> = (
    &'a [KernelArg],
    &'a [usize],
    &'a [Width],
    u32,
    &'a [Stmt],
    bool,
);

/// A kernel: buffer arguments, register variables and a body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// A descriptive name, e.g. `conv2d_3x3_fused`; not part of identity for deduplication
    /// purposes (callers compare [`Kernel::signature`]).
    pub name: String,
    /// Buffer arguments, in call order.
    pub args: Vec<KernelArg>,
    /// Lengths (in `f32` elements) of the local scratch buffers, per call.
    pub locals: Vec<usize>,
    /// Width of each register variable, indexed by [`VarId`].
    pub vars: Vec<Width>,
    /// Number of loop variables used (indices `0..num_loop_vars`).
    pub num_loop_vars: u32,
    /// The body.
    pub body: Vec<Stmt>,
    /// Whether the body's single top-level loop may be split across threads: its
    /// iterations write disjoint elements and read nothing another iteration writes, so
    /// any split gives bit-identical results (no reduction is ever split).
    pub parallel: bool,
}

impl Kernel {
    /// Everything that determines the generated code (all but the name): kernels with
    /// equal signatures compile to identical machine code, so they compile once.
    pub fn signature(&self) -> KernelSignature<'_> {
        (
            &self.args,
            &self.locals,
            &self.vars,
            self.num_loop_vars,
            &self.body,
            self.parallel,
        )
    }

    /// The trip count of the loop that may be split across threads, when the kernel is
    /// parallel (its body is one loop). A call runs trips `lo..hi` of that loop
    /// (`0 <= lo <= hi <= trips`); a kernel that is not parallel runs whole for `0..1`.
    pub fn parallel_trips(&self) -> Option<i64> {
        match (self.parallel, self.body.as_slice()) {
            (
                true,
                [Stmt::Loop {
                    start, end, step, ..
                }],
            ) => Some(trip_count(*start, *end, *step)),
            _ => None,
        }
    }

    /// Bytes one call moves at least: every argument's elements once (reads and writes),
    /// for GB/s reports.
    pub fn bytes(&self) -> u64 {
        self.args
            .iter()
            .map(|a| (a.len * a.dtype.size_bytes()) as u64)
            .sum()
    }

    /// Whether a call can end with a [`Fault`] status (it holds a run-time index or an
    /// integer division).
    pub fn can_fault(&self) -> bool {
        fn block(stmts: &[Stmt], vars: &[Width]) -> bool {
            stmts.iter().any(|s| match s {
                Stmt::Loop { body, .. } => block(body, vars),
                Stmt::Assign { value, .. } | Stmt::Store { value, .. } => value.can_fault(vars),
                Stmt::ConvTile { .. }
                | Stmt::DepthwiseRow { .. }
                | Stmt::BlockedDepthwiseRow { .. }
                | Stmt::SoftmaxRow { .. }
                | Stmt::ActivationRows { .. }
                | Stmt::StoreRows { .. }
                | Stmt::StorePlanes { .. }
                | Stmt::WinogradOutputRow { .. }
                | Stmt::WinogradInputRow { .. }
                | Stmt::Prefetch { .. } => false,
            })
        }
        block(&self.body, &self.vars)
    }

    /// Number of floating-point operations one call performs (FMA counts two), counted
    /// statically over the loop trip counts; for GFLOP/s reports. Loops limited at run
    /// time ([`LoopLimit`]) count every constant iteration: see [`Kernel::flops_at`].
    pub fn flops(&self) -> u64 {
        self.flops_at(None)
    }

    /// [`Kernel::flops`] of a call whose limited loops read `extent` (`None`: every
    /// iteration counted): the loops around a limited one are walked iteration by
    /// iteration, the others multiplied out.
    pub fn flops_at(&self, extent: Option<i64>) -> u64 {
        fn expr(e: &Expr, vars: &[Width]) -> u64 {
            match e {
                Expr::Var(_) | Expr::Const(..) | Expr::Int(..) | Expr::Load { .. } => 0,
                Expr::LoadAt { index, .. } => expr(index, vars),
                Expr::Splat(x) | Expr::Cast(_, x) => expr(x, vars),
                Expr::Compare(_, a, b) => 1 + expr(a, vars) + expr(b, vars),
                Expr::Unary(_, x) => lanes_of(e, vars) + expr(x, vars),
                Expr::Binary(_, a, b) => lanes_of(e, vars) + expr(a, vars) + expr(b, vars),
                Expr::Fma(a, b, c) => {
                    2 * lanes_of(e, vars) + expr(a, vars) + expr(b, vars) + expr(c, vars)
                }
                Expr::Select {
                    a,
                    b,
                    if_true,
                    if_false,
                    ..
                } => {
                    lanes_of(e, vars)
                        + expr(a, vars)
                        + expr(b, vars)
                        + expr(if_true, vars)
                        + expr(if_false, vars)
                }
                Expr::Reduce(_, x) => 3 + expr(x, vars),
                Expr::Lane(x, _) => expr(x, vars),
                // data movement, not arithmetic
                Expr::Shuffle(a, b, _) => expr(a, vars) + expr(b, vars),
            }
        }
        fn lanes_of(e: &Expr, vars: &[Width]) -> u64 {
            fn width(e: &Expr, vars: &[Width]) -> usize {
                match e {
                    Expr::Var(v) => vars.get(v.0 as usize).map_or(1, |w| w.lanes()),
                    Expr::Const(_, w)
                    | Expr::Int(_, w)
                    | Expr::Load { width: w, .. }
                    | Expr::LoadAt { width: w, .. }
                    | Expr::Cast(w, _) => w.lanes(),
                    Expr::Compare(..) => 1,
                    Expr::Splat(_) => 4,
                    Expr::Unary(_, x) => width(x, vars),
                    Expr::Binary(_, a, b) => width(a, vars).max(width(b, vars)),
                    Expr::Fma(a, b, c) => width(a, vars).max(width(b, vars)).max(width(c, vars)),
                    Expr::Select {
                        if_true, if_false, ..
                    } => width(if_true, vars).max(width(if_false, vars)),
                    Expr::Reduce(..) | Expr::Lane(..) => 1,
                    Expr::Shuffle(..) => 4,
                }
            }
            width(e, vars) as u64
        }
        fn limited(stmts: &[Stmt]) -> bool {
            stmts.iter().any(|s| match s {
                Stmt::Loop { limit, body, .. } => limit.is_some() || limited(body),
                _ => false,
            })
        }
        /// Whether an iteration runs under `limit` with the loop variables at `at`.
        fn runs(limit: &LoopLimit, at: &[i64], extent: i64) -> bool {
            let row = limit.row.terms.iter().fold(limit.row.offset, |r, &(v, c)| {
                r.saturating_add(c.saturating_mul(at.get(v.0 as usize).copied().unwrap_or(0)))
            });
            (row < extent) != limit.from
        }
        fn block(stmts: &[Stmt], vars: &[Width], at: &mut Vec<i64>, extent: Option<i64>) -> u64 {
            stmts
                .iter()
                .map(|s| match s {
                    Stmt::Loop {
                        var,
                        start,
                        end,
                        step,
                        limit,
                        body,
                    } => match extent {
                        Some(x) if limited(std::slice::from_ref(s)) => {
                            let slot = var.0 as usize;
                            if at.len() <= slot {
                                at.resize(slot + 1, 0);
                            }
                            let mut total = 0u64;
                            let mut i = *start;
                            while i < *end {
                                at[slot] = i;
                                if limit.as_ref().is_none_or(|l| runs(l, at, x)) {
                                    total = total.saturating_add(block(body, vars, at, extent));
                                }
                                i = i.saturating_add((*step).max(1));
                            }
                            total
                        }
                        _ => trip_count(*start, *end, *step) as u64 * block(body, vars, at, extent),
                    },
                    Stmt::Assign { value, .. } | Stmt::Store { value, .. } => expr(value, vars),
                    Stmt::ConvTile { tile, .. } => tile.flops(),
                    Stmt::DepthwiseRow { row, .. } => row.flops(),
                    Stmt::BlockedDepthwiseRow { row, .. } => row.flops(),
                    // a max, a subtraction, an exponential (counted one), a sum and a product
                    Stmt::SoftmaxRow { len, .. } => 5 * (*len).max(0) as u64,
                    // an add, a negation, an exponential, an add, a division, a product
                    Stmt::ActivationRows { rows, lanes, .. } => {
                        6 * ((*rows).max(0) * (*lanes).max(0)) as u64
                    }
                    // the bias and residual adds; the activation's compare is not counted
                    Stmt::StoreRows {
                        rows,
                        lanes,
                        bias,
                        residual,
                        ..
                    } => {
                        let adds = bias.is_some() as u64 + residual.is_some() as u64;
                        adds * ((*rows).max(0) * (*lanes).max(0)) as u64
                    }
                    // the bias add
                    Stmt::StorePlanes {
                        pixels,
                        channels,
                        bias,
                        ..
                    } => bias.is_some() as u64 * ((*pixels).max(0) * (*channels).max(0)) as u64,
                    Stmt::WinogradOutputRow { row, .. } => row.flops(),
                    Stmt::WinogradInputRow { row, .. } => row.flops(),
                    Stmt::Prefetch { .. } => 0,
                })
                .sum()
        }
        block(&self.body, &self.vars, &mut Vec::new(), extent)
    }
}

/// Number of iterations of a loop `start..end` by `step` (0 when empty or `step <= 0`;
/// computed without overflow, and at most `i64::MAX`).
pub fn trip_count(start: i64, end: i64, step: i64) -> i64 {
    if step <= 0 || end <= start {
        0
    } else {
        let trips = (i128::from(end) - i128::from(start) + i128::from(step) - 1) / i128::from(step);
        i64::try_from(trips).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy_kernel(len_in: usize, end: i64) -> Kernel {
        let mut b = KernelBuilder::new("copy");
        let x = b.arg("x", len_in, Access::Read);
        let y = b.arg("y", 8, Access::Write);
        b.for_loop(0, end, 4, |b, i| {
            let v = Expr::load(x, Affine::var(i), Width::F32x4);
            let v = Expr::binary(BinOp::Max, v, Expr::constant(0.0, Width::F32x4));
            b.store(y, Affine::var(i), v, Width::F32x4);
        });
        b.finish()
    }

    /// A kernel storing `shuffle(x[0..4], x[4..8], m)` (or of two scalars).
    fn shuffle_kernel(m: [u8; 4], width: Width) -> Kernel {
        let mut b = KernelBuilder::new("shuffle");
        let x = b.arg("x", 8, Access::Read);
        let y = b.arg("y", 4, Access::Write);
        let v = Expr::shuffle(
            Expr::load(x, Affine::constant(0), width),
            Expr::load(x, Affine::constant(4), width),
            m,
        );
        b.store(y, Affine::constant(0), v, Width::F32x4);
        b.finish()
    }

    #[test]
    fn shuffles_take_lanes_of_two_vectors() {
        let ok = shuffle_kernel([0, 4, 1, 5], Width::F32x4);
        assert!(ok.check().is_ok());
        assert!(ok.to_string().contains("shuffle("), "{ok}");
        let err = shuffle_kernel([0, 8, 1, 5], Width::F32x4)
            .check()
            .unwrap_err();
        assert!(err.contains("outside the 8 lanes"), "{err}");
        let err = shuffle_kernel([0, 1, 2, 3], Width::Scalar)
            .check()
            .unwrap_err();
        assert!(err.contains("shuffle of scalars"), "{err}");
    }

    #[test]
    fn bounds_are_proven_per_access() {
        assert!(copy_kernel(8, 8).check().is_ok());
        // the last vector of the second iteration reads elements 4..8 of a 7-element buffer
        let err = copy_kernel(7, 8).check().unwrap_err();
        assert!(err.contains("outside its 7 elements"), "{err}");
    }

    #[test]
    fn store_to_read_only_and_width_mismatch_are_rejected() {
        let mut b = KernelBuilder::new("bad");
        let x = b.arg("x", 4, Access::Read);
        b.store(
            x,
            Affine::constant(0),
            Expr::constant(1.0, Width::Scalar),
            Width::Scalar,
        );
        assert!(b.finish().check().unwrap_err().contains("read-only"));

        let mut b = KernelBuilder::new("bad");
        let y = b.arg("y", 4, Access::Write);
        let v = Expr::binary(
            BinOp::Add,
            Expr::constant(1.0, Width::Scalar),
            Expr::constant(1.0, Width::F32x4),
        );
        b.store(y, Affine::constant(0), v, Width::Scalar);
        assert!(b.finish().check().unwrap_err().contains("mixes"));
    }

    #[test]
    fn affine_terms_merge_and_print() {
        let (i, j) = (LoopVar(0), LoopVar(1));
        let a = Affine::var(j).scale(3).add(&Affine::var(i).plus(2));
        assert_eq!(a.to_string(), "i0 + 3*i1 + 2");
        let z = a.add(&Affine::var(j).scale(-3));
        assert_eq!(z.to_string(), "i0 + 2");
    }

    /// A kernel calling a 16-lane conv tile on `x` (len `x_len`) into a local buffer.
    fn tile_kernel(x_len: usize, tile: ConvTile) -> Kernel {
        let mut b = KernelBuilder::new("tile");
        let x = b.arg("x", x_len, Access::Read);
        let w = b.arg("w", 16 * 8, Access::Read);
        let sums = b.local(16 * 4);
        let at = |buf| BufPtr {
            buf,
            index: Affine::constant(0),
        };
        b.conv_tile(at(x), at(w), at(sums), None, tile);
        b.finish()
    }

    fn four_pixels() -> ConvTile {
        ConvTile {
            lanes: 16,
            pixels: 4,
            rows: 1,
            row_stride: 0,
            taps: 1,
            tap_stride: 0,
            chans: 8,
            chan_stride: 1,
            pixel_stride: 8,
            w_tap_stride: 128,
            out_pixel_stride: 16,
            out_vec_stride: 4,
            out_block_stride: 16,
            next_len: 0,
            finish: 0,
            accumulate: false,
        }
    }

    /// A kernel calling `tile` (16 lanes) with a finish: its bias (`bias_len` elements)
    /// and residual (`residual_len`), each when given.
    fn finished_tile_kernel(
        tile: ConvTile,
        bias_len: Option<usize>,
        residual_len: Option<usize>,
    ) -> Kernel {
        let mut b = KernelBuilder::new("finished");
        let x = b.arg("x", 32, Access::Read);
        let w = b.arg("w", 16 * 8, Access::Read);
        let bias = bias_len.map(|n| b.arg("bias", n, Access::Read));
        let residual = residual_len.map(|n| b.arg("residual", n, Access::Read));
        let out = b.arg("out", 16 * 4, Access::Write);
        let at = |buf| BufPtr {
            buf,
            index: Affine::constant(0),
        };
        b.conv_tile_finished(
            at(x),
            at(w),
            at(out),
            None,
            bias.map(at),
            residual.map(at),
            tile,
        );
        b.finish()
    }

    /// A finish reads its bias over the lanes and its residual over the output's
    /// footprint; it needs a known activation and vector-wide output groups, and a bias
    /// or residual without one is refused.
    #[test]
    fn finished_tiles_prove_their_bias_and_residual() {
        let relu = ConvTile {
            finish: ConvTile::finish_code(StoreActivation::Relu),
            ..four_pixels()
        };
        assert_eq!(relu.finish_act(), Some(StoreActivation::Relu));
        assert!(finished_tile_kernel(relu, Some(16), Some(64))
            .check()
            .is_ok());
        let text = finished_tile_kernel(relu, Some(16), Some(64)).to_string();
        assert!(
            text.contains("bias: &%2[0], residual: &%3[0]; lanes=16")
                && text.contains("finish=relu"),
            "{text}"
        );
        let err = finished_tile_kernel(relu, Some(15), None)
            .check()
            .unwrap_err();
        assert!(err.contains("(bias)"), "{err}");
        let err = finished_tile_kernel(relu, None, Some(63))
            .check()
            .unwrap_err();
        assert!(err.contains("(residual)"), "{err}");
        let unknown = ConvTile {
            finish: 9,
            ..four_pixels()
        };
        assert_eq!(unknown.footprints(), None);
        let quads = ConvTile {
            out_vec_stride: 8,
            ..relu
        };
        assert_eq!(quads.footprints(), None);
        let err = finished_tile_kernel(four_pixels(), Some(16), None)
            .check()
            .unwrap_err();
        assert!(err.contains("needs a finish"), "{err}");
    }

    #[test]
    fn micro_kernel_calls_are_proven_from_their_footprints() {
        // x: pixel 3, channel 7 is element 31; w: 8 channels × 16; out: 4 pixels × 16
        assert_eq!(four_pixels().footprints(), Some([32, 128, 64]));
        assert_eq!(four_pixels().flops(), 2 * 4 * 8 * 16);
        assert!(tile_kernel(32, four_pixels()).check().is_ok());
        let err = tile_kernel(31, four_pixels()).check().unwrap_err();
        assert!(err.contains("outside its 31 elements"), "{err}");
        let mut wide = four_pixels();
        wide.pixels = 5;
        let err = tile_kernel(64, wide).check().unwrap_err();
        assert!(err.contains("%local0"), "{err}");
        let mut negative = four_pixels();
        negative.chan_stride = -1;
        let err = tile_kernel(64, negative).check().unwrap_err();
        assert!(err.contains("negative"), "{err}");
        let mut wider = four_pixels();
        wider.lanes = 32;
        let err = tile_kernel(32, wider).check().unwrap_err();
        assert!(err.contains("%1 (w) at [0, 255]"), "{err}");
        let text = tile_kernel(32, four_pixels()).to_string();
        assert!(text.contains("%local0: local f32[64]"), "{text}");
        assert!(
            text.contains(
                "call conv_tile(x: &%0[0], w: &%1[0], out: &%local0[0]; lanes=16, pixels=4"
            ),
            "{text}"
        );
    }

    #[test]
    fn next_runs_are_clamped_to_their_buffer_and_need_a_length() {
        // trips 0..4 prefetch from 128·(i0 + 1): past the end of 512 elements on the last
        // trip, which the clamp moves back; only a negative start or a run longer than
        // the buffer is refused
        let kernel = |w_len: usize, start: i64, next: Option<i64>, next_len: i64| {
            let mut b = KernelBuilder::new("next");
            let x = b.arg("x", 32, Access::Read);
            let w = b.arg("w", w_len, Access::Read);
            let sums = b.local(16 * 4);
            let mut tile = four_pixels();
            tile.next_len = next_len;
            b.for_loop(0, 4, 1, |b, i| {
                let at = |buf, index| BufPtr { buf, index };
                let next = next.map(|step| at(w, Affine::var(i).scale(step).plus(start)));
                let (x, wb) = (at(x, Affine::constant(0)), at(w, Affine::constant(0)));
                let sums = at(sums, Affine::constant(0));
                b.conv_tile(x, wb, sums, next, tile);
            });
            b.finish()
        };
        let ok = kernel(512, 128, Some(128), 128);
        assert!(ok.check().is_ok(), "{:?}", ok.check());
        let text = ok.to_string();
        assert!(text.contains("next: &%1[128*i0 + 128]"), "{text}");
        assert!(text.contains("next_len=128"), "{text}");
        let err = kernel(512, -1, Some(128), 128).check().unwrap_err();
        assert!(err.contains("from -1"), "{err}");
        let err = kernel(512, 0, Some(128), 513).check().unwrap_err();
        assert!(err.contains("outside its 512 elements"), "{err}");
        for (next, len) in [(Some(128), 0), (None, 128)] {
            let err = kernel(512, 0, next, len).check().unwrap_err();
            assert!(err.contains("needs both"), "{err}");
        }
    }

    #[test]
    fn prefetches_are_proven_inside_their_buffer() {
        let kernel = |len: usize, rows: i64, row_stride: i64, row_len: i64| {
            let mut b = KernelBuilder::new("prefetch");
            let r = b.arg("r", len, Access::Read);
            b.for_loop(0, 2, 1, |b, i| {
                let at = BufPtr {
                    buf: r,
                    index: Affine::var(i).scale(4),
                };
                b.prefetch(at, rows, row_stride, row_len);
            });
            b.finish()
        };
        // the last run of the last trip: 4 + 2·10 .. 4 + 2·10 + 4
        assert!(kernel(28, 3, 10, 4).check().is_ok());
        let err = kernel(27, 3, 10, 4).check().unwrap_err();
        assert!(err.contains("outside its 27 elements"), "{err}");
        for (rows, stride, len) in [(0, 10, 4), (3, -1, 4), (3, 10, 0), (i64::MAX, i64::MAX, 1)] {
            let err = kernel(1 << 20, rows, stride, len).check().unwrap_err();
            assert!(err.contains("prefetch of"), "{err}");
        }
        let text = kernel(28, 3, 10, 4).to_string();
        assert!(
            text.contains("prefetch &%0[4*i0]; rows=3x10, len=4"),
            "{text}"
        );
        assert_eq!(kernel(28, 3, 10, 4).flops(), 0);
    }

    /// `out[i] = table[base + 2·ids[i]]` for `n` ids, the table `len` elements long and
    /// each id checked against `bound` at run time.
    fn gather_kernel(len: usize, base: i64, bound: i64, parallel: bool) -> Kernel {
        let mut b = KernelBuilder::new("gather");
        let table = b.arg("table", len, Access::Read);
        let ids = b.typed_arg("ids", DType::I64, 3, Access::Read);
        let out = b.arg("out", 3, Access::Write);
        b.for_loop(0, 3, 1, |b, i| {
            let v = Expr::LoadAt {
                buf: table,
                base: Affine::constant(base),
                index: Box::new(Expr::load(ids, Affine::var(i), Width::I64)),
                stride: 2,
                bound,
                width: Width::Scalar,
            };
            b.store(out, Affine::var(i), v, Width::Scalar);
        });
        if parallel {
            b.set_parallel();
        }
        b.finish()
    }

    #[test]
    fn run_time_indices_are_proven_for_every_index_below_their_bound() {
        // indices 0..4 read base + 0, 2, 4, 6: element 7 is the last one with base 1
        assert!(gather_kernel(8, 1, 4, false).check().is_ok());
        assert!(gather_kernel(8, 1, 4, false).can_fault());
        let err = gather_kernel(7, 1, 4, false).check().unwrap_err();
        assert!(err.contains("outside its 7 elements"), "{err}");
        let err = gather_kernel(8, -1, 4, false).check().unwrap_err();
        assert!(err.contains("outside"), "{err}");
        let err = gather_kernel(8, 0, 0, false).check().unwrap_err();
        assert!(err.contains("positive bound"), "{err}");
        // a split call's fault would be lost, so a kernel that can fault is never parallel
        let err = gather_kernel(8, 1, 4, true).check().unwrap_err();
        assert!(err.contains("cannot fault"), "{err}");
        let text = gather_kernel(8, 1, 4, false).to_string();
        assert!(text.contains("%1 ids: read i64[3]"), "{text}");
        assert!(
            text.contains("load.f32 %0[1 + 2*checked(load.i64 %1[i0] < 4)]"),
            "{text}"
        );
    }

    #[test]
    fn element_types_of_buffers_and_values_are_checked() {
        let mut b = KernelBuilder::new("types");
        let ids = b.typed_arg("ids", DType::I64, 4, Access::Read);
        let out = b.arg("out", 4, Access::Write);
        // an f32 load from an i64 buffer
        let v = Expr::load(ids, Affine::constant(0), Width::Scalar);
        b.store(out, Affine::constant(0), v, Width::Scalar);
        let err = b.finish().check().unwrap_err();
        assert!(err.contains("a buffer of i64"), "{err}");
        // bitwise ops take integers only; float functions take floats only
        let mut b = KernelBuilder::new("types");
        let out = b.arg("out", 4, Access::Write);
        let v = Expr::binary(
            BinOp::And,
            Expr::constant(1.0, Width::Scalar),
            Expr::constant(1.0, Width::Scalar),
        );
        b.store(out, Affine::constant(0), v, Width::Scalar);
        assert!(b.finish().check().unwrap_err().contains("And of f32"));
        let mut b = KernelBuilder::new("types");
        let out = b.typed_arg("out", DType::I64, 4, Access::Write);
        let v = Expr::unary(UnOp::Exp, Expr::int(3, Width::I64));
        b.store(out, Affine::constant(0), v, Width::I64);
        assert!(b
            .finish()
            .check()
            .unwrap_err()
            .contains("Exp of i64 values"));
    }

    #[test]
    fn printer_is_stable() {
        let text = copy_kernel(8, 8).to_string();
        assert_eq!(
            text,
            "kernel @copy(\n  %0 x: read f32[8]\n  %1 y: write f32[8]\n) {\n  \
             for i0 in 0..8 step 4 {\n    store.f32x4 %1[i0] = max(load.f32x4 %0[i0], splat(0.0))\n  }\n}\n"
        );
    }
}
