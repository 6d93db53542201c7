//! Exact checks of polynomial and rational laws (BN folding, conv and matmul linearity,
//! the weight-preparation ops) by evaluation at random rational points: Schwartz–Zippel.
//!
//! Each instance the sampling checker builds (shapes and attributes sampled per op, convs
//! padded or not, strided, grouped) is evaluated a second time, both sides, in exact
//! rational arithmetic: every input and every non-splat weight is replaced by a random
//! rational `n / d` with `|n| ≤ 64`, `1 ≤ d ≤ 16`; splat constants (the values `scalar`
//! guards fix) keep their f32 value exactly. Each output element of either side is a
//! rational function of those values of low degree (at most 4 here); if the two sides
//! differed as functions, clearing denominators gives a nonzero polynomial of degree
//! `k ≤ 8`, which a uniformly random point from a set `S` zeroes with probability at most
//! `k / |S|` (Schwartz–Zippel; `|S|` is about 2 000 here), and independent instances
//! multiply: agreement on 8 instances leaves a chance below 1e-20 that the law is false
//! for that shape family — no solver needed. A difference is a witness: exact, no
//! rounding involved.
//!
//! Square roots of weights (BN's `sqrt(var + eps)`) are kept rational: a variance fed to
//! an op with an epsilon is drawn as `s² − eps` for a random positive rational `s`, so the
//! root is `s` exactly.
//!
//! Square roots of computed values (layer norm's `sqrt(mean((x − mean x)²) + eps)`) have
//! no rational form, so `sqrt` — the `sqrt` op, and the one inside `layer_norm`'s
//! definition — is uninterpreted: a random function, [`Uninterpreted`], whose value at
//! an argument is a random positive rational (`n / d`, `1 ≤ n ≤ 64`, `1 ≤ d ≤ 16`:
//! 634 distinct values) drawn from the argument's exact value and the point's seed, the
//! same on both sides. This is Ackermann's reduction, sampled: the
//! sides are rational functions of the inputs and of one unknown `y_a = sqrt(a)` per
//! distinct argument `a`. Arguments that are the same function of the inputs (as both
//! sides of a true layer-norm rule compute the variance) take the same value at every
//! point and so get the same `y`; arguments that are different functions coincide at a
//! random point with probability at most their degree over `|S|` (Schwartz–Zippel
//! again). So agreement at random points proves the law for every function in place of
//! `sqrt`, the real one included. A difference proves nothing about the real `sqrt`
//! (`sqrt(x·x) = |x|` differs for a random function), so an instance that used the
//! function and differs is not a witness: it is [`ExactCheck::Outside`], and the
//! sampling, which computes the real root, has the last word.
//!
//! Why here and not in the SMT solver ([`super::smt`]): this module evaluates the
//! instances the sampling checker built through the real e-graph, guards and applier, so
//! a reduction sees real shapes and broadcasting, and the right-hand side is what the
//! rule really builds — `layer_norm[epsilon=?eps]` with the epsilon the applier read from
//! the matched constant, not a re-encoding of the template. The solver would need the
//! reduced axis unrolled into per-element symbols, a second encoding of every
//! attribute template, and nonlinear real arithmetic (`x·x`, division by an
//! uninterpreted term), which z3 may not decide within a query's timeout; and it only
//! runs in `check-rules`, while this runs wherever user rules load.
//!
//! Arithmetic is i128 with every step checked: on overflow the instance is not counted
//! (no `num-bigint`: with denominators at most 16 and reductions of a few dozen terms,
//! overflow does not happen on the rules' instances, and a checked i128 cannot give a
//! wrong answer).
//!
//! Ops: `conv2d` (pads, strides, dilations, groups, bias), `batch_norm`, `layer_norm`,
//! 2-D `matmul`, `gemm`, `add`, `sub`, `mul`, `div` (with broadcasting), `neg`,
//! `reciprocal`, `sqrt` (uninterpreted), `reduce_sum` and `reduce_mean` over any axes
//! (as the sums they are), and the weight-prep ops
//! `bn_fold_weight`, `bn_fold_bias`, `bn_scale`, `bn_shift`, `channel_scale`,
//! `channel_vector` and `conv_shift_bias`, each by its definition in `smelt_ir::op`.
//! Anything else leaves the rule to the other provers or to sampling.

