//! Batch separability: whether a function computes each element of a batch on its own,
//! so that a run over `n` elements can be split into runs over chunks of them.
//!
//! A model whose inputs have a dynamic leading dimension (ONNX's `batch`, `N` or `-1`)
//! is compiled for a few batch sizes and a run of any batch is split into chunks of those
//! sizes (`smelt::DynamicExecutable`). That is exact only when no op mixes elements of
//! different batch positions: a convolution, a matmul over rows, a softmax along
//! features all keep them apart; a softmax or a reduction along the batch, a reshape that
//! moves batch elements into the features, or a constant as large as the batch do not.
//! [`batch_axes`] follows the batch through every instruction and either says where it
//! is in each value or names the first instruction that would mix it.
//!
//! Where the batch is: one axis of a value, whose index is `batch · inner + rest` (the
//! batch the outermost factor of that axis, as when `[N, S, H]` is reshaped to
//! `[N·S, H]`). A value computed from constants alone has no batch.
//!
//! A gather along the batch axis mixes elements in general, but not the one exporters
//! write to read a padding mask through a flattened `[N·S]` view: constant indices whose
//! element `n` picks rows `n·S + p` with the same offsets `p` for every `n`. Such a gather
//! is followed, and reported ([`BatchAnalysis::element_gathers`]) so that the caller can
//! check that the model at batch 1 gathers at `p` — a constant the importer folded from
//! the batch is only known per import.

use std::cell::RefCell;

use crate::diag::{Diagnostic, Location};
use crate::graph::Func;
use crate::op::{FusedOp, Op, PostOp};
use crate::types::TensorType;
use crate::weights::{Weight, WeightStore};

/// Where the batch lives in one value: the axis, and how many positions of that axis
/// each batch element spans (1 unless axes were merged into it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchAxis {
    /// The axis of the value.
    pub axis: usize,
    /// Positions per batch element along that axis.
    pub inner: usize,
}

impl BatchAxis {
    /// The leading axis, one position per element: how a dynamic batch enters as input.
    pub const LEADING: BatchAxis = BatchAxis { axis: 0, inner: 1 };
}

/// What [`batch_axes`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchAnalysis {
    /// Where the batch is in every value of the function (indexed like
    /// [`Func::type_of`]'s values), `None` in values that do not depend on it.
    pub axes: Vec<Option<BatchAxis>>,
    /// The gathers that select along the batch axis at constant positions inside each
    /// element's own rows (an exporter's padding mask read through a flattened
    /// `[N·S]` view): the split is exact only if the model at batch 1 gathers at
    /// [`ElementGather::indices`], which the caller checks on that model.
    pub element_gathers: Vec<ElementGather>,
}

/// A gather along the batch axis whose constant indices, at each batch element, pick
/// that element's own rows, the same ones for every element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementGather {
    /// The instruction's index in the function body.
    pub inst: usize,
    /// The indices of element 0 (row-major, the batch axis of the indices dropped to 1).
    pub indices: Vec<i64>,
}

