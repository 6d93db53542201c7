//! Sequence padding: whether a model run at a padded length gives, on the valid prefix
//! of its results, what it gives at the real length.
//!
//! A model with a symbolic sequence length `S` (a BERT's `[batch, sequence]` token ids
//! and attention mask) is compiled for a few *bucket* lengths `P`; a run of length
//! `S ≤ P` pads each input along its sequence axes to `P` with zeros (token 0, mask 0),
//! runs the bucket and keeps the first `S` positions of each result. That is exact
//! only when no valid position of a result reads a padded one, and when nothing the
//! importer folded from the length (position ids, mask index tables) differs on the
//! valid prefix. [`padding_proof`] checks both on two imports of the same model, at the
//! bucket length `P` and at a shorter length `Q` (the shortest the bucket serves):
//!
//! - **Where the sequence is.** A value's padded axes are those whose size differs
//!   between the two imports; each must be exactly `P` long in one and `Q` in the other
//!   (an axis of `S − 1` or `2·S` is refused). The two functions must be the same
//!   instructions on the same operands; an op whose attributes differ while its type
//!   does not (a scale computed from `S`) is refused, and so is a constant that differs
//!   other than by growing along its padded axes, or whose first `Q` positions differ
//!   from the shorter import's (the prefix consistency of `Range(0, S)`).
//! - **What padded positions hold.** For each padded axis of each value the analysis
//!   knows what the positions past the valid length hold where every other padded axis
//!   is valid ([`Padding`]): an exact value, a value below any score (the additive
//!   attention mask: `−10⁴` or less), or anything. Inputs are padded with 0; elementwise
//!   ops compute on exact values; movement ops carry them along their axes.
//! - **Where padded positions meet valid ones.** A softmax along a padded axis needs the
//!   padded positions below any score (they then weigh exactly 0); a matmul or gemm
//!   contracting a padded axis needs one side exactly 0 there (attention's `P·V` after
//!   that softmax); a gather along a padded axis needs constant indices that are the
//!   identity along one padded axis or stay inside the shortest length; a slice along
//!   it keeps the whole axis or only positions every length has. Any other op that
//!   reads along a padded axis (a reduction, a normalization over it, a convolution,
//!   a concat) is refused, naming the instruction.
//!
//! Two assumptions, the ones a padded batch in any runtime makes: the model computes
//! finite values at padded positions (the fill tokens are valid inputs), so that
//! `0 · x = 0`; and an additive mask of `−10⁴` or less makes `exp` underflow to 0, so
//! valid scores span less than `≈ 9,900`.

use crate::diag::{Diagnostic, Location};
use crate::graph::Module;
use crate::interp::eval_op;
use crate::op::{BinaryOp, LogicOp, Op};
use crate::tensor::{Tensor, TensorData};
use crate::types::{DType, TensorType};

/// What the padded positions of one axis of a value hold, where every other padded axis
/// of that value is at a valid position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Padding {
    /// Exactly this value.
    Exact(f64),
    /// At most `−10⁴` plus a finite value: an additive attention mask, which a softmax
    /// along this axis turns into exact zeros.
    Low,
    /// Any finite value.
    Any,
}

/// The most elements a constant read for one uniform value may have.
const UNIFORM_LIMIT: usize = 4096;

/// A mask value at or below this makes `exp(x − max)` underflow to 0 for any score.
const LOW_MASK: f64 = -1e4;

impl Padding {
    fn is_low(self) -> bool {
        match self {
            Padding::Low => true,
            Padding::Exact(c) => c <= LOW_MASK,
            Padding::Any => false,
        }
    }

    fn is_zero(self) -> bool {
        self == Padding::Exact(0.0)
    }
}

/// What [`padding_proof`] found: which axes of each result carry the sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddingProof {
    /// Per result of the function, its padded axes (ascending): the valid prefix of a
    /// run at length `S` is the first `S` positions along each.
    pub results: Vec<Vec<usize>>,
}

/// The code of the diagnostic [`padding_proof`] refuses a model with: callers tell a
/// model that cannot be padded from other failures by it.
pub const NOT_PADDABLE: &str = "sequence-not-paddable";

