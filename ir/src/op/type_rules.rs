//! The type rules: `Op::infer_type` and the shape helpers it shares (`broadcast`, conv
//! and matmul result types).

use super::{Conv2dAttrs, ConvTranspose2dAttrs, Op, PadMode, UnaryOp};
use crate::types::{DType, Layout, TensorType};
use crate::weights::WeightId;

impl Op {
    /// The type rule: the result type for these operand types, or a message saying
    /// which operand or attribute is wrong. Operand counts are checked by the caller
    /// against [`Op::arity`]; this checks them again so it never indexes out of bounds.
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
        let dtype = self.result_dtype(operands)?;
        let out = match self {
            Op::Const(id) => weight_type(*id).ok_or_else(|| format!("unknown weight {}", id.0))?,
            Op::Conv2d(a) => conv2d_type(a, operands)?,
            Op::ConvTranspose2d(a) => conv_transpose2d_type(a, operands)?,
            Op::BatchNorm { .. } => {
                let x = operands[0];
                if x.rank() < 2 {
                    return Err(format!("batch_norm input must have rank >= 2, got {x}"));
                }
                let c = x.dims[1];
                for (i, name) in ["scale", "bias", "mean", "var"].iter().enumerate() {
                    expect_vector(operands[i + 1], c, name, "input channel count")?;
                }
                plain(x.clone())
            }
            Op::Unary(_) => plain(operands[0].clone()),
            Op::Binary(_) => {
                let dims = broadcast(&operands[0].dims, &operands[1].dims)?;
                TensorType::f32(dims)
            }
            Op::LayerNorm { axis, .. } => {
                let x = operands[0];
                if *axis >= x.rank() {
                    return Err(format!("layer_norm axis {axis} out of range for {x}"));
                }
                let norm = &x.dims[*axis..];
                for (i, t) in operands[1..].iter().enumerate() {
                    if t.dims != norm {
                        return Err(format!(
                            "layer_norm {} has shape {t}, expected dims {norm:?}",
                            ["scale", "bias"][i]
                        ));
                    }
                }
                plain(x.clone())
            }
            Op::MaxPool2d(p) | Op::AvgPool2d { pool: p, .. } => {
                let x = expect_rank(operands[0], 4, "pool input")?;
                if p.kernel.contains(&0) || p.strides.contains(&0) || p.dilations.contains(&0) {
                    return Err("pool kernel, strides and dilations must be positive".into());
                }
                if p.pads[0] >= p.kernel[0] * p.dilations[0]
                    || p.pads[1] >= p.kernel[1] * p.dilations[1]
                    || p.pads[2] >= p.kernel[0] * p.dilations[0]
                    || p.pads[3] >= p.kernel[1] * p.dilations[1]
                {
                    return Err(format!(
                        "pool pads {:?} must be smaller than the window {:?}",
                        p.pads, p.kernel
                    ));
                }
                let oh = p.output_size(0, x.dims[2]);
                let ow = p.output_size(1, x.dims[3]);
                let result = match (oh, ow) {
                    (Some(oh), Some(ow)) if oh > 0 && ow > 0 => {
                        TensorType::f32([x.dims[0], x.dims[1], oh, ow]).with_layout(p.layout)
                    }
                    _ => return Err(format!("pool window {:?} does not fit input {x}", p.kernel)),
                };
                if let Layout::Blocked { axis, block } = p.layout {
                    if axis != 1 || block == 0 || !result.dims[1].is_multiple_of(block as usize) {
                        return Err(format!(
                            "pool result layout {:?} does not fit {result}",
                            p.layout
                        ));
                    }
                }
                result
            }
            Op::GlobalAvgPool => {
                let x = operands[0];
                if x.rank() < 3 {
                    return Err(format!(
                        "global_avg_pool input must have rank >= 3, got {x}"
                    ));
                }
                let mut dims = x.dims.clone();
                for d in &mut dims[2..] {
                    *d = 1;
                }
                TensorType::f32(dims)
            }
            Op::Flatten { axis } => {
                let x = operands[0];
                if *axis > x.rank() {
                    return Err(format!("flatten axis {axis} out of range for {x}"));
                }
                let outer: usize = x.dims[..*axis].iter().product();
                let inner: usize = x.dims[*axis..].iter().product();
                TensorType::f32([outer, inner])
            }
            Op::Reshape { shape } => {
                let x = operands[0];
                let want = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if want != Some(x.num_elements()) {
                    return Err(format!(
                        "reshape of {x} ({} elements) to {shape:?} changes the element count",
                        x.num_elements()
                    ));
                }
                TensorType::f32(shape.clone())
            }
            Op::Transpose { perm } => {
                let x = operands[0];
                let mut seen = vec![false; x.rank()];
                if perm.len() != x.rank() {
                    return Err(format!(
                        "transpose perm {perm:?} does not match rank of {x}"
                    ));
                }
                for &p in perm {
                    if p >= x.rank() || std::mem::replace(&mut seen[p], true) {
                        return Err(format!("transpose perm {perm:?} is not a permutation"));
                    }
                }
                TensorType::f32(perm.iter().map(|&p| x.dims[p]).collect::<Vec<_>>())
            }
            Op::MatMul => matmul_type(operands[0], operands[1])?,
            Op::Expand { shape } => {
                let x = operands[0];
                let fits = broadcast(&x.dims, shape).is_ok_and(|b| b == *shape);
                if !fits {
                    return Err(format!(
                        "expand of {x} to {shape:?}: the input does not broadcast to that shape"
                    ));
                }
                TensorType::f32(shape.clone())
            }
            Op::Tile { repeats } => {
                let x = operands[0];
                if repeats.len() != x.rank() {
                    return Err(format!(
                        "tile repeats {repeats:?} must have one entry per axis of {x}"
                    ));
                }
                if repeats.contains(&0) {
                    return Err(format!(
                        "tile repeats {repeats:?} must be at least 1 (tensors have no empty dims)"
                    ));
                }
                let dims = x
                    .dims
                    .iter()
                    .zip(repeats)
                    .map(|(&d, &r)| d.checked_mul(r))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("tile of {x} by {repeats:?} is too large"))?;
                TensorType::f32(dims)
            }
            Op::Slice(s) => {
                let dims = s.result_dims(&operands[0].dims)?;
                if let Some(k) = dims.iter().position(|&d| d == 0) {
                    return Err(format!(
                        "slice of {} selects no elements along axis {k} (start {}, end {}, step {}); tensors have no empty dims",
                        operands[0], s.starts[k], s.ends[k], s.steps[k]
                    ));
                }
                TensorType::f32(dims)
            }
            Op::Pad(p) => {
                let x = operands[0];
                let dims = p.result_dims(&x.dims)?;
                if let Some(v) = operands.get(1) {
                    if p.mode != PadMode::Constant {
                        return Err(format!(
                            "pad in {} mode takes no fill value operand (only constant mode fills)",
                            p.mode.name()
                        ));
                    }
                    if v.num_elements() != 1 {
                        return Err(format!("pad fill value {v} must hold exactly one element"));
                    }
                }
                TensorType::f32(dims)
            }
            Op::Gemm(g) => {
                let a = expect_rank(operands[0], 2, "gemm A")?;
                let b = expect_rank(operands[1], 2, "gemm B")?;
                let (m, ka) = if g.trans_a {
                    (a.dims[1], a.dims[0])
                } else {
                    (a.dims[0], a.dims[1])
                };
                let (kb, n) = if g.trans_b {
                    (b.dims[1], b.dims[0])
                } else {
                    (b.dims[0], b.dims[1])
                };
                if ka != kb {
                    return Err(format!(
                        "gemm inner dimensions differ: A gives K = {ka}, B gives K = {kb}"
                    ));
                }
                if let Some(c) = operands.get(2) {
                    let bc = broadcast(&c.dims, &[m, n])?;
                    if bc != [m, n] {
                        return Err(format!("gemm C {c} does not broadcast to [{m}, {n}]"));
                    }
                }
                TensorType::f32([m, n])
            }
            Op::Concat { axis } => {
                let first = operands[0];
                if *axis >= first.rank() {
                    return Err(format!("concat axis {axis} out of range for {first}"));
                }
                let mut dims = first.dims.clone();
                for (i, t) in operands.iter().enumerate().skip(1) {
                    let same_rest = t.rank() == first.rank()
                        && t.dims
                            .iter()
                            .zip(&first.dims)
                            .enumerate()
                            .all(|(k, (a, b))| k == *axis || a == b);
                    if !same_rest {
                        return Err(format!(
                            "concat operand {i} {t} does not match {first} outside axis {axis}"
                        ));
                    }
                    dims[*axis] += t.dims[*axis];
                }
                TensorType::f32(dims)
            }
            Op::Softmax { axis } => {
                let x = operands[0];
                if *axis >= x.rank() {
                    return Err(format!("softmax axis {axis} out of range for {x}"));
                }
                plain(x.clone())
            }
            Op::Reorder { layout } => {
                let x = operands[0];
                if let Layout::Blocked { axis, block } = layout {
                    if *axis as usize >= x.rank() || *block == 0 {
                        return Err(format!("layout {layout:?} does not fit {x}"));
                    }
                }
                x.with_layout(*layout)
            }
            Op::BnFoldWeight { .. } => {
                let w = operands[0];
                if w.rank() < 1 {
                    return Err("bn_fold_weight weight must have rank >= 1".into());
                }
                expect_vector(operands[1], w.dims[0], "scale", "output channel count")?;
                expect_vector(operands[2], w.dims[0], "var", "output channel count")?;
                plain(w.clone())
            }
            Op::BnFoldBias { .. } => {
                let c = operands[0].dims.first().copied().unwrap_or(0);
                for (i, t) in operands.iter().enumerate() {
                    let name = ["scale", "bias", "mean", "var", "conv_bias"][i];
                    expect_vector(t, c, name, "channel count")?;
                }
                TensorType::f32([c])
            }
            Op::BnScale { .. } | Op::BnShift { .. } => {
                let c = operands[0].dims.first().copied().unwrap_or(0);
                let names: &[&str] = match self {
                    Op::BnScale { .. } => &["scale", "var"],
                    _ => &["scale", "bias", "mean", "var"],
                };
                for (t, name) in operands.iter().zip(names) {
                    expect_vector(t, c, name, "channel count")?;
                }
                TensorType::f32([c, 1, 1])
            }
            Op::ChannelScale => {
                let (w, s) = (operands[0], operands[1]);
                let o = w.dims.first().copied().unwrap_or(0);
                if w.rank() < 1 || s.num_elements() != o {
                    return Err(format!(
                        "channel_scale needs one scale per index of the first axis of {w}, got {s}"
                    ));
                }
                plain(w.clone())
            }
            Op::ChannelVector => TensorType::f32([operands[0].num_elements()]),
            Op::ConvShiftBias => {
                let w = expect_rank(operands[0], 4, "conv_shift_bias weight")?;
                let t = operands[1];
                let (o, cg) = (w.dims[0], w.dims[1]);
                let c = t.num_elements();
                let groups_fit =
                    cg > 0 && c >= cg && c.is_multiple_of(cg) && o.is_multiple_of(c / cg);
                if !groups_fit {
                    return Err(format!(
                        "conv_shift_bias: {t} has no whole number of groups of the {cg} input channels of weight {w}"
                    ));
                }
                TensorType::f32([o])
            }
            Op::Cast { .. } | Op::Not => plain(operands[0].clone()),
            Op::Reduce(_, r) => TensorType::f32(r.result_dims(&operands[0].dims)?),
            Op::Resize(r) => {
                let x = operands[0];
                if r.sizes.len() != x.rank() || r.scales.len() != x.rank() {
                    return Err(format!(
                        "resize of {x} needs one size and one scale per axis, got {:?} and {} scales",
                        r.sizes,
                        r.scales.len()
                    ));
                }
                if r.sizes.contains(&0) || x.dims.contains(&0) {
                    return Err(format!(
                        "resize of {x} to {:?}: tensors have no empty dims",
                        r.sizes
                    ));
                }
                if let Some(s) = r.scales.iter().find(|s| !(s.0.is_finite() && s.0 > 0.0)) {
                    return Err(format!("resize scale {} must be positive and finite", s.0));
                }
                TensorType::f32(r.sizes.clone())
            }
            Op::Compare(_) | Op::Logic(_) => {
                TensorType::f32(broadcast(&operands[0].dims, &operands[1].dims)?)
            }
            Op::Where => {
                let ab = broadcast(&operands[1].dims, &operands[2].dims)?;
                TensorType::f32(broadcast(&operands[0].dims, &ab)?)
            }
            Op::Gather { axis } => {
                let (data, indices) = (operands[0], operands[1]);
                if *axis >= data.rank() {
                    return Err(format!("gather axis {axis} out of range for {data}"));
                }
                if data.dims[*axis] == 0 {
                    return Err(format!("gather from {data}: axis {axis} is empty"));
                }
                let mut dims = data.dims[..*axis].to_vec();
                dims.extend_from_slice(&indices.dims);
                dims.extend_from_slice(&data.dims[axis + 1..]);
                TensorType::f32(dims)
            }
            Op::Fused(f) => {
                if !f.anchor.is_anchor() {
                    return Err(format!("'{}' cannot anchor a fused op", f.anchor.name()));
                }
                let n_anchor = operands.len() - f.num_post_operands();
                let acc = f.anchor.infer_type(&operands[..n_anchor], weight_type)?;
                for (i, t) in operands[n_anchor..].iter().enumerate() {
                    let b = broadcast(&acc.dims, &t.dims)?;
                    if b != acc.dims {
                        return Err(format!(
                            "post-op operand {i} {t} does not broadcast to the anchor result {acc}"
                        ));
                    }
                }
                acc
            }
        };
        let out = match self {
            // a weight keeps its own element type
            Op::Const(_) => out,
            _ => out.with_dtype(dtype),
        };
        out.check_size()?;
        Ok(out)
    }
}

