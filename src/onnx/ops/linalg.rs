//! Matrix ops, Softmax and Hardmax: Gemm, MatMul, Softmax and Hardmax (with their pre-13
//! flattening semantics), LogSoftmax, and DFT as products with constant cosine and sine
//! matrices.

use smelt_ir::op::{Comparison, GemmAttrs, Op, ReduceAttrs, Reduction};
use smelt_ir::{DType, Diagnostic, Value, F32};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "DFT"                 [17, 20],                       from 17 => dft;
    "Gemm"                [1, 6, 7, 9, 11, 13],           from 6  => gemm;
    "Hardmax"             [1, 11, 13],                  from 1  => hardmax;
    "LogSoftmax"          [1, 11, 13],                    from 1  => log_softmax;
    "MatMul"              [1, 9, 13],                     from 1  => matmul;
    "Softmax"             [1, 11, 13],                    from 1  => softmax;
};

/// Gemm: `alpha * op(A) * op(B) + beta * C` with optional C (from version 11). Version 6's
/// `broadcast` flag only allowed what numpy broadcasting of C allows.
pub fn gemm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["alpha", "beta", "transA", "transB", "broadcast"])?;
    let attrs = GemmAttrs {
        alpha: F32(cx.attr_float_or("alpha", 1.0)?),
        beta: F32(cx.attr_float_or("beta", 1.0)?),
        trans_a: cx.attr_bool("transA", false)?,
        trans_b: cx.attr_bool("transB", false)?,
    };
    let mut operands = vec![cx.value(0)?, cx.value(1)?];
    if let Some(c) = cx.opt_value(2)? {
        operands.push(c);
    }
    Ok(vec![Entry::Value(cx.emit(Op::Gemm(attrs), &operands)?)])
}

/// MatMul with numpy semantics.
pub fn matmul(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let a = cx.value(0)?;
    let b = cx.value(1)?;
    Ok(vec![Entry::Value(cx.emit(Op::MatMul, &[a, b])?)])
}

/// LogSoftmax as `x − max − log(Σ exp(x − max))` along the axis (the stable form
/// onnxruntime computes), with Softmax's axis rules (one axis from 13, flattened before).
pub fn log_softmax(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    along_softmax_axis(cx, |cx, x, _, axis| log_softmax_of(cx, x, axis))
}

/// `x − max − log(Σ exp(x − max))` along `axis` (the stable form onnxruntime computes).
pub(super) fn log_softmax_of(cx: &mut NodeCtx, x: Value, axis: usize) -> Result<Value, Diagnostic> {
    use smelt_ir::op::{BinaryOp, UnaryOp};
    let along = ReduceAttrs {
        axes: vec![axis],
        keep_dims: true,
    };
    let max = cx.emit(Op::Reduce(Reduction::Max, along.clone()), &[x])?;
    let shifted = cx.emit(Op::Binary(BinaryOp::Sub), &[x, max])?;
    let e = cx.emit(Op::Unary(UnaryOp::Exp), &[shifted])?;
    let sum = cx.emit(Op::Reduce(Reduction::Sum, along), &[e])?;
    let log_sum = cx.emit(Op::Unary(UnaryOp::Log), &[sum])?;
    cx.emit(Op::Binary(BinaryOp::Sub), &[shifted, log_sum])
}

/// Applies `f(x, dims, axis)` with the axis rules Softmax, LogSoftmax and Hardmax share:
/// from version 13 along one axis (default -1); before, along the second dimension of the
/// input flattened to 2-D at `axis` (default 1; it may equal the rank, a flattened inner
/// size of 1), the result reshaped back. Flattening at the last axis changes nothing, so
/// there `f` sees the input as it is.
fn along_softmax_axis(
    cx: &mut NodeCtx,
    f: impl FnOnce(&mut NodeCtx, Value, &[usize], usize) -> Result<Value, Diagnostic>,
) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let x = cx.value(0)?;
    let axis = if cx.version >= 13 {
        cx.axis("axis", cx.attr_int_or("axis", -1)?, rank)?
    } else {
        let raw = cx.attr_int_or("axis", 1)?;
        let axis = if raw == rank as i64 {
            rank
        } else {
            cx.axis("axis", raw, rank)?
        };
        if axis + 1 != rank {
            let outer: usize = dims[..axis].iter().product();
            let inner: usize = dims[axis..].iter().product();
            let flat = cx.reshape(x, vec![outer, inner])?;
            let y = f(cx, flat, &[outer, inner], 1)?;
            return Ok(vec![Entry::Value(cx.reshape(y, dims)?)]);
        }
        axis
    };
    Ok(vec![Entry::Value(f(cx, x, &dims, axis)?)])
}