use std::collections::HashMap;

use smelt_ir::graph::{Func, Module, Value};
use smelt_ir::op::{BinaryOp, Op, ReduceAttrs, Reduction, UnaryOp};
use smelt_ir::weights::WeightId;

use super::prove::Q;

/// `sqrt` as an uninterpreted function: a random positive rational per exact argument,
/// the same for both sides of an instance (see the module docs).
struct Uninterpreted {
    /// The point's seed: the function is fixed for one instance, random across them.
    seed: u64,
    /// Whether any value was taken from it (then a difference is no witness).
    used: bool,
}

impl Uninterpreted {
    fn sqrt(&mut self, argument: Q) -> Q {
        self.used = true;
        // the argument is reduced, so equal values hash alike; each word is mixed in
        // through the generator's output, so different arguments give unrelated states
        let mut rng = Rng(self.seed);
        let n = argument.n as u128;
        let d = argument.d as u128;
        for word in [n as u64, (n >> 64) as u64, d as u64, (d >> 64) as u64] {
            rng.0 = rng.next() ^ word;
        }
        rng.rational(true)
    }
}

/// A tensor of exact rationals, row-major.
#[derive(Clone, Debug)]
struct Exact {
    dims: Vec<usize>,
    data: Vec<Q>,
}

impl Exact {
    /// Every element times `by` (an overflow is an error, as everywhere here).
    fn scaled(&self, by: Q) -> Result<Exact, String> {
        Ok(Exact {
            dims: self.dims.clone(),
            data: self
                .data
                .iter()
                .map(|v| ovf(v.mul(by)))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// What the exact evaluation of one instance found.
#[derive(Clone, Debug, PartialEq)]
pub enum ExactCheck {
    /// Both sides are equal at every element; `sqrt_uninterpreted` when some `sqrt` was
    /// the random function of the module docs.
    Agreed {
        /// Whether a square root of a computed value was taken as uninterpreted.
        sqrt_uninterpreted: bool,
    },
    /// Some element differs: where, both values, and the relative difference
    /// `|lhs − rhs| / max(|lhs|, |rhs|, 1)`.
    Differed {
        /// The element and both sides' values, in words.
        witness: String,
        /// The relative difference there.
        relative: f64,
    },
    /// The instance has an op outside this module's fragment, or a value overflowed.
    Outside(String),
}

const OVERFLOW: &str = "a value overflows exact 128-bit arithmetic";

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `n / d` with `|n| ≤ 64` and `1 ≤ d ≤ 16` (positive: `1 ≤ n ≤ 64`).
    fn rational(&mut self, positive: bool) -> Q {
        let n = if positive {
            1 + (self.next() % 64) as i128
        } else {
            (self.next() % 129) as i128 - 64
        };
        let d = 1 + (self.next() % 16) as i128;
        Q::new(n, d).unwrap_or(Q::ZERO)
    }
}

fn isqrt(n: i128) -> Option<i128> {
    if n < 0 {
        return None;
    }
    let mut r = (n as f64).sqrt() as i128;
    while r > 0 && r.checked_mul(r)? > n {
        r -= 1;
    }
    while (r + 1).checked_mul(r + 1)? <= n {
        r += 1;
    }
    (r * r == n).then_some(r)
}

/// The exact square root of `q`, when `q` is the square of a rational.
fn sqrt(q: Q) -> Result<Q, String> {
    match (isqrt(q.n), isqrt(q.d)) {
        (Some(n), Some(d)) => Q::new(n, d).ok_or_else(|| OVERFLOW.to_string()),
        _ => Err("a square root of a value that is not a rational square".into()),
    }
}

fn ovf<T>(x: Option<T>) -> Result<T, String> {
    x.ok_or_else(|| OVERFLOW.to_string())
}

/// The exact f32 value of `x`.
fn exact_f32(x: f32) -> Result<Q, String> {
    Q::from_f32(x).ok_or_else(|| format!("the value {x} has no exact rational form here"))
}

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// `a op b` with numpy broadcasting to `out` dims.
fn broadcast(a: &Exact, b: &Exact, out: &[usize], op: BinaryOp) -> Result<Exact, String> {
    let n: usize = out.iter().product();
    let index = |t: &Exact, flat: usize| -> usize {
        let os = strides(out);
        let ts = strides(&t.dims);
        let shift = out.len() - t.dims.len();
        let mut at = 0;
        for (k, &s) in os.iter().enumerate() {
            let i = (flat / s) % out[k];
            if k >= shift && t.dims[k - shift] != 1 {
                at += i * ts[k - shift];
            }
        }
        at
    };
    let mut data = Vec::with_capacity(n);
    for flat in 0..n {
        let (x, y) = (a.data[index(a, flat)], b.data[index(b, flat)]);
        data.push(match op {
            BinaryOp::Add => ovf(x.add(y))?,
            BinaryOp::Sub => ovf(x.sub(y))?,
            BinaryOp::Mul => ovf(x.mul(y))?,
            BinaryOp::Div if y != Q::ZERO => ovf(x.div(y))?,
            BinaryOp::Div => return Err("a division by zero".into()),
            BinaryOp::Min | BinaryOp::Max | BinaryOp::PRelu => {
                return Err(format!("'{}' is not polynomial", Op::Binary(op).name()))
            }
        });
    }
    Ok(Exact {
        dims: out.to_vec(),
        data,
    })
}

/// `scale / sqrt(var + eps)` per channel.
fn bn_factor(scale: &Exact, var: &Exact, eps: Q) -> Result<Vec<Q>, String> {
    scale
        .data
        .iter()
        .zip(&var.data)
        .map(|(s, v)| ovf(s.div(sqrt(ovf(v.add(eps))?)?)))
        .collect()
}

fn conv2d(
    a: &smelt_ir::op::Conv2dAttrs,
    x: &Exact,
    w: &Exact,
    bias: Option<&Exact>,
    out: &[usize],
) -> Result<Exact, String> {
    let [n, c, h, wd] = x.dims[..] else {
        return Err("a conv input that is not 4-D".into());
    };
    let [o, cg, kh, kw] = w.dims[..] else {
        return Err("a conv weight that is not 4-D".into());
    };
    let [_, _, oh, ow] = out[..] else {
        return Err("a conv result that is not 4-D".into());
    };
    let groups = a.groups.max(1);
    let per_group = o / groups;
    let mut data = Vec::with_capacity(n * o * oh * ow);
    for b in 0..n {
        for oc in 0..o {
            let g = oc / per_group.max(1);
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = bias.map_or(Q::ZERO, |k| k.data[oc]);
                    for ci in 0..cg {
                        let channel = g * cg + ci;
                        if channel >= c {
                            return Err("a conv whose groups do not fit its input".into());
                        }
                        for p in 0..kh {
                            for q in 0..kw {
                                let y = (i * a.strides[0] + p * a.dilations[0]) as isize
                                    - a.pads[0] as isize;
                                let xx = (j * a.strides[1] + q * a.dilations[1]) as isize
                                    - a.pads[1] as isize;
                                if y < 0 || xx < 0 || y as usize >= h || xx as usize >= wd {
                                    continue; // zero padding
                                }
                                let xv =
                                    x.data[((b * c + channel) * h + y as usize) * wd + xx as usize];
                                let wv = w.data[((oc * cg + ci) * kh + p) * kw + q];
                                acc = ovf(acc.add(ovf(xv.mul(wv))?))?;
                            }
                        }
                    }
                    data.push(acc);
                }
            }
        }
    }
    Ok(Exact {
        dims: out.to_vec(),
        data,
    })
}

/// `op(a) · op(b)` for 2-D operands, `op` transposing when asked.
fn product(a: &Exact, b: &Exact, trans_a: bool, trans_b: bool) -> Result<Exact, String> {
    let ([ar, ac], [br, bc]) = (&a.dims[..], &b.dims[..]) else {
        return Err("a batched matmul".into());
    };
    let (m, k) = if trans_a { (*ac, *ar) } else { (*ar, *ac) };
    let (k2, n) = if trans_b { (*bc, *br) } else { (*br, *bc) };
    if k != k2 {
        return Err("a product whose inner dimensions differ".into());
    }
    let at = |i: usize, l: usize| {
        if trans_a {
            a.data[l * ac + i]
        } else {
            a.data[i * ac + l]
        }
    };
    let bt = |l: usize, j: usize| {
        if trans_b {
            b.data[j * bc + l]
        } else {
            b.data[l * bc + j]
        }
    };
    let mut data = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let mut acc = Q::ZERO;
            for l in 0..k {
                acc = ovf(acc.add(ovf(at(i, l).mul(bt(l, j)))?))?;
            }
            data.push(acc);
        }
    }
    Ok(Exact {
        dims: vec![m, n],
        data,
    })
}

