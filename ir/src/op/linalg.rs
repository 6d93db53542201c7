//! The linear-algebra family: `matmul` and `gemm` — variants, rows, type rules, flops
//! and `gemm`'s text schema.

use super::dim::{broadcast_dims, Dim, Shape};
use super::rules::{expect_rank, OperandTypes};
use super::GemmAttrs;
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::TensorType;

macro_rules! linalg_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Numpy matmul: batched, with broadcasting of leading dimensions.
        MatMul,
        /// `alpha * op(A) * op(B) + beta * C` with 2-D `A`, `B` and broadcastable `C`.
        Gemm(GemmAttrs),
    ]
    [$($rows)*
        MatMul "matmul" Some(Exact(2)), Anchor: (Op::MatMul) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: matmul_shape,
            flops: product_flops(false);
        Gemm "gemm" Some(Range(2, 3)), Anchor: (Op::Gemm(g)) <=> (Attrs::Gemm(g))
            attrs { ..g },
            dtype: all_f32,
            shape: |o| gemm_shape(g, o),
            flops: product_flops(g.trans_a);
    ]
    $($more),* } };
}
pub(super) use linalg_ops;

/// Numpy matmul's result: broadcast batch dims, then `M` and `N` (each dropped for a
/// vector operand).
pub(super) fn matmul_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let (a, b) = (o.ty(0), o.ty(1));
    if a.rank() == 0 || b.rank() == 0 {
        return Err("matmul operands must have rank >= 1".into());
    }
    let (ad, bd) = (o.dims(0), o.dims(1));
    let a2 = if ad.len() == 1 {
        vec![Dim::ONE, ad[0]]
    } else {
        ad
    };
    let b2 = if bd.len() == 1 {
        vec![bd[0], Dim::ONE]
    } else {
        bd
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    k.expect_eq(kb, |k, kb| {
        format!("matmul inner dimensions differ: {a} @ {b} ({k} vs {kb})")
    })?;
    let mut dims = broadcast_dims(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    if a.rank() > 1 {
        dims.push(m);
    }
    if b.rank() > 1 {
        dims.push(n);
    }
    Ok(dims.into())
}

/// `[M, N]`, with `C` broadcasting to it.
pub(super) fn gemm_shape(g: &GemmAttrs, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let a = expect_rank(o.ty(0), 2, "gemm A")?;
    let b = expect_rank(o.ty(1), 2, "gemm B")?;
    let (m, ka) = if g.trans_a {
        (a[1], a[0])
    } else {
        (a[0], a[1])
    };
    let (kb, n) = if g.trans_b {
        (b[1], b[0])
    } else {
        (b[0], b[1])
    };
    ka.expect_eq(kb, |ka, kb| {
        format!("gemm inner dimensions differ: A gives K = {ka}, B gives K = {kb}")
    })?;
    if let Some(c) = o.get(2) {
        let bc = broadcast_dims(&Dim::all(&c.dims), &[m, n])?;
        if bc != [m, n] {
            return Err(format!("gemm C {c} does not broadcast to [{m}, {n}]"));
        }
    }
    Ok(vec![m, n].into())
}

/// A multiply and an add per result element and step of the reduction (`K`: `A`'s last
/// dim, or its first when transposed).
pub(super) fn product_flops(trans_a: bool) -> impl FnOnce(&[&TensorType], &TensorType) -> u64 {
    move |operands, result| {
        let a = operands.first().map(|t| t.dims.clone()).unwrap_or_default();
        let k = if trans_a { a.first() } else { a.last() };
        2 * result.num_elements() as u64 * k.copied().unwrap_or(0) as u64
    }
}

impl AttrSchema for GemmAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        let def = GemmAttrs::default();
        Ok(GemmAttrs {
            alpha: d.f32("alpha")?.unwrap_or(def.alpha),
            beta: d.f32("beta")?.unwrap_or(def.beta),
            trans_a: d.bool("trans_a")?.unwrap_or(def.trans_a),
            trans_b: d.bool("trans_b")?.unwrap_or(def.trans_b),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        let def = GemmAttrs::default();
        out.unless("alpha", &self.alpha, &def.alpha, rank);
        out.unless("beta", &self.beta, &def.beta, rank);
        out.unless("trans_a", &self.trans_a, &def.trans_a, rank);
        out.unless("trans_b", &self.trans_b, &def.trans_b, rank);
    }
}