impl Op {
    /// The element-type half of the type rule: checks the operands' element types and
    /// gives the result's. Floating-point ops take `f32`; arithmetic (`add`, `neg`, ...)
    /// takes one numeric type; data movement takes any, one type across operands.
    fn result_dtype(&self, operands: &[&TensorType]) -> Result<DType, String> {
        let name = self.name();
        let need = |i: usize, ok: &dyn Fn(DType) -> bool, what: &str| -> Result<DType, String> {
            let d = operands[i].dtype;
            if ok(d) {
                Ok(d)
            } else {
                Err(format!("operand {i} of '{name}' must be {what}, got {d}"))
            }
        };
        let same_as = |first: usize, i: usize| -> Result<(), String> {
            let (a, b) = (operands[first].dtype, operands[i].dtype);
            if a == b {
                Ok(())
            } else {
                Err(format!(
                    "operands {first} and {i} of '{name}' must have one element type, got {a} and {b}"
                ))
            }
        };
        let all_f32 = || -> Result<DType, String> {
            for i in 0..operands.len() {
                need(i, &|d| d == DType::F32, "f32")?;
            }
            Ok(DType::F32)
        };
        match self {
            Op::Const(_) => Ok(DType::F32),
            Op::Unary(UnaryOp::Neg | UnaryOp::Abs) => need(0, &DType::is_numeric, "numeric"),
            Op::Binary(_) => {
                same_as(0, 1)?;
                need(0, &DType::is_numeric, "numeric")
            }
            Op::Pad(_) => {
                if operands.len() > 1 {
                    same_as(0, 1)?;
                }
                Ok(operands[0].dtype)
            }
            Op::Flatten { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice(_)
            | Op::Expand { .. }
            | Op::Tile { .. }
            | Op::Reorder { .. } => Ok(operands[0].dtype),
            Op::Concat { .. } => {
                for i in 1..operands.len() {
                    same_as(0, i)?;
                }
                Ok(operands[0].dtype)
            }
            Op::Cast { to } => Ok(*to),
            Op::Compare(_) => {
                same_as(0, 1)?;
                Ok(DType::Bool)
            }
            Op::Logic(_) | Op::Not => {
                for i in 0..operands.len() {
                    need(i, &|d| d == DType::Bool, "i1")?;
                }
                Ok(DType::Bool)
            }
            Op::Where => {
                need(0, &|d| d == DType::Bool, "i1")?;
                same_as(1, 2)?;
                Ok(operands[1].dtype)
            }
            Op::Gather { .. } => {
                need(1, &DType::is_integer, "i64 or i32")?;
                Ok(operands[0].dtype)
            }
            Op::Resize(r) => match r.mode {
                super::ResizeMode::Nearest(_) => Ok(operands[0].dtype),
                super::ResizeMode::Linear => all_f32(),
            },
            Op::Conv2d(_)
            | Op::BatchNorm { .. }
            | Op::Unary(_)
            | Op::LayerNorm { .. }
            | Op::MaxPool2d(_)
            | Op::AvgPool2d { .. }
            | Op::GlobalAvgPool
            | Op::MatMul
            | Op::Gemm(_)
            | Op::Softmax { .. }
            | Op::BnFoldWeight { .. }
            | Op::BnFoldBias { .. }
            | Op::BnScale { .. }
            | Op::BnShift { .. }
            | Op::ChannelScale
            | Op::ChannelVector
            | Op::ConvShiftBias
            | Op::Reduce(..)
            | Op::Fused(_)
            | Op::ConvTranspose2d(_) => all_f32(),
        }
    }
}

fn plain(t: TensorType) -> TensorType {
    t.with_layout(Layout::RowMajor)
}

fn expect_rank<'a>(t: &'a TensorType, rank: usize, what: &str) -> Result<&'a TensorType, String> {
    if t.rank() == rank {
        Ok(t)
    } else {
        Err(format!("{what} must have rank {rank}, got {t}"))
    }
}

