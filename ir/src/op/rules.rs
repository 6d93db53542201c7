//! The type rule's frame and its shared vocabulary: [`Op::infer_type`] checks the arity,
//! runs the op's row (its element-type rule, then its shape rule, both in the op's
//! family file) and stores the result; [`OperandTypes`] is what a rule reads, and the
//! element-type rules and shape checks several families share live here.
//!
//! Rules compute over [`Dim`] (see `dim` for the boundary with `TensorType`'s storage).

use super::dim::{Dim, Shape};
use super::Op;
use crate::types::{DType, TensorType};
use crate::weights::WeightId;

/// The operands' types as a type rule sees them: positions below the op's minimum arity
/// are present (checked before any rule runs).
pub struct OperandTypes<'a> {
    /// The op's mnemonic, for messages.
    pub name: &'static str,
    types: &'a [&'a TensorType],
    weight_type: &'a dyn Fn(WeightId) -> Option<TensorType>,
}

impl<'a> OperandTypes<'a> {
    /// How many operands there are.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Operand `i`'s type.
    pub fn ty(&self, i: usize) -> &'a TensorType {
        self.types[i]
    }

    /// Operand `i`'s type, if there is one (an optional trailing operand).
    pub fn get(&self, i: usize) -> Option<&'a TensorType> {
        self.types.get(i).copied()
    }

    /// Every operand's type.
    pub fn all(&self) -> &'a [&'a TensorType] {
        self.types
    }

    /// Operand `i`'s dims, as the rules compute with them.
    pub fn dims(&self, i: usize) -> Vec<Dim> {
        Dim::all(&self.types[i].dims)
    }

    /// The same operands from `from` on, or before `to` (a fused op's anchor and post-op
    /// operands).
    pub fn range(&self, range: std::ops::Range<usize>) -> OperandTypes<'a> {
        OperandTypes {
            name: self.name,
            types: &self.types[range],
            weight_type: self.weight_type,
        }
    }

    /// The type of weight `id`.
    pub fn weight(&self, id: WeightId) -> Option<TensorType> {
        (self.weight_type)(id)
    }

    /// Operand `i`'s element type when `ok` accepts it, else a message saying it must be
    /// `what`.
    pub fn need(&self, i: usize, ok: fn(DType) -> bool, what: &str) -> Result<DType, String> {
        let d = self.types[i].dtype;
        if ok(d) {
            Ok(d)
        } else {
            Err(format!(
                "operand {i} of '{}' must be {what}, got {d}",
                self.name
            ))
        }
    }

    /// `Ok` when operands `first` and `i` have one element type.
    pub fn same_as(&self, first: usize, i: usize) -> Result<(), String> {
        let (a, b) = (self.types[first].dtype, self.types[i].dtype);
        if a == b {
            Ok(())
        } else {
            Err(format!(
                "operands {first} and {i} of '{}' must have one element type, got {a} and {b}",
                self.name
            ))
        }
    }
}

/// Element-type rule of floating-point ops: every operand `f32`.
pub fn all_f32(o: &OperandTypes<'_>) -> Result<DType, String> {
    for i in 0..o.len() {
        o.need(i, |d| d == DType::F32, "f32")?;
    }
    Ok(DType::F32)
}

/// Element-type rule of arithmetic on two operands: one numeric type.
pub fn numeric_pair(o: &OperandTypes<'_>) -> Result<DType, String> {
    o.same_as(0, 1)?;
    o.need(0, DType::is_numeric, "numeric")
}

/// Element-type rule of data movement: any type, the first operand's (and every
/// operand's, when there are several).
pub fn any_one_type(o: &OperandTypes<'_>) -> Result<DType, String> {
    for i in 1..o.len() {
        o.same_as(0, i)?;
    }
    Ok(o.ty(0).dtype)
}

/// Shape rule of ops whose result has their first operand's dims, row-major.
pub fn same_dims(o: &OperandTypes<'_>) -> Result<Shape, String> {
    Ok(o.dims(0).into())
}

/// Flops of an op that moves or selects data: none.
pub fn no_flops(_: &[&TensorType], _: &TensorType) -> u64 {
    0
}

/// Flops of one operation per result element.
pub fn one_per_element(_: &[&TensorType], result: &TensorType) -> u64 {
    result.num_elements() as u64
}

/// `Ok` with `t`'s dims when `t` has rank `rank`, else a message naming `what`.
pub fn expect_rank(t: &TensorType, rank: usize, what: &str) -> Result<Vec<Dim>, String> {
    if t.rank() == rank {
        Ok(Dim::all(&t.dims))
    } else {
        Err(format!("{what} must have rank {rank}, got {t}"))
    }
}

/// `Ok` when `t` is a vector of `len` elements (one per channel), else a message naming
/// the operand (`name`) and what `len` counts.
pub fn expect_vector(t: &TensorType, len: Dim, name: &str, what: &str) -> Result<(), String> {
    if t.rank() == 1 && Dim::known(t.dims[0]) == len {
        Ok(())
    } else {
        Err(format!(
            "{name} has shape {t}, expected tensor<{len}xf32> to match the {what} {len}"
        ))
    }
}

impl Op {
    /// The type rule: the result type for these operand types, or a message saying
    /// which operand or attribute is wrong. Operand counts are checked here against
    /// [`Op::arity`] before the op's row runs, so a rule may read every operand below
    /// the minimum arity.
    ///
    /// Computing ops take row-major operands except where noted; `reorder` and
    /// layout-aware kernels introduced by the layout pass are the exceptions.
    pub fn infer_type(
        &self,
        operands: &[&TensorType],
        weight_type: &dyn Fn(WeightId) -> Option<TensorType>,
    ) -> Result<TensorType, String> {
        let arity = self.arity();
        if !arity.accepts(operands.len()) {
            return Err(format!(
                "'{}' takes {arity} operands, got {}",
                self.name(),
                operands.len()
            ));
        }
        let o = OperandTypes {
            name: self.name(),
            types: operands,
            weight_type,
        };
        let out = self.row_rules(&o)?;
        out.check_size()?;
        Ok(out)
    }
}

/// Numpy broadcasting of two shapes of known sizes (for callers outside the type rules).
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    super::dim::broadcast_dims(&Dim::all(a), &Dim::all(b)).map(|d| Dim::stored_all(&d))
}
