//! The reduction family: `reduce_sum`, `reduce_mean`, `reduce_max` and `reduce_min` —
//! variant, rows, type rule and the axes' text schema.

use super::dim::{Dim, Shape};
use super::rules::OperandTypes;
use super::ReduceAttrs;
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::TensorType;

macro_rules! reduce_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// A reduction of `f32` data over `attrs.axes` (sum, mean, max or min; sums and means
        /// accumulate in f64 in the interpreter).
        Reduce(Reduction, ReduceAttrs),
    ]
    [$($rows)*
        ReduceSum "reduce_sum" Some(Exact(1)), Plain: (Op::Reduce(Reduction::Sum, r)) <=> (Attrs::Reduce(r))
            attrs { ..r },
            dtype: all_f32,
            shape: |o| reduce_shape(r, o),
            flops: one_per_input;
        ReduceMean "reduce_mean" Some(Exact(1)), Plain: (Op::Reduce(Reduction::Mean, r)) <=> (Attrs::Reduce(r))
            attrs { ..r },
            dtype: all_f32,
            shape: |o| reduce_shape(r, o),
            flops: one_per_input;
        ReduceMax "reduce_max" Some(Exact(1)), Plain: (Op::Reduce(Reduction::Max, r)) <=> (Attrs::Reduce(r))
            attrs { ..r },
            dtype: all_f32,
            shape: |o| reduce_shape(r, o),
            flops: one_per_input;
        ReduceMin "reduce_min" Some(Exact(1)), Plain: (Op::Reduce(Reduction::Min, r)) <=> (Attrs::Reduce(r))
            attrs { ..r },
            dtype: all_f32,
            shape: |o| reduce_shape(r, o),
            flops: one_per_input;
    ]
    $($more),* } };
}
pub(super) use reduce_ops;

/// The input's dims with the reduced axes dropped, or kept as 1.
pub(super) fn reduce_shape(r: &ReduceAttrs, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let dims = o.dims(0);
    if r.axes.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!(
            "reduction axes {:?} must be sorted and distinct",
            r.axes
        ));
    }
    if let Some(&a) = r.axes.iter().find(|&&a| a >= dims.len()) {
        return Err(format!(
            "reduction axis {a} is out of range for rank {}",
            dims.len()
        ));
    }
    let kept =
        dims.iter()
            .enumerate()
            .filter_map(|(k, &d)| match (r.axes.contains(&k), r.keep_dims) {
                (false, _) => Some(d),
                (true, true) => Some(Dim::ONE),
                (true, false) => None,
            });
    Ok(kept.collect::<Vec<_>>().into())
}

/// One operation per input element.
pub(super) fn one_per_input(operands: &[&TensorType], _: &TensorType) -> u64 {
    operands.first().map_or(0, |t| t.num_elements() as u64)
}

impl AttrSchema for ReduceAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        Ok(ReduceAttrs {
            axes: d.need("axes", AttrDict::usizes)?,
            keep_dims: d.bool("keep_dims")?.unwrap_or(false),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        out.always("axes", &self.axes, rank);
        out.unless("keep_dims", &self.keep_dims, &false, rank);
    }
}