/// numpy's matmul of `a` `[..., M, K]` and `b` `[..., K, N]` (rank 2 or more each): one
/// [`product`] per index of their batch dims, broadcast against each other as numpy
/// broadcasts them (aligned from the right, a 1 stretching).
fn batched_product(a: &Exact, b: &Exact) -> Result<Exact, String> {
    if a.dims.len() == 2 && b.dims.len() == 2 {
        return product(a, b, false, false);
    }
    let (ra, rb) = (a.dims.len(), b.dims.len());
    if ra < 2 || rb < 2 {
        return Err("a matmul of a vector".into());
    }
    let (a_batch, b_batch) = (&a.dims[..ra - 2], &b.dims[..rb - 2]);
    let rank = a_batch.len().max(b_batch.len());
    let dim =
        |batch: &[usize], d: usize| (d + batch.len()).checked_sub(rank).map_or(1, |j| batch[j]);
    let mut batch = Vec::with_capacity(rank);
    for d in 0..rank {
        let (x, y) = (dim(a_batch, d), dim(b_batch, d));
        if x != y && x != 1 && y != 1 {
            return Err("a matmul whose batch dims do not broadcast".into());
        }
        batch.push(x.max(y));
    }
    let matrix = |e: &Exact, batch_of: &[usize], index: &[usize]| {
        let (r, c) = (e.dims[e.dims.len() - 2], e.dims[e.dims.len() - 1]);
        // the operand's own batch index: the result's, where its dim is not 1
        let mut flat = 0;
        for d in 0..batch_of.len() {
            let i = index[d + rank - batch_of.len()];
            flat = flat * batch_of[d] + if batch_of[d] == 1 { 0 } else { i };
        }
        Exact {
            dims: vec![r, c],
            data: e.data[flat * r * c..(flat + 1) * r * c].to_vec(),
        }
    };
    let count: usize = batch.iter().product();
    let mut index = vec![0usize; rank];
    let mut data = Vec::new();
    let mut last = Vec::new();
    for _ in 0..count {
        let p = product(
            &matrix(a, a_batch, &index),
            &matrix(b, b_batch, &index),
            false,
            false,
        )?;
        data.extend(p.data);
        last = p.dims;
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < batch[d] {
                break;
            }
            index[d] = 0;
        }
    }
    batch.extend(last);
    Ok(Exact { dims: batch, data })
}

