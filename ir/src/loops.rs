//! The loop-nest IR: kernels as loops over vector loads, stores, FMAs and epilogues.
//!
//! A [`Kernel`] is a function of buffer arguments (pointers to `f32` elements, each
//! with a static length). Its body is a tree of [`Stmt`]s: counted loops with constant
//! bounds, assignments to register variables, and stores. Values are [`Expr`] trees over
//! loads at affine addresses, constants, broadcasts, arithmetic, FMAs and selects, in
//! scalar (`f32`) or vector (`f32x4`) width.
//!
//! Everything is static, so [`Kernel::check`] proves every access of every load and
//! store inside its buffer before any code runs: the runtime's safety argument rests on
//! it. Lowering (in smelt-passes) produces kernels; code generation (in smelt) turns them
//! into Cranelift IR. The printer ([`Kernel::fmt`]) is deterministic, for `--dump-loops`
//! and snapshot tests.

use std::fmt::{self, Write as _};

use crate::types::F32;

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

/// Width of a value: one `f32` or a vector of four.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Width {
    /// One `f32`.
    Scalar,
    /// Four `f32` lanes (128 bits).
    F32x4,
}

impl Width {
    /// Number of `f32` lanes.
    pub fn lanes(self) -> usize {
        match self {
            Width::Scalar => 1,
            Width::F32x4 => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Width::Scalar => "f32",
            Width::F32x4 => "f32x4",
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
    /// Length in `f32` elements; every access is proven inside it.
    pub len: usize,
    /// Read-only or written.
    pub access: Access,
}

/// An integer address in elements: `offset + Σ coefficient · loop variable`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Affine {
    /// Constant part.
    pub offset: i64,
    /// Terms, at most one per loop variable, sorted by variable.
    pub terms: Vec<(LoopVar, i64)>,
}

impl Affine {
    /// A constant address.
    pub fn constant(offset: i64) -> Affine {
        Affine {
            offset,
            terms: Vec::new(),
        }
    }

    /// The loop variable itself.
    pub fn var(v: LoopVar) -> Affine {
        Affine {
            offset: 0,
            terms: vec![(v, 1)],
        }
    }

    /// `self + other`.
    pub fn add(&self, other: &Affine) -> Affine {
        let mut out = self.clone();
        out.offset += other.offset;
        for &(v, c) in &other.terms {
            out.add_term(v, c);
        }
        out
    }

    /// `self + k`.
    pub fn plus(&self, k: i64) -> Affine {
        let mut out = self.clone();
        out.offset += k;
        out
    }

    /// `self · k`.
    pub fn scale(&self, k: i64) -> Affine {
        let mut out = Affine::constant(self.offset * k);
        for &(v, c) in &self.terms {
            out.add_term(v, c * k);
        }
        out
    }

    fn add_term(&mut self, v: LoopVar, c: i64) {
        match self.terms.binary_search_by_key(&v, |t| t.0) {
            Ok(i) => {
                self.terms[i].1 += c;
                if self.terms[i].1 == 0 {
                    self.terms.remove(i);
                }
            }
            Err(i) if c != 0 => self.terms.insert(i, (v, c)),
            Err(_) => {}
        }
    }
}

/// An elementwise function of one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// Square root.
    Sqrt,
    /// `e^x` (code generation expands it into a polynomial; relative error ≈ 2e-7).
    Exp,
}

/// An elementwise function of two values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `a > b ? a : b` (the x86 `maxps` rule: a NaN in `a` gives `b`).
    Max,
    /// `a < b ? a : b`.
    Min,
}

/// A comparison for [`Expr::Select`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CmpOp {
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
}

/// A horizontal reduction of a vector to a scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum of the lanes.
    Add,
    /// Largest lane.
    Max,
}

/// A value computed in registers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// The current value of a register variable.
    Var(VarId),
    /// A constant, splatted to every lane.
    Const(F32, Width),
    /// Loads `width.lanes()` consecutive elements of `buf` starting at `index`.
    Load {
        /// The buffer.
        buf: BufId,
        /// Element index of the first lane.
        index: Affine,
        /// How many lanes.
        width: Width,
    },
    /// A scalar broadcast to every lane of a vector.
    Splat(Box<Expr>),
    /// An elementwise function of one value.
    Unary(UnOp, Box<Expr>),
    /// An elementwise function of two values of the same width.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `a * b + c`, fused when the target has FMA.
    Fma(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `(a cmp b) ? if_true : if_false`, lane by lane.
    Select {
        /// The comparison.
        cmp: CmpOp,
        /// Left side of the comparison.
        a: Box<Expr>,
        /// Right side of the comparison.
        b: Box<Expr>,
        /// Value where the comparison holds.
        if_true: Box<Expr>,
        /// Value where it does not.
        if_false: Box<Expr>,
    },
    /// A vector reduced to a scalar.
    Reduce(ReduceOp, Box<Expr>),
    /// One lane (0..4) of a vector, as a scalar.
    Lane(Box<Expr>, u8),
    /// Lanes picked from two vectors: lane `i` of the result is lane `m[i]` of the
    /// eight lanes `a ++ b` (`m[i] < 8`). Register tiles are transposed with these.
    Shuffle(Box<Expr>, Box<Expr>, [u8; 4]),
}