/// Checks that `big` (the model imported at the bucket length `padded`) run on inputs
/// padded with zeros along their sequence axes gives, on the valid prefix of every
/// result, the results of the model at any length from `short` to `padded`; `small` is
/// the model imported at `short` (at least 1, below `padded`). See the module doc for
/// what is checked and assumed. An error names the first instruction that could let a
/// padded position reach a valid one.
pub fn padding_proof(
    big: &Module,
    small: &Module,
    padded: usize,
    short: usize,
) -> Result<PaddingProof, Diagnostic> {
    let (fb, pads) = padded_values(big, small, padded, short)?;
    let results = fb
        .results
        .iter()
        .map(|r| {
            pads[r.value.index()]
                .iter()
                .enumerate()
                .filter_map(|(k, p)| p.map(|_| k))
                .collect()
        })
        .collect();
    Ok(PaddingProof { results })
}

/// Which values of a function compiled at a padded length may hold anything finite in
/// the rows past a run's valid length ([`padded_rows`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddedRows {
    /// The length the function is compiled at (the bucket).
    pub length: usize,
    /// By value index: the first of its padded axes (of `length` positions) along which
    /// the value's positions from a run's valid length on may hold any finite value,
    /// whatever its other axes' indices.
    pub axes: Vec<Option<usize>>,
}

/// [`padding_proof`]'s analysis of `big` against `small`, kept per value: the values
/// whose padded positions along a padded axis hold anything finite ([`Padding::Any`])
/// — which no later op can rely on, so a kernel may leave them to any finite value
/// (zeros) instead of computing them. (A position padded along two axes is only ever
/// assumed finite.) Run on the optimized function the kernels are lowered from (`small`
/// optimized the same way: the same instructions at the shorter length), it tells
/// lowering which row loops may stop at a run's valid length.
pub fn padded_rows(
    big: &Module,
    small: &Module,
    padded: usize,
    short: usize,
) -> Result<PaddedRows, Diagnostic> {
    let (fb, pads) = padded_values(big, small, padded, short)?;
    let axes = pads
        .iter()
        .enumerate()
        .map(|(v, pads)| {
            let dims = &fb.type_of(crate::graph::Value(v as u32)).dims;
            (0..dims.len())
                .find(|&k| pads.get(k).copied().flatten() == Some(Padding::Any))
                .filter(|&k| dims[k] == padded)
        })
        .collect();
    Ok(PaddedRows {
        length: padded,
        axes,
    })
}

/// `big`'s entry function and what the padded positions of each of its values hold, by
/// value index and axis (`None`: not a padded axis); an error names the first
/// instruction that could let a padded position reach a valid one.
fn padded_values<'m>(
    big: &'m Module,
    small: &Module,
    padded: usize,
    short: usize,
) -> Result<(&'m crate::graph::Func, Vec<Pads>), Diagnostic> {
    let fail =
        |loc: &Location, message: String| Diagnostic::error(NOT_PADDABLE, message, loc.clone());
    let (Some(fb), Some(fs)) = (big.entry(), small.entry()) else {
        return Err(fail(&Location::Unknown, big.no_entry_reason()));
    };
    if !(1..padded).contains(&short) {
        return Err(fail(
            &fb.loc,
            format!("a padding proof compares a length from 1 below {padded}, not {short}"),
        ));
    }
    if fb.params.len() != fs.params.len()
        || fb.insts.len() != fs.insts.len()
        || fb.results.len() != fs.results.len()
    {
        return Err(fail(
            &fb.loc,
            format!(
                "the model imports as different graphs at lengths {padded} and {short} \
                 ({} and {} instructions): its structure depends on the sequence length",
                fb.insts.len(),
                fs.insts.len()
            ),
        ));
    }
    let lengths = Lengths { padded, short };
    let mut pads: Vec<Pads> = Vec::with_capacity(fb.num_values());
    for (pb, ps) in fb.params.iter().zip(&fs.params) {
        let axes = lengths
            .padded_axes(&pb.ty, &ps.ty)
            .map_err(|why| fail(&fb.loc, format!("parameter %{}: {why}", pb.name)))?;
        pads.push(
            axes.iter()
                .map(|&p| p.then_some(Padding::Exact(0.0)))
                .collect(),
        );
    }
    for (ib, is) in fb.insts.iter().zip(&fs.insts) {
        let here = |why: String| fail(&ib.loc, format!("`{}` {why}", ib.op.name()));
        if ib.operands != is.operands
            || std::mem::discriminant(&ib.op) != std::mem::discriminant(&is.op)
        {
            return Err(here(format!(
                "is not the same instruction at lengths {padded} and {short}: the graph's \
                 structure depends on the sequence length"
            )));
        }
        let axes = lengths.padded_axes(&ib.ty, &is.ty).map_err(&here)?;
        let operands: Vec<Operand<'_>> = ib
            .operands
            .iter()
            .map(|&v| Operand {
                ty: fb.type_of(v),
                pads: &pads[v.index()],
                constant: match fb.inst_of(v).map(|i| &i.op) {
                    Some(Op::Const(id)) => big.weights.get(*id),
                    _ => None,
                },
            })
            .collect();
        let step = Step {
            operands: &operands,
            result: &ib.ty,
            axes: &axes,
            lengths,
        };
        let result = match (&ib.op, &is.op) {
            (Op::Const(b), Op::Const(s)) => step.constant(big, small, *b, *s),
            (op, small_op) => {
                if op != small_op && ib.ty == is.ty {
                    return Err(here(format!(
                        "has attributes that depend on the sequence length (length {padded}: \
                         {op:?}; length {short}: {small_op:?}) while its type does not"
                    )));
                }
                step.op(op)
            }
        }
        .map_err(&here)?;
        pads.push(result);
    }
    Ok((fb, pads))
}