/// `reduce_sum` or `reduce_mean` of `x` over `attrs.axes`: each result element the sum
/// of its elements (divided by their count for the mean); `out` is the result's dims,
/// with or without the reduced axes kept as 1s.
fn reduce(
    reduction: Reduction,
    attrs: &ReduceAttrs,
    x: &Exact,
    out: &[usize],
) -> Result<Exact, String> {
    if let Some(a) = attrs.axes.iter().find(|a| **a >= x.dims.len()) {
        return Err(format!("a reduction axis {a} beyond rank {}", x.dims.len()));
    }
    let kept: Vec<usize> = (0..x.dims.len())
        .filter(|k| !attrs.axes.contains(k))
        .collect();
    let kept_dims: Vec<usize> = kept.iter().map(|k| x.dims[*k]).collect();
    let kept_strides = strides(&kept_dims);
    let in_strides = strides(&x.dims);
    let len: usize = kept_dims.iter().product();
    if out.iter().product::<usize>() != len {
        return Err("a reduction whose result has another size".into());
    }
    let mut sums = vec![Q::ZERO; len];
    for (flat, v) in x.data.iter().enumerate() {
        let at: usize = kept
            .iter()
            .zip(&kept_strides)
            .map(|(k, s)| (flat / in_strides[*k]) % x.dims[*k] * s)
            .sum();
        sums[at] = ovf(sums[at].add(*v))?;
    }
    let count: usize = attrs.axes.iter().map(|a| x.dims[*a]).product();
    let data = match reduction {
        Reduction::Sum => sums,
        Reduction::Mean if count > 0 => {
            let n = Q::int(count as i128);
            sums.iter()
                .map(|s| ovf(s.div(n)))
                .collect::<Result<_, _>>()?
        }
        Reduction::Mean => return Err("a mean over no elements".into()),
        Reduction::Max | Reduction::Min => {
            return Err(format!("'{}' is not polynomial", reduction.name()))
        }
    };
    Ok(Exact {
        dims: out.to_vec(),
        data,
    })
}