/// Where the batch is in every value of `func`, given where it is in each parameter and
/// the batch size the function was instantiated with (at least 2, so the batch is told
/// apart from unit axes); `weights` are its module's (a gather's constant indices are
/// read). An error names the first instruction through which the batch cannot be
/// followed, and why.
pub fn batch_axes(
    func: &Func,
    weights: &WeightStore,
    params: &[Option<BatchAxis>],
    batch: usize,
) -> Result<BatchAnalysis, Diagnostic> {
    if batch < 2 {
        return Err(Diagnostic::error(
            "batch-analysis",
            format!("the batch is followed at a size of at least 2, not {batch}"),
            func.loc.clone(),
        ));
    }
    let mut axes: Vec<Option<BatchAxis>> = Vec::with_capacity(func.num_values());
    for (p, at) in func.params.iter().zip(params) {
        if let Some(at) = at {
            if p.ty.dims.get(at.axis) != Some(&(batch * at.inner)) {
                return Err(Diagnostic::error(
                    "batch-analysis",
                    format!(
                        "parameter %{} of type {} has no axis {} of {} batch elements",
                        p.name,
                        p.ty,
                        at.axis,
                        batch * at.inner
                    ),
                    func.loc.clone(),
                ));
            }
        }
        axes.push(*at);
    }
    axes.resize(func.params.len(), None);
    let mut element_gathers = Vec::new();
    for (index, inst) in func.insts.iter().enumerate() {
        let operands: Vec<Operand<'_>> = inst
            .operands
            .iter()
            .map(|&v| Operand {
                ty: func.type_of(v),
                at: axes[v.index()],
                constant: match func.inst_of(v).map(|i| &i.op) {
                    Some(Op::Const(id)) => weights.get(*id),
                    _ => None,
                },
            })
            .collect();
        let follow = Follow {
            operands: &operands,
            result: &inst.ty,
            batch,
            element_indices: RefCell::new(None),
        };
        let at = follow.op(&inst.op).map_err(|why| {
            Diagnostic::error(
                "batch-not-separable",
                format!(
                    "`{}` {why}, so a dynamic batch cannot be split into runs of fewer \
                     elements; pin the batch size",
                    inst.op.name()
                ),
                inst.loc.clone(),
            )
        })?;
        if let Some(at) = at {
            if inst.ty.dims.get(at.axis) != Some(&(batch * at.inner)) {
                return Err(Diagnostic::error(
                    "batch-analysis",
                    format!(
                        "`{}`: the batch was followed to axis {} of {}, which does not hold \
                         {} batch elements",
                        inst.op.name(),
                        at.axis,
                        inst.ty,
                        batch
                    ),
                    inst.loc.clone(),
                ));
            }
        }
        if let Some(indices) = follow.element_indices.into_inner() {
            element_gathers.push(ElementGather {
                inst: index,
                indices,
            });
        }
        axes.push(at);
    }
    Ok(BatchAnalysis {
        axes,
        element_gathers,
    })
}

/// One operand as the analysis sees it: its type, where its batch is, and its weight
/// when it is a constant.
struct Operand<'a> {
    ty: &'a TensorType,
    at: Option<BatchAxis>,
    constant: Option<&'a Weight>,
}

/// The rules for one instruction. Each returns where the batch is in the result, or
/// why the instruction mixes batch elements (or cannot be shown not to).
struct Follow<'a> {
    operands: &'a [Operand<'a>],
    result: &'a TensorType,
    batch: usize,
    /// Set by a gather along the batch axis at per-element constant positions: element
    /// 0's indices (see [`ElementGather`]).
    element_indices: RefCell<Option<Vec<i64>>>,
}

type Rule = Result<Option<BatchAxis>, String>;