/// The two lengths the model was imported at.
#[derive(Clone, Copy)]
struct Lengths {
    padded: usize,
    short: usize,
}

impl Lengths {
    /// Which axes of a value (typed `big` in the padded import, `small` in the short one)
    /// carry the sequence.
    fn padded_axes(self, big: &TensorType, small: &TensorType) -> Result<Vec<bool>, String> {
        if big.rank() != small.rank() || big.dtype != small.dtype {
            return Err(format!(
                "is {big} at length {} but {small} at length {}",
                self.padded, self.short
            ));
        }
        big.dims
            .iter()
            .zip(&small.dims)
            .enumerate()
            .map(|(k, (&b, &s))| match (b, s) {
                _ if b == s => Ok(false),
                _ if b == self.padded && s == self.short => Ok(true),
                _ => Err(format!(
                    "has axis {k} of {b} at length {} and {s} at length {}: only an axis as \
                     long as the sequence can be padded",
                    self.padded, self.short
                )),
            })
            .collect()
    }
}

/// One operand: its type in the padded import and its padded axes' contents.
struct Operand<'a> {
    ty: &'a TensorType,
    pads: &'a [Option<Padding>],
    /// The weight, when the operand is a constant of the padded import.
    constant: Option<&'a crate::weights::Weight>,
}

impl Operand<'_> {
    fn padded(&self) -> bool {
        self.pads.iter().any(Option::is_some)
    }

    /// The one value of a constant whose elements are all equal (a where's fill, a
    /// scale): what it contributes at any position, padded or not.
    fn uniform(&self) -> Option<Padding> {
        let weight = self.constant?;
        // a fill is small; reading a large weight's every element here would cost more
        // than the proof
        if weight.ty.num_elements() > UNIFORM_LIMIT {
            return None;
        }
        let values = weight.elements()?.to_f64();
        let (&first, rest) = values.split_first()?;
        rest.iter()
            .all(|&v| v == first)
            .then_some(Padding::Exact(first))
    }
}

/// The rules for one instruction: each returns the contents of the result's padded
/// axes (`axes`), or why a padded position could reach a valid one.
struct Step<'a> {
    operands: &'a [Operand<'a>],
    result: &'a TensorType,
    /// The result's padded axes.
    axes: &'a [bool],
    lengths: Lengths,
}

type Pads = Vec<Option<Padding>>;

