//! The packed GEMM path (matmul and gemm by a constant weight on the conv-tile
//! micro-kernels) against the interpreter, over every kernel choice the host runs: the
//! encoders' shapes (M rows of tokens, K and N of 384 and 1536) and odd ones (37, 100:
//! a padded last panel, a partial last vector), plain and with the epilogues the
//! exported models fuse (bias, GELU, residual add), rank-3 activations flattened into
//! M or looped per batch.

mod jit_util;

use jit_util::{check_against_interp, f32t, kernel_choices, random_inputs};
use smelt::{CompileOptions, Executable, Kernels};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{FusedOp, GeluApproximation, GemmAttrs, PostOp};
use smelt_ir::weights::random_f32;
use smelt_ir::{BinaryOp, Module, Op, TensorType, UnaryOp, Value, F32};

/// Rows of A: one token, a few, a register block's remainder, and the encoders' 64, 128
/// and 197 (more than three calls of 56 rows, with a remainder).
const ROWS: [usize; 6] = [1, 2, 7, 64, 128, 197];

/// (K, N): the encoders' projections and FFN layers, and odd sizes.
const SHAPES: [(usize, usize); 5] = [(384, 384), (384, 1536), (1536, 384), (37, 100), (100, 37)];

/// Relative error bound: K up to 1536 products summed in f32 against the interpreter's
/// f64 (measured ≤ 1e-6 on these inputs).
const TOL: f64 = 2e-5;

/// What follows the product in a test case.
#[derive(Clone, Copy, Debug)]
enum Epi {
    None,
    /// `+ bias[N]`, then GELU (BERT's first FFN layer).
    BiasGelu,
    /// `+ bias[N]`, then `+ residual` of the result's shape.
    BiasResidual,
    /// `+ mask[b, 1, N]` that broadcasts over rows but not batches: the batch dims cannot
    /// flatten into M, so they stay loops.
    PerBatch,
}

/// `x[a_dims] · W[K, N]` (a constant) followed by `epi`.
fn matmul_model(a_dims: &[usize], n: usize, epi: Epi) -> Module {
    let k = *a_dims.last().expect("rank ≥ 1");
    let mut out_dims = a_dims.to_vec();
    *out_dims.last_mut().expect("rank ≥ 1") = n;
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    // parameters come before the constants
    let x = b.param("x", f32t(a_dims));
    let param = match epi {
        Epi::None | Epi::BiasGelu => None,
        Epi::BiasResidual => Some(b.param("res", f32t(&out_dims))),
        Epi::PerBatch => {
            let mut mask = out_dims.clone();
            let rows = mask.len() - 2;
            mask[rows] = 1;
            Some(b.param("mask", f32t(&mask)))
        }
    };
    let w = constant(&mut b, "w", &[k, n], 7);
    let add = PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: true,
    };
    let (post, extra): (Vec<PostOp>, Vec<Value>) = match (epi, param) {
        (Epi::BiasGelu, _) => {
            let bias = constant(&mut b, "bias", &[n], 8);
            (
                vec![
                    add,
                    PostOp::Unary(UnaryOp::Gelu {
                        approximate: GeluApproximation::None,
                    }),
                ],
                vec![bias],
            )
        }
        (Epi::BiasResidual, Some(res)) => {
            let bias = constant(&mut b, "bias", &[n], 8);
            (vec![add, add], vec![bias, res])
        }
        (Epi::PerBatch, Some(mask)) => (vec![add], vec![mask]),
        _ => (vec![], vec![]),
    };
    let op = if post.is_empty() {
        Op::MatMul
    } else {
        Op::Fused(FusedOp {
            anchor: Box::new(Op::MatMul),
            post_ops: post,
        })
    };
    let mut operands = vec![x, w];
    operands.extend(extra);
    let y = b.op(op, &operands).expect("matmul type-checks");
    b.finish(&[("y", y)]);
    m
}

