//! ReduceSum, ReduceMean, ReduceMax and ReduceMin: `reduce_*` ops over the listed axes
//! (an attribute until the version where they became input 1: ReduceSum-13, the others
//! 18), `keepdims` (default 1), and `noop_with_empty_axes` (no axes: every axis, or with
//! it set, the identity); ReduceSumSquare, ReduceL1 and ReduceL2 as a sum of `x·x` or
//! `|x|` (then `sqrt`); ReduceLogSum as `log` of the sum, ReduceLogSumExp as the stable
//! `m + log(Σ exp(x − m))` with `m` the maximum; GlobalMaxPool as `reduce_max` over the
//! spatial axes; ReduceProd as repeated halving products (no product reduction in the
//! IR); ArgMax and ArgMin as reductions of the positions where the extremum is; CumSum
//! and CumProd as Hillis–Steele scans of shifted copies; TopK as `k` rounds of that
//! arg-extremum over the positions not yet taken.

use smelt_ir::op::{BinaryOp, Comparison, LogicOp, Op, ReduceAttrs, Reduction, UnaryOp};
use smelt_ir::{DType, Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "ArgMax"              [1, 11, 12, 13],                from 1  => arg_extremum;
    "ArgMin"              [1, 11, 12, 13],                from 1  => arg_extremum;
    "CumProd"             [26],                           from 26 => cumulative;
    "CumSum"              [11, 14],                       from 11 => cumulative;
    "GlobalMaxPool"       [1, 22],                        from 1  => global_max_pool;
    "ReduceL1"            [1, 11, 13, 18],                from 1  => reduce;
    "ReduceL2"            [1, 11, 13, 18],                from 1  => reduce;
    "ReduceLogSum"        [1, 11, 13, 18, 28],            from 1  => reduce;
    "ReduceLogSumExp"     [1, 11, 13, 18, 28],            from 1  => reduce;
    "ReduceMax"           [1, 11, 12, 13, 18, 20],        from 1  => reduce;
    "ReduceMean"          [1, 11, 13, 18],                from 1  => reduce;
    "ReduceMin"           [1, 11, 12, 13, 18, 20],        from 1  => reduce;
    "ReduceProd"          [1, 11, 13, 18],                from 1  => reduce;
    "ReduceSum"           [1, 11, 13],                    from 1  => reduce;
    "ReduceSumSquare"     [1, 11, 13, 18],                from 1  => reduce;
    "TopK"                [1, 10, 11, 24],                from 10 => top_k;
};