impl Expr {
    /// A load of `width` lanes.
    pub fn load(buf: BufId, index: Affine, width: Width) -> Expr {
        Expr::Load { buf, index, width }
    }

    /// A constant.
    pub fn constant(v: f32, width: Width) -> Expr {
        Expr::Const(F32(v), width)
    }

    /// `op(a, b)`.
    pub fn binary(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }

    /// `op(x)`.
    pub fn unary(op: UnOp, x: Expr) -> Expr {
        Expr::Unary(op, Box::new(x))
    }

    /// `a * b + c`.
    pub fn fma(a: Expr, b: Expr, c: Expr) -> Expr {
        Expr::Fma(Box::new(a), Box::new(b), Box::new(c))
    }

    /// `(a cmp b) ? t : f`.
    pub fn select(cmp: CmpOp, a: Expr, b: Expr, t: Expr, f: Expr) -> Expr {
        Expr::Select {
            cmp,
            a: Box::new(a),
            b: Box::new(b),
            if_true: Box::new(t),
            if_false: Box::new(f),
        }
    }

    /// `x` broadcast to `width` (no-op for scalar width).
    pub fn splat_to(x: Expr, width: Width) -> Expr {
        match width {
            Width::Scalar => x,
            Width::F32x4 => Expr::Splat(Box::new(x)),
        }
    }

    /// Lane `lane` (0..4) of the vector `x`.
    pub fn lane(x: Expr, lane: u8) -> Expr {
        Expr::Lane(Box::new(x), lane)
    }

    /// Lanes `m` of the eight lanes `a ++ b` (see [`Expr::Shuffle`]).
    pub fn shuffle(a: Expr, b: Expr, m: [u8; 4]) -> Expr {
        Expr::Shuffle(Box::new(a), Box::new(b), m)
    }

    /// Whether evaluating the expression twice costs nothing (a variable or a constant).
    pub fn is_trivial(&self) -> bool {
        matches!(self, Expr::Var(_) | Expr::Const(..))
    }
}

/// A leaf routine written natively (with `std::arch`) that kernels call for GEMM-shaped
/// tiles; the runtime provides it and selects it only where the host has the ISA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MicroKernel {
    /// The conv tile with AVX2 + FMA (two `f32x8` per pixel).
    ConvTileAvx2,
    /// The conv tile with AVX-512F (one `f32x16` per pixel).
    ConvTileAvx512,
    /// The conv tile with AVX-512F over 32 channels (two `f32x16` per pixel).
    ConvTileAvx512x32,
}

impl MicroKernel {
    /// Output channels per call: the lanes of one packed weight row.
    pub fn lanes(self) -> i64 {
        match self {
            MicroKernel::ConvTileAvx2 | MicroKernel::ConvTileAvx512 => 16,
            MicroKernel::ConvTileAvx512x32 => 32,
        }
    }

    /// The routine to use instead when a group's output channels are not a multiple of
    /// [`MicroKernel::lanes`] (the 16-channel AVX-512 tile for the 32-channel one).
    pub fn narrower(self) -> Option<MicroKernel> {
        match self {
            MicroKernel::ConvTileAvx512x32 => Some(MicroKernel::ConvTileAvx512),
            MicroKernel::ConvTileAvx2 | MicroKernel::ConvTileAvx512 => None,
        }
    }

    /// Lanes of the routine's FMA instructions (8 for AVX2, 16 for AVX-512), for cost
    /// models and peak-speed reports.
    pub fn fma_lanes(self) -> i64 {
        match self {
            MicroKernel::ConvTileAvx2 => 8,
            MicroKernel::ConvTileAvx512 | MicroKernel::ConvTileAvx512x32 => 16,
        }
    }

    /// The routine's symbol name, as the JIT links it.
    pub fn symbol(self) -> &'static str {
        match self {
            MicroKernel::ConvTileAvx2 => "smelt_conv_tile_avx2",
            MicroKernel::ConvTileAvx512 => "smelt_conv_tile_avx512",
            MicroKernel::ConvTileAvx512x32 => "smelt_conv_tile_avx512_x32",
        }
    }
}

