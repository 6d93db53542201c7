//! Ops on every element type: data movement (generic over the element), exact integer
//! arithmetic, casts, comparisons, logic, `where` and `gather` with its run-time index
//! check.

use std::borrow::Cow;

use super::shape;
use crate::half;
use crate::op::{
    AxisTaps, BinaryOp, Comparison, CoordinateMode, LogicOp, PadAttrs, ResizeAttrs, ResizeMode,
    SliceAttrs, UnaryOp,
};
use crate::tensor::TensorData;
use crate::types::DType;
use crate::with_elements;

/// An operand of any element type: logical dims and row-major elements.
pub(super) struct Operand<'a> {
    pub(super) dims: &'a [usize],
    pub(super) data: Cow<'a, TensorData>,
}

/// One element type's vector inside a [`TensorData`].
trait Element: Copy + Default + PartialOrd {
    fn slice(data: &TensorData) -> Option<&[Self]>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            fn slice(data: &TensorData) -> Option<&[$t]> {
                match data {
                    TensorData::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(i64, I64);
element!(i32, I32);
element!(bool, Bool);
element!(i8, I8);
element!(u8, U8);
element!(i16, I16);

/// `ui16` elements and the 2-byte floats' bit patterns, for data movement only (the type
/// rules keep every comparison and arithmetic off the storage types, so the floats'
/// integer order is never used).
impl Element for u16 {
    fn slice(data: &TensorData) -> Option<&[u16]> {
        match data {
            TensorData::F16(v) | TensorData::BF16(v) | TensorData::U16(v) => Some(v),
            _ => None,
        }
    }
}

/// The elements of `data` as `T`s, where the type rule has said they are.
fn elements<T: Element>(data: &TensorData) -> Result<&[T], String> {
    T::slice(data).ok_or_else(|| format!("internal: an operand holds {}", data.dtype()))
}

/// `f` on each pair of elements of `a` and `b` (as `T`s), both broadcast to `out`: the
/// common loop of the binary kernels here.
fn pairwise<T: Element, U>(
    a: &Operand,
    b: &Operand,
    out: &[usize],
    mut f: impl FnMut(T, T) -> U,
) -> Result<Vec<U>, String> {
    let x = shape::broadcast_to(elements::<T>(&a.data)?, a.dims, out);
    let y = shape::broadcast_to(elements::<T>(&b.data)?, b.dims, out);
    Ok(x.iter().zip(y.iter()).map(|(&p, &q)| f(p, q)).collect())
}

/// The result of reading `x` at the source positions `f` gives for its dims: data
/// movement is a reindexing, computed once whatever the element type.
fn moved(x: &Operand, f: impl FnOnce(&[usize], &[usize]) -> Vec<usize>) -> TensorData {
    let positions: Vec<usize> = (0..x.data.len()).collect();
    x.data.pick(&f(&positions, x.dims))
}

/// `transpose` of any element type.
pub(super) fn transpose(x: &Operand, perm: &[usize]) -> TensorData {
    moved(x, |p, dims| shape::transpose(p, dims, perm))
}

/// `slice` of any element type.
pub(super) fn slice(x: &Operand, s: &SliceAttrs, out: &[usize]) -> TensorData {
    moved(x, |p, dims| shape::slice(p, dims, s, out))
}

/// `pad` of any element type: each result element reads the input where every axis's
/// [`PadAttrs::source_index`] names an input index, and is the fill (`value`'s one
/// element, else zero or `false`) where one does not.
pub(super) fn pad(
    x: &Operand,
    value: Option<&Operand>,
    p: &PadAttrs,
    out: &[usize],
) -> Result<TensorData, String> {
    let axes = p.axes(x.dims)?;
    let in_st = shape::row_major_strides(x.dims);
    let total: usize = out.iter().product();
    let mut sources: Vec<Option<usize>> = Vec::with_capacity(total);
    let mut idx = vec![0usize; out.len()];
    for _ in 0..total {
        let at = idx
            .iter()
            .zip(&axes)
            .zip(&in_st)
            .try_fold(0usize, |at, ((&i, ax), &st)| {
                PadAttrs::source_index(p.mode, ax, i).map(|s| at + s * st)
            });
        sources.push(at);
        for k in (0..out.len()).rev() {
            idx[k] += 1;
            if idx[k] < out[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    let fill = match value {
        Some(v) => v.data.as_ref().clone(),
        None => TensorData::zeros(x.data.dtype(), 1),
    };
    Ok(with_elements!(x.data.as_ref(), |v, wrap| {
        let c = *elements(&fill)?
            .first()
            .ok_or("internal: a pad fill value without elements")?;
        wrap!(sources.iter().map(|s| s.map_or(c, |k| v[k])).collect())
    }))
}

/// `expand` of any element type.
pub(super) fn expand(x: &Operand, out: &[usize]) -> TensorData {
    moved(x, |p, dims| shape::broadcast_to(p, dims, out).into_owned())
}

/// `tile` of any element type.
pub(super) fn tile(x: &Operand, repeats: &[usize]) -> TensorData {
    moved(x, |p, dims| shape::tile(p, dims, repeats))
}

/// `concat` of operands of one element type.
pub(super) fn concat(args: &[Operand], axis: usize) -> Result<TensorData, String> {
    fn typed<T: Element>(args: &[Operand], axis: usize) -> Result<Vec<T>, String> {
        let parts = args
            .iter()
            .map(|a| Ok((a.dims, elements::<T>(&a.data)?)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(shape::concat(&parts, axis))
    }
    Ok(match args[0].data.dtype() {
        DType::F32 => TensorData::F32(typed(args, axis)?),
        DType::I64 => TensorData::I64(typed(args, axis)?),
        DType::I32 => TensorData::I32(typed(args, axis)?),
        DType::Bool => TensorData::Bool(typed(args, axis)?),
        DType::F16 => TensorData::F16(typed(args, axis)?),
        DType::BF16 => TensorData::BF16(typed(args, axis)?),
        DType::I8 => TensorData::I8(typed(args, axis)?),
        DType::U8 => TensorData::U8(typed(args, axis)?),
        DType::I16 => TensorData::I16(typed(args, axis)?),
        DType::U16 => TensorData::U16(typed(args, axis)?),
    })
}

/// An integer type's exact arithmetic: wrapping like two's-complement hardware, with
/// division by zero an error rather than a trap.
trait Integer: Element {
    fn binary(op: BinaryOp, a: Self, b: Self) -> Option<Self>;
    fn unary(op: UnaryOp, a: Self) -> Option<Self>;
}

macro_rules! integer {
    ($t:ty) => {
        impl Integer for $t {
            fn binary(op: BinaryOp, a: $t, b: $t) -> Option<$t> {
                Some(match op {
                    BinaryOp::Add => a.wrapping_add(b),
                    BinaryOp::Sub => a.wrapping_sub(b),
                    BinaryOp::Mul => a.wrapping_mul(b),
                    // truncating toward zero, as ONNX runtimes do; MIN / -1 wraps
                    BinaryOp::Div => a
                        .checked_div(b)
                        .or_else(|| (b == -1).then(|| a.wrapping_neg()))?,
                    BinaryOp::Min => a.min(b),
                    BinaryOp::Max => a.max(b),
                    BinaryOp::PRelu if a >= 0 => a,
                    BinaryOp::PRelu => b.wrapping_mul(a),
                })
            }
            fn unary(op: UnaryOp, a: $t) -> Option<$t> {
                match op {
                    UnaryOp::Neg => Some(a.wrapping_neg()),
                    UnaryOp::Abs => Some(a.wrapping_abs()),
                    _ => None,
                }
            }
        }
    };
}
integer!(i64);
integer!(i32);

/// `a op b` on integers, both broadcast to `out`.
pub(super) fn integer_binary(
    op: BinaryOp,
    a: &Operand,
    b: &Operand,
    out: &[usize],
) -> Result<TensorData, String> {
    fn typed<T: Integer>(
        op: BinaryOp,
        a: &Operand,
        b: &Operand,
        out: &[usize],
    ) -> Result<Vec<T>, String> {
        pairwise(a, b, out, |p: T, q: T| {
            T::binary(op, p, q)
                .ok_or_else(|| format!("integer division by zero in '{}'", op.name()))
        })?
        .into_iter()
        .collect()
    }
    Ok(match a.data.dtype() {
        DType::I64 => TensorData::I64(typed(op, a, b, out)?),
        DType::I32 => TensorData::I32(typed(op, a, b, out)?),
        d => return Err(format!("internal: integer '{}' on {d}", op.name())),
    })
}

/// `op(x)` on integers (`neg`, `abs`).
pub(super) fn integer_unary(op: UnaryOp, x: &Operand) -> Result<TensorData, String> {
    fn typed<T: Integer>(op: UnaryOp, x: &Operand) -> Result<Vec<T>, String> {
        elements::<T>(&x.data)?
            .iter()
            .map(|&v| T::unary(op, v).ok_or_else(|| format!("internal: integer '{}'", op.name())))
            .collect()
    }
    Ok(match x.data.dtype() {
        DType::I64 => TensorData::I64(typed(op, x)?),
        DType::I32 => TensorData::I32(typed(op, x)?),
        d => return Err(format!("internal: integer '{}' on {d}", op.name())),
    })
}

/// ONNX `Cast`: see [`Op::Cast`] for the rules. Rust's `as` between these types is
/// exactly them (float to int truncates and saturates, NaN to 0; int to float rounds
/// to nearest; int to int wraps), the narrow integers included (float to `i8` saturates
/// at -128 and 127, `i64` to `ui8` keeps the low 8 bits). `f16` and `bf16` go through
/// `f32`: widening is exact, and narrowing rounds to nearest even ([`crate::half`]).
pub(super) fn cast(x: &TensorData, to: DType) -> TensorData {
    fn each<S: Copy, D>(v: &[S], f: impl Fn(S) -> D) -> Vec<D> {
        v.iter().map(|&e| f(e)).collect()
    }
    let from_f32 = |v: &[f32]| match to {
        DType::F32 => TensorData::F32(v.to_vec()),
        DType::I64 => TensorData::I64(each(v, |e| e as i64)),
        DType::I32 => TensorData::I32(each(v, |e| e as i32)),
        // NaN is true, as in numpy and onnxruntime
        DType::Bool => TensorData::Bool(each(v, |e| e != 0.0)),
        DType::F16 => TensorData::F16(each(v, half::f32_to_f16)),
        DType::BF16 => TensorData::BF16(each(v, half::f32_to_bf16)),
        DType::I8 => TensorData::I8(each(v, |e| e as i8)),
        DType::U8 => TensorData::U8(each(v, |e| e as u8)),
        DType::I16 => TensorData::I16(each(v, |e| e as i16)),
        DType::U16 => TensorData::U16(each(v, |e| e as u16)),
    };
    // Integers go through i64, which holds every i32, narrow integer and i1 exactly.
    let from_int = |v: Vec<i64>| match to {
        DType::F32 => TensorData::F32(each(&v, |e| e as f32)),
        DType::I64 => TensorData::I64(v),
        DType::I32 => TensorData::I32(each(&v, |e| e as i32)),
        DType::Bool => TensorData::Bool(each(&v, |e| e != 0)),
        DType::I8 => TensorData::I8(each(&v, |e| e as i8)),
        DType::U8 => TensorData::U8(each(&v, |e| e as u8)),
        DType::I16 => TensorData::I16(each(&v, |e| e as i16)),
        DType::U16 => TensorData::U16(each(&v, |e| e as u16)),
        // through f32: exact below 2^24, and every integer from 65520 on is f16's
        // infinity either way (bf16 may round twice above 2^24)
        DType::F16 | DType::BF16 => from_f32(&each(&v, |e| e as f32)),
    };
    match x {
        TensorData::F32(v) => from_f32(v),
        TensorData::F16(_) if to == DType::F16 => x.clone(),
        TensorData::BF16(_) if to == DType::BF16 => x.clone(),
        TensorData::F16(v) => from_f32(&each(v, half::f16_to_f32)),
        TensorData::BF16(v) => from_f32(&each(v, half::bf16_to_f32)),
        TensorData::I64(v) => from_int(v.clone()),
        TensorData::I32(v) => from_int(each(v, i64::from)),
        TensorData::Bool(v) => from_int(each(v, i64::from)),
        TensorData::I8(v) => from_int(each(v, i64::from)),
        TensorData::U8(v) => from_int(each(v, i64::from)),
        TensorData::I16(v) => from_int(each(v, i64::from)),
        TensorData::U16(v) => from_int(each(v, i64::from)),
    }
}

/// `a cmp b`, both broadcast to `out`.
pub(super) fn compare(
    cmp: Comparison,
    a: &Operand,
    b: &Operand,
    out: &[usize],
) -> Result<TensorData, String> {
    fn typed<T: Element>(
        cmp: Comparison,
        a: &Operand,
        b: &Operand,
        out: &[usize],
    ) -> Result<Vec<bool>, String> {
        pairwise(a, b, out, |p: T, q: T| cmp.holds(p, q))
    }
    Ok(TensorData::Bool(match a.data.dtype() {
        DType::F32 => typed::<f32>(cmp, a, b, out)?,
        DType::I64 => typed::<i64>(cmp, a, b, out)?,
        DType::I32 => typed::<i32>(cmp, a, b, out)?,
        DType::Bool => typed::<bool>(cmp, a, b, out)?,
        d @ (DType::F16 | DType::BF16 | DType::I8 | DType::U8 | DType::I16 | DType::U16) => {
            return Err(format!("internal: '{}' on {d}", cmp.name()))
        }
    }))
}

/// `a op b`, both broadcast to `out`: logic on `i1`, bitwise operators and shifts on
/// integers (exact, by [`LogicOp::eval_int`]).
pub(super) fn logic(
    op: LogicOp,
    a: &Operand,
    b: &Operand,
    out: &[usize],
) -> Result<TensorData, String> {
    Ok(match a.data.dtype() {
        DType::I64 => TensorData::I64(pairwise(a, b, out, |p: i64, q: i64| {
            op.eval_int(p, q, 64, true)
        })?),
        DType::I32 => TensorData::I32(pairwise(a, b, out, |p: i32, q: i32| {
            op.eval_int(p.into(), q.into(), 32, true) as i32
        })?),
        _ => TensorData::Bool(pairwise(a, b, out, |p, q| op.eval(p, q))?),
    })
}

/// `!x`: negation on `i1`, bitwise complement on integers.
pub(super) fn not(x: &Operand) -> Result<TensorData, String> {
    Ok(match x.data.dtype() {
        DType::I64 => TensorData::I64(elements::<i64>(&x.data)?.iter().map(|&v| !v).collect()),
        DType::I32 => TensorData::I32(elements::<i32>(&x.data)?.iter().map(|&v| !v).collect()),
        _ => TensorData::Bool(elements::<bool>(&x.data)?.iter().map(|&v| !v).collect()),
    })
}

/// `where(cond, a, b)`, all three broadcast to `out`.
pub(super) fn select(
    cond: &Operand,
    a: &Operand,
    b: &Operand,
    out: &[usize],
) -> Result<TensorData, String> {
    let c = shape::broadcast_to(elements::<bool>(&cond.data)?, cond.dims, out);
    let n: usize = out.iter().product();
    // where each result element comes from: a's element, or b's (offset by a's count)
    let from_a =
        shape::broadcast_to(&(0..a.data.len()).collect::<Vec<_>>(), a.dims, out).into_owned();
    let from_b =
        shape::broadcast_to(&(0..b.data.len()).collect::<Vec<_>>(), b.dims, out).into_owned();
    let picks: Vec<(bool, usize)> = (0..n)
        .map(|i| {
            if c[i] {
                (true, from_a[i])
            } else {
                (false, from_b[i])
            }
        })
        .collect();
    Ok(with_elements!(a.data.as_ref(), |va, wrap| {
        let vb = elements(&b.data)?;
        wrap!(picks
            .iter()
            .map(|&(in_a, k)| if in_a { va[k] } else { vb[k] })
            .collect())
    }))
}

/// `gather(data, indices)` along `axis`. A negative index counts from the end; one
/// outside `-d..d` is an error naming it (never a clamp).
pub(super) fn gather(data: &Operand, indices: &Operand, axis: usize) -> Result<TensorData, String> {
    let d = data.dims[axis];
    let idx = indices
        .data
        .to_i64s()
        .ok_or("internal: gather indices are not integers")?;
    let resolved = idx
        .iter()
        .map(|&i| {
            let k = if i < 0 { i + d as i64 } else { i };
            if (0..d as i64).contains(&k) {
                Ok(k as usize)
            } else {
                Err(format!(
                    "gather index {i} is out of range for axis {axis} of size {d} (valid: {} to {})",
                    -(d as i64),
                    d - 1
                ))
            }
        })
        .collect::<Result<Vec<usize>, String>>()?;
    let outer: usize = data.dims[..axis].iter().product();
    let inner: usize = data.dims[axis + 1..].iter().product();
    let mut positions = Vec::with_capacity(outer * resolved.len() * inner);
    for o in 0..outer {
        for &k in &resolved {
            let base = (o * d + k) * inner;
            positions.extend(base..base + inner);
        }
    }
    Ok(data.data.pick(&positions))
}

/// `resize`: nearest picks one input element per result element (any element type);
/// linear and cubic weigh the product of every axis's taps around it, in f64; an element
/// outside a `tf_crop_and_resize` window takes the extrapolation value.
pub(super) fn resize(x: &Operand, r: &ResizeAttrs) -> Result<TensorData, String> {
    let rank = x.dims.len();
    let strides = shape::row_major_strides(x.dims);
    let taps: Vec<AxisTaps> = (0..rank).map(|k| r.taps(k, x.dims[k])).collect();
    let total: usize = r.sizes.iter().product();
    let mut idx = vec![0usize; rank];
    // a mixed-radix counter over `limits`, last axis fastest; false once it wraps
    let advance = |idx: &mut [usize], limits: &[usize]| {
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < limits[k] {
                return true;
            }
            idx[k] = 0;
        }
        false
    };
    let per_output: Vec<usize> = taps.iter().map(|t| t.per_output).collect();
    if let ResizeMode::Nearest(_) = r.mode {
        if r.coordinate != CoordinateMode::TfCropAndResize {
            let mut positions = Vec::with_capacity(total);
            for _ in 0..total {
                positions.push((0..rank).map(|k| taps[k].index[idx[k]] * strides[k]).sum());
                advance(&mut idx, &r.sizes);
            }
            return Ok(x.data.pick(&positions));
        }
    }
    let data = elements::<f32>(&x.data)?;
    let mut out = Vec::with_capacity(total);
    let mut tap = vec![0usize; rank];
    for _ in 0..total {
        if (0..rank).any(|k| !taps[k].inside[idx[k]]) {
            out.push(r.extrapolation.0);
        } else {
            let mut acc = 0.0f64;
            tap.fill(0);
            loop {
                let mut weight = 1.0f64;
                let mut at = 0;
                for k in 0..rank {
                    let j = idx[k] * per_output[k] + tap[k];
                    weight *= taps[k].weight[j];
                    at += taps[k].index[j] * strides[k];
                }
                if weight != 0.0 {
                    acc += weight * f64::from(data[at]);
                }
                if !advance(&mut tap, &per_output) {
                    break;
                }
            }
            out.push(acc as f32);
        }
        advance(&mut idx, &r.sizes);
    }
    Ok(TensorData::F32(out))
}

/// `mod(a, b)` (see [`crate::op::Op::Mod`]), both broadcast to `out`: integers exactly,
/// with the sign of `b` unless `fmod` (then of `a`, as Rust's `%`); `f32` as C's `fmod`,
/// which is exact. An integer remainder by zero is an error.
pub(super) fn modulo(
    fmod: bool,
    a: &Operand,
    b: &Operand,
    out: &[usize],
) -> Result<TensorData, String> {
    fn integer<T: Integer + RemInt>(
        fmod: bool,
        a: &Operand,
        b: &Operand,
        out: &[usize],
    ) -> Result<Vec<T>, String> {
        pairwise(a, b, out, |p: T, q: T| {
            T::remainder(p, q, fmod).ok_or_else(|| "integer remainder by zero in 'mod'".to_string())
        })?
        .into_iter()
        .collect()
    }
    Ok(match a.data.dtype() {
        DType::I64 => TensorData::I64(integer(fmod, a, b, out)?),
        DType::I32 => TensorData::I32(integer(fmod, a, b, out)?),
        DType::F32 => TensorData::F32(pairwise(a, b, out, |p: f32, q: f32| p % q)?),
        d => return Err(format!("internal: 'mod' on {d}")),
    })
}

/// The integer remainder both ways `mod` computes it.
trait RemInt: Sized {
    /// `a mod b` with the sign of `b` (or, with `fmod`, of `a`); `None` for `b = 0`.
    /// `MIN mod -1` is 0 (no overflow: the remainder is exact).
    fn remainder(a: Self, b: Self, fmod: bool) -> Option<Self>;
}

macro_rules! rem_int {
    ($t:ty) => {
        impl RemInt for $t {
            fn remainder(a: $t, b: $t, fmod: bool) -> Option<$t> {
                let r = a.checked_rem(b).or_else(|| (b == -1).then_some(0))?;
                let signs_differ = (r < 0) != (b < 0);
                Some(if !fmod && r != 0 && signs_differ {
                    r + b
                } else {
                    r
                })
            }
        }
    };
}
rem_int!(i64);
rem_int!(i32);
