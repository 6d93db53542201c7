//! The closed op table: every tensor op, defined once, by family.
//!
//! An op's whole definition — its [`Op`] variant with docs, its row in the op table
//! (mnemonic, arity, role, attribute payload), its element-type and shape rules, its
//! flops and its text-form attribute schema (keys, defaults, print order) — is one entry
//! of its family's file: `conv`, `norm`, `elementwise`, `pool`, `movement`, `linalg`,
//! `weight_prep`, `logic`, `reduce`, `resize`, `grid_sample`, `fused`. Each family file holds a
//! `*_ops!` macro with its variants and rows (and the functions its rules call); `kind`
//! chains them into one `op_table!` that generates [`Op`], [`OpKind`], the split into
//! kind and payload the e-graph uses, the dispatch of [`Op::infer_type`] and
//! [`Op::flops`], and the text form's attribute reading and printing. Every consumer
//! (interpreter, e-graph, cost model, lowering, ONNX) matches on [`Op`] exhaustively,
//! without `_ =>` arms, so the compiler lists every site a new op needs.
//!
//! Also here: [`Arity`]; `attrs`, the attribute structs several families share; `dim`,
//! [`Dim`] and [`Shape`], what type rules compute with; `rules`, the type rule's frame
//! ([`Op::infer_type`]) and the rule vocabulary families share ([`OperandTypes`]).

mod attrs;
mod conv;
mod dim;
mod elementwise;
mod fused;
mod grid_sample;
mod kind;
mod linalg;
mod logic;
mod movement;
mod norm;
mod pool;
mod reduce;
mod resize;
mod rules;
mod samples;
mod weight_prep;

pub use attrs::{
    Conv2dAttrs, ConvTranspose2dAttrs, GemmAttrs, PadAttrs, PadAxis, PadMode, Pool2dAttrs,
    ReduceAttrs, SliceAttrs,
};
pub use dim::{dims_text, Dim, Shape};
pub use elementwise::{
    erf, BinaryOp, GeluApproximation, UnaryOp, GELU_TANH_CUBIC, GELU_TANH_SCALE,
};
pub use fused::{FusedOp, PostOp};
pub use grid_sample::{
    cubic_weights, reflect, GridAxis, GridPadding, GridSampleAttrs, SampleMode, GRID_CUBIC_A,
    GRID_REFLECT_LIMIT, GRID_ZEROS_REACH,
};
pub use kind::{Attrs, Op, OpKind, Role};
pub use logic::{Comparison, LogicOp, Reduction};
pub use resize::{AxisTaps, CoordinateMode, NearestMode, ResizeAttrs, ResizeMode};
pub use rules::{broadcast, OperandTypes};
pub use samples::samples;

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exact(usize),
    /// Between the two bounds, inclusive (optional trailing operands).
    Range(usize, usize),
    /// At least this many.
    AtLeast(usize),
}

impl Arity {
    /// Whether `n` operands are accepted.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::Range(lo, hi) => (lo..=hi).contains(&n),
            Arity::AtLeast(lo) => n >= lo,
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arity::Exact(k) => write!(f, "{k}"),
            Arity::Range(lo, hi) => write!(f, "{lo} to {hi}"),
            Arity::AtLeast(lo) => write!(f, "at least {lo}"),
        }
    }
}

impl Op {
    /// The sizes of its result it holds as an attribute — a reshape's or an expand's
    /// `shape`, a resize's `sizes` —, the attributes that may hold symbolic sizes
    /// ([`crate::symbolic`]); `None` for every other op.
    pub fn result_sizes(&self) -> Option<&[usize]> {
        match self {
            Op::Reshape { shape } | Op::Expand { shape } => Some(shape),
            Op::Resize(r) => Some(&r.sizes),
            _ => None,
        }
    }

    /// The op with its [`Op::result_sizes`] replaced by `sizes`; `None` for an op
    /// without them.
    pub fn with_result_sizes(&self, sizes: Vec<usize>) -> Option<Op> {
        Some(match self {
            Op::Reshape { .. } => Op::Reshape { shape: sizes },
            Op::Expand { .. } => Op::Expand { shape: sizes },
            Op::Resize(r) => Op::Resize(ResizeAttrs { sizes, ..r.clone() }),
            _ => return None,
        })
    }

    /// Text mnemonic (from the op table).
    pub fn name(&self) -> &'static str {
        self.kind().map_or("const", OpKind::name)
    }

    /// Number of operands accepted (from the op table; a fused op's anchor's plus its
    /// post-ops' operands).
    pub fn arity(&self) -> Arity {
        if let Op::Fused(f) = self {
            let extra = f.num_post_operands();
            return match f.anchor.arity() {
                Arity::Exact(k) => Arity::Exact(k + extra),
                Arity::Range(lo, hi) => Arity::Range(lo + extra, hi + extra),
                Arity::AtLeast(lo) => Arity::AtLeast(lo + extra),
            };
        }
        // `const` has no kind and no operands
        self.kind()
            .and_then(OpKind::arity)
            .unwrap_or(Arity::Exact(0))
    }

    /// Whether this op may anchor a [`FusedOp`].
    pub fn is_anchor(&self) -> bool {
        self.kind().is_some_and(|k| k.role() == Role::Anchor)
    }

    /// Whether the op only prepares weights (always evaluated at compile time by const folding).
    pub fn is_weight_prep(&self) -> bool {
        self.kind().is_some_and(|k| k.role() == Role::WeightPrep)
    }
}