/// The shape of one conv-tile call: for pixel `p < pixels` and output channel
/// `l < lanes`,
///
/// ```text
/// out[p·out_pixel_stride + (l/4)·out_vec_stride + l%4]  (+)=
///     Σ_{r<rows, t<taps, c<chans} x[r·row_stride + t·tap_stride + c·chan_stride + p·pixel_stride]
///                                · w[(r·taps + t)·w_tap_stride + lanes·c + l]
/// ```
///
/// starting from the old `out` when `accumulate`, else from zero. All counts and strides
/// are non-negative ([`Kernel::check`] verifies it and proves the footprints, which bound
/// every index above, inside their buffers).
///
/// It is also the record a routine reads its shape from (`*const ConvTile`, after the
/// three buffer pointers), hence `repr(C)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct ConvTile {
    /// Output channels (the routine's [`MicroKernel::lanes`]).
    pub lanes: i64,
    /// Output pixels.
    pub pixels: i64,
    /// Kernel rows.
    pub rows: i64,
    /// Input elements between kernel rows.
    pub row_stride: i64,
    /// Taps per kernel row.
    pub taps: i64,
    /// Input elements between taps.
    pub tap_stride: i64,
    /// Input channels.
    pub chans: i64,
    /// Input elements between channels.
    pub chan_stride: i64,
    /// Input elements between output pixels.
    pub pixel_stride: i64,
    /// Weight elements between taps (`lanes` per input channel of the whole filter).
    pub w_tap_stride: i64,
    /// Output elements between pixels.
    pub out_pixel_stride: i64,
    /// Output elements between groups of 4 channels.
    pub out_vec_stride: i64,
    /// Elements of the call's `next` run (see [`Stmt::ConvTile`]) that the routine
    /// prefetches, spread over its reduction; 0 for none.
    pub next_len: i64,
    /// Add to the old output instead of overwriting it.
    pub accumulate: bool,
}

impl ConvTile {
    fn is_empty(&self) -> bool {
        self.pixels == 0 || self.rows == 0 || self.taps == 0 || self.chans == 0
    }

    /// Elements of `x`, `w` and `out` from each pointer that the call may touch
    /// (`None` when a count or stride is negative, the lanes are not a positive multiple
    /// of 4, or a product overflows).
    pub fn footprints(&self) -> Option<[i64; 3]> {
        let t = self;
        if t.lanes <= 0 || t.lanes % 4 != 0 {
            return None;
        }
        let fields = [
            t.pixels,
            t.rows,
            t.row_stride,
            t.taps,
            t.tap_stride,
            t.chans,
            t.chan_stride,
            t.pixel_stride,
            t.w_tap_stride,
            t.out_pixel_stride,
            t.out_vec_stride,
        ];
        if fields.iter().any(|&f| f < 0) {
            return None;
        }
        let out = (t.pixels.max(1) - 1)
            .checked_mul(t.out_pixel_stride)?
            .checked_add((t.lanes / 4 - 1).checked_mul(t.out_vec_stride)?)?
            .checked_add(4)?;
        if t.is_empty() {
            // nothing read; `out` is still written (zeroed) unless there are no pixels
            return Some([0, 0, if t.pixels == 0 { 0 } else { out }]);
        }
        let x = [
            (t.rows, t.row_stride),
            (t.taps, t.tap_stride),
            (t.chans, t.chan_stride),
            (t.pixels, t.pixel_stride),
        ]
        .iter()
        .try_fold(1i64, |acc, &(n, s)| {
            acc.checked_add((n - 1).checked_mul(s)?)
        })?;
        let w = (t.rows.checked_mul(t.taps)? - 1)
            .checked_mul(t.w_tap_stride)?
            .checked_add((t.chans - 1).checked_mul(t.lanes)?)?
            .checked_add(t.lanes)?;
        Some([x, w, out])
    }

    /// Floating-point operations of one call (an FMA counts two).
    pub fn flops(&self) -> u64 {
        let n = [
            self.pixels,
            self.rows,
            self.taps,
            self.chans,
            2 * self.lanes,
        ];
        n.iter().map(|&v| v.max(0) as u64).product()
    }
}

impl fmt::Display for ConvTile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lanes={}, pixels={}, rows={}x{}, taps={}x{}, chans={}x{}, pixel_stride={}, w_tap_stride={}, out_strides=({}, {}){}{}",
            self.lanes,
            self.pixels,
            self.rows,
            self.row_stride,
            self.taps,
            self.tap_stride,
            self.chans,
            self.chan_stride,
            self.pixel_stride,
            self.w_tap_stride,
            self.out_pixel_stride,
            self.out_vec_stride,
            if self.next_len > 0 {
                format!(", next_len={}", self.next_len)
            } else {
                String::new()
            },
            if self.accumulate { ", accumulate" } else { "" }
        )
    }
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

