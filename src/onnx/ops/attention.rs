//! Attention (opsets 23 to 25) as a composition of IR ops: scaled dot-product attention
//! with grouped key/value heads, a key/value cache, boolean or additive masks, the causal
//! and sliding-window frontiers, soft capping and the fully-masked-row guard, in the
//! order and form of the operator's reference function.
//!
//! Shapes are static, so everything the mask depends on besides `attn_mask` (the causal
//! frontier, the windows, `nonpad_kv_seqlen`) is computed at import as one constant
//! additive bias of zeros and `-inf`. Grouped heads are never repeated: query heads that
//! share a key/value head are folded into that head's rows (`[B, Hkv, r·Sq, D]`), which
//! is the same product as numpy's interleaved repeat of K and V. RotaryEmbedding (the
//! positional rotation attention inputs get) is here too, as slices, products and concats.

use smelt_ir::op::{BinaryOp, Comparison, Op, ReduceAttrs, Reduction, UnaryOp};
use smelt_ir::{DType, Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Attention"           [23, 24, 25],                   from 23 => attention;
    "RotaryEmbedding"     [23],                           from 23 => rotary_embedding;
};

/// Which intermediate the optional fourth output (`qk_matmul_output`) holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QkOutput {
    /// The scaled Q·Kᵀ (mode 0).
    Raw,
    /// After the soft cap (mode 1).
    Capped,
    /// After the soft cap and the bias (mode 2).
    Biased,
    /// The guarded softmax probabilities (mode 3).
    Probabilities,
}

/// The attention inputs in the 4-D form `[batch, heads, sequence, head size]`.
struct Heads {
    q: Value,
    k: Value,
    v: Value,
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    head_size: usize,
    v_head_size: usize,
    /// Whether Q, K and V came as 3-D `[batch, sequence, hidden]` (so Y goes back to it).
    three_d: bool,
}