/// `layer_norm` by its definition (`smelt_ir::op::norm`): per row of the axes from `axis`
/// on, `(x − mean) / sqrt(var + eps) · scale + bias` with `var` the mean of the squared
/// deviations, the root uninterpreted.
fn layer_norm(
    axis: usize,
    epsilon: Q,
    x: &Exact,
    scale: &Exact,
    bias: Option<&Exact>,
    roots: &mut Uninterpreted,
) -> Result<Exact, String> {
    let inner: usize = x.dims.get(axis..).map_or(0, |d| d.iter().product());
    if inner == 0 || scale.data.len() != inner || bias.is_some_and(|b| b.data.len() != inner) {
        return Err("a layer_norm whose scale or bias is not one row".into());
    }
    let n = Q::int(inner as i128);
    let mut data = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(inner) {
        let mut sum = Q::ZERO;
        for v in row {
            sum = ovf(sum.add(*v))?;
        }
        let mean = ovf(sum.div(n))?;
        let mut squares = Q::ZERO;
        for v in row {
            let d = ovf(v.sub(mean))?;
            squares = ovf(squares.add(ovf(d.mul(d))?))?;
        }
        let root = roots.sqrt(ovf(ovf(squares.div(n))?.add(epsilon))?);
        for (j, v) in row.iter().enumerate() {
            let normalized = ovf(ovf(v.sub(mean))?.div(root))?;
            let shift = bias.map_or(Q::ZERO, |b| b.data[j]);
            data.push(ovf(ovf(normalized.mul(scale.data[j]))?.add(shift))?);
        }
    }
    Ok(Exact {
        dims: x.dims.clone(),
        data,
    })
}