/// A statement of a kernel body.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `for var = start; var < end; var += step { body }` with constant bounds.
    Loop {
        /// The induction variable.
        var: LoopVar,
        /// First value.
        start: i64,
        /// Exclusive bound.
        end: i64,
        /// Positive increment.
        step: i64,
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
    /// A call of the conv-tile micro-kernel `routine` (see [`ConvTile`]): reads `x` and
    /// `w`, writes `out`, and prefetches `tile.next_len` elements from `next` (what later
    /// calls will read: the next weight block, which would otherwise stream from memory
    /// in one burst at its first use). The run starts at `next`, or earlier where it
    /// would pass the buffer's end, so it is always inside the buffer.
    ConvTile {
        /// Which implementation.
        routine: MicroKernel,
        /// The input pointer.
        x: BufPtr,
        /// The packed weights pointer.
        w: BufPtr,
        /// The output pointer.
        out: BufPtr,
        /// Where the prefetched run starts, before the clamp to the buffer's end; present
        /// exactly when `tile.next_len > 0`.
        next: Option<BufPtr>,
        /// The tile's shape.
        tile: ConvTile,
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
        self.args.iter().map(|a| a.len as u64 * 4).sum()
    }

    /// Checks the kernel: widths agree, variables and loop variables are in scope, stores
    /// go to written buffers, and every load and store stays inside its buffer for every
    /// iteration. This is the proof the runtime relies on before calling native code.
    pub fn check(&self) -> Result<(), String> {
        if self.parallel && self.parallel_trips().is_none() {
            return Err(format!(
                "kernel {}: a parallel kernel's body must be one loop",
                self.name
            ));
        }
        let mut cx = CheckCx {
            kernel: self,
            ranges: vec![None; self.num_loop_vars as usize],
            assigned: vec![false; self.vars.len()],
        };
        cx.block(&self.body)
            .map_err(|e| format!("kernel {}: {e}", self.name))
    }

    /// Number of floating-point operations one call performs (FMA counts two), counted
    /// statically over the loop trip counts; for GFLOP/s reports.
    pub fn flops(&self) -> u64 {
        fn expr(e: &Expr, vars: &[Width]) -> u64 {
            match e {
                Expr::Var(_) | Expr::Const(..) | Expr::Load { .. } => 0,
                Expr::Splat(x) => expr(x, vars),
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
                    Expr::Const(_, w) | Expr::Load { width: w, .. } => w.lanes(),
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
        fn block(stmts: &[Stmt], vars: &[Width]) -> u64 {
            stmts
                .iter()
                .map(|s| match s {
                    Stmt::Loop {
                        start,
                        end,
                        step,
                        body,
                        ..
                    } => trip_count(*start, *end, *step) as u64 * block(body, vars),
                    Stmt::Assign { value, .. } | Stmt::Store { value, .. } => expr(value, vars),
                    Stmt::ConvTile { tile, .. } => tile.flops(),
                    Stmt::Prefetch { .. } => 0,
                })
                .sum()
        }
        block(&self.body, &self.vars)
    }
}

/// Number of iterations of a loop `start..end` by `step` (0 when empty or `step <= 0`).
pub fn trip_count(start: i64, end: i64, step: i64) -> i64 {
    if step <= 0 || end <= start {
        0
    } else {
        (end - start + step - 1) / step
    }
}

struct CheckCx<'k> {
    kernel: &'k Kernel,
    /// Inclusive value range of each loop variable in scope.
    ranges: Vec<Option<(i64, i64)>>,
    assigned: Vec<bool>,
}

impl CheckCx<'_> {
    fn block(&mut self, stmts: &[Stmt]) -> Result<(), String> {
        for s in stmts {
            match s {
                Stmt::Loop {
                    var,
                    start,
                    end,
                    step,
                    body,
                } => {
                    if *step <= 0 {
                        return Err(format!("loop i{} has step {step}", var.0));
                    }
                    let slot = self
                        .ranges
                        .get_mut(var.0 as usize)
                        .ok_or_else(|| format!("loop variable i{} is not declared", var.0))?;
                    if slot.is_some() {
                        return Err(format!("loop variable i{} is reused in its scope", var.0));
                    }
                    let trips = trip_count(*start, *end, *step);
                    if trips == 0 {
                        continue;
                    }
                    *slot = Some((*start, start + step * (trips - 1)));
                    let r = self.block(body);
                    self.ranges[var.0 as usize] = None;
                    r?;
                }
                Stmt::Assign { dst, value } => {
                    let want = *self
                        .kernel
                        .vars
                        .get(dst.0 as usize)
                        .ok_or_else(|| format!("variable ${} is not declared", dst.0))?;
                    let got = self.expr(value)?;
                    if got != want {
                        return Err(format!(
                            "${} is {} but is assigned a {} value",
                            dst.0,
                            want.name(),
                            got.name()
                        ));
                    }
                    self.assigned[dst.0 as usize] = true;
                }
                Stmt::Store {
                    buf,
                    index,
                    value,
                    width,
                } => {
                    let got = self.expr(value)?;
                    if got != *width {
                        return Err(format!(
                            "store of {} to {buf} stores a {} value",
                            width.name(),
                            got.name()
                        ));
                    }
                    if self.access(*buf, index, width.lanes() as i64)? != Access::Write {
                        return Err(format!("store to read-only argument {buf}"));
                    }
                }
                Stmt::ConvTile {
                    routine,
                    x,
                    w,
                    out,
                    next,
                    tile,
                } => {
                    match (next, tile.next_len) {
                        (None, 0) => {}
                        (Some(at), len) if len > 0 => self.clamped_run(at, len)?,
                        _ => {
                            return Err(format!(
                                "{routine:?} call: a prefetched run needs both a start and a positive length ({tile})"
                            ))
                        }
                    }
                    if tile.lanes != routine.lanes() {
                        return Err(format!(
                            "{routine:?} computes {} channels per call, not {}",
                            routine.lanes(),
                            tile.lanes
                        ));
                    }
                    let [xs, ws, os] = tile
                        .footprints()
                        .ok_or_else(|| format!("{routine:?} call with a negative count or stride, or an overflowing footprint: {tile}"))?;
                    for (ptr, span) in [(x, xs), (w, ws), (out, os)] {
                        if span > 0 {
                            self.access(ptr.buf, &ptr.index, span)?;
                        }
                    }
                    if os > 0 && self.access(out.buf, &out.index, os)? != Access::Write {
                        return Err(format!(
                            "{routine:?} call writes read-only argument {}",
                            out.buf
                        ));
                    }
                }
                Stmt::Prefetch {
                    at,
                    rows,
                    row_stride,
                    row_len,
                } => {
                    let span = (*rows > 0 && *row_stride >= 0 && *row_len > 0)
                        .then(|| row_stride.checked_mul(rows - 1)?.checked_add(*row_len))
                        .flatten()
                        .ok_or_else(|| {
                            format!("prefetch of {rows} runs of {row_len} every {row_stride}")
                        })?;
                    self.access(at.buf, &at.index, span)?;
                }
            }
        }
        Ok(())
    }

    /// Proves that a run of `span` elements starting at `at`, moved back where it would
    /// pass the buffer's end, lies inside the buffer for every iteration in scope: the
    /// start is never negative and the run is no longer than the buffer.
    fn clamped_run(&self, at: &BufPtr, span: i64) -> Result<(), String> {
        let (name, len, _) = self.buffer(at.buf)?;
        let (lo, _) = self.index_range(&at.index)?;
        if lo < 0 || span > len as i64 {
            return Err(format!(
                "prefetched run of {span} elements of {} ({name}) from {lo} is outside its {len} elements",
                at.buf
            ));
        }
        Ok(())
    }

    /// The name, length and access of `buf`.
    fn buffer(&self, buf: BufId) -> Result<(&str, usize, Access), String> {
        Ok(match buf.local_index() {
            Some(i) => {
                let len = self
                    .kernel
                    .locals
                    .get(i)
                    .ok_or_else(|| format!("local buffer {buf} does not exist"))?;
                ("local", *len, Access::Write)
            }
            None => {
                let arg = self
                    .kernel
                    .args
                    .get(buf.0 as usize)
                    .ok_or_else(|| format!("argument {buf} does not exist"))?;
                (arg.name.as_str(), arg.len, arg.access)
            }
        })
    }

    /// The least and greatest value of `index` over the iterations in scope.
    fn index_range(&self, index: &Affine) -> Result<(i64, i64), String> {
        let (mut lo, mut hi) = (index.offset, index.offset);
        for &(v, c) in &index.terms {
            let (a, b) = self
                .ranges
                .get(v.0 as usize)
                .copied()
                .flatten()
                .ok_or_else(|| format!("loop variable i{} used outside its loop", v.0))?;
            let (x, y) = (a.saturating_mul(c), b.saturating_mul(c));
            lo = lo.saturating_add(x.min(y));
            hi = hi.saturating_add(x.max(y));
        }
        Ok((lo, hi))
    }

    /// Proves `span` elements from `index` inside `buf` for every iteration in scope, and
    /// returns how the buffer may be accessed.
    fn access(&self, buf: BufId, index: &Affine, span: i64) -> Result<Access, String> {
        let (name, len, access) = self.buffer(buf)?;
        let (lo, hi) = self.index_range(index)?;
        let last = hi.saturating_add(span - 1);
        if lo < 0 || last >= len as i64 {
            return Err(format!(
                "access to {buf} ({name}) at [{lo}, {last}] is outside its {len} elements"
            ));
        }
        Ok(access)
    }

    fn expr(&self, e: &Expr) -> Result<Width, String> {
        let same = |a: Width, b: Width, what: &str| {
            if a == b {
                Ok(a)
            } else {
                Err(format!(
                    "{what} mixes {} and {} operands",
                    a.name(),
                    b.name()
                ))
            }
        };
        match e {
            Expr::Var(v) => {
                let w = self
                    .kernel
                    .vars
                    .get(v.0 as usize)
                    .ok_or_else(|| format!("variable ${} is not declared", v.0))?;
                if !self.assigned[v.0 as usize] {
                    return Err(format!("variable ${} is read before any assignment", v.0));
                }
                Ok(*w)
            }
            Expr::Const(_, w) => Ok(*w),
            Expr::Load { buf, index, width } => {
                self.access(*buf, index, width.lanes() as i64)?;
                Ok(*width)
            }
            Expr::Splat(x) => match self.expr(x)? {
                Width::Scalar => Ok(Width::F32x4),
                Width::F32x4 => Err("splat of a vector".into()),
            },
            Expr::Unary(_, x) => self.expr(x),
            Expr::Binary(op, a, b) => same(self.expr(a)?, self.expr(b)?, &format!("{op:?}")),
            Expr::Fma(a, b, c) => {
                let ab = same(self.expr(a)?, self.expr(b)?, "fma")?;
                same(ab, self.expr(c)?, "fma")
            }
            Expr::Select {
                a,
                b,
                if_true,
                if_false,
                ..
            } => {
                let ab = same(self.expr(a)?, self.expr(b)?, "select comparison")?;
                let tf = same(self.expr(if_true)?, self.expr(if_false)?, "select")?;
                same(ab, tf, "select")
            }
            Expr::Reduce(_, x) => match self.expr(x)? {
                Width::F32x4 => Ok(Width::Scalar),
                Width::Scalar => Err("reduction of a scalar".into()),
            },
            Expr::Lane(x, lane) => match self.expr(x)? {
                Width::F32x4 if *lane < 4 => Ok(Width::Scalar),
                Width::F32x4 => Err(format!("lane {lane} of a 4-lane vector")),
                Width::Scalar => Err("lane of a scalar".into()),
            },
            Expr::Shuffle(a, b, m) => {
                if same(self.expr(a)?, self.expr(b)?, "shuffle")? != Width::F32x4 {
                    return Err("shuffle of scalars".into());
                }
                if m.iter().any(|&l| l >= 8) {
                    return Err(format!("shuffle lanes {m:?} outside the 8 lanes of a ++ b"));
                }
                Ok(Width::F32x4)
            }
        }
    }
}