impl Step<'_> {
    /// Every padded axis of the result holding anything.
    fn any(&self) -> Pads {
        self.axes
            .iter()
            .map(|&p| p.then_some(Padding::Any))
            .collect()
    }

    fn op(&self, op: &Op) -> Result<Pads, String> {
        match op {
            Op::Const(_) => Err("is a constant read as an op".into()),
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Cast { .. }
            | Op::Compare(_)
            | Op::Logic(_)
            | Op::Not
            | Op::Where
            | Op::Mod { .. } => self.elementwise(op),
            Op::Softmax { axis } => {
                let input = &self.operands[0];
                if let Some(p) = input.pads[*axis] {
                    if !p.is_low() {
                        return Err(format!(
                            "normalizes along the sequence axis {axis}, whose padded \
                             positions are not masked (they hold {p:?}, not −10⁴ or less)"
                        ));
                    }
                }
                let mut pads = self.any();
                if input.pads[*axis].is_some() {
                    pads[*axis] = Some(Padding::Exact(0.0));
                }
                Ok(pads)
            }
            Op::LayerNorm { axis, .. } => {
                self.not_along(|k| k >= *axis, "normalizes along")?;
                Ok(self.any())
            }
            Op::Reduce(_, r) => {
                self.not_along(|k| r.axes.contains(&k), "reduces along")?;
                Ok(self.any())
            }
            Op::MatMul => {
                let (a, b) = (&self.operands[0], &self.operands[1]);
                let ka = a.ty.rank() - 1;
                let kb = b.ty.rank().saturating_sub(2);
                self.contraction(a.pads[ka], b.pads[kb])?;
                Ok(self.any())
            }
            Op::Gemm(g) => {
                let (a, b) = (&self.operands[0], &self.operands[1]);
                let ka = usize::from(!g.trans_a);
                let kb = usize::from(g.trans_b);
                self.contraction(a.pads[ka], b.pads[kb])?;
                if self.operands.get(2).is_some_and(Operand::padded) && self.result.rank() != 2 {
                    return Err("adds a padded bias of an unexpected rank".into());
                }
                Ok(self.any())
            }
            Op::Transpose { perm } => {
                let input = self.operands[0].pads;
                Ok(perm.iter().map(|&p| input[p]).collect())
            }
            Op::Flatten { .. } | Op::Reshape { .. } => self.reshape(),
            Op::Fused(f) => self.fused(f),
            Op::Expand { .. } => {
                let input = &self.operands[0];
                let shift = self.result.rank() - input.ty.rank();
                Ok((0..self.result.rank())
                    .map(|k| {
                        let carried = k.checked_sub(shift).and_then(|j| input.pads[j]);
                        match self.axes[k] {
                            false => None,
                            true => Some(carried.unwrap_or(Padding::Any)),
                        }
                    })
                    .collect())
            }
            Op::Slice(s) => {
                let input = &self.operands[0];
                for (k, pad) in input.pads.iter().enumerate() {
                    if pad.is_none() {
                        continue;
                    }
                    let whole = self.axes[k] && s.starts[k] == 0 && s.steps[k] == 1;
                    let start_ok = (0..self.lengths.short as i64).contains(&s.starts[k]);
                    let within = !self.axes[k]
                        && s.steps[k] > 0
                        && start_ok
                        && s.ends[k] <= self.lengths.short as i64;
                    if !(whole || within) {
                        return Err(format!(
                            "slices the sequence axis {k} from {} to {} by {}: only the whole \
                             axis or positions below {} (valid at every length) are kept",
                            s.starts[k], s.ends[k], s.steps[k], self.lengths.short
                        ));
                    }
                }
                Ok((0..self.result.rank())
                    .map(|k| self.axes[k].then(|| input.pads[k].unwrap_or(Padding::Any)))
                    .collect())
            }
            Op::Gather { axis } => self.gather(*axis),
            Op::Concat { axis } => {
                if self.axes[*axis] || self.operands.iter().any(|o| o.pads[*axis].is_some()) {
                    return Err(format!("concatenates along the sequence axis {axis}"));
                }
                Ok((0..self.result.rank())
                    .map(|k| {
                        let first = self.operands[0].pads[k];
                        match self.axes[k] {
                            false => None,
                            true if self.operands.iter().all(|o| o.pads[k] == first) => first,
                            true => Some(Padding::Any),
                        }
                    })
                    .collect())
            }
            Op::Pad(p) => {
                let input = &self.operands[0];
                let pads = p.axes(&input.ty.dims)?;
                for (k, a) in pads.iter().enumerate() {
                    let moves = a.crop_begin != 0 || a.pad_begin != 0 || a.pad_end != 0;
                    if input.pads[k].is_some() && moves {
                        return Err(format!("pads or crops the sequence axis {k}"));
                    }
                }
                Ok(self.any())
            }
            _ => {
                if self.operands.iter().any(Operand::padded) || self.axes.contains(&true) {
                    return Err(
                        "works along axes of a value padded along the sequence, which \
                                only elementwise ops, movement, softmax, normalizations, \
                                reductions and products over other axes may"
                            .into(),
                    );
                }
                Ok(self.any())
            }
        }
    }

    /// A fused op: its anchor, then each post-op as the elementwise op it is, on the
    /// accumulator and the next extra operand.
    fn fused(&self, f: &crate::op::FusedOp) -> Result<Pads, String> {
        let n_anchor = self
            .operands
            .len()
            .checked_sub(f.num_post_operands())
            .ok_or("has fewer operands than its post-ops read")?;
        let on = |operands: &[Operand<'_>], op: &Op| {
            Step {
                operands,
                result: self.result,
                axes: self.axes,
                lengths: self.lengths,
            }
            .op(op)
        };
        let mut pads = on(&self.operands[..n_anchor], &f.anchor)?;
        let mut extra = self.operands[n_anchor..].iter();
        for post in &f.post_ops {
            let acc = Operand {
                ty: self.result,
                pads: &pads,
                constant: None,
            };
            pads = match post {
                crate::op::PostOp::Unary(u) => on(&[acc], &Op::Unary(*u))?,
                crate::op::PostOp::Binary { op, acc_is_lhs } => {
                    let o = extra
                        .next()
                        .ok_or("has fewer operands than its post-ops read")?;
                    let other = Operand {
                        ty: o.ty,
                        pads: o.pads,
                        constant: o.constant,
                    };
                    let pair = match acc_is_lhs {
                        true => [acc, other],
                        false => [other, acc],
                    };
                    on(&pair, &Op::Binary(*op))?
                }
            };
        }
        Ok(pads)
    }

    /// Refuses a padded operand axis `k` for which `along(k)`.
    fn not_along(&self, along: impl Fn(usize) -> bool, verb: &str) -> Result<(), String> {
        match self.operands[0]
            .pads
            .iter()
            .enumerate()
            .find(|&(k, p)| p.is_some() && along(k))
        {
            Some((k, _)) => Err(format!("{verb} the sequence axis {k}")),
            None => Ok(()),
        }
    }

    /// A product contracting axes whose padded positions hold `a` and `b`: a padded
    /// contraction axis needs exact zeros on one side.
    fn contraction(&self, a: Option<Padding>, b: Option<Padding>) -> Result<(), String> {
        match (a, b) {
            (None, None) => Ok(()),
            (Some(a), Some(b)) if a.is_zero() || b.is_zero() => Ok(()),
            (a, b) => Err(format!(
                "contracts over the sequence axis, whose padded positions hold {a:?} and \
                 {b:?}: neither is exactly 0"
            )),
        }
    }

    /// An elementwise op with numpy broadcasting: per padded axis of the result, the
    /// op applied to what each operand holds there (an operand not padded on that axis
    /// contributes its valid values: anything).
    fn elementwise(&self, op: &Op) -> Result<Pads, String> {
        let rank = self.result.rank();
        (0..rank)
            .map(|k| {
                if !self.axes[k] {
                    return Ok(None);
                }
                let held: Vec<(Padding, DType)> = self
                    .operands
                    .iter()
                    .map(|o| {
                        let pad = (k + o.ty.rank())
                            .checked_sub(rank)
                            .and_then(|j| o.pads[j])
                            .or_else(|| o.uniform())
                            .unwrap_or(Padding::Any);
                        (pad, o.ty.dtype)
                    })
                    .collect();
                Ok(Some(apply(op, &held, self.result.dtype)))
            })
            .collect()
    }

    /// A row-major reshape: each padded axis must stay an axis of the same length with
    /// the same elements before it, and the result's padded axes be exactly those.
    fn reshape(&self) -> Result<Pads, String> {
        let input = &self.operands[0];
        let dims = &input.ty.dims;
        let out = &self.result.dims;
        let mut pads: Pads = vec![None; out.len()];
        for (k, pad) in input.pads.iter().enumerate() {
            let Some(pad) = pad else { continue };
            let before: usize = dims[..k].iter().product();
            let target = (0..out.len())
                .find(|&j| out[..j].iter().product::<usize>() == before && out[j] == dims[k]);
            match target {
                Some(j) if self.axes[j] => pads[j] = Some(*pad),
                _ => {
                    return Err(format!(
                        "reshapes {} to {} and the sequence axis {k} no longer stays an axis",
                        input.ty, self.result
                    ))
                }
            }
        }
        if pads
            .iter()
            .map(Option::is_some)
            .ne(self.axes.iter().copied())
        {
            return Err(format!(
                "reshapes {} to {}, which moves the sequence between axes",
                input.ty, self.result
            ));
        }
        Ok(pads)
    }

    /// `gather(data, indices)` along `axis`.
    fn gather(&self, axis: usize) -> Result<Pads, String> {
        let (data, indices) = (&self.operands[0], &self.operands[1]);
        let rank_i = indices.ty.rank();
        // result axes: data's before `axis`, the indices', data's after it
        let mut pads: Pads = Vec::with_capacity(self.result.rank());
        pads.extend(data.pads[..axis].iter().copied());
        match (data.pads[axis], indices.padded()) {
            (None, _) => {
                // the indices choose rows of unpadded data: valid indices (an exact
                // in-range fill) give rows of real data
                for (j, p) in indices.pads.iter().enumerate() {
                    match p {
                        None => pads.push(None),
                        Some(Padding::Exact(c))
                            if *c >= 0.0 && (*c as usize) < data.ty.dims[axis] =>
                        {
                            pads.push(Some(Padding::Any))
                        }
                        Some(p) => {
                            return Err(format!(
                                "gathers with indices whose padded positions along axis {j} \
                                 hold {p:?}, not one valid index"
                            ))
                        }
                    }
                }
            }
            (Some(along), _) => {
                let Some(values) = self.constant_indices() else {
                    return Err(format!(
                        "gathers along the sequence axis {axis} with indices computed at run \
                         time"
                    ));
                };
                let identity_axis = (0..rank_i).find(|&j| {
                    indices.pads[j].is_some()
                        && (0..rank_i).all(|i| i == j || indices.pads[i].is_none())
                        && is_identity_along(&indices.ty.dims, j, &values)
                });
                let within = !indices.padded()
                    && values
                        .iter()
                        .all(|&v| v >= 0 && (v as usize) < self.lengths.short);
                match identity_axis {
                    Some(j) => pads.extend((0..rank_i).map(|i| (i == j).then_some(along))),
                    None if within => pads.extend((0..rank_i).map(|_| None)),
                    None => {
                        return Err(format!(
                            "gathers along the sequence axis {axis} at constant positions that \
                             are neither the identity along one sequence axis nor all below {}",
                            self.lengths.short
                        ))
                    }
                }
            }
        }
        pads.extend(data.pads[axis + 1..].iter().copied());
        if pads
            .iter()
            .map(Option::is_some)
            .ne(self.axes.iter().copied())
        {
            return Err("moves the sequence between axes".into());
        }
        Ok(pads)
    }

    /// The indices of a gather when they are a constant of the padded import.
    fn constant_indices(&self) -> Option<Vec<i64>> {
        self.operands[1].constant?.elements()?.to_i64s()
    }

    /// A constant: equal in both imports, or grown along its padded axes with the
    /// shorter import's values as its prefix. Its padded positions hold one value when
    /// every position past the shorter length holds it.
    fn constant(
        &self,
        big: &Module,
        small: &Module,
        b: crate::weights::WeightId,
        s: crate::weights::WeightId,
    ) -> Result<Pads, String> {
        let (Some(wb), Some(ws)) = (big.weights.get(b), small.weights.get(s)) else {
            return Err("reads a weight the module does not hold".into());
        };
        if !self.axes.contains(&true) {
            return match wb.data.as_bytes() == ws.data.as_bytes() {
                true => Ok(vec![None; self.axes.len()]),
                false => Err(format!(
                    "is a constant {} whose values depend on the sequence length",
                    wb.ty
                )),
            };
        }
        let row_major = |w: &crate::weights::Weight| w.ty.layout == crate::types::Layout::RowMajor;
        let (Some(vb), Some(vs)) = (
            wb.elements().filter(|_| row_major(wb)),
            ws.elements().filter(|_| row_major(ws)),
        ) else {
            return Err(format!("is a constant {} the analysis cannot read", wb.ty));
        };
        let (vb, vs) = (vb.to_f64(), vs.to_f64());
        let same = |x: f64, y: f64| x == y || (x.is_nan() && y.is_nan());
        let (big_dims, small_dims) = (&wb.ty.dims, &ws.ty.dims);
        let mut index = vec![0usize; small_dims.len()];
        for &y in &vs {
            if !same(vb[flat(big_dims, &index)], y) {
                return Err(format!(
                    "is a constant {} whose first {} positions along the sequence differ                      from the model's at that length (at {index:?})",
                    wb.ty, self.lengths.short
                ));
            }
            next_index(small_dims, &mut index);
        }
        let mut held: Pads = self
            .axes
            .iter()
            .map(|&p| p.then_some(Padding::Any))
            .collect();
        for (k, slot) in held.iter_mut().enumerate() {
            if slot.is_none() {
                continue;
            }
            let stride: usize = big_dims[k + 1..].iter().product();
            let mut past = vb
                .iter()
                .enumerate()
                .filter(|(i, _)| (i / stride) % big_dims[k] >= self.lengths.short)
                .map(|(_, &x)| x);
            if let Some(first) = past.next() {
                if past.all(|x| same(x, first)) {
                    *slot = Some(Padding::Exact(first));
                }
            }
        }
        Ok(held)
    }
}

