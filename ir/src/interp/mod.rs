//! The reference interpreter: plain loops, f64 accumulation, every op and layout — the oracle.
//!
//! Every later stage (fusion, layout, lowering, the JIT, ONNX import) is checked against
//! this module. It favours obviously-right loops over speed, with one exception: the
//! convolution keeps its index math out of the inner loop so that a whole ResNet-50 runs
//! in seconds.
//!
//! Conventions shared by every op:
//! - operands may come in any layout; each is read in row-major order first;
//! - integer and `i1` ops are exact (wrapping two's-complement arithmetic; integer
//!   division by zero and an out-of-range gather index are errors);
//! - every reduction (conv, matmul, gemm, pools, norms, softmax) accumulates in `f64`,
//!   every elementwise op evaluates in `f64`, and every op rounds its result to `f32`
//!   once, so a fused op equals the unfused sequence of ops bit for bit;
//! - the result is produced in the layout of the declared result type;
//! - NaN and infinities flow through as the arithmetic says (max pool propagates NaN;
//!   a pool window that holds no input element at all yields NaN, as ONNX's reference does).
//!
//! ```
//! use smelt_ir::{builder::FuncBuilder, interp, op::{Op, UnaryOp}, Module, Tensor, TensorType};
//! let mut module = Module::default();
//! let mut b = FuncBuilder::new(&mut module, "f");
//! let x = b.param("x", TensorType::f32([3]));
//! let y = b.op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
//! b.finish(&[("y", y)]);
//! let input = Tensor::new([3], vec![-1.0, 0.5, 2.0]).unwrap();
//! let out = interp::run(&module, &module.funcs[0], &[input]).unwrap();
//! assert_eq!(out[0].f32s(), [0.0, 0.5, 2.0]);
//! ```

mod conv;
mod elementwise;
mod grid_sample;
mod linalg;
mod norm;
mod pool;
mod shape;
mod typed;

use typed::Operand;

use std::borrow::Cow;

use crate::diag::{Diagnostic, Location};
use crate::graph::{Func, Module, Use};
use crate::op::{FusedOp, Op, PostOp};
use crate::tensor::{Tensor, TensorData};
use crate::types::{DType, Layout, TensorType};
use crate::weights::WeightStore;

/// Runs `func` of `module` on `inputs` (one per parameter, in order) and returns its
/// results in order.
///
/// Inputs are checked against the parameters (count, element type, dims, layout, data
/// length); errors name the parameter. Intermediate values are freed after their last
/// use. Errors inside an op carry that instruction's location.
pub fn run(module: &Module, func: &Func, inputs: &[Tensor]) -> Result<Vec<Tensor>, Diagnostic> {
    execute(module, func, inputs, Keep::Results)
}

