//! `Dim`, one dimension as the type rules compute with it, and [`Shape`], what a shape
//! rule gives.
//!
//! The boundary: [`TensorType`] stores its dims as `usize`, and a type rule reads its
//! operands' dims through [`OperandTypes::dims`](super::OperandTypes::dims) as `Dim`s,
//! computes with `Dim` arithmetic only (sums, differences, products, floor division for
//! conv and pool windows, divisibility, equality that fails with a message), and hands
//! back a [`Shape`] that [`Op::infer_type`](super::Op::infer_type) turns into a
//! `TensorType` ([`Dim::stored`], the one place a `Dim` becomes a `usize`).
//!
//! A `Dim` is a known size or a symbolic one (issue #23): an expression over named
//! symbols ([`crate::symbolic`]), stored as a handle with the top bit set. Its arithmetic
//! builds canonical expressions, so equality still means equal sizes for every value of
//! the symbols. A rule that needs a size it cannot know (a slice's clamp, a ceil-mode
//! window) asks [`Dim::known_size`] or [`Dim::concrete`] and says so.

use std::fmt;
use std::sync::Arc;

use crate::symbolic::{self, DimExpr};
use crate::types::Layout;

/// The top bit of a stored dim marks an interned symbolic expression.
const SYMBOLIC: usize = 1 << (usize::BITS - 1);
/// The stored form of a size too complex to represent (see [`crate::symbolic`]).
const UNREPRESENTABLE: usize = usize::MAX;
/// The largest known size a dim can hold (an attribute beyond it saturates).
const MAX_KNOWN: usize = SYMBOLIC - 1;

/// One dimension of a shape in a type rule: a known size or a symbolic expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim(usize);

impl Dim {
    /// The dimension of size 1 (broadcast, kept reduced axes).
    pub const ONE: Dim = Dim(1);

    /// A dimension of known size `n`.
    pub const fn known(n: usize) -> Dim {
        Dim(n)
    }

    /// The symbol `name`.
    pub fn symbol(name: &str) -> Dim {
        Dim::from_expr(DimExpr::symbol(name))
    }

    /// The size `e`: known when it is a constant, else interned; the unrepresentable
    /// size when it is too complex or a negative constant.
    pub fn from_expr(e: DimExpr) -> Dim {
        match e.as_constant() {
            Some(c) => usize::try_from(c).map_or(Dim(UNREPRESENTABLE), Dim),
            None => symbolic::intern(e).map_or(Dim(UNREPRESENTABLE), |id| Dim(SYMBOLIC | id)),
        }
    }

    /// A dim as [`TensorType`](crate::TensorType) stores it.
    pub const fn from_stored(stored: usize) -> Dim {
        Dim(stored)
    }

    /// Dims as a type or a `Dims` attribute stores them.
    pub fn all(stored: &[usize]) -> Vec<Dim> {
        stored.iter().map(|&n| Dim(n)).collect()
    }

    /// The stored form: the size, or the handle of a symbolic one.
    pub const fn stored(self) -> usize {
        self.0
    }

    /// The stored forms of `dims` (the boundary back to storage).
    pub fn stored_all(dims: &[Dim]) -> Vec<usize> {
        dims.iter().map(|d| d.0).collect()
    }

    /// Whether the size is symbolic (or unrepresentable), not a known number.
    pub const fn is_symbolic(self) -> bool {
        self.0 & SYMBOLIC != 0
    }

    /// Whether this is the size too complex to represent.
    pub const fn is_unrepresentable(self) -> bool {
        self.0 == UNREPRESENTABLE
    }

    /// The size, when it is known.
    pub const fn known_size(self) -> Option<usize> {
        if self.is_symbolic() {
            None
        } else {
            Some(self.0)
        }
    }

    /// The size, or a message saying that `what` needs a known size.
    pub fn concrete(self, what: &str) -> Result<usize, String> {
        self.known_size()
            .ok_or_else(|| format!("{what} needs a known size, got the symbolic size {self}"))
    }

    /// The known sizes of `dims`, or a message naming the first symbolic one and what
    /// needs them known.
    pub fn concrete_all(dims: &[Dim], what: &str) -> Result<Vec<usize>, String> {
        dims.iter().map(|d| d.concrete(what)).collect()
    }

    /// The expression of a symbolic size (`None` for a known or unrepresentable one).
    pub fn symbolic(self) -> Option<Arc<DimExpr>> {
        if self.is_symbolic() && !self.is_unrepresentable() {
            symbolic::interned(self.0 & !SYMBOLIC)
        } else {
            None
        }
    }

    /// The size as an expression (a constant when known); `None` when unrepresentable.
    pub fn expr(self) -> Option<DimExpr> {
        match self.known_size() {
            Some(n) => i64::try_from(n).ok().map(DimExpr::constant),
            None => self.symbolic().map(|e| (*e).clone()),
        }
    }

    /// Whether it prints without parentheses inside a type: a number or one symbol.
    pub fn is_simple(self) -> bool {
        !self.is_symbolic() || self.symbolic().is_some_and(|e| e.is_simple())
    }

    /// Known sizes by `known`, symbolic ones by `symbolic` over their expressions;
    /// `None` when either fails or an operand is unrepresentable.
    fn combine(
        self,
        other: Dim,
        known: impl FnOnce(usize, usize) -> Option<usize>,
        symbolic: impl FnOnce(&DimExpr, &DimExpr) -> Option<DimExpr>,
    ) -> Option<Dim> {
        match (self.known_size(), other.known_size()) {
            (Some(a), Some(b)) => known(a, b).map(Dim),
            _ => {
                let d = Dim::from_expr(symbolic(&self.expr()?, &other.expr()?)?);
                (!d.is_unrepresentable()).then_some(d)
            }
        }
    }