/// Attention: `softmax(softcap(Q·Kᵀ·scale) + bias)·V` per head, with the present key and
/// value (the cache with the new keys appended) and the `qk_matmul_output` intermediate.
/// `softmax_precision` other than float32 is refused: smelt computes in float32.
pub fn attention(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let mut known = vec![
        "is_causal",
        "kv_num_heads",
        "q_num_heads",
        "qk_matmul_output_mode",
        "scale",
        "softcap",
        "softmax_precision",
    ];
    if cx.version >= 25 {
        known.extend(["left_window_size", "right_window_size"]);
    }
    cx.check_attrs(&known)?;
    cx.check_max_inputs(if cx.version >= 24 { 7 } else { 6 })?;
    let qk_output = match cx.attr_int_or("qk_matmul_output_mode", 0)? {
        0 => QkOutput::Raw,
        1 => QkOutput::Capped,
        2 => QkOutput::Biased,
        3 => QkOutput::Probabilities,
        m => return Err(cx.bad_attr("qk_matmul_output_mode", format!("{m} is not 0, 1, 2 or 3"))),
    };
    if let Some(p) = cx.attr_int("softmax_precision")? {
        if p != 1 {
            return Err(cx.err(
                "onnx-unsupported-attribute",
                format!(
                    "softmax_precision {p}: smelt computes the softmax in float32 \
                     (softmax_precision 1) only"
                ),
            ));
        }
    }
    let softcap = cx.attr_float_or("softcap", 0.0)?;
    if softcap.is_nan() || softcap < 0.0 {
        return Err(cx.bad_attr("softcap", format!("{softcap} must be 0 (none) or positive")));
    }
    let is_causal = cx.attr_bool("is_causal", false)?;
    let window = [
        window_bound(cx, "left_window_size")?,
        window_bound(cx, "right_window_size")?,
    ];

    let heads = heads(cx)?;
    let Heads {
        batch,
        q_heads,
        kv_heads,
        q_len,
        head_size,
        v_head_size,
        ..
    } = heads;

    // the cache: past keys and values in front of the new ones
    let past = match (cx.input_name(4), cx.input_name(5)) {
        (None, None) => None,
        (Some(_), Some(_)) => Some((cx.value(4)?, cx.value(5)?)),
        _ => {
            return Err(cx.err(
                "onnx-bad-model",
                "past_key and past_value must be given together",
            ))
        }
    };
    let (k, v, past_len) = match past {
        None => (heads.k, heads.v, 0),
        Some((past_k, past_v)) => {
            let pk = cx.type_of(past_k).dims.clone();
            let pv = cx.type_of(past_v).dims.clone();
            if pk.len() != 4
                || pk[..2] != [batch, kv_heads]
                || pk[3] != head_size
                || pv.len() != 4
                || pv[..3] != pk[..3]
                || pv[3] != v_head_size
            {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!(
                        "past_key {pk:?} and past_value {pv:?} must be [{batch}, {kv_heads}, \
                         past length, {head_size}] and [{batch}, {kv_heads}, past length, \
                         {v_head_size}]"
                    ),
                ));
            }
            let k = cx.emit(Op::Concat { axis: 2 }, &[past_k, heads.k])?;
            let v = cx.emit(Op::Concat { axis: 2 }, &[past_v, heads.v])?;
            (k, v, pk[2])
        }
    };
    let total = cx.type_of(k).dims[2];

    let nonpad = match cx.input_name(6) {
        None => None,
        Some(_) => {
            if past.is_some() {
                return Err(cx.err(
                    "onnx-bad-model",
                    "nonpad_kv_seqlen cannot be combined with past_key and past_value",
                ));
            }
            let lengths = cx.const_ints(6, "nonpad_kv_seqlen")?;
            if lengths.len() != batch {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!(
                        "nonpad_kv_seqlen has {} values; it must have one per batch entry ({batch})",
                        lengths.len()
                    ),
                ));
            }
            Some(lengths)
        }
    };

    // scores: (Q·√scale)(K·√scale)ᵀ, the grouped query heads as rows of their key head
    let scale = match cx.attr_float("scale")? {
        None => 1.0 / (head_size as f64).sqrt(),
        Some(s) if s.is_finite() && s > 0.0 => f64::from(s),
        Some(s) => {
            return Err(cx.err(
                "onnx-unsupported-attribute",
                format!("scale {s}: smelt scales Q and K by √scale, so scale must be positive"),
            ))
        }
    };
    let root = cx.scalar(scale.sqrt() as f32)?;
    let group = q_heads / kv_heads;
    let q = cx.emit(Op::Binary(BinaryOp::Mul), &[heads.q, root])?;
    let q = cx.reshape(q, vec![batch, kv_heads, group * q_len, head_size])?;
    let k_scaled = cx.emit(Op::Binary(BinaryOp::Mul), &[k, root])?;
    let k_t = cx.emit(
        Op::Transpose {
            perm: vec![0, 1, 3, 2],
        },
        &[k_scaled],
    )?;
    let scores = cx.emit(Op::MatMul, &[q, k_t])?;
    let scores = cx.reshape(scores, vec![batch, q_heads, q_len, total])?;
    let raw = scores;

    let capped = if softcap > 0.0 {
        let cap = cx.scalar(softcap)?;
        let s = cx.emit(Op::Binary(BinaryOp::Div), &[scores, cap])?;
        let t = cx.emit(Op::Unary(UnaryOp::Tanh), &[s])?;
        cx.emit(Op::Binary(BinaryOp::Mul), &[t, cap])?
    } else {
        scores
    };

    let frontier = Frontier {
        is_causal,
        window,
        past_len,
        nonpad: nonpad.as_deref(),
        batch,
        q_len,
        total,
    };
    let fixed = frontier.bias();
    let mask = attn_mask(cx, [batch, q_heads, q_len, total])?;
    let fixed_value = match &fixed {
        Some(b) => {
            let name = cx.derived_name("attention_bias");
            Some(cx.materialize(b, &name)?)
        }
        None => None,
    };
    let bias = match (mask, fixed_value) {
        (Some(m), Some(f)) => Some(cx.emit(Op::Binary(BinaryOp::Add), &[m, f])?),
        (m, f) => m.or(f),
    };
    let biased = match bias {
        Some(b) => cx.emit(Op::Binary(BinaryOp::Add), &[capped, b])?,
        None => capped,
    };

    let probabilities = cx.emit(Op::Softmax { axis: 3 }, &[biased])?;
    let masked = match mask {
        None => fixed
            .as_ref()
            .map(|f| masked_rows_of(cx, f))
            .transpose()?
            .flatten(),
        Some(_) => bias.map(|b| masked_rows(cx, b)).transpose()?,
    };
    let probabilities = match masked {
        Some(masked) => {
            let zero = cx.scalar(0.0)?;
            cx.emit(Op::Where, &[masked, zero, probabilities])?
        }
        None => probabilities,
    };

    let p = cx.reshape(probabilities, vec![batch, kv_heads, group * q_len, total])?;
    let y = cx.emit(Op::MatMul, &[p, v])?;
    let y = cx.reshape(y, vec![batch, q_heads, q_len, v_head_size])?;
    let y = if heads.three_d {
        let t = cx.emit(
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[y],
        )?;
        cx.reshape(t, vec![batch, q_len, q_heads * v_head_size])?
    } else {
        y
    };
    let qk = match qk_output {
        QkOutput::Raw => raw,
        QkOutput::Capped => capped,
        QkOutput::Biased => biased,
        QkOutput::Probabilities => probabilities,
    };
    Ok(vec![
        Entry::Value(y),
        Entry::Value(k),
        Entry::Value(v),
        Entry::Value(qk),
    ])
}