fn expect_vector(t: &TensorType, len: usize, name: &str, what: &str) -> Result<(), String> {
    if t.dims == [len] {
        Ok(())
    } else {
        Err(format!(
            "{name} has shape {t}, expected tensor<{len}xf32> to match the {what} {len}"
        ))
    }
}

fn conv2d_type(a: &Conv2dAttrs, operands: &[&TensorType]) -> Result<TensorType, String> {
    let x = expect_rank(operands[0], 4, "conv2d input")?;
    let w = expect_rank(operands[1], 4, "conv2d weight")?;
    if a.strides.contains(&0) || a.dilations.contains(&0) || a.groups == 0 {
        return Err("conv2d strides, dilations and groups must be positive".into());
    }
    let [n, c, h, wd] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let [o, cg, kh, kw] = [w.dims[0], w.dims[1], w.dims[2], w.dims[3]];
    if c % a.groups != 0 || o % a.groups != 0 {
        return Err(format!(
            "conv2d groups = {} must divide input channels {c} and output channels {o}",
            a.groups
        ));
    }
    if cg * a.groups != c {
        return Err(format!(
            "conv2d weight has {cg} input channels per group, input has {c} channels in {} groups",
            a.groups
        ));
    }
    if let Some(b) = operands.get(2) {
        expect_vector(b, o, "conv2d bias", "output channel count")?;
    }
    let out = |i: usize, input: usize, k: usize| -> Option<usize> {
        let span = a.dilations[i] * (k.checked_sub(1)?) + 1;
        let padded = input + a.pads[i] + a.pads[i + 2];
        Some(padded.checked_sub(span)? / a.strides[i] + 1)
    };
    match (out(0, h, kh), out(1, wd, kw)) {
        (Some(oh), Some(ow)) => {
            let result = TensorType::f32([n, o, oh, ow]).with_layout(a.layout);
            if let Layout::Blocked { axis, block } = a.layout {
                if axis >= 4 || block == 0 {
                    return Err(format!("conv2d result layout {a:?} does not fit {result}"));
                }
            }
            Ok(result)
        }
        _ => Err(format!(
            "conv2d kernel {kh}x{kw} (dilations {:?}) does not fit the padded input {h}x{wd}",
            a.dilations
        )),
    }
}