/// Softmax. From version 13 it normalizes along one axis (default -1); before, the input
/// is flattened to 2-D at `axis` (default 1) and normalized along the second dimension.
pub fn softmax(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    along_softmax_axis(cx, |cx, x, _, axis| cx.emit(Op::Softmax { axis }, &[x]))
}

/// Hardmax: 1.0 at the first largest element along the axis, 0.0 elsewhere; from version
/// 13 along one axis (default -1), before along the second dimension of the input
/// flattened to 2-D at `axis` (default 1), as Softmax.
pub fn hardmax(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    along_softmax_axis(cx, first_largest)
}

/// The one-hot float32 mask of the first largest element of `x` (of shape `dims`) along
/// `axis`: the positions equal to the maximum, the smallest index among them (`where`
/// over the axis' indices, then `reduce_min`), and a comparison of the indices with it.
fn first_largest(
    cx: &mut NodeCtx,
    x: Value,
    dims: &[usize],
    axis: usize,
) -> Result<Value, Diagnostic> {
    let n = dims[axis];
    let indices = super::reduce::positions_along(cx, dims.len(), axis, n)?;
    let first = super::reduce::extremum_position(cx, x, indices, axis, true, false, true)?;
    let one_hot = cx.emit(Op::Compare(Comparison::Equal), &[indices, first])?;
    cx.emit(Op::Cast { to: DType::F32 }, &[one_hot])
}