/// A window attribute: `-1` (the default) is unbounded, `None`.
fn window_bound(cx: &NodeCtx, name: &str) -> Result<Option<i64>, Diagnostic> {
    match cx.attr_int_or(name, -1)? {
        -1 => Ok(None),
        w if w >= 0 => Ok(Some(w)),
        w => Err(cx.bad_attr(name, format!("{w} must be -1 (unbounded) or non-negative"))),
    }
}

/// Q, K and V checked and brought to the 4-D form (3-D inputs split into heads).
fn heads(cx: &mut NodeCtx) -> Result<Heads, Diagnostic> {
    let dims = [cx.dims(0)?, cx.dims(1)?, cx.dims(2)?];
    let rank = dims[0].len();
    if dims.iter().any(|d| d.len() != rank) || !(rank == 3 || rank == 4) {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "Q {:?}, K {:?} and V {:?} must all be 3-D [batch, sequence, hidden] or all \
                 4-D [batch, heads, sequence, head size]",
                dims[0], dims[1], dims[2]
            ),
        ));
    }
    let q_num = cx.attr_int("q_num_heads")?;
    let kv_num = cx.attr_int("kv_num_heads")?;
    let three_d = rank == 3;
    let (q, k, v, q_heads, kv_heads) = if three_d {
        let (Some(qn), Some(kvn)) = (q_num, kv_num) else {
            return Err(cx.err(
                "onnx-bad-model",
                "3-D Q, K and V need the q_num_heads and kv_num_heads attributes",
            ));
        };
        let split = |cx: &mut NodeCtx, i: usize, n: i64, what: &str| -> Result<Value, Diagnostic> {
            let d = &dims[i];
            if n <= 0 || d[2] % n as usize != 0 {
                return Err(cx.bad_attr(
                    what,
                    format!(
                        "{n} heads do not divide the hidden size {} of input {i}",
                        d[2]
                    ),
                ));
            }
            let n = n as usize;
            let x = cx.value(i)?;
            let x = cx.reshape(x, vec![d[0], d[1], n, d[2] / n])?;
            cx.emit(
                Op::Transpose {
                    perm: vec![0, 2, 1, 3],
                },
                &[x],
            )
        };
        let q = split(cx, 0, qn, "q_num_heads")?;
        let k = split(cx, 1, kvn, "kv_num_heads")?;
        let v = split(cx, 2, kvn, "kv_num_heads")?;
        (q, k, v, qn as usize, kvn as usize)
    } else {
        for (given, i, what) in [(q_num, 0, "q_num_heads"), (kv_num, 1, "kv_num_heads")] {
            if let Some(n) = given {
                if cx.version >= 25 || n != dims[i][1] as i64 {
                    return Err(cx.bad_attr(
                        what,
                        "is for 3-D inputs; 4-D inputs give their heads as dimension 1",
                    ));
                }
            }
        }
        (
            cx.value(0)?,
            cx.value(1)?,
            cx.value(2)?,
            dims[0][1],
            dims[1][1],
        )
    };
    let [qd, kd, vd] = [q, k, v].map(|x| cx.type_of(x).dims.clone());
    if kd[..3] != vd[..3]
        || qd[0] != kd[0]
        || qd[3] != kd[3]
        || kv_heads == 0
        || q_heads % kv_heads != 0
    {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "as [batch, heads, sequence, head size], Q {qd:?}, K {kd:?} and V {vd:?} \
                 must share the batch, K and V their heads and sequence, Q and K the head \
                 size, and Q's heads must be a multiple of K's"
            ),
        ));
    }
    Ok(Heads {
        q,
        k,
        v,
        batch: qd[0],
        q_heads,
        kv_heads,
        q_len: qd[2],
        head_size: qd[3],
        v_head_size: vd[3],
        three_d,
    })
}