    /// Whether this dim is known to be `n`.
    pub fn is(self, n: usize) -> bool {
        self.0 == n && !self.is_symbolic()
    }

    /// `self - other`, or `None` when it would be negative (for symbolic sizes: when
    /// the difference is a negative constant).
    pub fn checked_sub(self, other: Dim) -> Option<Dim> {
        self.combine(other, usize::checked_sub, DimExpr::sub)
    }

    /// `self * other`, or `None` on overflow.
    pub fn checked_mul(self, other: Dim) -> Option<Dim> {
        self.combine(other, usize::checked_mul, DimExpr::mul)
    }

    /// `floor(self / by)`, as window counts are computed (`by` is an attribute, never 0
    /// once the rule has checked it; 0 gives 0 rather than a panic).
    pub fn floor_div(self, by: usize) -> Dim {
        match self.known_size() {
            Some(n) => Dim(n.checked_div(by).unwrap_or(0)),
            None if by == 0 => Dim(0),
            None => self
                .expr()
                .and_then(|e| e.floor_div(by as u64))
                .map_or(Dim(UNREPRESENTABLE), Dim::from_expr),
        }
    }

    /// `ceil(self / by)` (0 for `by` = 0, as [`Dim::floor_div`]).
    pub fn ceil_div(self, by: usize) -> Dim {
        match self.known_size() {
            Some(_) if by == 0 => Dim(0),
            Some(n) => Dim(n.div_ceil(by)),
            None => (self + by.saturating_sub(1)).floor_div(by),
        }
    }

    /// Whether `by` divides this dim (false for `by` = 0); a symbolic size is divisible
    /// when it is for every value of its symbols (every coefficient is a multiple).
    pub fn divisible_by(self, by: usize) -> bool {
        match self.known_size() {
            Some(n) => by != 0 && n.is_multiple_of(by),
            None => by != 0 && self.floor_div(by).checked_mul(Dim(by)) == Some(self),
        }
    }

    /// The product of `dims` (1 for none), or `None` on overflow.
    pub fn product(dims: &[Dim]) -> Option<Dim> {
        dims.iter().try_fold(Dim::ONE, |a, &d| a.checked_mul(d))
    }

    /// `Ok` when the two dims are equal, else the message `what` makes from them.
    pub fn expect_eq(
        self,
        other: Dim,
        what: impl FnOnce(Dim, Dim) -> String,
    ) -> Result<(), String> {
        if self == other {
            Ok(())
        } else {
            Err(what(self, other))
        }
    }
}

/// Sums of dims and attributes (pads, kernel spans) fit easily: dims are bounded by the
/// 4 GiB tensor limit and attributes by `MAX_ATTR_INT`.
impl std::ops::Add for Dim {
    type Output = Dim;
    fn add(self, other: Dim) -> Dim {
        self.combine(other, |a, b| Some(a.saturating_add(b)), DimExpr::add)
            .unwrap_or(Dim(UNREPRESENTABLE))
    }
}

impl std::ops::Add<usize> for Dim {
    type Output = Dim;
    fn add(self, n: usize) -> Dim {
        self + Dim(n.min(MAX_KNOWN))
    }
}

impl std::ops::Mul<usize> for Dim {
    type Output = Dim;
    fn mul(self, n: usize) -> Dim {
        self.combine(
            Dim(n.min(MAX_KNOWN)),
            |a, b| Some(a.saturating_mul(b)),
            DimExpr::mul,
        )
        .unwrap_or(Dim(UNREPRESENTABLE))
    }
}

/// A number, or the expression (`N`, `(H + 1) / 2`, `B*S`).
impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.known_size(), self.symbolic()) {
            (Some(n), _) => write!(f, "{n}"),
            (None, Some(e)) => write!(f, "{e}"),
            (None, None) if self.is_unrepresentable() => f.write_str("<unrepresentable>"),
            // a number in the handles' range that no expression was interned as
            (None, None) => write!(f, "{}", self.0),
        }
    }
}

/// `[N, 3, (H + 1) / 2]`: dims for messages.
pub fn dims_text(dims: &[Dim]) -> String {
    let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// What a shape rule gives: the result's dims and layout (row-major unless the op
/// computes in another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The result's logical dims.
    pub dims: Vec<Dim>,
    /// The result's layout.
    pub layout: Layout,
}

impl Shape {
    /// A row-major result of `dims`.
    pub fn row_major(dims: Vec<Dim>) -> Shape {
        Shape {
            dims,
            layout: Layout::RowMajor,
        }
    }

    /// The same dims in `layout`.
    pub fn with_layout(self, layout: Layout) -> Shape {
        Shape { layout, ..self }
    }
}

impl From<Vec<Dim>> for Shape {
    fn from(dims: Vec<Dim>) -> Shape {
        Shape::row_major(dims)
    }
}

/// Numpy broadcasting of two shapes.
pub fn broadcast_dims(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, String> {
    let rank = a.len().max(b.len());
    let at = |s: &[Dim], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank]
        } else {
            Dim::ONE
        }
    };
    (0..rank)
        .map(|i| {
            let (da, db) = (at(a, i), at(b, i));
            if da == db || db.is(1) {
                Ok(da)
            } else if da.is(1) {
                Ok(db)
            } else {
                Err(format!(
                    "shapes {} and {} do not broadcast (dimension {i}: {da} vs {db})",
                    dims_text(a),
                    dims_text(b)
                ))
            }
        })
        .collect()
}