/// DFT (opsets 17 to 20) as products with constant cosine and sine matrices along the
/// axis: the forward transform, the inverse (scaled by 1/n), the one-sided forward
/// transform (the first n/2 + 1 frequencies) and the one-sided inverse of a Hermitian
/// spectrum (real output of length 2(m − 1), each inner frequency counted twice). The
/// matrices are computed in f64; `dft_length` other than the default is refused.
pub fn dft(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    use smelt_ir::op::BinaryOp;
    cx.check_attrs(&["axis", "inverse", "onesided"])?;
    cx.check_max_inputs(3)?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let parts = dims.last().copied().unwrap_or(0);
    if rank < 2 || !(parts == 1 || parts == 2) {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input of shape {dims:?} must end in 1 (real) or 2 (real, imaginary)"),
        ));
    }
    let raw_axis = if cx.version >= 20 {
        if cx.node.attribute.iter().any(|a| a.name() == "axis") {
            return Err(cx.bad_attr("axis", "is input 2 from opset 20"));
        }
        match cx.input_name(2) {
            Some(_) => cx.const_int(2, "axis")?,
            None => -2,
        }
    } else {
        cx.attr_int_or("axis", 1)?
    };
    let axis = cx.axis("axis", raw_axis, rank)?;
    if axis == rank - 1 {
        return Err(cx.bad_attr("axis", "names the real/imaginary axis, not a signal axis"));
    }
    let inverse = cx.attr_bool("inverse", false)?;
    let onesided = cx.attr_bool("onesided", false)?;
    let n_in = dims[axis];
    let length = if inverse && onesided {
        2 * (n_in.max(1) - 1)
    } else {
        n_in
    };
    if cx.input_name(1).is_some() {
        let given = cx.const_ints(1, "dft_length")?;
        if given != [length as i64] {
            return Err(cx.err(
                "onnx-unsupported-attribute",
                format!("dft_length {given:?}: smelt transforms the axis' own length ({length})"),
            ));
        }
    }
    if length == 0 {
        return Err(cx.err(
            "onnx-bad-model",
            "the one-sided inverse needs at least 2 frequencies",
        ));
    }
    let out_len = if onesided && !inverse {
        length / 2 + 1
    } else {
        length
    };
    // the matrices [n_in, out_len], scaled and weighted as the transform needs
    let mut cos = Vec::with_capacity(n_in * out_len);
    let mut sin = Vec::with_capacity(n_in * out_len);
    for j in 0..n_in {
        let weight = match (inverse, onesided) {
            (true, true) if j == 0 || j == n_in - 1 => 1.0,
            (true, true) => 2.0,
            _ => 1.0,
        } / if inverse { length as f64 } else { 1.0 };
        for k in 0..out_len {
            let angle = 2.0 * std::f64::consts::PI * ((j * k) % length) as f64 / length as f64;
            cos.push((weight * angle.cos()) as f32);
            sin.push((weight * angle.sin()) as f32);
        }
    }
    let c_name = cx.derived_name("dft_cos");
    let cos = cx.materialize(&ConstTensor::f32(vec![n_in, out_len], cos), &c_name)?;
    let s_name = cx.derived_name("dft_sin");
    let sin = cx.materialize(&ConstTensor::f32(vec![n_in, out_len], sin), &s_name)?;
    // real and imaginary parts with the axis moved last
    let x = cx.value(0)?;
    let signal_dims = dims[..rank - 1].to_vec();
    let mut perm: Vec<usize> = (0..rank - 1).filter(|&k| k != axis).collect();
    perm.push(axis);
    let mut back = vec![0; rank - 1];
    for (i, &k) in perm.iter().enumerate() {
        back[k] = i;
    }
    let part = |cx: &mut NodeCtx, p: usize| -> Result<Value, Diagnostic> {
        let s = cx.slice_along(x, rank - 1, p, p + 1)?;
        let s = cx.reshape(s, signal_dims.clone())?;
        cx.emit(Op::Transpose { perm: perm.clone() }, &[s])
    };
    let re = part(cx, 0)?;
    let im = if parts == 2 { Some(part(cx, 1)?) } else { None };
    let product = |cx: &mut NodeCtx, a: Value, m: Value| cx.emit(Op::MatMul, &[a, m]);
    let combine = |cx: &mut NodeCtx, a: Value, b: Option<Value>, op: BinaryOp| match b {
        Some(b) => cx.emit(Op::Binary(op), &[a, b]),
        None => Ok(a),
    };
    let rc = product(cx, re, cos)?;
    let rs = product(cx, re, sin)?;
    let (ic, is) = match im {
        Some(im) => (Some(product(cx, im, cos)?), Some(product(cx, im, sin)?)),
        None => (None, None),
    };
    let neg = |cx: &mut NodeCtx, v: Value| cx.emit(Op::Unary(smelt_ir::op::UnaryOp::Neg), &[v]);
    // forward: e^{-iθ}; inverse: e^{+iθ}
    let outputs: Vec<Value> = if inverse && onesided {
        vec![combine(cx, rc, is, BinaryOp::Sub)?]
    } else if inverse {
        let real = combine(cx, rc, is, BinaryOp::Sub)?;
        let imag = match ic {
            Some(ic) => cx.emit(Op::Binary(BinaryOp::Add), &[rs, ic])?,
            None => rs,
        };
        vec![real, imag]
    } else {
        let real = combine(cx, rc, is, BinaryOp::Add)?;
        let imag = match ic {
            Some(ic) => cx.emit(Op::Binary(BinaryOp::Sub), &[ic, rs])?,
            None => neg(cx, rs)?,
        };
        vec![real, imag]
    };
    let mut out_dims = dims.clone();
    out_dims[axis] = out_len;
    out_dims[rank - 1] = 1;
    let mut pieces = Vec::with_capacity(2);
    for v in outputs {
        let v = cx.emit(Op::Transpose { perm: back.clone() }, &[v])?;
        pieces.push(cx.reshape(v, out_dims.clone())?);
    }
    let y = match pieces.as_slice() {
        [one] => *one,
        _ => cx.emit(Op::Concat { axis: rank - 1 }, &pieces)?,
    };
    Ok(vec![Entry::Value(y)])
}