impl fmt::Display for Affine {
    /// `4*i0 + 58*i1 + 7`; `0` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for &(v, c) in &self.terms {
            if !first {
                f.write_str(" + ")?;
            }
            first = false;
            if c == 1 {
                write!(f, "i{}", v.0)?;
            } else {
                write!(f, "{c}*i{}", v.0)?;
            }
        }
        if first {
            write!(f, "{}", self.offset)
        } else if self.offset != 0 {
            write!(f, " + {}", self.offset)
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Var(v) => write!(f, "${}", v.0),
            Expr::Const(c, Width::Scalar) => write!(f, "{c}"),
            Expr::Const(c, Width::F32x4) => write!(f, "splat({c})"),
            Expr::Load { buf, index, width } => {
                write!(f, "load.{} {buf}[{index}]", width.name())
            }
            Expr::Splat(x) => write!(f, "splat({x})"),
            Expr::Unary(op, x) => write!(f, "{}({x})", format!("{op:?}").to_lowercase()),
            Expr::Binary(op, a, b) => {
                write!(f, "{}({a}, {b})", format!("{op:?}").to_lowercase())
            }
            Expr::Fma(a, b, c) => write!(f, "fma({a}, {b}, {c})"),
            Expr::Select {
                cmp,
                a,
                b,
                if_true,
                if_false,
            } => {
                let c = match cmp {
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                write!(f, "select({a} {c} {b}, {if_true}, {if_false})")
            }
            Expr::Reduce(op, x) => {
                let n = match op {
                    ReduceOp::Add => "reduce_add",
                    ReduceOp::Max => "reduce_max",
                };
                write!(f, "{n}({x})")
            }
            Expr::Lane(x, lane) => write!(f, "lane({x}, {lane})"),
            Expr::Shuffle(a, b, [m0, m1, m2, m3]) => {
                write!(f, "shuffle({a}, {b}, [{m0}, {m1}, {m2}, {m3}])")
            }
        }
    }
}