/// Like [`run`], but returns every value of the function: the parameters, then the
/// result of each instruction in order (so value `%i` is element `i`). Used to compare
/// two functions layer by layer.
pub fn run_keep_all(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>, Diagnostic> {
    execute(module, func, inputs, Keep::All)
}

/// Evaluates one op on concrete operands, producing a tensor of `result_ty` (including
/// its layout). `weights` resolves `const` ops.
///
/// The operands' types are checked with the op's type rule and the inferred result dims
/// must equal `result_ty`'s; operand data must match its type's storage length. This is
/// what const folding calls to materialize folded weights.
pub fn eval_op(
    op: &Op,
    operands: &[&Tensor],
    result_ty: &TensorType,
    weights: &WeightStore,
) -> Result<Tensor, Diagnostic> {
    let err = |code, msg: String| Diagnostic::error(code, msg, Location::Unknown);
    for (i, t) in operands.iter().enumerate() {
        check_tensor(t).map_err(|m| {
            err(
                "bad-operand",
                format!("operand {i} of '{}': {m}", op.name()),
            )
        })?;
    }
    check_type(result_ty).map_err(|m| {
        err(
            "type-mismatch",
            format!("result type of '{}': {m}", op.name()),
        )
    })?;
    let types: Vec<&TensorType> = operands.iter().map(|t| &t.ty).collect();
    let inferred = op
        .infer_type(&types, &|id| weights.type_of(id))
        .map_err(|m| err("type-mismatch", m))?;
    if inferred.dims != result_ty.dims || inferred.dtype != result_ty.dtype {
        return Err(err(
            "type-mismatch",
            format!(
                "'{}' computes {inferred} but the result is declared {result_ty}",
                op.name()
            ),
        ));
    }
    let args: Vec<Operand> = operands.iter().map(|t| Operand::of(t)).collect();
    let data = compute(op, &args, &result_ty.dims, weights)?;
    if data.len() != result_ty.num_elements() || data.dtype() != result_ty.dtype {
        // A kernel bug, reported rather than panicking in the layout conversion below.
        return Err(err(
            "internal-error",
            format!(
                "'{}' produced {} elements of {} for {result_ty}",
                op.name(),
                data.len(),
                data.dtype()
            ),
        ));
    }
    let row_major = Tensor {
        ty: result_ty.with_layout(Layout::RowMajor),
        data,
    };
    Ok(match result_ty.layout {
        Layout::RowMajor => row_major,
        Layout::Blocked { .. } => row_major.to_layout(result_ty.layout),
    })
}

/// Which values [`execute`] returns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    Results,
    All,
}

fn execute(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
    keep: Keep,
) -> Result<Vec<Tensor>, Diagnostic> {
    if func.is_symbolic() {
        return Err(Diagnostic::error(
            "symbolic-sizes",
            crate::symbolic::needs_known_sizes("the interpreter", func),
            func.loc.clone(),
        ));
    }
    check_inputs(func, inputs)?;
    let uses = func.uses();
    let num_params = func.params.len();
    // Index of the last instruction reading each value; results stay alive to the end.
    let last_use: Vec<Option<usize>> = uses
        .iter()
        .map(|us| {
            if us.iter().any(|u| matches!(u, Use::Result(_))) {
                return None;
            }
            Some(
                us.iter()
                    .filter_map(|u| match u {
                        Use::Operand { inst, .. } => Some(*inst),
                        Use::Result(_) => None,
                    })
                    .max()
                    .unwrap_or(0),
            )
        })
        .collect();
    let mut values: Vec<Option<Cow<Tensor>>> =
        inputs.iter().map(|t| Some(Cow::Borrowed(t))).collect();
    values.reserve(func.insts.len());
    for (i, inst) in func.insts.iter().enumerate() {
        let here = |d: Diagnostic| {
            Diagnostic {
                location: if d.location == Location::Unknown {
                    inst.loc.clone()
                } else {
                    d.location
                },
                ..d
            }
            .with_note(format!(
                "while interpreting %{} = {} (instruction {i} of @{})",
                num_params + i,
                inst.op.name(),
                func.name
            ))
        };
        let mut operands = Vec::with_capacity(inst.operands.len());
        for (k, v) in inst.operands.iter().enumerate() {
            match values.get(v.index()) {
                Some(Some(t)) => operands.push(t.as_ref()),
                Some(None) | None => {
                    return Err(here(Diagnostic::error(
                        "undefined-value",
                        format!(
                            "operand {k} of '{}' is %{}, which is not defined before it",
                            inst.op.name(),
                            v.index()
                        ),
                        Location::Unknown,
                    )))
                }
            }
        }
        let result = eval_op(&inst.op, &operands, &inst.ty, &module.weights).map_err(here)?;
        values.push(Some(Cow::Owned(result)));
        if keep == Keep::Results {
            let defined = num_params + i;
            for v in inst.operands.iter().map(|v| v.index()).chain([defined]) {
                if last_use
                    .get(v)
                    .copied()
                    .flatten()
                    .is_some_and(|last| last <= i)
                {
                    values[v] = None;
                }
            }
        }
    }
    match keep {
        // Nothing was freed, so every value is present.
        Keep::All => Ok(values.into_iter().flatten().map(Cow::into_owned).collect()),
        Keep::Results => func
            .results
            .iter()
            .map(|r| match values.get(r.value.index()) {
                Some(Some(t)) => Ok(t.as_ref().clone()),
                Some(None) | None => Err(Diagnostic::error(
                    "undefined-value",
                    format!(
                        "result '{}' of @{} is %{}, which is not defined",
                        r.name,
                        func.name,
                        r.value.index()
                    ),
                    func.loc.clone(),
                )),
            })
            .collect(),
    }
}

