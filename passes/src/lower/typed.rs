//! Lowerings of the ops on integer and `i1` tensors (and the comparisons, casts and
//! selects that produce or consume them): scalar loops over typed loads, exact integer
//! arithmetic, and `gather`, whose run-time index the generated code checks before the
//! load (an index outside the axis ends the run with an error, never a read outside).
//!
//! These tensors are ids, masks and shape values: small next to activations, so the
//! loops stay scalar and the kernels simple.

use smelt_ir::loops::{Access, Affine, BinOp, BufId, CmpOp, Expr, KernelBuilder, UnOp, Width};
use smelt_ir::op::{Comparison, LogicOp};
use smelt_ir::{BinaryOp, DType, Diagnostic, TensorType, UnaryOp, Value};

use super::elementwise::{
    broadcast_strides, collapse, dims_name, emit_nest, index_of, row_major_strides,
};
use super::{BufferId, Cx};

/// What a typed elementwise kernel computes per element: the ops the lowering dispatch
/// sends to [`lower_typed_map`], so its matches are exhaustive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TypedMap {
    /// Integer `neg` or `abs`.
    Unary(UnaryOp),
    /// Integer arithmetic with broadcasting.
    Binary(BinaryOp),
    /// A conversion to the element type.
    Cast(DType),
    /// A comparison with broadcasting (any element type), giving `i1`.
    Compare(Comparison),
    /// `and`, `or`, `xor` on `i1` or integers, the shifts on integers, of this element type.
    Logic(LogicOp, DType),
    /// `not` on `i1` or an integer type.
    Not(DType),
    /// `where(cond, a, b)` with broadcasting.
    Where,
    /// `mod(a, b)` of this element type with broadcasting: C's remainder with `fmod`,
    /// else Python's (integers only, the type rule's check).
    Mod {
        /// The sign of the dividend rather than the divisor's.
        fmod: bool,
        /// The operands' element type.
        dtype: DType,
    },
}

impl TypedMap {
    fn name(self) -> String {
        match self {
            TypedMap::Unary(u) => u.name().to_string(),
            TypedMap::Binary(b) => b.name().to_string(),
            TypedMap::Cast(to) => format!("cast_{to}"),
            TypedMap::Compare(c) => c.name().to_string(),
            TypedMap::Logic(l, _) => l.name().to_string(),
            TypedMap::Not(_) => "not".into(),
            TypedMap::Where => "where".into(),
            TypedMap::Mod { fmod: false, .. } => "mod".into(),
            TypedMap::Mod { fmod: true, .. } => "fmod".into(),
        }
    }

    /// The value of one result element from its operands' elements.
    fn apply(self, x: &[Expr]) -> Result<Expr, String> {
        let bool_const = |v: i64| Expr::int(v, Width::Bool);
        Ok(match self {
            TypedMap::Unary(u) => {
                let op = match u {
                    UnaryOp::Neg => UnOp::Neg,
                    UnaryOp::Abs => UnOp::Abs,
                    other => return Err(format!("'{}' has no integer form", other.name())),
                };
                Expr::unary(op, x[0].clone())
            }
            TypedMap::Binary(b) => {
                let op = match b {
                    BinaryOp::Add => BinOp::Add,
                    BinaryOp::Sub => BinOp::Sub,
                    BinaryOp::Mul => BinOp::Mul,
                    BinaryOp::Div => BinOp::Div,
                    BinaryOp::Min => BinOp::Min,
                    BinaryOp::Max => BinOp::Max,
                    // its type rule takes f32 only
                    BinaryOp::PRelu => return Err("'prelu' has no integer form".into()),
                };
                Expr::binary(op, x[0].clone(), x[1].clone())
            }
            TypedMap::Cast(to) => Expr::cast(Width::scalar(to), x[0].clone()),
            TypedMap::Compare(c) => {
                let cmp = match c {
                    Comparison::Equal => CmpOp::Eq,
                    Comparison::Less => CmpOp::Lt,
                    Comparison::LessOrEqual => CmpOp::Le,
                    Comparison::Greater => CmpOp::Gt,
                    Comparison::GreaterOrEqual => CmpOp::Ge,
                };
                Expr::compare(cmp, x[0].clone(), x[1].clone())
            }
            TypedMap::Logic(l, dtype) => {
                let (a, b) = (x[0].clone(), x[1].clone());
                let width = Width::scalar(dtype);
                let op = match l {
                    LogicOp::And => BinOp::And,
                    LogicOp::Or => BinOp::Or,
                    LogicOp::Xor => BinOp::Xor,
                    LogicOp::ShiftLeft => BinOp::Shl,
                    LogicOp::ShiftRight => BinOp::Shr,
                };
                let shifted = Expr::binary(op, a.clone(), b.clone());
                if !l.is_shift() {
                    return Ok(shifted);
                }
                // the hardware takes the amount modulo the width; ONNX gives an amount
                // outside [0, width) the result of shifting every bit out
                let bits = (dtype.size_bytes() * 8) as i64;
                let zero = Expr::int(0, width);
                let out_of_range = match l {
                    LogicOp::ShiftRight => Expr::select(
                        CmpOp::Lt,
                        a,
                        zero.clone(),
                        Expr::int(-1, width),
                        zero.clone(),
                    ),
                    _ => zero.clone(),
                };
                let below_width = Expr::select(
                    CmpOp::Lt,
                    b.clone(),
                    Expr::int(bits, width),
                    shifted,
                    out_of_range.clone(),
                );
                Expr::select(CmpOp::Lt, b, zero, out_of_range, below_width)
            }
            TypedMap::Not(dtype) => {
                let all_ones = match dtype {
                    DType::Bool => bool_const(1),
                    other => Expr::int(-1, Width::scalar(other)),
                };
                Expr::binary(BinOp::Xor, x[0].clone(), all_ones)
            }
            TypedMap::Mod { fmod, dtype } => {
                let (a, b) = (x[0].clone(), x[1].clone());
                let rem = Expr::binary(BinOp::Rem, a, b.clone());
                if fmod {
                    rem
                } else {
                    // Python's sign (the divisor's): a nonzero remainder whose sign
                    // differs from the divisor's (their xor is negative) moves by `b`
                    let zero = Expr::int(0, Width::scalar(dtype));
                    let shifted = Expr::binary(BinOp::Add, rem.clone(), b.clone());
                    let signs_differ = Expr::binary(BinOp::Xor, rem.clone(), b);
                    let fixed =
                        Expr::select(CmpOp::Lt, signs_differ, zero.clone(), shifted, rem.clone());
                    Expr::select(CmpOp::Eq, rem.clone(), zero, rem, fixed)
                }
            }
            TypedMap::Where => Expr::select(
                CmpOp::Ne,
                x[0].clone(),
                bool_const(0),
                x[1].clone(),
                x[2].clone(),
            ),
        })
    }
}