/// A constant of `dims` with seeded values in [-1, 1].
fn constant(b: &mut FuncBuilder, name: &str, dims: &[usize], seed: u64) -> Value {
    let ty = f32t(dims);
    let values = random_f32(seed, ty.storage_len(), -1.0, 1.0);
    b.constant(name, ty, &values).expect("constant")
}

/// Compiles `m` with each micro-kernel choice the host runs and asserts a packed-GEMM
/// kernel is among its kernels (so the cases below test that path, not the Cranelift
/// tiles); returns the choices checked. An x86-64 host runs AVX2 at least
/// (`kernel_choices` asserts it, and reports once which choices it tests: without
/// AVX-512 the 32-lane routine goes untested); elsewhere only Cranelift code runs, which
/// this says.
fn assert_packed_path(what: &str, m: &Module) -> Vec<Kernels> {
    let micro: Vec<Kernels> = kernel_choices()
        .into_iter()
        .filter(|k| *k != Kernels::Cranelift)
        .collect();
    if cfg!(target_arch = "x86_64") {
        assert!(
            !micro.is_empty(),
            "{what}: no micro-kernel choice on x86-64"
        );
    } else if micro.is_empty() {
        eprintln!("{what}: no micro-kernel on this host, the packed GEMM path is not tested");
    }
    for &kernels in &micro {
        let o = CompileOptions {
            kernels,
            ..jit_util::opts()
        };
        let exe = Executable::compile(m, None, &o).expect("compiles");
        assert!(
            exe.kernels()
                .iter()
                .any(|k| k.name.starts_with("gemm_packed")),
            "{what} ({kernels:?}): no packed GEMM kernel among {:?}",
            exe.kernels().iter().map(|k| &k.name).collect::<Vec<_>>()
        );
    }
    micro
}

/// The names of the kernels `m` compiles to with `kernels`.
fn kernel_names(m: &Module, kernels: Kernels) -> Vec<String> {
    let o = CompileOptions {
        kernels,
        ..jit_util::opts()
    };
    let exe = Executable::compile(m, None, &o).expect("compiles");
    exe.kernels().iter().map(|k| k.name.clone()).collect()
}

/// `m` compiled with `kernels` for `threads` threads, run on `inputs`.
fn run_at(
    m: &Module,
    kernels: Kernels,
    threads: usize,
    inputs: &[smelt::Tensor],
) -> Vec<smelt::Tensor> {
    let o = CompileOptions {
        kernels,
        threads,
        ..jit_util::opts()
    };
    let exe = Executable::compile(m, None, &o).expect("compiles");
    exe.run(inputs).expect("runs")
}

fn check(what: &str, m: &Module) {
    check_against_interp(what, m, &random_inputs(m, 23), TOL);
}

#[test]
fn matmul_by_constant_weight_every_shape() {
    let mut checked = 0;
    for m_rows in ROWS {
        for (k, n) in SHAPES {
            let what = format!("matmul [1, {m_rows}, {k}] x [{k}, {n}]");
            let m = matmul_model(&[1, m_rows, k], n, Epi::None);
            check(&what, &m);
            checked += 1;
        }
    }
    assert_eq!(checked, ROWS.len() * SHAPES.len());
    // the path these cases are for: every micro-kernel choice takes it (x86-64 hosts
    // have AVX2 at least, `kernel_choices` asserts it; AVX-512 hosts also test it)
    let m = matmul_model(&[1, 7, 37], 100, Epi::None);
    assert_packed_path("matmul [1, 7, 37] x [37, 100]", &m);
}

#[test]
fn matmul_with_fused_epilogues() {
    for m_rows in ROWS {
        for (k, n, epi) in [
            (384, 1536, Epi::BiasGelu),
            (1536, 384, Epi::BiasResidual),
            (100, 37, Epi::BiasGelu),
            (37, 100, Epi::BiasResidual),
        ] {
            let what = format!("matmul [1, {m_rows}, {k}] x [{k}, {n}] {epi:?}");
            let m = matmul_model(&[1, m_rows, k], n, epi);
            assert_packed_path(&what, &m);
            check(&what, &m);
        }
    }
}