fn conv_transpose2d_type(
    a: &ConvTranspose2dAttrs,
    operands: &[&TensorType],
) -> Result<TensorType, String> {
    let x = expect_rank(operands[0], 4, "conv_transpose2d input")?;
    let w = expect_rank(operands[1], 4, "conv_transpose2d weight")?;
    if a.strides.contains(&0) || a.dilations.contains(&0) || a.groups == 0 {
        return Err("conv_transpose2d strides, dilations and groups must be positive".into());
    }
    let [n, c, h, wd] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let [wc, og, kh, kw] = [w.dims[0], w.dims[1], w.dims[2], w.dims[3]];
    if c % a.groups != 0 {
        return Err(format!(
            "conv_transpose2d groups = {} must divide the input channels {c}",
            a.groups
        ));
    }
    if wc != c {
        return Err(format!(
            "conv_transpose2d weight {w} must have one row per input channel ({c})"
        ));
    }
    let o = og * a.groups;
    if let Some(b) = operands.get(2) {
        expect_vector(b, o, "conv_transpose2d bias", "output channel count")?;
    }
    match (a.output_size(0, h, kh), a.output_size(1, wd, kw)) {
        (Some(oh), Some(ow)) => Ok(TensorType::f32([n, o, oh, ow])),
        _ => Err(format!(
            "conv_transpose2d kernel {kh}x{kw} (strides {:?}, dilations {:?}, output padding \
             {:?}) over the input {h}x{wd} leaves nothing inside pads {:?}",
            a.strides, a.dilations, a.output_padding, a.pads
        )),
    }
}