/// Checks the inputs against the function's parameters.
fn check_inputs(func: &Func, inputs: &[Tensor]) -> Result<(), Diagnostic> {
    let bad = |msg: String| Diagnostic::error("bad-input", msg, func.loc.clone());
    if inputs.len() != func.params.len() {
        return Err(bad(format!(
            "@{} takes {} inputs ({}), got {}",
            func.name,
            func.params.len(),
            func.params
                .iter()
                .map(|p| format!("%{}", p.name))
                .collect::<Vec<_>>()
                .join(", "),
            inputs.len()
        )));
    }
    for (p, t) in func.params.iter().zip(inputs) {
        if t.ty.dtype != p.ty.dtype || t.ty.dims != p.ty.dims || t.ty.layout != p.ty.layout {
            return Err(bad(format!(
                "input %{} of @{} must be {}, got {}",
                p.name, func.name, p.ty, t.ty
            )));
        }
        check_tensor(t).map_err(|m| bad(format!("input %{} of @{}: {m}", p.name, func.name)))?;
    }
    Ok(())
}

/// Checks that a type is allocatable and its layout fits its rank.
fn check_type(ty: &TensorType) -> Result<(), String> {
    if let Layout::Blocked { axis, block } = ty.layout {
        if axis as usize >= ty.rank() || block == 0 {
            return Err(format!(
                "layout blocked<{axis},{block}> does not fit a rank-{} tensor",
                ty.rank()
            ));
        }
    }
    ty.check_size()
}

/// Checks that a tensor's data length matches its type's storage.
fn check_tensor(t: &Tensor) -> Result<(), String> {
    check_type(&t.ty)?;
    if t.data.len() != t.ty.storage_len() {
        return Err(format!(
            "{} stores {} elements, but its data has {}",
            t.ty,
            t.ty.storage_len(),
            t.data.len()
        ));
    }
    Ok(())
}

impl<'a> Operand<'a> {
    fn of(t: &'a Tensor) -> Operand<'a> {
        let data = match t.ty.layout {
            Layout::RowMajor => Cow::Borrowed(&t.data),
            Layout::Blocked { .. } => Cow::Owned(t.to_row_major()),
        };
        Operand {
            dims: &t.ty.dims,
            data,
        }
    }
}

/// An `f32` operand seen by the floating-point kernels: logical dims and row-major data.
struct Arg<'a> {
    dims: &'a [usize],
    data: Cow<'a, [f32]>,
}