/// One op, exactly; `out` is the result's dims (from the instruction's type); square
/// roots of computed values come from `roots`.
fn eval(
    op: &Op,
    args: &[&Exact],
    out: &[usize],
    roots: &mut Uninterpreted,
) -> Result<Exact, String> {
    let a = |i: usize| {
        args.get(i)
            .copied()
            .ok_or_else(|| "a missing operand".to_string())
    };
    let shaped = |data: Vec<Q>| Exact {
        dims: out.to_vec(),
        data,
    };
    match op {
        Op::Conv2d(c) => conv2d(c, a(0)?, a(1)?, args.get(2).copied(), out),
        Op::BatchNorm { epsilon } => {
            let x = a(0)?;
            let eps = exact_f32(epsilon.0)?;
            let factor = bn_factor(a(1)?, a(4)?, eps)?;
            let channels = x.dims.get(1).copied().unwrap_or(1);
            let inner: usize = x.dims.iter().skip(2).product();
            let (beta, mean) = (a(2)?, a(3)?);
            let mut data = Vec::with_capacity(x.data.len());
            for (i, v) in x.data.iter().enumerate() {
                let ch = (i / inner.max(1)) % channels;
                let centered = ovf(v.sub(mean.data[ch]))?;
                data.push(ovf(ovf(centered.mul(factor[ch]))?.add(beta.data[ch]))?);
            }
            Ok(shaped(data))
        }
        Op::MatMul => batched_product(a(0)?, a(1)?),
        Op::Gemm(g) => {
            let p = product(a(0)?, a(1)?, g.trans_a, g.trans_b)?;
            let scaled = p.scaled(exact_f32(g.alpha.0)?)?;
            match args.get(2) {
                None => Ok(scaled),
                Some(c) => {
                    let c = c.scaled(exact_f32(g.beta.0)?)?;
                    broadcast(&scaled, &c, out, BinaryOp::Add)
                }
            }
        }
        Op::Binary(b) => broadcast(a(0)?, a(1)?, out, *b),
        Op::Unary(UnaryOp::Neg) => Ok(shaped(a(0)?.data.iter().map(|v| v.neg()).collect())),
        Op::Unary(UnaryOp::Reciprocal) => {
            let data = a(0)?
                .data
                .iter()
                .map(|v| match *v == Q::ZERO {
                    true => Err("a reciprocal of zero".to_string()),
                    false => ovf(Q::ONE.div(*v)),
                })
                .collect::<Result<_, _>>()?;
            Ok(shaped(data))
        }
        Op::Unary(UnaryOp::Sqrt) => Ok(shaped(a(0)?.data.iter().map(|v| roots.sqrt(*v)).collect())),
        Op::Reduce(reduction, attrs) => reduce(*reduction, attrs, a(0)?, out),
        Op::LayerNorm { axis, epsilon } => layer_norm(
            *axis,
            exact_f32(epsilon.0)?,
            a(0)?,
            a(1)?,
            args.get(2).copied(),
            roots,
        ),
        Op::BnFoldWeight { epsilon } => {
            let w = a(0)?;
            let factor = bn_factor(a(1)?, a(2)?, exact_f32(epsilon.0)?)?;
            let per: usize = w.dims.iter().skip(1).product();
            let data = w
                .data
                .iter()
                .enumerate()
                .map(|(i, v)| ovf(v.mul(factor[i / per.max(1)])))
                .collect::<Result<_, _>>()?;
            Ok(shaped(data))
        }
        Op::BnFoldBias { epsilon } | Op::BnShift { epsilon } => {
            let factor = bn_factor(a(0)?, a(3)?, exact_f32(epsilon.0)?)?;
            let (beta, mean) = (a(1)?, a(2)?);
            let conv_bias = match op {
                Op::BnFoldBias { .. } => args.get(4).copied(),
                _ => None,
            };
            let data = (0..factor.len())
                .map(|c| {
                    let b0 = conv_bias.map_or(Q::ZERO, |k| k.data[c]);
                    ovf(ovf(ovf(b0.sub(mean.data[c]))?.mul(factor[c]))?.add(beta.data[c]))
                })
                .collect::<Result<_, _>>()?;
            Ok(shaped(data))
        }
        Op::BnScale { epsilon } => Ok(shaped(bn_factor(a(0)?, a(1)?, exact_f32(epsilon.0)?)?)),
        Op::ChannelScale => {
            let (w, s) = (a(0)?, a(1)?);
            let per: usize = w.dims.iter().skip(1).product();
            let data = w
                .data
                .iter()
                .enumerate()
                .map(|(i, v)| ovf(v.mul(s.data[i / per.max(1)])))
                .collect::<Result<_, _>>()?;
            Ok(shaped(data))
        }
        Op::ChannelVector => Ok(shaped(a(0)?.data.clone())),
        Op::ConvShiftBias => {
            let (w, t) = (a(0)?, a(1)?);
            let (o, cg) = (w.dims[0], w.dims[1]);
            let k: usize = w.dims.iter().skip(2).product();
            let groups = (t.data.len() / cg.max(1)).max(1);
            let per_group = (o / groups).max(1);
            let mut data = Vec::with_capacity(o);
            for oc in 0..o {
                let first = (oc / per_group) * cg;
                let mut acc = Q::ZERO;
                for c in 0..cg {
                    let shift = t.data[first + c];
                    for v in &w.data[(oc * cg + c) * k..(oc * cg + c + 1) * k] {
                        acc = ovf(acc.add(ovf(v.mul(shift))?))?;
                    }
                }
                data.push(acc);
            }
            Ok(shaped(data))
        }
        other => Err(format!("'{}' has no exact rational encoding", other.name())),
    }
}