/// ReduceSum, ReduceMean, ReduceMax, ReduceMin, and the compositions the module doc names.
pub fn reduce(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let op = cx.node.op_type();
    let (r, input_from) = match op {
        "ReduceSum" => (Reduction::Sum, 13),
        "ReduceMean" => (Reduction::Mean, 18),
        "ReduceMax" => (Reduction::Max, 18),
        "ReduceMin" => (Reduction::Min, 18),
        // ReduceSumSquare, ReduceL1, ReduceL2: sums of a prepared input
        _ => (Reduction::Sum, 18),
    };
    cx.check_attrs(&["axes", "keepdims", "noop_with_empty_axes"])?;
    let rank = cx.dims(0)?.len();
    let keep_dims = cx.attr_int_or("keepdims", 1)? != 0;
    let noop_when_empty = cx.attr_int_or("noop_with_empty_axes", 0)? != 0;
    let listed = cx.versioned_axes(input_from)?.unwrap_or_default();
    let mut axes = Vec::with_capacity(listed.len());
    for &a in &listed {
        let k = cx.axis("axes", a, rank)?;
        if axes.contains(&k) {
            return Err(cx.bad_attr("axes", format!("{listed:?} repeats an axis")));
        }
        axes.push(k);
    }
    axes.sort_unstable();
    if axes.is_empty() {
        if noop_when_empty {
            return Ok(vec![cx.entry(0)?]);
        }
        axes = (0..rank).collect();
    }
    let x = cx.value(0)?;
    if matches!(op, "ReduceMax" | "ReduceMin") && cx.type_of(x).dtype == DType::Bool {
        // any / all: the reduction of the flags as 0.0 and 1.0 (an empty max is -inf,
        // an empty min +inf), then whether it exceeds one half
        let flags = cx.emit(Op::Cast { to: DType::F32 }, &[x])?;
        let y = cx.emit(Op::Reduce(r, ReduceAttrs { axes, keep_dims }), &[flags])?;
        let half = cx.scalar(0.5)?;
        let y = cx.emit(Op::Compare(Comparison::Greater), &[y, half])?;
        return Ok(vec![Entry::Value(y)]);
    }
    if op == "ReduceProd" {
        return Ok(vec![Entry::Value(product(cx, x, &axes, keep_dims)?)]);
    }
    if op == "ReduceLogSumExp" {
        let along = ReduceAttrs {
            axes: axes.clone(),
            keep_dims: true,
        };
        let m = cx.emit(Op::Reduce(Reduction::Max, along), &[x])?;
        let shifted = cx.emit(Op::Binary(BinaryOp::Sub), &[x, m])?;
        let e = cx.emit(Op::Unary(UnaryOp::Exp), &[shifted])?;
        let s = cx.emit(
            Op::Reduce(
                Reduction::Sum,
                ReduceAttrs {
                    axes: axes.clone(),
                    keep_dims,
                },
            ),
            &[e],
        )?;
        let l = cx.emit(Op::Unary(UnaryOp::Log), &[s])?;
        // the maximum, shaped as the result
        let m_out = cx.emit(
            Op::Reduce(Reduction::Max, ReduceAttrs { axes, keep_dims }),
            &[x],
        )?;
        let y = cx.emit(Op::Binary(BinaryOp::Add), &[m_out, l])?;
        return Ok(vec![Entry::Value(y)]);
    }
    let f32_input = cx.type_of(x).dtype == DType::F32;
    if op == "ReduceMean" && rank == 4 && axes == [2, 3] && keep_dims && f32_input {
        // the mean of each channel's plane, kept as 1×1, is a global average pool — as
        // torch's dynamo exporter writes SE blocks' adaptive_avg_pool2d — whose kernel
        // reads channel blocks
        return Ok(vec![Entry::Value(cx.emit(Op::GlobalAvgPool, &[x])?)]);
    }
    let summed = match op {
        "ReduceSumSquare" | "ReduceL2" => cx.emit(Op::Binary(BinaryOp::Mul), &[x, x])?,
        "ReduceL1" => cx.emit(Op::Unary(UnaryOp::Abs), &[x])?,
        _ => x,
    };
    let y = cx.emit(Op::Reduce(r, ReduceAttrs { axes, keep_dims }), &[summed])?;
    let y = match op {
        "ReduceL2" => cx.emit(Op::Unary(UnaryOp::Sqrt), &[y])?,
        "ReduceLogSum" => cx.emit(Op::Unary(UnaryOp::Log), &[y])?,
        _ => y,
    };
    Ok(vec![Entry::Value(y)])
}

/// GlobalMaxPool: the largest element of each channel's plane, as `reduce_max` over
/// every axis after the first two, kept.
pub fn global_max_pool(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let rank = cx.dims(0)?.len();
    if rank < 3 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("GlobalMaxPool needs an N x C x spatial input, got rank {rank}"),
        ));
    }
    let x = cx.value(0)?;
    let attrs = ReduceAttrs {
        axes: (2..rank).collect(),
        keep_dims: true,
    };
    Ok(vec![Entry::Value(
        cx.emit(Op::Reduce(Reduction::Max, attrs), &[x])?,
    )])
}

/// Largest index exact in float32 (2^24): ArgMax and ArgMin reduce indices as floats.
const MAX_EXACT_INDEX: usize = 1 << 24;

/// ArgMax and ArgMin along `axis` (`keepdims`, `select_last_index` from version 12) as
/// reductions: the extremum, where the input equals it, then the smallest (or, with
/// `select_last_index`, the largest) such index — the indices reduced as float32 (exact
/// below 2^24, checked), then cast to int64. A NaN counts as the largest value for ArgMax
/// and the smallest for ArgMin (tying an infinity of that sign), so the result is the
/// same index in the interpreter and on every kernel whatever their NaN rules.
pub fn arg_extremum(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let largest = cx.node.op_type() == "ArgMax";
    cx.check_attrs(&["axis", "keepdims", "select_last_index"])?;
    cx.check_max_inputs(1)?;
    let dims = cx.dims(0)?;
    let axis = cx.axis("axis", cx.attr_int_or("axis", 0)?, dims.len())?;
    let keep_dims = cx.attr_bool("keepdims", true)?;
    let last = cx.attr_bool("select_last_index", false)?;
    let n = dims[axis];
    if n > MAX_EXACT_INDEX {
        return Err(cx.err(
            "onnx-unsupported",
            format!("axis {axis} has {n} elements; smelt's ArgMax and ArgMin take at most 2^24"),
        ));
    }
    let (_, keyed) = float32_nan_as_extreme(cx, largest, "ArgMax and ArgMin")?;
    let positions = positions_along(cx, dims.len(), axis, n)?;
    let index = extremum_position(cx, keyed, positions, axis, largest, last, keep_dims)?;
    let index = cx.emit(
        Op::Cast {
            to: smelt_ir::DType::I64,
        },
        &[index],
    )?;
    Ok(vec![Entry::Value(index)])
}