#[test]
fn batched_activations_flattened_or_looped() {
    for (dims, epi) in [
        // flattened into 2·3·7 = 42 rows, with and without an epilogue
        (&[2, 3, 7, 37][..], Epi::None),
        (&[2, 3, 7, 37][..], Epi::BiasResidual),
        (&[3, 64, 100][..], Epi::BiasGelu),
        // a per-batch operand: the batch dims stay loops
        (&[2, 3, 7, 37][..], Epi::PerBatch),
        (&[3, 64, 100][..], Epi::PerBatch),
    ] {
        let what = format!("matmul {dims:?} x [K, 48] {epi:?}");
        let m = matmul_model(dims, 48, epi);
        assert_packed_path(&what, &m);
        check(&what, &m);
    }
}

/// `gemm(x, W, C)` with a constant `W` (`transB` or not), alpha and beta, a C that is a
/// bias row, a full matrix or a column, with and without a post-op.
#[test]
fn gemm_by_constant_weight() {
    for m_rows in [1, 7, 128] {
        for (k, n) in [(384, 384), (37, 100)] {
            for trans_b in [false, true] {
                for c_dims in [
                    None,
                    Some(vec![n]),
                    Some(vec![m_rows, n]),
                    Some(vec![m_rows, 1]),
                ] {
                    for relu in [false, true] {
                        let g = GemmAttrs {
                            alpha: F32(0.5),
                            beta: F32(2.0),
                            trans_a: false,
                            trans_b,
                        };
                        let what = format!(
                            "gemm [{m_rows}, {k}] x [{k}, {n}] tB={trans_b} C={c_dims:?} relu={relu}"
                        );
                        let m = gemm_model(m_rows, k, n, g, c_dims.as_deref(), relu);
                        // M = 1 with transB is the dot-product kernel (a classifier)
                        if !(m_rows == 1 && trans_b) {
                            assert_packed_path(&what, &m);
                        }
                        check(&what, &m);
                    }
                }
            }
        }
    }
}

fn gemm_model(
    m_rows: usize,
    k: usize,
    n: usize,
    g: GemmAttrs,
    c_dims: Option<&[usize]>,
    relu: bool,
) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", f32t(&[m_rows, k]));
    let c = c_dims.map(|c| b.param("c", TensorType::f32(c.to_vec())));
    let w_dims = if g.trans_b { [n, k] } else { [k, n] };
    let w = constant(&mut b, "w", &w_dims, 9);
    let mut operands = vec![x, w];
    operands.extend(c);
    let op = if relu {
        Op::Fused(FusedOp {
            anchor: Box::new(Op::Gemm(g)),
            post_ops: vec![PostOp::Unary(UnaryOp::Relu)],
        })
    } else {
        Op::Gemm(g)
    };
    let y = b.op(op, &operands).expect("gemm type-checks");
    b.finish(&[("y", y)]);
    m
}

/// Threads split the panel loop: every micro-kernel choice gives bit-identical results at
/// 1 and 2 threads, with whole and padded panels, flattened and looped batches.
#[test]
fn one_and_two_threads_are_bit_identical() {
    let cases = [
        (
            "[1, 128, 384] x [384, 384] bias gelu",
            matmul_model(&[1, 128, 384], 384, Epi::BiasGelu),
        ),
        (
            "[1, 7, 100] x [100, 37]",
            matmul_model(&[1, 7, 100], 37, Epi::None),
        ),
        (
            "[3, 64, 100] x [100, 48] per batch",
            matmul_model(&[3, 64, 100], 48, Epi::PerBatch),
        ),
    ];
    for (what, m) in &cases {
        let inputs = random_inputs(m, 41);
        for kernels in assert_packed_path(what, m) {
            let run = |threads: usize| run_at(m, kernels, threads, &inputs);
            let (one, two) = (run(1), run(2));
            assert_eq!(one[0].data, two[0].data, "{what} ({kernels:?})");
        }
    }
}