impl Follow<'_> {
    fn op(&self, op: &Op) -> Rule {
        match op {
            Op::Const(_) => Ok(None),
            // elementwise and broadcasting: numpy's right-aligned axes
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Cast { .. }
            | Op::Compare(_)
            | Op::Logic(_)
            | Op::Not
            | Op::Where
            | Op::Mod { .. }
            | Op::Reorder { .. } => self.broadcast(0..self.operands.len()),
            // windows over the trailing axes of `[N, C, ...]`, per-channel parameters
            Op::Conv2d(_)
            | Op::ConvTranspose2d(_)
            | Op::MaxPool2d(_)
            | Op::AvgPool2d { .. }
            | Op::GlobalAvgPool
            | Op::BatchNorm { .. }
            | Op::Resize(_) => self.leading_only(&[0]),
            Op::GridSample(_) => self.leading_only(&[0, 1]),
            Op::LayerNorm { axis, .. } => {
                let at = self.only_first()?;
                match at {
                    Some(at) if at.axis >= *axis => Err(format!(
                        "normalizes over axes {axis}.. and the batch is on axis {}",
                        at.axis
                    )),
                    _ => Ok(at),
                }
            }
            Op::Softmax { axis } => self.not_along(&[*axis], "normalizes along"),
            Op::Reduce(_, r) => {
                let at = self.not_along(&r.axes, "reduces along")?;
                Ok(at.map(|at| {
                    let removed = if r.keep_dims {
                        0
                    } else {
                        r.axes.iter().filter(|&&a| a < at.axis).count()
                    };
                    BatchAxis {
                        axis: at.axis - removed,
                        ..at
                    }
                }))
            }
            Op::Flatten { .. } | Op::Reshape { .. } => self.reshape(),
            Op::Transpose { perm } => {
                let at = self.only_first()?;
                Ok(at.and_then(|at| {
                    perm.iter()
                        .position(|&p| p == at.axis)
                        .map(|axis| BatchAxis { axis, ..at })
                }))
            }
            Op::Slice(s) => {
                let at = self.only_first()?;
                if let Some(at) = at {
                    let whole = self.operands[0].ty.dims.get(at.axis)
                        == self.result.dims.get(at.axis)
                        && s.steps.get(at.axis) == Some(&1);
                    if !whole {
                        return Err(format!("slices along the batch axis {}", at.axis));
                    }
                }
                Ok(at)
            }
            Op::Pad(p) => {
                let at = self.only_first()?;
                if let Some(at) = at {
                    let axes = p.axes(&self.operands[0].ty.dims)?;
                    let a = axes[at.axis];
                    if a.crop_begin != 0 || a.pad_begin != 0 || a.pad_end != 0 {
                        return Err(format!("pads or crops the batch axis {}", at.axis));
                    }
                }
                Ok(at)
            }
            Op::Expand { .. } | Op::Tile { .. } => {
                let at = self.only_first()?;
                let shift = self.result.rank() - self.operands[0].ty.rank();
                let at = at.map(|at| BatchAxis {
                    axis: at.axis + shift,
                    ..at
                });
                if let Some(at) = at {
                    if self.result.dims[at.axis] != self.operands[0].ty.dims[at.axis - shift] {
                        return Err(format!("repeats the batch axis {}", at.axis));
                    }
                }
                Ok(at)
            }
            Op::Concat { axis } => {
                let at = self.broadcast(0..self.operands.len())?;
                if at.is_some_and(|at| at.axis == *axis) {
                    return Err(format!("concatenates along the batch axis {axis}"));
                }
                Ok(at)
            }
            Op::Gather { axis } => self.gather(*axis),
            Op::MatMul => self.matmul(),
            Op::Gemm(g) => {
                // rows of A are independent; B and C must not depend on the batch
                let a = self.operands[0].at;
                if self.operands[1..].iter().any(|o| o.at.is_some()) {
                    return Err("multiplies by a batch-dependent right-hand side".into());
                }
                match a {
                    Some(at) if at.axis == usize::from(!g.trans_a) => {
                        Err("contracts over the batch axis".into())
                    }
                    Some(at) => {
                        self.c_is_row_free()?;
                        Ok(Some(BatchAxis { axis: 0, ..at }))
                    }
                    None => Ok(None),
                }
            }
            Op::BnFoldWeight { .. }
            | Op::BnFoldBias { .. }
            | Op::BnScale { .. }
            | Op::BnShift { .. }
            | Op::ChannelScale
            | Op::ChannelVector
            | Op::ConvShiftBias => match self.operands.iter().any(|o| o.at.is_some()) {
                true => Err("prepares weights from a batch-dependent value".into()),
                false => Ok(None),
            },
            Op::Fused(f) => self.fused(f),
        }
    }

    /// An op applied along axes broadcast numpy-style: every operand that has the batch
    /// has it on the same result axis, and no other operand spans that axis.
    fn broadcast(&self, operands: std::ops::Range<usize>) -> Rule {
        let rank = self.result.rank();
        let mut found: Option<BatchAxis> = None;
        for o in &self.operands[operands.clone()] {
            if let Some(at) = o.at {
                let at = BatchAxis {
                    axis: at.axis + rank - o.ty.rank(),
                    ..at
                };
                if found.is_some_and(|f| f != at) {
                    return Err("combines operands whose batches are on different axes".into());
                }
                found = Some(at);
            }
        }
        if let Some(at) = found {
            for o in &self.operands[operands] {
                let spans = at
                    .axis
                    .checked_sub(rank - o.ty.rank())
                    .and_then(|k| o.ty.dims.get(k))
                    .is_some_and(|&d| d != 1);
                if o.at.is_none() && spans {
                    return Err(format!(
                        "combines the batch with an operand of type {} whose axis {} is as \
                         long as the batch but does not depend on it",
                        o.ty, at.axis
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Ops whose listed operands carry the batch on their leading axis, one position per
    /// element, and whose other operands (weights) do not carry it.
    fn leading_only(&self, batched: &[usize]) -> Rule {
        let mut found = None;
        for (i, o) in self.operands.iter().enumerate() {
            match o.at {
                Some(at) if batched.contains(&i) && at == BatchAxis::LEADING => {
                    found = Some(at);
                }
                Some(at) if batched.contains(&i) => {
                    return Err(format!(
                        "works on [N, C, ...] and the batch is on axis {} of operand {i}",
                        at.axis
                    ))
                }
                Some(_) => return Err(format!("takes a batch-dependent operand {i} as weights")),
                None => {}
            }
        }
        if found.is_some() && batched.iter().any(|&i| self.operands[i].at.is_none()) {
            return Err("combines a batched operand with an unbatched one".into());
        }
        if found.is_some() && self.result.dims.first() != self.operands[0].ty.dims.first() {
            return Err("changes the size of the batch axis".into());
        }
        Ok(found)
    }

    /// The batch of the first operand, with every other operand free of it.
    fn only_first(&self) -> Result<Option<BatchAxis>, String> {
        if self.operands[1..].iter().any(|o| o.at.is_some()) {
            return Err("takes the batch in a parameter operand".into());
        }
        Ok(self.operands[0].at)
    }

    /// The first operand's batch, which must not be on one of `axes`.
    fn not_along(&self, axes: &[usize], verb: &str) -> Rule {
        let at = self.only_first()?;
        match at {
            Some(at) if axes.contains(&at.axis) => {
                Err(format!("{verb} the batch axis {}", at.axis))
            }
            _ => Ok(at),
        }
    }

    /// A row-major reshape: the batch stays separable when the elements before it (the
    /// product of the axes before its axis) stay before it, so some result axis starts
    /// at the same flat offset and its length is a multiple of the batch.
    fn reshape(&self) -> Rule {
        let Some(at) = self.only_first()? else {
            return Ok(None);
        };
        let dims = &self.operands[0].ty.dims;
        let before: usize = dims[..at.axis].iter().product();
        let mut prefix = 1usize;
        for (j, &d) in self.result.dims.iter().enumerate() {
            if prefix == before && d != 1 && d.is_multiple_of(self.batch) {
                let inner_elems: usize = dims[at.axis + 1..].iter().product::<usize>() * at.inner;
                let out_after: usize = self.result.dims[j + 1..].iter().product();
                let inner = d / self.batch;
                if inner * out_after == inner_elems {
                    return Ok(Some(BatchAxis { axis: j, inner }));
                }
            }
            prefix = prefix.saturating_mul(d);
            if prefix > before {
                break;
            }
        }
        Err(format!(
            "reshapes {} to {} and the batch (axis {}) no longer leads a result axis",
            self.operands[0].ty, self.result, at.axis
        ))
    }

    /// `gather(data, indices)` along `axis`: the batch may be in the data off that axis,
    /// or in the indices, not both.
    fn gather(&self, axis: usize) -> Rule {
        let (data, indices) = (&self.operands[0], &self.operands[1]);
        match (data.at, indices.at) {
            (Some(_), Some(_)) => Err("indexes batched data with batched indices".into()),
            (Some(at), None) if at.axis == axis => self.element_gather(at, axis),
            (Some(at), None) if at.axis < axis => Ok(Some(at)),
            (Some(at), None) => Ok(Some(BatchAxis {
                axis: at.axis - 1 + indices.ty.rank(),
                ..at
            })),
            (None, Some(at)) => Ok(Some(BatchAxis {
                axis: axis + at.axis,
                ..at
            })),
            (None, None) => Ok(None),
        }
    }

    /// A gather along the batch axis `axis` of data (`at.inner` positions per element)
    /// at constant indices: separable when the indices have an axis of one position per
    /// element along which element `n`'s indices are `n · inner` plus the same offsets
    /// for every `n`, each inside `0..inner` — each element reads only its own rows.
    fn element_gather(&self, at: BatchAxis, axis: usize) -> Rule {
        let (data, indices) = (&self.operands[0], &self.operands[1]);
        let refuse = || Err(format!("selects along the batch axis {axis}"));
        let Some(values) = indices.constant.and_then(|w| w.elements()?.to_i64s()) else {
            return refuse();
        };
        let dims = &indices.ty.dims;
        let size = data.ty.dims[axis] as i64;
        let inner = at.inner as i64;
        let element_axis = (0..dims.len()).find(|&j| {
            dims[j] == self.batch && {
                let stride: usize = dims[j + 1..].iter().product();
                let offset = |i: usize, v: i64| {
                    let v = if v < 0 { v + size } else { v };
                    v - ((i / stride) % self.batch) as i64 * inner
                };
                // element n's offsets equal element 0's, each inside one element's rows
                values.iter().enumerate().all(|(i, &v)| {
                    let o = offset(i, v);
                    let first = i - ((i / stride) % self.batch) * stride;
                    (0..inner).contains(&o) && o == offset(first, values[first])
                })
            }
        });
        let Some(j) = element_axis else {
            return refuse();
        };
        let stride: usize = dims[j + 1..].iter().product();
        let first: Vec<i64> = values
            .iter()
            .enumerate()
            .filter(|(i, _)| (i / stride).is_multiple_of(self.batch))
            .map(|(_, &v)| if v < 0 { v + size } else { v })
            .collect();
        *self.element_indices.borrow_mut() = Some(first);
        Ok(Some(BatchAxis {
            axis: axis + j,
            inner: 1,
        }))
    }

    /// `matmul(A, B)` with numpy batch broadcasting: the batch may be in the leading
    /// axes of either, in A's rows or in B's columns, never in the contracted axis.
    fn matmul(&self) -> Rule {
        let (a, b) = (&self.operands[0], &self.operands[1]);
        let rank = self.result.rank();
        let place = |o: &Operand<'_>, is_a: bool| -> Result<Option<BatchAxis>, String> {
            let Some(at) = o.at else { return Ok(None) };
            let r = o.ty.rank();
            let contracted = if is_a { r - 1 } else { r.saturating_sub(2) };
            if r < 2 || at.axis == contracted {
                return Err("contracts over the batch axis".into());
            }
            Ok(Some(BatchAxis {
                axis: match (is_a, at.axis + 2 >= r) {
                    (_, false) => at.axis + rank - r,
                    (true, true) => rank - 2,
                    (false, true) => rank - 1,
                },
                ..at
            }))
        };
        let (pa, pb) = (place(a, true)?, place(b, false)?);
        match (pa, pb) {
            (Some(x), Some(y)) if x != y => {
                Err("multiplies operands whose batches are on different axes".into())
            }
            (Some(at), _) | (None, Some(at)) => {
                // on a broadcast (leading) axis, the unbatched operand must not span it
                for o in [a, b] {
                    let leading = o.ty.rank().saturating_sub(2);
                    let spans = at
                        .axis
                        .checked_sub(rank - o.ty.rank())
                        .filter(|&k| k < leading)
                        .is_some_and(|k| o.ty.dims[k] != 1);
                    if o.at.is_none() && spans {
                        return Err(format!(
                            "broadcasts the batch against an operand of type {} that spans it",
                            o.ty
                        ));
                    }
                }
                Ok(Some(at))
            }
            (None, None) => Ok(None),
        }
    }

    /// Gemm's C must be the same for every row: a row vector or a scalar.
    fn c_is_row_free(&self) -> Result<(), String> {
        match self.operands.get(2) {
            Some(c) if c.ty.rank() == 2 && c.ty.dims[0] != 1 => {
                Err(format!("adds a C of type {} that varies by row", c.ty))
            }
            _ => Ok(()),
        }
    }

    /// A fused op: its anchor's rule over the anchor's operands, then each post-op's
    /// operand broadcast against the accumulated result.
    fn fused(&self, f: &FusedOp) -> Rule {
        let anchor_arity = self.operands.len() - f.num_post_operands();
        let anchor = Follow {
            operands: &self.operands[..anchor_arity],
            result: self.result,
            batch: self.batch,
            element_indices: RefCell::new(None),
        };
        let mut at = anchor.op(&f.anchor)?;
        let mut next = anchor_arity;
        for post in &f.post_ops {
            if let PostOp::Binary { .. } = post {
                let pair = [
                    Operand {
                        ty: self.result,
                        at,
                        constant: None,
                    },
                    Operand {
                        ty: self.operands[next].ty,
                        at: self.operands[next].at,
                        constant: self.operands[next].constant,
                    },
                ];
                at = Follow {
                    operands: &pair,
                    result: self.result,
                    batch: self.batch,
                    element_indices: RefCell::new(None),
                }
                .broadcast(0..2)?;
                next += 1;
            }
        }
        Ok(at)
    }
}

/// Where `func`'s results carry the batch, when every one that depends on it has it on
/// its leading axis (so a chunk of the batch is a contiguous range of each result). An
/// error names the result that does not.
pub fn leading_results(func: &Func, axes: &[Option<BatchAxis>]) -> Result<Vec<bool>, Diagnostic> {
    func.results
        .iter()
        .map(|r| match axes[r.value.index()] {
            None => Ok(false),
            Some(BatchAxis::LEADING) => Ok(true),
            Some(at) => Err(Diagnostic::error(
                "batch-not-separable",
                format!(
                    "result {} has its batch on axis {} ({} positions per element), not \
                     leading, so runs of fewer elements do not give contiguous parts of it; \
                     pin the batch size",
                    r.name, at.axis, at.inner
                ),
                Location::Unknown,
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    /// A `[2, 3]` mask flattened to `[6]` and gathered at `table` (shape `[2, 3]`).
    fn masked(table: &str) -> crate::graph::Module {
        let src = format!(
            "const @at : tensor<2x3xi64> = dense<[{table}]>
func @f(%mask: tensor<2x3xf32>) -> (y: tensor<2x3xf32>) {{
  %0 = reshape %mask {{shape = [6]}} : tensor<6xf32>
  %1 = const @at : tensor<2x3xi64>
  %2 = gather %0, %1 : tensor<2x3xf32>
  return %2 : tensor<2x3xf32>
}}"
        );
        parse(&src, "mask.tir").expect("parses")
    }

    fn analyse(m: &crate::graph::Module) -> Result<BatchAnalysis, Diagnostic> {
        batch_axes(
            m.entry().unwrap(),
            &m.weights,
            &[Some(BatchAxis::LEADING)],
            2,
        )
    }

    #[test]
    fn a_gather_of_each_elements_own_rows_is_followed() {
        let m = masked("2, 0, 1, 5, 3, -2");
        let a = analyse(&m).expect("each element reads its own rows");
        assert_eq!(a.axes.last().copied().flatten(), Some(BatchAxis::LEADING));
        assert_eq!(
            a.element_gathers,
            vec![ElementGather {
                inst: 2,
                indices: vec![2, 0, 1]
            }]
        );
    }

    #[test]
    fn a_gather_across_elements_is_refused() {
        // element 1 reads element 0's rows
        for table in ["0, 1, 2, 0, 1, 2", "0, 1, 2, 4, 3, 5"] {
            let e = analyse(&masked(table)).expect_err(table).to_string();
            assert!(e.contains("selects along the batch axis 0"), "{table}: {e}");
        }
    }
}