/// Numpy broadcasting of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(format!(
                    "shapes {a:?} and {b:?} do not broadcast (dimension {i}: {da} vs {db})"
                ))
            }
        };
    }
    Ok(out)
}

fn matmul_type(a: &TensorType, b: &TensorType) -> Result<TensorType, String> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err("matmul operands must have rank >= 1".into());
    }
    let a2 = if a.rank() == 1 {
        vec![1, a.dims[0]]
    } else {
        a.dims.clone()
    };
    let b2 = if b.rank() == 1 {
        vec![b.dims[0], 1]
    } else {
        b.dims.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(format!(
            "matmul inner dimensions differ: {a} @ {b} ({k} vs {kb})"
        ));
    }
    let mut dims = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    if a.rank() > 1 {
        dims.push(m);
    }
    if b.rank() > 1 {
        dims.push(n);
    }
    Ok(TensorType::f32(dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_weights(_: WeightId) -> Option<TensorType> {
        None
    }

    #[test]
    fn conv_output_shape_with_stride_pads_dilation() {
        let x = TensorType::f32([1, 4, 10, 9]);
        let w = TensorType::f32([6, 2, 3, 3]);
        let op = Op::Conv2d(Conv2dAttrs {
            strides: [2, 1],
            pads: [1, 0, 2, 1],
            dilations: [1, 2],
            groups: 2,
            layout: Layout::RowMajor,
        });
        let t = op.infer_type(&[&x, &w], &no_weights).unwrap();
        // H: (10 + 3 - 3) / 2 + 1 = 6; W: (9 + 1 - 5) / 1 + 1 = 6
        assert_eq!(t.dims, vec![1, 6, 6, 6]);
    }

    #[test]
    fn conv_result_takes_the_layout_attribute() {
        let blocks = Layout::Blocked { axis: 1, block: 16 };
        let x = TensorType::f32([1, 32, 5, 5]);
        let w = TensorType::f32([48, 32, 1, 1]);
        let conv = |layout| {
            Op::Conv2d(Conv2dAttrs {
                layout,
                ..Conv2dAttrs::default()
            })
        };
        let t = conv(blocks).infer_type(&[&x.with_layout(blocks), &w], &no_weights);
        assert_eq!(
            t.unwrap(),
            TensorType::f32([1, 48, 5, 5]).with_layout(blocks)
        );
        let bad = Layout::Blocked { axis: 4, block: 8 };
        let e = conv(bad).infer_type(&[&x, &w], &no_weights).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
    }

    #[test]
    fn broadcast_rules() {
        assert_eq!(
            broadcast(&[1, 64, 1, 1], &[2, 64, 7, 7]).unwrap(),
            vec![2, 64, 7, 7]
        );
        assert_eq!(
            broadcast(&[64, 1, 1], &[1, 64, 7, 7]).unwrap(),
            vec![1, 64, 7, 7]
        );
        assert!(broadcast(&[3], &[4]).is_err());
    }
}
