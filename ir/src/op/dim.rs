//! `Dim`, one dimension as the type rules compute with it, and [`Shape`], what a shape
//! rule gives.
//!
//! The boundary: [`TensorType`] stores its dims as `usize`, and a type rule reads its
//! operands' dims through [`OperandTypes::dims`](super::OperandTypes::dims) as `Dim`s,
//! computes with `Dim` arithmetic only (sums, differences, products, floor division for
//! conv and pool windows, divisibility, equality that fails with a message), and hands
//! back a [`Shape`] that [`Op::infer_type`](super::Op::infer_type) turns into a
//! `TensorType` (the one place a `Dim` becomes a `usize`: [`Dim::size`]). A `Dim` is a
//! known size today; symbolic dimensions (issue #23) change this type — a symbol, its
//! arithmetic and what its comparisons mean — and the storage in `TensorType`, not the
//! rules.

use std::fmt;

use crate::types::Layout;

/// One dimension of a shape in a type rule: a known size today.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim(usize);

impl Dim {
    /// The dimension of size 1 (broadcast, kept reduced axes).
    pub const ONE: Dim = Dim(1);

    /// A dimension of known size `n`.
    pub const fn known(n: usize) -> Dim {
        Dim(n)
    }

    /// Dims of these sizes.
    pub fn all(sizes: &[usize]) -> Vec<Dim> {
        sizes.iter().map(|&n| Dim(n)).collect()
    }

    /// The sizes of these dims (the boundary back to storage).
    pub fn sizes(dims: &[Dim]) -> Vec<usize> {
        dims.iter().map(|d| d.size()).collect()
    }

    /// The size, where a shape is stored or an attribute indexes into it.
    pub const fn size(self) -> usize {
        self.0
    }

    /// Whether this dim is known to be `n`.
    pub fn is(self, n: usize) -> bool {
        self.0 == n
    }

    /// `self - other`, or `None` when it would be negative.
    pub fn checked_sub(self, other: Dim) -> Option<Dim> {
        self.0.checked_sub(other.0).map(Dim)
    }

    /// `self * other`, or `None` on overflow.
    pub fn checked_mul(self, other: Dim) -> Option<Dim> {
        self.0.checked_mul(other.0).map(Dim)
    }

    /// `floor(self / by)`, as window counts are computed (`by` is an attribute, never 0
    /// once the rule has checked it; 0 gives 0 rather than a panic).
    pub fn floor_div(self, by: usize) -> Dim {
        Dim(self.0.checked_div(by).unwrap_or(0))
    }

    /// `ceil(self / by)` (0 for `by` = 0, as [`Dim::floor_div`]).
    pub fn ceil_div(self, by: usize) -> Dim {
        if by == 0 {
            Dim(0)
        } else {
            Dim(self.0.div_ceil(by))
        }
    }

    /// Whether `by` divides this dim (false for `by` = 0).
    pub fn divisible_by(self, by: usize) -> bool {
        by != 0 && self.0.is_multiple_of(by)
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
        Dim(self.0.saturating_add(other.0))
    }
}

impl std::ops::Add<usize> for Dim {
    type Output = Dim;
    fn add(self, n: usize) -> Dim {
        Dim(self.0.saturating_add(n))
    }
}

impl std::ops::Mul<usize> for Dim {
    type Output = Dim;
    fn mul(self, n: usize) -> Dim {
        Dim(self.0.saturating_mul(n))
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
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
                    "shapes {:?} and {:?} do not broadcast (dimension {i}: {da} vs {db})",
                    Dim::sizes(a),
                    Dim::sizes(b)
                ))
            }
        })
        .collect()
}