fn print_block(out: &mut String, stmts: &[Stmt], depth: usize) {
    let pad = "  ".repeat(depth);
    for s in stmts {
        match s {
            Stmt::Loop {
                var,
                start,
                end,
                step,
                body,
            } => {
                let _ = write!(out, "{pad}for i{} in {start}..{end}", var.0);
                if *step != 1 {
                    let _ = write!(out, " step {step}");
                }
                out.push_str(" {\n");
                print_block(out, body, depth + 1);
                let _ = writeln!(out, "{pad}}}");
            }
            Stmt::Assign { dst, value } => {
                let _ = writeln!(out, "{pad}${} = {value}", dst.0);
            }
            Stmt::Store {
                buf,
                index,
                value,
                width,
            } => {
                let _ = writeln!(out, "{pad}store.{} {buf}[{index}] = {value}", width.name());
            }
            Stmt::ConvTile {
                routine,
                x,
                w,
                out: o,
                next,
                tile,
            } => {
                let next = next
                    .as_ref()
                    .map_or(String::new(), |at| format!(", next: {at}"));
                let _ = writeln!(
                    out,
                    "{pad}call {}(x: {x}, w: {w}, out: {o}{next}; {tile})",
                    routine.symbol()
                );
            }
            Stmt::Prefetch {
                at,
                rows,
                row_stride,
                row_len,
            } => {
                let _ = writeln!(
                    out,
                    "{pad}prefetch {at}; rows={rows}x{row_stride}, len={row_len}"
                );
            }
        }
    }
}