/// The mask positions known at import: the causal frontier, the windows and the padding
/// `nonpad_kv_seqlen` gives, each relative to the query block's offset in the keys.
struct Frontier<'a> {
    is_causal: bool,
    /// Left and right window sizes (`None`: unbounded).
    window: [Option<i64>; 2],
    past_len: usize,
    nonpad: Option<&'a [i64]>,
    batch: usize,
    q_len: usize,
    total: usize,
}

impl Frontier<'_> {
    /// The additive bias (0 where a key may be attended, `-inf` where not), `[Sq, T]`,
    /// or `[B, 1, Sq, T]` when the offset differs per batch entry; `None` when every key
    /// may be attended.
    fn bias(&self) -> Option<ConstTensor> {
        let limited = self.is_causal || self.window.iter().any(Option::is_some);
        if !limited && self.nonpad.is_none() {
            return None;
        }
        let (rows, dims) = match self.nonpad {
            Some(_) => (self.batch, vec![self.batch, 1, self.q_len, self.total]),
            None => (1, vec![self.q_len, self.total]),
        };
        let mut values = Vec::with_capacity(rows * self.q_len * self.total);
        let mut any_masked = false;
        for b in 0..rows {
            let offset = match self.nonpad {
                Some(n) => n[b] - self.q_len as i64,
                None => self.past_len as i64,
            };
            for i in 0..self.q_len as i64 {
                for j in 0..self.total as i64 {
                    let position = i + offset;
                    let allowed = (!self.is_causal || j <= position)
                        && self.window[0].is_none_or(|l| position - j <= l)
                        && self.window[1].is_none_or(|r| j - position <= r)
                        && self.nonpad.is_none_or(|n| j < n[b]);
                    any_masked |= !allowed;
                    values.push(if allowed { 0.0 } else { f32::NEG_INFINITY });
                }
            }
        }
        any_masked.then(|| ConstTensor::f32(dims, values))
    }
}