/// `x · y` of two activations (attention's `Q·Kᵀ` and `P·V` per head, and a B that
/// broadcasts over a batch dim): B is packed by a kernel at run time, then one kernel
/// split over the largest batch dim (the heads) computes every panel of each matrix,
/// the whole panels on the widest routine and the rest of N on the narrowest that
/// covers it (N = 197 on AVX-512: six 32-lane panels and one of 16); checked at 1 and 2
/// threads (the packing kernel splits over B's matrices).
#[test]
fn matmul_of_two_activations() {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[1, 12, 197, 64], &[1, 12, 64, 197]),
        (&[1, 12, 197, 197], &[1, 12, 197, 64]),
        (&[2, 1, 9, 37], &[3, 37, 20]),
        (&[2, 3, 8, 100], &[2, 3, 100, 37]),
        (&[64, 48], &[48, 100]),
    ];
    for (a, b) in cases {
        let what = format!("matmul {a:?} x {b:?}");
        let mut m = Module::default();
        let mut fb = FuncBuilder::new(&mut m, "f");
        let x = fb.param("x", f32t(a));
        let y = fb.param("y", f32t(b));
        let z = fb.op(Op::MatMul, &[x, y]).expect("matmul type-checks");
        fb.finish(&[("z", z)]);
        for kernels in assert_packed_path(&what, &m) {
            let names = kernel_names(&m, kernels);
            let by_batch = names.iter().any(|n| n.contains("_by_batch"));
            assert_eq!(by_batch, a.len() > 2, "{what} ({kernels:?}): {names:?}");
            if kernels == Kernels::Avx512 && b.ends_with(&[197]) {
                assert!(
                    names.iter().any(|n| n.contains("_l32_t16_by_batch")),
                    "{what}: no 32-lane kernel with a 16-lane tail among {names:?}"
                );
            }
        }
        check(&what, &m);
        let inputs = random_inputs(&m, 43);
        for kernels in kernel_choices() {
            let run = |threads: usize| run_at(&m, kernels, threads, &inputs);
            assert_eq!(run(1)[0].data, run(2)[0].data, "{what} ({kernels:?})");
        }
    }
}

/// A bias add and GELU leading a GEMM's epilogue run in the native GELU-rows routine on
/// full panels (the partial last panel of N = 100 in Cranelift code): the lowering for a
/// micro-kernel target calls it, and the results are the interpreter's (the cases above
/// check every shape; this one names the call).
#[test]
fn a_leading_bias_and_gelu_run_natively_on_full_panels() {
    let m = matmul_model(&[1, 9, 64], 100, Epi::BiasGelu);
    check("bias gelu, N = 100", &m);
    let opts = smelt_passes::lower::LowerOptions {
        micro: Some(smelt::microkernels::TileIsa::Avx2.target()),
        ..Default::default()
    };
    let p = smelt_passes::lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
    let loops = p.dump_loops();
    assert!(loops.contains("call gelu_rows"), "{loops}");
    // the residual case has no activation: nothing native
    let m = matmul_model(&[1, 9, 64], 100, Epi::BiasResidual);
    let p = smelt_passes::lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
    assert!(
        !p.dump_loops().contains("_rows("),
        "no activation, no rows call"
    );
}