/// The flat row-major offset of `index` in `dims`.
fn flat(dims: &[usize], index: &[usize]) -> usize {
    dims.iter().zip(index).fold(0, |at, (&d, &i)| at * d + i)
}

/// Advances a row-major multi-index within `dims` (wrapping to zeros at the end).
fn next_index(dims: &[usize], index: &mut [usize]) {
    for k in (0..dims.len()).rev() {
        index[k] += 1;
        if index[k] < dims[k] {
            return;
        }
        index[k] = 0;
    }
}

/// Whether every element of a row-major tensor of `dims` equals its position along
/// axis `axis`.
fn is_identity_along(dims: &[usize], axis: usize, values: &[i64]) -> bool {
    let stride: usize = dims[axis + 1..].iter().product();
    values
        .iter()
        .enumerate()
        .all(|(i, &v)| v == ((i / stride) % dims[axis]) as i64)
}

/// What an elementwise op yields on padded positions holding `held` (each with its
/// operand's element type), into elements of `dtype`.
fn apply(op: &Op, held: &[(Padding, DType)], dtype: DType) -> Padding {
    if let Some(values) = held
        .iter()
        .map(|&(p, t)| match p {
            Padding::Exact(c) => Some((c, t)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
    {
        return evaluate(op, &values, dtype).map_or(Padding::Any, Padding::Exact);
    }
    let finite = |p: Padding| match p {
        Padding::Exact(c) => c.is_finite(),
        Padding::Low | Padding::Any => true,
    };
    let pads: Vec<Padding> = held.iter().map(|&(p, _)| p).collect();
    // an absorbing operand decides the result whatever the other holds: `false && x`
    // (and `0 & x` on integers), `true || x` on booleans — the padding masks of
    // exporters that combine a padded key mask with a constant one
    let absorbs = |(p, t): (Padding, DType)| match op {
        Op::Logic(LogicOp::And) => p == Padding::Exact(0.0),
        Op::Logic(LogicOp::Or) => t == DType::Bool && matches!(p, Padding::Exact(c) if c != 0.0),
        _ => false,
    };
    if let Some(&(p, _)) = held.iter().find(|&&h| absorbs(h)) {
        return p;
    }
    match (op, &pads[..]) {
        (Op::Where, &[Padding::Exact(c), t, f]) => match c != 0.0 {
            true => t,
            false => f,
        },
        (Op::Where, &[_, t, f]) if t == f => t,
        (Op::Binary(BinaryOp::Add), &[a, b])
            if (a.is_low() && finite(b)) || (b.is_low() && finite(a)) =>
        {
            Padding::Low
        }
        (Op::Binary(BinaryOp::Sub), &[a, b]) if a.is_low() && finite(b) && !b.is_low() => {
            Padding::Low
        }
        (Op::Binary(BinaryOp::Mul), &[a, Padding::Exact(c)])
        | (Op::Binary(BinaryOp::Mul), &[Padding::Exact(c), a])
            if a.is_low() && c >= 1.0 && c.is_finite() =>
        {
            Padding::Low
        }
        (Op::Cast { to }, &[a])
            if a.is_low() && matches!(to, DType::F32 | DType::F16 | DType::BF16) =>
        {
            Padding::Low
        }
        _ => Padding::Any,
    }
}

/// An elementwise op on one element per operand, by the reference interpreter.
fn evaluate(op: &Op, values: &[(f64, DType)], dtype: DType) -> Option<f64> {
    let tensors: Vec<Tensor> = values
        .iter()
        .map(|&(c, t)| {
            let data = match t {
                DType::F32 | DType::F16 | DType::BF16 => TensorData::from_f32s(t, &[c as f32])?,
                _ => TensorData::from_i64s(t, vec![c as i64]).ok()?,
            };
            Some(Tensor {
                ty: TensorType::new(t, Vec::<usize>::new()),
                data,
            })
        })
        .collect::<Option<_>>()?;
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let ty = TensorType::new(dtype, Vec::<usize>::new());
    let out = eval_op(op, &refs, &ty, &crate::weights::WeightStore::new()).ok()?;
    out.data.to_f64().first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    /// One attention head over `length` positions, its keys masked by
    /// `(1 − mask) · −10⁴` (multiplied by it instead unless `masked`).
    fn attention(length: usize, masked: bool) -> Module {
        let scores = match masked {
            true => "%5 = add %6, %4 : tensor<SxSxf32>",
            false => "%5 = mul %6, %4 : tensor<SxSxf32>",
        };
        let src = format!(
            "const @one : tensor<f32> = dense<1.0>
const @low : tensor<f32> = dense<-10000.0>
func @head(%x: tensor<Sx8xf32>, %mask: tensor<1xSxf32>) -> (y: tensor<Sx8xf32>) {{
  %0 = const @one : tensor<f32>
  %1 = sub %0, %mask : tensor<1xSxf32>
  %2 = const @low : tensor<f32>
  %3 = transpose %x {{perm = [1, 0]}} : tensor<8xSxf32>
  %4 = mul %1, %2 : tensor<1xSxf32>
  %6 = matmul %x, %3 : tensor<SxSxf32>
  {scores}
  %7 = softmax %5 {{axis = 1}} : tensor<SxSxf32>
  %8 = matmul %7, %x : tensor<Sx8xf32>
  return %8 : tensor<Sx8xf32>
}}"
        )
        .replace('S', &length.to_string());
        parse(&src, "head.tir").expect("the attention head parses")
    }

    #[test]
    fn masked_attention_pads_along_the_sequence() {
        let proof = padding_proof(&attention(8, true), &attention(5, true), 8, 5)
            .expect("a masked softmax makes padded keys weigh 0");
        assert_eq!(proof.results, vec![vec![0]]);
    }

    #[test]
    fn an_unmasked_softmax_over_the_sequence_is_refused_by_name() {
        let e = padding_proof(&attention(8, false), &attention(5, false), 8, 5)
            .expect_err("padded keys would get weight")
            .to_string();
        assert!(e.contains("softmax") && e.contains("not masked"), "{e}");
    }

    #[test]
    fn a_reduction_over_the_sequence_is_refused() {
        let model = |s: usize| {
            let src = "func @pool(%x: tensor<1xSx4xf32>) -> (y: tensor<1x1x4xf32>) {
  %0 = reduce_mean %x {axes = [1], keep_dims = true} : tensor<1x1x4xf32>
  return %0 : tensor<1x1x4xf32>
}"
            .replace('S', &s.to_string());
            parse(&src, "pool.tir").expect("parses")
        };
        let e = padding_proof(&model(16), &model(9), 16, 9)
            .expect_err("a mean over padded positions")
            .to_string();
        assert!(
            e.contains("reduce_mean") && e.contains("sequence axis 1"),
            "{e}"
        );
    }

    #[test]
    fn a_constant_that_changes_with_the_length_is_refused() {
        // position ids 0..S are a prefix-consistent constant; a reversed table is not
        let model = |s: usize, reversed: bool| {
            let table: Vec<String> = (0..s)
                .map(|i| if reversed { s - 1 - i } else { i }.to_string())
                .collect();
            let src = format!(
                "const @pos : tensor<1xSxf32> = dense<[{}]>
func @f(%x: tensor<1xSxf32>) -> (y: tensor<1xSxf32>) {{
  %0 = const @pos : tensor<1xSxf32>
  %1 = add %x, %0 : tensor<1xSxf32>
  return %1 : tensor<1xSxf32>
}}",
                table.join(", ")
            )
            .replace('S', &s.to_string());
            parse(&src, "pos.tir").expect("parses")
        };
        let proof = padding_proof(&model(8, false), &model(3, false), 8, 3).expect("a prefix");
        assert_eq!(proof.results, vec![vec![1]]);
        let e = padding_proof(&model(8, true), &model(3, true), 8, 3)
            .expect_err("a reversed table")
            .to_string();
        assert!(e.contains("first 3 positions"), "{e}");
    }
}