/// Input 0, checked to be float32, and a copy with each NaN replaced by +inf (`largest`)
/// or -inf: the key ArgMax, ArgMin and TopK rank by, so a NaN counts as the extreme value
/// (tying an infinity of that sign) whatever the kernels' NaN rules. `ops` names the
/// operators in the error.
fn float32_nan_as_extreme(
    cx: &mut NodeCtx,
    largest: bool,
    ops: &str,
) -> Result<(Value, Value), Diagnostic> {
    let x = cx.value(0)?;
    let dtype = cx.type_of(x).dtype;
    if dtype != smelt_ir::DType::F32 {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            format!("input of type {dtype}: smelt's {ops} take float32"),
        ));
    }
    let is_number = cx.emit(Op::Compare(Comparison::Equal), &[x, x])?;
    let extreme = cx.scalar(if largest {
        f32::INFINITY
    } else {
        f32::NEG_INFINITY
    })?;
    let keyed = cx.emit(Op::Where, &[is_number, x, extreme])?;
    Ok((x, keyed))
}

/// The float32 positions `0..n` along `axis` of a rank-`rank` tensor (size 1 elsewhere),
/// a constant the position reductions broadcast against.
pub(super) fn positions_along(
    cx: &mut NodeCtx,
    rank: usize,
    axis: usize,
    n: usize,
) -> Result<Value, Diagnostic> {
    let mut dims = vec![1; rank];
    dims[axis] = n;
    let name = cx.derived_name("positions");
    cx.materialize(
        &ConstTensor::f32(dims, (0..n).map(|i| i as f32).collect()),
        &name,
    )
}

/// The float32 position along `axis` of the first element of `x` equal to
/// its largest (or smallest) value, or with `last` of the last one: the extremum, where
/// `x` equals it, then the least (greatest) such position — a miss is placed where it never
/// wins. Exact below 2^24 positions.
pub(super) fn extremum_position(
    cx: &mut NodeCtx,
    x: Value,
    positions: Value,
    axis: usize,
    largest: bool,
    last: bool,
    keep_dims: bool,
) -> Result<Value, Diagnostic> {
    let along = |keep_dims| ReduceAttrs {
        axes: vec![axis],
        keep_dims,
    };
    let extremum = if largest {
        Reduction::Max
    } else {
        Reduction::Min
    };
    let best = cx.emit(Op::Reduce(extremum, along(true)), &[x])?;
    let hit = cx.emit(Op::Compare(Comparison::Equal), &[x, best])?;
    let n = cx.type_of(x).dims[axis];
    let (miss, pick) = if last {
        (-1.0, Reduction::Max)
    } else {
        (n as f32, Reduction::Min)
    };
    let miss = cx.scalar(miss)?;
    let candidates = cx.emit(Op::Where, &[hit, positions, miss])?;
    cx.emit(Op::Reduce(pick, along(keep_dims)), &[candidates])
}

/// Most elements TopK takes: each is one round of about ten ops over the whole input.
const MAX_TOP_K: usize = 64;