/// Attention's heads split off a fused Q/K/V projection the way PyTorch exports it (a
/// reshape to `[1, S, 3, H, dh]`, one transpose, a slice and a reshape per matrix, Kᵀ by
/// another transpose, Q and Kᵀ scaled by √scale each). After fusion (the scales become
/// the product's, `scale-after-matmul`) the products read Q, K and V straight from the
/// projection through strides, and the scale goes into packed Kᵀ: no slice, transpose or
/// mul kernel is left but the final head merge, and the softmax runs inside `Q·Kᵀ`'s
/// kernel on each block of finished rows. Returning Kᵀ as well makes its chain a
/// value of its own (computed, read by the product plainly) while Q and V stay views.
/// Checked against the interpreter of the unfused model, on every kernel choice.
#[test]
fn attention_heads_are_read_through_views() {
    use smelt_ir::op::SliceAttrs;
    let (s, h, dh) = (37usize, 3usize, 16usize);
    let d = h * dh;
    // V computed after the scores (`late_v`) cannot be packed before their kernel: P·V
    // then runs on its own
    for (also_kt, late_v) in [(false, false), (true, false), (false, true)] {
        let what = format!("attention heads (Kᵀ returned: {also_kt}, V late: {late_v})");
        let mut m = Module::default();
        let mut fb = FuncBuilder::new(&mut m, "f");
        let x = fb.param("qkv", f32t(&[1, s, 3 * d]));
        let op = |fb: &mut FuncBuilder, op: Op, args: &[Value]| fb.op(op, args).expect("types");
        let r = op(
            &mut fb,
            Op::Reshape {
                shape: vec![1, s, 3, h, dh],
            },
            &[x],
        );
        let t = op(
            &mut fb,
            Op::Transpose {
                perm: vec![2, 0, 3, 1, 4],
            },
            &[r],
        );
        let mut heads = Vec::new();
        for i in 0..3i64 {
            let sl = SliceAttrs {
                starts: vec![i, 0, 0, 0, 0],
                ends: vec![i + 1, 1, h as i64, s as i64, dh as i64],
                steps: vec![1; 5],
            };
            let piece = op(&mut fb, Op::Slice(sl), &[t]);
            let shape = vec![1, h, s, dh];
            heads.push(op(&mut fb, Op::Reshape { shape }, &[piece]));
        }
        let kt = op(
            &mut fb,
            Op::Transpose {
                perm: vec![0, 1, 3, 2],
            },
            &[heads[1]],
        );
        let scale = constant(&mut fb, "scale", &[1], 7);
        let qs = op(&mut fb, Op::Binary(BinaryOp::Mul), &[heads[0], scale]);
        let ks = op(&mut fb, Op::Binary(BinaryOp::Mul), &[kt, scale]);
        let scores = op(&mut fb, Op::MatMul, &[qs, ks]);
        let p = op(&mut fb, Op::Softmax { axis: 3 }, &[scores]);
        let v = if late_v {
            let bias = constant(&mut fb, "v_bias", &[dh], 11);
            op(&mut fb, Op::Binary(BinaryOp::Add), &[heads[2], bias])
        } else {
            heads[2]
        };
        let o = op(&mut fb, Op::MatMul, &[p, v]);
        let merged = op(
            &mut fb,
            Op::Transpose {
                perm: vec![0, 2, 1, 3],
            },
            &[o],
        );
        let out = op(
            &mut fb,
            Op::Reshape {
                shape: vec![1, s, d],
            },
            &[merged],
        );
        let mut results = vec![("out", out)];
        if also_kt {
            results.push(("kt", kt));
        }
        fb.finish(&results);
        let inputs = random_inputs(&m, 29);
        let want = smelt_ir::interp::run(&m, &m.funcs[0], &inputs).expect("interprets");
        let mut fused = m.clone();
        smelt::optimize(&mut fused, &Default::default(), None).expect("optimizes");
        let got = check_against_interp(&what, &fused, &inputs, TOL);
        for (g, w) in got.iter().zip(&want) {
            let stats = smelt_ir::ErrorStats::between_tensors(g, w).expect("same shape");
            assert!(
                stats.relative <= TOL,
                "{what}: {} against the unfused model",
                stats.relative
            );
        }
        for kernels in assert_packed_path(&what, &fused) {
            let names = kernel_names(&fused, kernels);
            let count = |prefix: &str| names.iter().filter(|n| n.starts_with(prefix)).count();
            // when Kᵀ is returned, its slice and transpose and the split they share with
            // Q and V (which the products then read through); when V is added to, its
            // slice, the split, and the head merge (P·V, on its own, writes row-major;
            // computed with the scores, it writes through the merge)
            let (slices, transposes) = match (also_kt, late_v) {
                (true, _) => (1, 2),
                (false, true) => (1, 2),
                (false, false) => (0, 0),
            };
            assert_eq!(count("slice"), slices, "{what} ({kernels:?}): {names:?}");
            assert_eq!(
                count("transpose"),
                transposes,
                "{what} ({kernels:?}): {names:?}"
            );
            assert_eq!(count("mul"), 0, "{what} ({kernels:?}): {names:?}");
            // the softmax runs inside the product, on each block of finished rows, and
            // so does P·V: one product kernel (after the two packs of Kᵀ and V)
            assert_eq!(count("softmax"), 0, "{what} ({kernels:?}): {names:?}");
            let fused_pv = names
                .iter()
                .filter(|n| n.contains("_by_batch_softmax_pv"))
                .count();
            let softmax_only = names
                .iter()
                .filter(|n| n.ends_with("_by_batch_softmax"))
                .count();
            assert_eq!(
                (fused_pv, softmax_only),
                if late_v { (0, 1) } else { (1, 0) },
                "{what} ({kernels:?}): {names:?}"
            );
            let products = if late_v { 2 } else { 1 };
            assert_eq!(
                count("gemm_packed"),
                products,
                "{what} ({kernels:?}): {names:?}"
            );
            assert_eq!(count("gemm_pack_b"), 2, "{what} ({kernels:?}): {names:?}");
            // each thread computes whole heads: the same bits on one thread and two
            let run = |threads: usize| run_at(&fused, kernels, threads, &inputs);
            let (one, two) = (run(1), run(2));
            for (a, b) in one.iter().zip(&two) {
                assert_eq!(a.data, b.data, "{what} ({kernels:?})");
            }
        }
    }
}