impl fmt::Display for Kernel {
    /// The deterministic text form used by `--dump-loops` and the snapshots.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = format!(
            "kernel @{}{}(\n",
            self.name,
            if self.parallel { " parallel" } else { "" }
        );
        for (i, a) in self.args.iter().enumerate() {
            let access = match a.access {
                Access::Read => "read",
                Access::Write => "write",
            };
            let _ = writeln!(out, "  %{i} {}: {access} f32[{}]", a.name, a.len);
        }
        for (i, len) in self.locals.iter().enumerate() {
            let _ = writeln!(out, "  %local{i}: local f32[{len}]");
        }
        out.push_str(") {\n");
        // Consecutive variables of the same width print as one range.
        let mut i = 0;
        while i < self.vars.len() {
            let mut j = i;
            while j + 1 < self.vars.len() && self.vars[j + 1] == self.vars[i] {
                j += 1;
            }
            if i == j {
                let _ = writeln!(out, "  var ${i}: {}", self.vars[i].name());
            } else {
                let _ = writeln!(out, "  var ${i}..${j}: {}", self.vars[i].name());
            }
            i = j + 1;
        }
        print_block(&mut out, &self.body, 1);
        out.push_str("}\n");
        f.write_str(&out)
    }
}

/// Builds a [`Kernel`] statement by statement, handing out fresh variables.
///
/// ```
/// use smelt_ir::loops::*;
/// let mut b = KernelBuilder::new("copy");
/// let x = b.arg("x", 8, Access::Read);
/// let y = b.arg("y", 8, Access::Write);
/// b.for_loop(0, 8, 4, |b, i| {
///     let v = Expr::load(x, Affine::var(i), Width::F32x4);
///     b.store(y, Affine::var(i), v, Width::F32x4);
/// });
/// let k = b.finish();
/// assert!(k.check().is_ok());
/// ```
pub struct KernelBuilder {
    kernel: Kernel,
    stack: Vec<Vec<Stmt>>,
}

impl KernelBuilder {
    /// Starts an empty kernel.
    pub fn new(name: &str) -> KernelBuilder {
        KernelBuilder {
            kernel: Kernel {
                name: name.to_string(),
                args: Vec::new(),
                locals: Vec::new(),
                vars: Vec::new(),
                num_loop_vars: 0,
                body: Vec::new(),
                parallel: false,
            },
            stack: vec![Vec::new()],
        }
    }

    /// Adds a buffer argument.
    pub fn arg(&mut self, name: &str, len: usize, access: Access) -> BufId {
        self.kernel.args.push(KernelArg {
            name: name.to_string(),
            len,
            access,
        });
        BufId(self.kernel.args.len() as u32 - 1)
    }

    /// Adds a local scratch buffer of `len` elements (one per call, on its stack).
    pub fn local(&mut self, len: usize) -> BufId {
        self.kernel.locals.push(len);
        BufId(BufId::LOCAL + self.kernel.locals.len() as u32 - 1)
    }