/// Computes `op` on row-major operands whose types the type rule has accepted, giving
/// the row-major elements of a result with dims `out`. Ops on any element type are
/// `typed`'s; the rest compute on `f32`.
fn compute(
    op: &Op,
    args: &[Operand],
    out: &[usize],
    weights: &WeightStore,
) -> Result<TensorData, Diagnostic> {
    let fail = |m: String| Diagnostic::error("run-time-error", m, Location::Unknown);
    let integer = args.first().is_some_and(|a| a.data.dtype() != DType::F32);
    let a = |i: usize| &args[i];
    let typed = match op {
        Op::Const(id) => return read_weight(*id, weights),
        Op::Binary(b) if integer => typed::integer_binary(*b, a(0), a(1), out),
        Op::Unary(u) if integer => typed::integer_unary(*u, a(0)),
        Op::Cast { to } => Ok(typed::cast(&a(0).data, *to)),
        Op::Compare(c) => typed::compare(*c, a(0), a(1), out),
        Op::Logic(l) => typed::logic(*l, a(0), a(1), out),
        Op::Not => typed::not(a(0)),
        Op::Where => typed::select(a(0), a(1), a(2), out),
        Op::Mod { fmod } => typed::modulo(*fmod, a(0), a(1), out),
        Op::Gather { axis } => typed::gather(a(0), a(1), *axis),
        Op::Resize(r) => typed::resize(a(0), r),
        // the bytes do not move; `eval_op` stores the result in the target layout
        Op::Flatten { .. } | Op::Reshape { .. } | Op::Reorder { .. } => {
            Ok(a(0).data.as_ref().clone())
        }
        Op::Transpose { perm } => Ok(typed::transpose(a(0), perm)),
        Op::Slice(sl) => Ok(typed::slice(a(0), sl, out)),
        Op::Pad(p) => typed::pad(a(0), args.get(1), p, out),
        Op::Expand { .. } => Ok(typed::expand(a(0), out)),
        Op::Tile { repeats } => Ok(typed::tile(a(0), repeats)),
        Op::Concat { axis } => typed::concat(args, *axis),
        Op::Conv2d(_)
        | Op::BatchNorm { .. }
        | Op::Unary(_)
        | Op::Binary(_)
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
        | Op::ConvTranspose2d(_)
        | Op::GridSample(_) => {
            let floats = args
                .iter()
                .map(|x| match x.data.as_ref() {
                    TensorData::F32(v) => Ok(Arg {
                        dims: x.dims,
                        data: Cow::Borrowed(v.as_slice()),
                    }),
                    other => Err(fail(format!(
                        "internal: '{}' got an operand of {}",
                        op.name(),
                        other.dtype()
                    ))),
                })
                .collect::<Result<Vec<Arg>, Diagnostic>>()?;
            return Ok(TensorData::F32(compute_f32(op, &floats, out, weights)?));
        }
    };
    typed.map_err(fail)
}