/// Which operand of `op` is a variance under `sqrt(var + eps)`, and that epsilon.
fn variance_slot(op: &Op) -> Option<(usize, f32)> {
    if let Op::BatchNorm { epsilon } = op {
        return Some((4, epsilon.0));
    }
    if let Op::BnFoldWeight { epsilon } = op {
        return Some((2, epsilon.0));
    }
    if let Op::BnFoldBias { epsilon } | Op::BnShift { epsilon } = op {
        return Some((3, epsilon.0));
    }
    if let Op::BnScale { epsilon } = op {
        return Some((1, epsilon.0));
    }
    None
}

/// The weights read as a variance (under `sqrt(var + eps)`), with that epsilon.
fn variances(funcs: &[&Func]) -> HashMap<WeightId, f32> {
    let mut out = HashMap::new();
    for f in funcs {
        let weight_of = |v: Value| {
            if let Some(Op::Const(w)) = f.inst_of(v).map(|i| &i.op) {
                Some(*w)
            } else {
                None
            }
        };
        for inst in &f.insts {
            let Some((slot, eps)) = variance_slot(&inst.op) else {
                continue;
            };
            if let Some(w) = inst.operands.get(slot).and_then(|v| weight_of(*v)) {
                out.insert(w, eps);
            }
        }
    }
    out
}

/// Evaluates `func` exactly on `params`, with `weights` for its constants.
fn run(
    func: &Func,
    params: &[Exact],
    weights: &HashMap<WeightId, Exact>,
    roots: &mut Uninterpreted,
) -> Result<Exact, String> {
    let mut values: Vec<Exact> = params.to_vec();
    for inst in &func.insts {
        let value = match &inst.op {
            Op::Const(w) => weights
                .get(w)
                .cloned()
                .ok_or_else(|| "an unknown weight".to_string())?,
            op => {
                let args: Vec<&Exact> = inst.operands.iter().map(|v| &values[v.index()]).collect();
                eval(op, &args, &inst.ty.dims, roots)?
            }
        };
        values.push(value);
    }
    let result = func
        .results
        .first()
        .ok_or_else(|| "a function without a result".to_string())?;
    Ok(values[result.value.index()].clone())
}