/// TopK (k known at import): the `k` largest (or, with `largest = 0`, smallest) elements
/// along `axis` and their positions, in order, equal values by lower position first, as
/// ONNX says; NaN counts as the largest, resp. smallest, value, as in ArgMax. Each round
/// takes the arg-extremum of the positions not yet taken (`sorted = 0` leaves the order
/// to the implementation, so this sorted one is valid too).
pub fn top_k(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis", "largest", "sorted"])?;
    cx.check_max_inputs(2)?;
    let dims = cx.dims(0)?;
    let axis = cx.axis("axis", cx.attr_int_or("axis", -1)?, dims.len())?;
    let largest = cx.attr_bool("largest", true)?;
    let k = cx.const_int(1, "k")?;
    let n = dims[axis];
    if k < 0 || k as usize > n {
        return Err(cx.err(
            "onnx-bad-model",
            format!("k = {k} must be from 0 to the length {n} of axis {axis}"),
        ));
    }
    let k = k as usize;
    if k > MAX_TOP_K || k == 0 || n > MAX_EXACT_INDEX {
        return Err(cx.err(
            "onnx-unsupported",
            format!(
                "k = {k} along an axis of {n}: smelt's TopK takes k from 1 to {MAX_TOP_K} \
                 (one round of ops per element) on axes of at most 2^24"
            ),
        ));
    }
    // NaN as the extreme, so it is taken first, as ArgMax counts it
    let (x, keyed) = float32_nan_as_extreme(cx, largest, "TopK")?;
    let (extreme, reduction) = if largest {
        (f32::INFINITY, Reduction::Max)
    } else {
        (f32::NEG_INFINITY, Reduction::Min)
    };
    let along = ReduceAttrs {
        axes: vec![axis],
        keep_dims: true,
    };
    let iota = positions_along(cx, dims.len(), axis, n)?;
    let past_end = cx.scalar(n as f32)?;
    let zero = cx.scalar(0.0)?;
    let opposite = cx.scalar(-extreme)?;
    let mut available = cx.emit(Op::Compare(Comparison::Equal), &[keyed, keyed])?;
    let (mut values, mut indices) = (Vec::with_capacity(k), Vec::with_capacity(k));
    for _ in 0..k {
        // taken positions are excluded by the mask, not by a sentinel value, so an
        // infinite element still ranks by its position
        let candidates = cx.emit(Op::Where, &[available, keyed, opposite])?;
        let best = cx.emit(Op::Reduce(reduction, along.clone()), &[candidates])?;
        let equal = cx.emit(Op::Compare(Comparison::Equal), &[candidates, best])?;
        let hit = cx.emit(Op::Logic(LogicOp::And), &[equal, available])?;
        let positions = cx.emit(Op::Where, &[hit, iota, past_end])?;
        let index = cx.emit(Op::Reduce(Reduction::Min, along.clone()), &[positions])?;
        let chosen = cx.emit(Op::Compare(Comparison::Equal), &[iota, index])?;
        // the one chosen element, NaN included (the rest contribute +0)
        let picked = cx.emit(Op::Where, &[chosen, x, zero])?;
        values.push(cx.emit(Op::Reduce(Reduction::Sum, along.clone()), &[picked])?);
        indices.push(index);
        available = cx.emit(Op::Logic(LogicOp::Xor), &[available, chosen])?;
    }
    let values = if k == 1 {
        values[0]
    } else {
        cx.emit(Op::Concat { axis }, &values)?
    };
    let indices = if k == 1 {
        indices[0]
    } else {
        cx.emit(Op::Concat { axis }, &indices)?
    };
    let indices = cx.emit(
        Op::Cast {
            to: smelt_ir::DType::I64,
        },
        &[indices],
    )?;
    Ok(vec![Entry::Value(values), Entry::Value(indices)])
}