/// Computes a floating-point op (every operand and the result `f32`).
fn compute_f32(
    op: &Op,
    args: &[Arg],
    out: &[usize],
    weights: &WeightStore,
) -> Result<Vec<f32>, Diagnostic> {
    let a = |i: usize| &args[i];
    Ok(match op {
        Op::Conv2d(attrs) => conv::conv2d(attrs, a(0), a(1), args.get(2), out),
        Op::ConvTranspose2d(attrs) => conv::conv_transpose2d(attrs, a(0), a(1), args.get(2), out),
        Op::BatchNorm { epsilon } => {
            norm::batch_norm(a(0), [a(1), a(2), a(3), a(4)], epsilon.0 as f64)
        }
        Op::Unary(u) => elementwise::unary(*u, &a(0).data),
        Op::Binary(b) => elementwise::binary(*b, a(0), a(1), out),
        Op::LayerNorm { axis, epsilon } => {
            norm::layer_norm(a(0), *axis, a(1), args.get(2), epsilon.0 as f64)
        }
        Op::MaxPool2d(p) => pool::max_pool2d(p, a(0), out),
        Op::AvgPool2d {
            pool: p,
            count_include_pad,
        } => pool::avg_pool2d(p, *count_include_pad, a(0), out),
        Op::GlobalAvgPool => pool::global_avg_pool(a(0)),
        Op::MatMul => linalg::matmul(a(0), a(1), out),
        Op::Gemm(g) => linalg::gemm(g, a(0), a(1), args.get(2), out),
        Op::Softmax { axis } => norm::softmax(a(0), *axis),
        Op::BnFoldWeight { epsilon } => {
            norm::bn_fold_weight(a(0), &a(1).data, &a(2).data, epsilon.0 as f64)
        }
        Op::BnFoldBias { epsilon } => norm::bn_fold_bias(
            [&a(0).data, &a(1).data, &a(2).data, &a(3).data],
            args.get(4).map(|b| &*b.data),
            epsilon.0 as f64,
        ),
        Op::BnScale { epsilon } => norm::bn_scale(&a(0).data, &a(1).data, epsilon.0 as f64),
        Op::BnShift { epsilon } => norm::bn_fold_bias(
            [&a(0).data, &a(1).data, &a(2).data, &a(3).data],
            None,
            epsilon.0 as f64,
        ),
        Op::ChannelScale => norm::channel_scale(a(0), &a(1).data),
        Op::ChannelVector => a(0).data.to_vec(),
        Op::ConvShiftBias => conv::conv_shift_bias(a(0), &a(1).data),
        Op::Reduce(r, attrs) => norm::reduce(*r, attrs, a(0)),
        Op::GridSample(g) => grid_sample::grid_sample(g, a(0), a(1), out),
        Op::Fused(f) => fused(f, args, out, weights)?,
        // Ops on any element type are computed by `compute` before this.
        Op::Const(_)
        | Op::Flatten { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Concat { .. }
        | Op::Slice(_)
        | Op::Pad(_)
        | Op::Expand { .. }
        | Op::Tile { .. }
        | Op::Reorder { .. }
        | Op::Cast { .. }
        | Op::Compare(_)
        | Op::Logic(_)
        | Op::Not
        | Op::Where
        | Op::Mod { .. }
        | Op::Gather { .. }
        | Op::Resize(_) => {
            return Err(Diagnostic::error(
                "internal-error",
                format!("'{}' reached the f32 kernels", op.name()),
                Location::Unknown,
            ))
        }
    })
}

/// A fused op: the anchor, then each post-op applied elementwise in order, rounding to
/// f32 after each step exactly as the unfused sequence would.
fn fused(
    f: &FusedOp,
    args: &[Arg],
    out: &[usize],
    weights: &WeightStore,
) -> Result<Vec<f32>, Diagnostic> {
    let n_anchor = args.len() - f.num_post_operands();
    let mut acc = compute_f32(&f.anchor, &args[..n_anchor], out, weights)?;
    let mut extra = args[n_anchor..].iter();
    for post in &f.post_ops {
        match post {
            PostOp::Unary(u) => elementwise::unary_in_place(*u, &mut acc),
            PostOp::Binary { op, acc_is_lhs } => {
                let operand = extra.next().ok_or_else(|| {
                    Diagnostic::error(
                        "type-mismatch",
                        "fused op has fewer operands than binary post-ops",
                        Location::Unknown,
                    )
                })?;
                elementwise::binary_post_op(*op, *acc_is_lhs, &mut acc, operand, out);
            }
        }
    }
    Ok(acc)
}

/// The logical elements of a weight in row-major order, in its own element type.
fn read_weight(
    id: crate::weights::WeightId,
    weights: &WeightStore,
) -> Result<TensorData, Diagnostic> {
    let bad = |m: String| Diagnostic::error("bad-weight", m, Location::Unknown);
    let w = weights
        .get(id)
        .ok_or_else(|| bad(format!("unknown weight {}", id.0)))?;
    check_type(&w.ty).map_err(|m| bad(format!("weight @{}: {m}", w.name)))?;
    let values = w.elements().ok_or_else(|| {
        bad(format!(
            "weight @{} of type {} holds {} bytes, which are not {} elements",
            w.name,
            w.ty,
            w.data.len_bytes(),
            w.ty.dtype
        ))
    })?;
    if values.len() != w.ty.storage_len() {
        return Err(bad(format!(
            "weight @{} of type {} has {} elements of data, expected {}",
            w.name,
            w.ty,
            values.len(),
            w.ty.storage_len()
        )));
    }
    let stored = Tensor {
        ty: w.ty.clone(),
        data: values,
    };
    Ok(match w.ty.layout {
        Layout::RowMajor => stored.data,
        Layout::Blocked { .. } => stored.to_row_major(),
    })
}