/// The kernel argument of buffer `buf`, typed as the buffer.
fn typed_arg(cx: &Cx, b: &mut KernelBuilder, name: &str, buf: BufferId, access: Access) -> BufId {
    b.typed_arg(name, cx.dtype_of(buf), cx.len_of(buf), access)
}

/// `map` of the (broadcast) operands into `out`, one scalar element at a time.
pub(crate) fn lower_typed_map(
    cx: &mut Cx,
    map: TypedMap,
    operands: &[Value],
    out_ty: &TensorType,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let out_dims = &out_ty.dims;
    let mut b = KernelBuilder::new(&format!("{}_{}", map.name(), dims_name(out_dims)));
    let mut args = Vec::new();
    let mut strides = Vec::new();
    let mut srcs = Vec::new();
    for (i, &v) in operands.iter().enumerate() {
        let buf = cx.buf(v);
        srcs.push((
            typed_arg(cx, &mut b, &format!("in{i}"), buf, Access::Read),
            cx.dtype_of(buf),
        ));
        args.push(buf);
        strides.push(broadcast_strides(&cx.func.type_of(v).dims, out_dims));
    }
    let y = typed_arg(cx, &mut b, "out", out, Access::Write);
    args.push(out);
    strides.push(row_major_strides(out_dims));
    let (dims, st) = collapse(out_dims, &strides);
    let out_width = Width::scalar(out_ty.dtype);
    let mut failure = None;
    emit_nest(&mut b, &dims, false, &mut |b, idx, _| {
        let loads: Vec<Expr> = srcs
            .iter()
            .enumerate()
            .map(|(k, &(buf, dtype))| Expr::load(buf, index_of(&st[k], idx), Width::scalar(dtype)))
            .collect();
        match map.apply(&loads) {
            Ok(v) => b.store(y, index_of(&st[srcs.len()], idx), v, out_width),
            Err(m) => failure = Some(m),
        }
    });
    if let Some(m) = failure {
        return Err(cx.unsupported(m));
    }
    cx.step(b.finish(), args)
}

/// `gather(data, indices)` along `axis`: for each index (checked at run time against the
/// axis, negative ones counting from the end), the slice of `data` it selects.
pub(crate) fn lower_gather(
    cx: &mut Cx,
    axis: usize,
    operands: &[Value],
    out_ty: &TensorType,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let data_dims = cx.func.type_of(operands[0]).dims.clone();
    let indices = cx.func.type_of(operands[1]).clone();
    let outer: usize = data_dims[..axis].iter().product();
    let inner: usize = data_dims[axis + 1..].iter().product();
    let d = data_dims[axis] as i64;
    let count = indices.num_elements();
    let mut b = KernelBuilder::new(&format!("gather_{}", dims_name(&out_ty.dims)));
    let (data_buf, idx_buf) = (cx.buf(operands[0]), cx.buf(operands[1]));
    let data = typed_arg(cx, &mut b, "data", data_buf, Access::Read);
    let idx = typed_arg(cx, &mut b, "indices", idx_buf, Access::Read);
    let y = typed_arg(cx, &mut b, "out", out, Access::Write);
    let width = Width::scalar(out_ty.dtype);
    let idx_width = Width::scalar(indices.dtype);
    let (outer, count, inner) = (outer as i64, count as i64, inner as i64);
    b.for_loop(0, outer, 1, |b, o| {
        b.for_loop(0, count, 1, |b, j| {
            let raw = Expr::cast(Width::I64, Expr::load(idx, Affine::var(j), idx_width));
            let raw = b.let_(raw, Width::I64);
            // a negative index counts from the end; the load checks the result
            let wrapped = Expr::binary(BinOp::Add, raw.clone(), Expr::int(d, Width::I64));
            let k = Expr::select(
                CmpOp::Lt,
                raw.clone(),
                Expr::int(0, Width::I64),
                wrapped,
                raw,
            );
            let k = b.let_(k, Width::I64);
            b.for_loop(0, inner, 1, |b, e| {
                let base = Affine::var(o).scale(d * inner).add(&Affine::var(e));
                let v = Expr::LoadAt {
                    buf: data,
                    base,
                    index: Box::new(k),
                    stride: inner,
                    bound: d,
                    width,
                };
                let at = Affine::var(o)
                    .scale(count * inner)
                    .add(&Affine::var(j).scale(inner))
                    .add(&Affine::var(e));
                b.store(y, at, v, width);
            });
        });
    });
    cx.step(b.finish(), vec![data_buf, idx_buf, out])
}