/// A product by a weight: the first call of each panel's sweep (at row 0) prefetches
/// the whole next panel, the other calls nothing (prefetched a share at every call, the
/// prefetches cost 4–6% with the weight in cache; not at all, 14% with the weights
/// streaming from memory as in a model: benches/RESULTS.md). Checked on the loop IR of
/// each target's lowering, and the results against the interpreter.
#[test]
fn the_first_call_of_a_panel_prefetches_the_next_whole() {
    let (k, n) = (384, 1536);
    let m = matmul_model(&[1, 128, k], n, Epi::None);
    for isa in [
        smelt::microkernels::TileIsa::Avx2,
        smelt::microkernels::TileIsa::Avx512,
    ] {
        let target = isa.target();
        let opts = smelt_passes::lower::LowerOptions {
            micro: Some(target),
            ..Default::default()
        };
        let p = smelt_passes::lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
        let loops = p.dump_loops();
        let calls: Vec<&str> = loops
            .lines()
            .filter(|l| l.contains("call conv_tile("))
            .collect();
        let prefetching: Vec<&&str> = calls.iter().filter(|l| l.contains("next_len")).collect();
        let lanes = target.widest.lanes as usize;
        assert_eq!(prefetching.len(), 1, "{isa:?}: {loops}");
        assert!(
            prefetching[0].contains("x: &%0[0]")
                && prefetching[0].contains(&format!("next_len={}", k * lanes)),
            "{isa:?}: the call at row 0 prefetches the whole next panel: {loops}"
        );
        assert!(
            calls.len() > 1,
            "{isa:?}: more calls than the first: {loops}"
        );
    }
    check("M = 128, 384 × 1536", &m);
}