    /// Calls the conv-tile micro-kernel `routine`; with `next`, it prefetches
    /// `tile.next_len` elements from there (see [`Stmt::ConvTile`]).
    pub fn conv_tile(
        &mut self,
        routine: MicroKernel,
        x: BufPtr,
        w: BufPtr,
        out: BufPtr,
        next: Option<BufPtr>,
        tile: ConvTile,
    ) {
        self.push(Stmt::ConvTile {
            routine,
            x,
            w,
            out,
            next,
            tile,
        });
    }

    /// A fresh register variable.
    pub fn var(&mut self, width: Width) -> VarId {
        self.kernel.vars.push(width);
        VarId(self.kernel.vars.len() as u32 - 1)
    }

    /// Assigns `value` to `dst`.
    pub fn assign(&mut self, dst: VarId, value: Expr) {
        self.push(Stmt::Assign { dst, value });
    }

    /// Emits a [`Stmt::Prefetch`] of `rows` runs of `row_len` elements, `row_stride` apart.
    pub fn prefetch(&mut self, at: BufPtr, rows: i64, row_stride: i64, row_len: i64) {
        self.push(Stmt::Prefetch {
            at,
            rows,
            row_stride,
            row_len,
        });
    }

    /// Assigns `value` to a fresh variable of `width` and returns a read of it.
    pub fn let_(&mut self, value: Expr, width: Width) -> Expr {
        let v = self.var(width);
        self.assign(v, value);
        Expr::Var(v)
    }

    /// Stores `value`.
    pub fn store(&mut self, buf: BufId, index: Affine, value: Expr, width: Width) {
        self.push(Stmt::Store {
            buf,
            index,
            value,
            width,
        });
    }

    /// Emits `for i in start..end step step { body(i) }`; nothing when the loop is empty.
    /// A loop of one iteration still gets its variable (folded by code generation).
    pub fn for_loop(
        &mut self,
        start: i64,
        end: i64,
        step: i64,
        body: impl FnOnce(&mut KernelBuilder, LoopVar),
    ) {
        if trip_count(start, end, step) == 0 {
            return;
        }
        let var = LoopVar(self.kernel.num_loop_vars);
        self.kernel.num_loop_vars += 1;
        self.stack.push(Vec::new());
        body(self, var);
        let body = self.stack.pop().unwrap_or_default();
        self.push(Stmt::Loop {
            var,
            start,
            end,
            step,
            body,
        });
    }

    fn push(&mut self, s: Stmt) {
        if let Some(top) = self.stack.last_mut() {
            top.push(s);
        }
    }

    /// Marks the kernel parallel: its body must be one loop whose iterations are
    /// independent (see [`Kernel::parallel`]); [`Kernel::check`] verifies the shape.
    pub fn set_parallel(&mut self) {
        self.kernel.parallel = true;
    }

    /// The finished kernel. A kernel marked parallel whose body came out as anything but
    /// one loop (e.g. an empty loop was dropped) runs serially.
    pub fn finish(mut self) -> Kernel {
        self.kernel.body = self.stack.pop().unwrap_or_default();
        if !matches!(self.kernel.body.as_slice(), [Stmt::Loop { .. }]) {
            self.kernel.parallel = false;
        }
        self.kernel
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

    /// A kernel calling the AVX2 conv tile on `x` (len `x_len`) into a local buffer.
    fn tile_kernel(x_len: usize, tile: ConvTile) -> Kernel {
        let mut b = KernelBuilder::new("tile");
        let x = b.arg("x", x_len, Access::Read);
        let w = b.arg("w", 16 * 8, Access::Read);
        let sums = b.local(16 * 4);
        let at = |buf| BufPtr {
            buf,
            index: Affine::constant(0),
        };
        b.conv_tile(
            MicroKernel::ConvTileAvx2,
            at(x),
            at(w),
            at(sums),
            None,
            tile,
        );
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
            next_len: 0,
            accumulate: false,
        }
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
        let mut wrong_lanes = four_pixels();
        wrong_lanes.lanes = 32;
        let err = tile_kernel(32, wrong_lanes).check().unwrap_err();
        assert!(err.contains("16 channels per call"), "{err}");
        let text = tile_kernel(32, four_pixels()).to_string();
        assert!(text.contains("%local0: local f32[64]"), "{text}");
        assert!(
            text.contains(
                "call smelt_conv_tile_avx2(x: &%0[0], w: &%1[0], out: &%local0[0]; lanes=16, pixels=4"
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
                b.conv_tile(MicroKernel::ConvTileAvx2, x, wb, sums, next, tile);
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