/// Evaluates the first function of `lhs` and of `rhs` (sharing `lhs`'s weights and
/// parameters) exactly at one random rational point drawn from `seed`, and compares. The
/// weights named in `positive` (a rule's `positive` variables) are drawn as positive
/// rationals, so the point satisfies the rule's constraints.
pub fn exact_check(lhs: &Module, rhs: &Module, seed: u64, positive: &[String]) -> ExactCheck {
    let (Some(lf), Some(rf)) = (lhs.funcs.first(), rhs.funcs.first()) else {
        return ExactCheck::Outside("a module without a function".into());
    };
    let mut rng = Rng(seed ^ 0x51_7a11);
    let var_eps = variances(&[lf, rf]);
    let mut weights = HashMap::new();
    for (id, w) in lhs.weights.iter() {
        let values = w.f32s();
        let splat = values
            .first()
            .is_some_and(|v| values.iter().all(|x| x == v));
        let n = w.ty.num_elements();
        let data: Result<Vec<Q>, String> = match var_eps.get(&id) {
            Some(eps) => {
                // s² − eps, so that sqrt(var + eps) = s exactly
                let eps = match exact_f32(*eps) {
                    Ok(e) => e,
                    Err(m) => return ExactCheck::Outside(m),
                };
                (0..n)
                    .map(|_| {
                        let s = rng.rational(true);
                        ovf(ovf(s.mul(s))?.sub(eps))
                    })
                    .collect()
            }
            None if splat => values.iter().map(|v| exact_f32(*v)).collect(),
            None if positive.contains(&w.name) => Ok((0..n).map(|_| rng.rational(true)).collect()),
            None => Ok((0..n).map(|_| rng.rational(false)).collect()),
        };
        match data {
            Ok(data) => {
                weights.insert(
                    id,
                    Exact {
                        dims: w.ty.dims.clone(),
                        data,
                    },
                );
            }
            Err(m) => return ExactCheck::Outside(m),
        }
    }
    let params: Vec<Exact> = lf
        .params
        .iter()
        .map(|p| Exact {
            dims: p.ty.dims.clone(),
            data: (0..p.ty.num_elements())
                .map(|_| rng.rational(false))
                .collect(),
        })
        .collect();
    let mut roots = Uninterpreted {
        seed: rng.next(),
        used: false,
    };
    let (l, r) = match (
        run(lf, &params, &weights, &mut roots),
        run(rf, &params, &weights, &mut roots),
    ) {
        (Ok(l), Ok(r)) => (l, r),
        (Err(m), _) | (_, Err(m)) => return ExactCheck::Outside(m),
    };
    if roots.used && l.data != r.data {
        // a random function in place of sqrt: a difference says nothing of the real one
        return ExactCheck::Outside(
            "the sides differ with sqrt uninterpreted: they take square roots of different \
             values, which only the real sqrt can settle"
                .into(),
        );
    }
    if l.dims != r.dims || l.data.len() != r.data.len() {
        return ExactCheck::Differed {
            witness: format!("the sides have shapes {:?} and {:?}", l.dims, r.dims),
            relative: f64::INFINITY,
        };
    }
    let strides = strides(&l.dims);
    for (i, (a, b)) in l.data.iter().zip(&r.data).enumerate() {
        if a != b {
            let index: Vec<usize> = strides
                .iter()
                .zip(&l.dims)
                .map(|(s, d)| (i / s) % d)
                .collect();
            let (x, y) = (a.to_f64(), b.to_f64());
            return ExactCheck::Differed {
                witness: format!(
                    "at {index:?} exactly: left-hand side = {}/{} ({x}), right-hand side = {}/{} ({y})",
                    a.n, a.d, b.n, b.d
                ),
                relative: (x - y).abs() / x.abs().max(y.abs()).max(1.0),
            };
        }
    }
    ExactCheck::Agreed {
        sqrt_uninterpreted: roots.used,
    }
}
