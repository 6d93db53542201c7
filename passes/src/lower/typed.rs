//! Lowerings of the ops on integer and `i1` tensors (and the comparisons, casts and
//! selects that produce or consume them): scalar loops over typed loads, exact integer
//! arithmetic, and `gather`, whose run-time index the generated code checks before the
//! load (an index outside the axis ends the run with an error, never a read outside).
//!
//! These tensors are ids, masks and shape values: small next to activations, so the
//! loops stay scalar and the kernels simple. A chain of them is one kernel, though: a
//! producer whose one use is another typed map of the same shape is computed inside its
//! consumer's loop ([`inlined_into_consumer`]), so a mask such as an attention guard's
//! `where(not(equal(p, p)), 0, p)` (ONNX's IsNaN and Where after a softmax) reads `p`
//! and writes the result once instead of passing two `i1` tensors through memory.

use smelt_ir::graph::{Func, Use};
use smelt_ir::loops::{Access, Affine, BinOp, BufId, CmpOp, Expr, KernelBuilder, UnOp, Width};
use smelt_ir::op::{Comparison, LogicOp};
use smelt_ir::{BinaryOp, DType, Diagnostic, Op, TensorType, UnaryOp, Value};

use super::elementwise::{
    broadcast_strides, collapse, dims_name, emit_nest, index_of, load_lanes, row_major_strides,
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
    /// The map the lowering computes `op` with (operands of `operand_dtype`, a result of
    /// `out`), if it is lowered by [`lower_typed_map`].
    pub(crate) fn of(op: &Op, operand_dtype: Option<DType>, out: DType) -> Option<TypedMap> {
        let integer = operand_dtype.is_some_and(|d| d != DType::F32);
        Some(match op {
            Op::Unary(u) if integer => TypedMap::Unary(*u),
            Op::Binary(o) if integer => TypedMap::Binary(*o),
            Op::Cast { to } => TypedMap::Cast(*to),
            Op::Compare(c) => TypedMap::Compare(*c),
            Op::Logic(l) => TypedMap::Logic(*l, out),
            Op::Not => TypedMap::Not(out),
            Op::Where => TypedMap::Where,
            Op::Mod { fmod } => TypedMap::Mod {
                fmod: *fmod,
                dtype: out,
            },
            _ => return None,
        })
    }

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
            TypedMap::Compare(c) => Expr::compare(cmp_op(c), x[0].clone(), x[1].clone()),
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

/// The loop IR's comparison of an IR comparison.
fn cmp_op(c: Comparison) -> CmpOp {
    match c {
        Comparison::Equal => CmpOp::Eq,
        Comparison::Less => CmpOp::Lt,
        Comparison::LessOrEqual => CmpOp::Le,
        Comparison::Greater => CmpOp::Gt,
        Comparison::GreaterOrEqual => CmpOp::Ge,
    }
}

/// The typed map of instruction `i` of `func`, if it is lowered as one.
fn map_of(func: &Func, i: usize) -> Option<TypedMap> {
    let inst = &func.insts[i];
    let operand = inst.operands.first().map(|&v| func.type_of(v).dtype);
    TypedMap::of(&inst.op, operand, inst.ty.dtype)
}

/// Whether instruction `i` is computed inside its consumer's kernel (`uses`: the
/// function's use lists). An instruction is, when it is a typed map whose result is
/// used exactly once, as an operand of another typed map with a result of the same shape
/// (so the producer's elements are the consumer's, index for index), on row-major
/// tensors, and is no function result.
pub(crate) fn inlined_into_consumer(func: &Func, uses: &[Vec<Use>], i: usize) -> bool {
    let inst = &func.insts[i];
    let value = func.inst_value(i);
    let row_major = |t: &TensorType| t.layout == smelt_ir::Layout::RowMajor;
    let [Use::Operand { inst: consumer, .. }] = uses[value.index()][..] else {
        return false;
    };
    let c = &func.insts[consumer];
    map_of(func, i).is_some()
        && map_of(func, consumer).is_some()
        && c.ty.dims == inst.ty.dims
        && row_major(&c.ty)
        && row_major(&inst.ty)
        && inst.ty.storage_len() > 0
        && inst.operands.iter().all(|&v| row_major(func.type_of(v)))
}

/// What a typed kernel computes per element: a load of one of its sources, or a map of
/// the values of its terms (an inlined producer's, or the kernel's own op).
enum Term {
    Load(usize),
    Map(TypedMap, Vec<Term>),
}

/// `where(cmp(a, b), t, f)` over the loads of sources `[a, b, t, f]`.
struct FloatSelect {
    cmp: CmpOp,
    sources: [usize; 4],
}

impl FloatSelect {
    fn expr(&self, loads: &[Expr]) -> Expr {
        let [a, b, t, f] = self.sources.map(|k| loads[k].clone());
        Expr::select(self.cmp, a, b, t, f)
    }
}

impl Term {
    /// The element as one comparison and select on `f32` lanes, when the term is a
    /// `where` whose condition compares two `f32` sources (`not(equal(a, b))` is the
    /// comparison `≠`, true for NaN as `not` of IEEE equality is) and whose branches are
    /// `f32` sources: such a kernel runs on vectors. The comparison and the sources of
    /// its operands and branches; `dtypes` are the sources' element types.
    fn float_select(&self, dtypes: &[DType]) -> Option<FloatSelect> {
        let f32_source = |t: &Term| match t {
            Term::Load(k) if dtypes[*k] == DType::F32 => Some(*k),
            _ => None,
        };
        let Term::Map(TypedMap::Where, terms) = self else {
            return None;
        };
        let [cond, if_true, if_false] = &terms[..] else {
            return None;
        };
        let (cmp, operands) = match cond {
            Term::Map(TypedMap::Compare(c), operands) => (cmp_op(*c), operands),
            Term::Map(TypedMap::Not(DType::Bool), inner) => match &inner[..] {
                [Term::Map(TypedMap::Compare(Comparison::Equal), operands)] => {
                    (CmpOp::Ne, operands)
                }
                _ => return None,
            },
            _ => return None,
        };
        let [a, b] = &operands[..] else {
            return None;
        };
        Some(FloatSelect {
            cmp,
            sources: [
                f32_source(a)?,
                f32_source(b)?,
                f32_source(if_true)?,
                f32_source(if_false)?,
            ],
        })
    }

    fn expr(&self, loads: &[Expr]) -> Result<Expr, String> {
        match self {
            Term::Load(k) => Ok(loads[*k].clone()),
            Term::Map(map, terms) => {
                let x: Vec<Expr> = terms
                    .iter()
                    .map(|t| t.expr(loads))
                    .collect::<Result<_, _>>()?;
                map.apply(&x)
            }
        }
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
    // the operands, with every inlined producer's own operands in its place
    let mut names = vec![map.name()];
    let mut sources: Vec<Value> = Vec::new();
    let terms = operands
        .iter()
        .map(|&v| term_of(cx, v, &mut sources, &mut names))
        .collect();
    let term = Term::Map(map, terms);
    let mut b = KernelBuilder::new(&format!("{}_{}", names.join("_"), dims_name(out_dims)));
    let mut args = Vec::new();
    let mut strides = Vec::new();
    let mut srcs = Vec::new();
    for (i, &v) in sources.iter().enumerate() {
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
    let dtypes: Vec<DType> = srcs.iter().map(|&(_, d)| d).collect();
    // a select between f32 sources on an f32 comparison runs on f32x4 lanes, every
    // source consecutive or broadcast along the last dimension
    let select = term
        .float_select(&dtypes)
        .filter(|_| out_ty.dtype == DType::F32)
        .filter(|_| st.iter().all(|s| matches!(s.last(), Some(0 | 1))));
    if let Some(select) = select {
        emit_nest(&mut b, &dims, true, &mut |b, idx, w| {
            let loads: Vec<Expr> = srcs
                .iter()
                .enumerate()
                .map(|(k, &(buf, _))| {
                    let lane_stride = st[k].last().copied().unwrap_or(1);
                    load_lanes(buf, index_of(&st[k], idx), lane_stride, w)
                })
                .collect();
            b.store(y, index_of(&st[srcs.len()], idx), select.expr(&loads), w);
        });
        return cx.step(b.finish(), args);
    }
    let mut failure = None;
    emit_nest(&mut b, &dims, false, &mut |b, idx, _| {
        let loads: Vec<Expr> = srcs
            .iter()
            .enumerate()
            .map(|(k, &(buf, dtype))| Expr::load(buf, index_of(&st[k], idx), Width::scalar(dtype)))
            .collect();
        match term.expr(&loads) {
            Ok(v) => b.store(y, index_of(&st[srcs.len()], idx), v, out_width),
            Err(m) => failure = Some(m),
        }
    });
    if let Some(m) = failure {
        return Err(cx.unsupported(m));
    }
    cx.step(b.finish(), args)
}

/// The term of operand `v`: a load of a new source, or the map of an inlined producer
/// over its own operands' terms (its name added to `names`).
fn term_of(cx: &Cx, v: Value, sources: &mut Vec<Value>, names: &mut Vec<String>) -> Term {
    let producer = cx
        .func
        .def(v)
        .and_then(|d| match d {
            smelt_ir::graph::ValueDef::Inst(i) if cx.inlined.get(i) == Some(&true) => Some(i),
            _ => None,
        })
        .and_then(|i| Some((i, map_of(cx.func, i)?)));
    match producer {
        Some((i, map)) => {
            names.push(map.name());
            let terms = cx.func.insts[i]
                .operands
                .iter()
                .map(|&o| term_of(cx, o, sources, names))
                .collect();
            Term::Map(map, terms)
        }
        // one source per value: a value read twice is loaded once per element
        None => match sources.iter().position(|&s| s == v) {
            Some(k) => Term::Load(k),
            None => {
                sources.push(v);
                Term::Load(sources.len() - 1)
            }
        },
    }
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