/// `attn_mask` as an additive float bias: a boolean mask becomes 0 (attend) or `-inf`,
/// and a mask shorter than the keys is padded with `-inf` (false). `None` when absent.
fn attn_mask(cx: &mut NodeCtx, scores: [usize; 4]) -> Result<Option<Value>, Diagnostic> {
    if cx.input_name(3).is_none() {
        return Ok(None);
    }
    let dims = cx.dims(3)?;
    let total = scores[3];
    let fits = !dims.is_empty()
        && dims.len() <= 4
        && dims[dims.len() - 1] <= total
        && dims
            .iter()
            .rev()
            .skip(1)
            .zip(scores.iter().rev().skip(1))
            .all(|(&d, &s)| d == 1 || d == s);
    if !fits {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "attn_mask of shape {dims:?} does not broadcast to the scores {scores:?} \
                 (its last dimension may be shorter than the keys, then padded)"
            ),
        ));
    }
    let mut mask = cx.value(3)?;
    let dtype = cx.type_of(mask).dtype;
    if !matches!(dtype, DType::Bool | DType::F32) {
        return Err(cx.err(
            "onnx-bad-model",
            format!("attn_mask must be bool or float32, got {dtype}"),
        ));
    }
    let missing = total - dims[dims.len() - 1];
    if missing > 0 {
        let mut pad_dims = dims.clone();
        pad_dims[dims.len() - 1] = missing;
        let n: usize = pad_dims.iter().product();
        let pad = match dtype {
            DType::Bool => ConstTensor::bool(pad_dims, vec![false; n]),
            _ => ConstTensor::f32(pad_dims, vec![f32::NEG_INFINITY; n]),
        };
        let name = cx.derived_name("mask_padding");
        let pad = cx.materialize(&pad, &name)?;
        let axis = dims.len() - 1;
        mask = cx.emit(Op::Concat { axis }, &[mask, pad])?;
    }
    if dtype == DType::Bool {
        let zero = cx.scalar(0.0)?;
        let minus_inf = cx.scalar(f32::NEG_INFINITY)?;
        mask = cx.emit(Op::Where, &[mask, zero, minus_inf])?;
    }
    Ok(Some(mask))
}

/// The rows of the scores where every key is masked (the bias is `-inf` throughout), as
/// a boolean `[..., Sq, 1]`: their softmax is `NaN` and the operator defines them as
/// zero.
fn masked_rows(cx: &mut NodeCtx, bias: Value) -> Result<Value, Diagnostic> {
    let last = cx.type_of(bias).dims.len() - 1;
    let along = ReduceAttrs {
        axes: vec![last],
        keep_dims: true,
    };
    let max = cx.emit(Op::Reduce(Reduction::Max, along), &[bias])?;
    let minus_inf = cx.scalar(f32::NEG_INFINITY)?;
    cx.emit(Op::Compare(Comparison::Equal), &[max, minus_inf])
}

/// [`masked_rows`] of a bias known at import, as a constant; `None` when no row is fully
/// masked.
fn masked_rows_of(cx: &mut NodeCtx, bias: &ConstTensor) -> Result<Option<Value>, Diagnostic> {
    let (Some(values), Some(&row)) = (bias.f32s(), bias.dims.last()) else {
        return Ok(None);
    };
    let masked: Vec<bool> = values
        .chunks(row.max(1))
        .map(|r| r.iter().all(|&x| x == f32::NEG_INFINITY))
        .collect();
    if !masked.contains(&true) {
        return Ok(None);
    }
    let mut dims = bias.dims.clone();
    if let Some(last) = dims.last_mut() {
        *last = 1;
    }
    let name = cx.derived_name("masked_rows");
    cx.materialize(&ConstTensor::bool(dims, masked), &name)
        .map(Some)
}