/// The product of `x` over `axes`: the reduced axes moved last and merged into one of
/// length `R`, padded with ones to a power of two, then halved `log₂ R` times by
/// multiplying its two halves — exact on integers (wrapping, as ONNX's), and on floats
/// one rounding per product as a sequential product has, in a balanced order.
fn product(
    cx: &mut NodeCtx,
    x: Value,
    axes: &[usize],
    keep_dims: bool,
) -> Result<Value, Diagnostic> {
    use smelt_ir::op::SliceAttrs;
    let dims = cx.type_of(x).dims.clone();
    let dtype = cx.type_of(x).dtype;
    let kept_axes: Vec<usize> = (0..dims.len()).filter(|k| !axes.contains(k)).collect();
    let perm: Vec<usize> = kept_axes.iter().chain(axes).copied().collect();
    let moved = if perm.iter().enumerate().all(|(i, &k)| i == k) {
        x
    } else {
        cx.emit(Op::Transpose { perm }, &[x])?
    };
    let kept: usize = kept_axes.iter().map(|&k| dims[k]).product();
    let reduced: usize = axes.iter().map(|&k| dims[k]).product();
    let mut rows = cx.reshape(moved, vec![kept, reduced])?;
    let width = reduced.next_power_of_two();
    if width > reduced {
        let ones = ConstTensor::f32(
            vec![kept, width - reduced],
            vec![1.0; kept * (width - reduced)],
        );
        let name = cx.derived_name("ones");
        let mut ones = cx.materialize(&ones, &name)?;
        if dtype != smelt_ir::DType::F32 {
            ones = cx.emit(Op::Cast { to: dtype }, &[ones])?;
        }
        rows = cx.emit(Op::Concat { axis: 1 }, &[rows, ones])?;
    }
    let half = |lo: usize, hi: usize| {
        Op::Slice(SliceAttrs {
            starts: vec![0, lo as i64],
            ends: vec![kept as i64, hi as i64],
            steps: vec![1, 1],
        })
    };
    let mut width = width;
    while width > 1 {
        let h = width / 2;
        let a = cx.emit(half(0, h), &[rows])?;
        let b = cx.emit(half(h, width), &[rows])?;
        rows = cx.emit(Op::Binary(BinaryOp::Mul), &[a, b])?;
        width = h;
    }
    let out: Vec<usize> = (0..dims.len())
        .filter_map(|k| match (axes.contains(&k), keep_dims) {
            (false, _) => Some(dims[k]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    cx.reshape(rows, out)
}

/// CumSum and CumProd along `axis` (input 1, known at import), `exclusive` and
/// `reverse`, as a Hillis–Steele scan: `⌈log₂ n⌉` steps, each combining the running
/// result with itself shifted by the next power of two (the shifted-in positions the
/// identity, 0 or 1) — exact on integers (wrapping, as ONNX's), and on floats as accurate
/// as a sequential scan or better (each sum a balanced tree of the terms). An exclusive
/// scan first shifts the input by one.
pub fn cumulative(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let sum = cx.node.op_type() == "CumSum";
    cx.check_attrs(&["exclusive", "reverse"])?;
    cx.check_max_inputs(2)?;
    let dims = cx.dims(0)?;
    let axis = cx.axis("axis", cx.const_int(1, "axis")?, dims.len())?;
    let exclusive = cx.attr_bool("exclusive", false)?;
    let reverse = cx.attr_bool("reverse", false)?;
    let x = cx.value(0)?;
    let dtype = cx.type_of(x).dtype;
    if dtype == smelt_ir::DType::Bool {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            "a bool input: CumSum and CumProd take numbers",
        ));
    }
    let n = dims[axis];
    let (identity, combine) = if sum {
        (0.0, BinaryOp::Add)
    } else {
        (1.0, BinaryOp::Mul)
    };
    // `v` shifted by `d` along the axis toward the scan's end, the identity shifted in
    let shift = |cx: &mut NodeCtx, v: Value, d: usize| -> Result<Value, Diagnostic> {
        let mut fill_dims = dims.clone();
        fill_dims[axis] = d.min(n);
        let count: usize = fill_dims.iter().product();
        let name = cx.derived_name("scan_identity");
        let mut fill =
            cx.materialize(&ConstTensor::f32(fill_dims, vec![identity; count]), &name)?;
        if dtype != smelt_ir::DType::F32 {
            fill = cx.emit(Op::Cast { to: dtype }, &[fill])?;
        }
        if d >= n {
            return Ok(fill);
        }
        let mut starts = vec![0i64; dims.len()];
        let mut ends: Vec<i64> = dims.iter().map(|&k| k as i64).collect();
        if reverse {
            starts[axis] = d as i64;
        } else {
            ends[axis] = (n - d) as i64;
        }
        let kept = cx.emit(
            Op::Slice(smelt_ir::op::SliceAttrs {
                starts,
                ends,
                steps: vec![1; dims.len()],
            }),
            &[v],
        )?;
        let parts = if reverse { [kept, fill] } else { [fill, kept] };
        cx.emit(Op::Concat { axis }, &parts)
    };
    let mut y = if exclusive { shift(cx, x, 1)? } else { x };
    let mut d = 1;
    while d < n {
        let moved = shift(cx, y, d)?;
        y = cx.emit(Op::Binary(combine), &[y, moved])?;
        d *= 2;
    }
    Ok(vec![Entry::Value(y)])
}