/// RotaryEmbedding: the first `rotary_embedding_dim` features of each head (default all)
/// rotated pairwise by the cached angles of each position — halves paired, or neighbours
/// with `interleaved` — `(x₁·cos − x₂·sin, x₁·sin + x₂·cos)`, the rest passed through.
/// The caches are gathered by `position_ids` (a checked `gather`), or given per position.
pub fn rotary_embedding(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["interleaved", "num_heads", "rotary_embedding_dim"])?;
    cx.check_max_inputs(4)?;
    let dims = cx.dims(0)?;
    let interleaved = cx.attr_bool("interleaved", false)?;
    // 4-D [B, H, S, D] as it is; 3-D [B, S, H·D] split into [B, S, H, D]
    let (x, batch, seq, head, per_position) = match *dims.as_slice() {
        [b, _, s, d] => (cx.value(0)?, b, s, d, [b, 1, s]),
        [b, s, hidden] => {
            let heads = match cx.attr_int("num_heads")? {
                Some(n) if n > 0 && hidden % n as usize == 0 => n as usize,
                _ => {
                    return Err(cx.bad_attr(
                        "num_heads",
                        format!("a 3-D input needs a head count dividing its hidden size {hidden}"),
                    ))
                }
            };
            let x = cx.value(0)?;
            let x = cx.reshape(x, vec![b, s, heads, hidden / heads])?;
            (x, b, s, hidden / heads, [b, s, 1])
        }
        _ => {
            return Err(cx.err(
                "onnx-bad-model",
                format!("input of shape {dims:?} must be [B, H, S, D] or [B, S, hidden]"),
            ))
        }
    };
    let rotated = match cx.attr_int_or("rotary_embedding_dim", 0)? {
        0 => head,
        r if r > 0 && r as usize <= head && r % 2 == 0 => r as usize,
        r => {
            return Err(cx.bad_attr(
                "rotary_embedding_dim",
                format!("{r} must be even and at most the head size {head}"),
            ))
        }
    };
    let half = rotated / 2;
    let cache = |cx: &mut NodeCtx, i: usize, what: &str| -> Result<Value, Diagnostic> {
        let c = cx.value(i)?;
        let c = match cx.opt_value(3)? {
            Some(positions) => cx.emit(Op::Gather { axis: 0 }, &[c, positions])?,
            None => c,
        };
        let got = cx.type_of(c).dims.clone();
        if got != [batch, seq, half] {
            return Err(cx.err(
                "onnx-bad-model",
                format!("{what} gives {got:?} per position; it must be [{batch}, {seq}, {half}]"),
            ));
        }
        let mut shape = per_position.to_vec();
        shape.push(half);
        cx.reshape(c, shape)
    };
    let cos = cache(cx, 1, "cos_cache")?;
    let sin = cache(cx, 2, "sin_cache")?;
    let last = |cx: &mut NodeCtx, v: Value, start: usize, end: usize, step: i64| {
        let d = cx.type_of(v).dims.clone();
        let mut starts = vec![0i64; d.len()];
        let mut ends: Vec<i64> = d.iter().map(|&n| n as i64).collect();
        let mut steps = vec![1i64; d.len()];
        starts[d.len() - 1] = start as i64;
        ends[d.len() - 1] = end as i64;
        steps[d.len() - 1] = step;
        cx.emit(
            Op::Slice(smelt_ir::op::SliceAttrs {
                starts,
                ends,
                steps,
            }),
            &[v],
        )
    };
    let (x1, x2) = if interleaved {
        (last(cx, x, 0, rotated, 2)?, last(cx, x, 1, rotated, 2)?)
    } else {
        (last(cx, x, 0, half, 1)?, last(cx, x, half, rotated, 1)?)
    };
    let mul = |cx: &mut NodeCtx, a: Value, b: Value| cx.emit(Op::Binary(BinaryOp::Mul), &[a, b]);
    let c1 = mul(cx, cos, x1)?;
    let s2 = mul(cx, sin, x2)?;
    let real = cx.emit(Op::Binary(BinaryOp::Sub), &[c1, s2])?;
    let s1 = mul(cx, sin, x1)?;
    let c2 = mul(cx, cos, x2)?;
    let imag = cx.emit(Op::Binary(BinaryOp::Add), &[s1, c2])?;
    let x_dims = cx.type_of(x).dims.clone();
    let rotated_part = if interleaved {
        let mut pair = cx.type_of(real).dims.clone();
        pair.push(1);
        let real = cx.reshape(real, pair.clone())?;
        let imag = cx.reshape(imag, pair.clone())?;
        let both = cx.emit(
            Op::Concat {
                axis: pair.len() - 1,
            },
            &[real, imag],
        )?;
        let mut flat = x_dims.clone();
        flat[3] = rotated;
        cx.reshape(both, flat)?
    } else {
        cx.emit(Op::Concat { axis: 3 }, &[real, imag])?
    };
    let y = if rotated < head {
        let passed = last(cx, x, rotated, head, 1)?;
        cx.emit(Op::Concat { axis: 3 }, &[rotated_part, passed])?
    } else {
        rotated_part
    };
    let y = cx.reshape(y, dims)?;
    Ok(vec![Entry::Value(y)])
}
