//! Zero-size shapes through every op kind (issue 19). The corpus: the functions of the
//! parse cases (`tests/cases/parse/`), of [`SAMPLES`] (the kinds those lack) and of every
//! attribute-free unary elementwise kind the op table lists, and
//! each of their instructions alone as a one-op module. Each is rebuilt with dimensions
//! set to 0 — one parameter axis at a time, and every parameter and f32 weight axis of
//! one size at once (so both sides of a contraction can be empty) — wherever the type
//! rules accept it; [`EMPTY_FROM_FULL`] adds ops whose attributes empty a full input, and
//! contractions on weights with K = 0 (zeros plus the bias). Every kind of the op table
//! must be reached with an empty operand or result.
//! Each variant must verify, print and re-parse to the same text, and the interpreter
//! and the whole compiler (fusion, then the JIT on every kernel choice) must agree on it
//! without a panic. Inputs come from fixed seeds; every tensor is small.

mod common;
mod jit_util;

use std::collections::BTreeSet;

use smelt::{CompileOptions, Options};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{Attrs, OpKind};
use smelt_ir::text::{self, PrintOptions};
use smelt_ir::weights::random_f32;
use smelt_ir::{interp, verify, DType, ErrorStats, Func, Module, Op, Tensor, TensorType};

/// The largest tensor a variant may hold, so the corpus stays quick.
const MAX_ELEMENTS: usize = 1 << 16;

/// Relative error allowed between the JIT and the interpreter (f32 against f64 sums).
const TOLERANCE: f64 = 1e-4;

/// Rebuilds `func` of `source` with parameter types `params` and, where `zero_size` is
/// given, every f32 weight axis of that size set to 0. `None` when a type rule refuses
/// the new shapes (the op does not take them) or a tensor exceeds [`MAX_ELEMENTS`].
fn rebuild(
    source: &Module,
    func: &Func,
    params: &[TensorType],
    zero_size: Option<usize>,
) -> Option<Module> {
    let mut m = source.clone();
    m.funcs.clear();
    let mut b = FuncBuilder::new(&mut m, &func.name);
    for (p, ty) in func.params.iter().zip(params) {
        b.param(&p.name, ty.clone());
    }
    for (i, inst) in func.insts.iter().enumerate() {
        b.set_loc(inst.loc.clone());
        let v = match (&inst.op, zero_size) {
            (Op::Const(_), Some(size))
                if inst.ty.dtype == DType::F32 && inst.ty.dims.contains(&size) =>
            {
                let dims: Vec<usize> = inst
                    .ty
                    .dims
                    .iter()
                    .map(|&d| if d == size { 0 } else { d })
                    .collect();
                let ty = TensorType::f32(dims).with_layout(inst.ty.layout);
                let values = random_f32(700 + i as u64, ty.storage_len(), -1.0, 1.0);
                b.constant(&format!("w{i}"), ty, &values).ok()?
            }
            _ => b.op(inst.op.clone(), &inst.operands).ok()?,
        };
        if b.type_of(v).storage_len() > MAX_ELEMENTS {
            return None;
        }
    }
    let results: Vec<(&str, _)> = func
        .results
        .iter()
        .map(|r| (r.name.as_str(), r.value))
        .collect();
    b.finish(&results);
    Some(m)
}

/// The kinds of the instructions of `m` that read or write an empty tensor.
fn kinds_on_empty(m: &Module) -> BTreeSet<OpKind> {
    let f = &m.funcs[0];
    f.insts
        .iter()
        .filter(|inst| {
            inst.ty.num_elements() == 0
                || inst
                    .operands
                    .iter()
                    .any(|&v| f.type_of(v).num_elements() == 0)
        })
        .filter_map(|inst| inst.op.kind())
        .collect()
}

/// Checks one variant: it verifies, round-trips through the text form, and the
/// interpreter and the compiled executable (every kernel choice) agree on it.
fn check_variant(what: &str, m: &Module) {
    let base = common::root().join("tests/cases/parse");
    verify::verify_module(m).unwrap_or_else(|d| panic!("{what}: does not verify: {d}"));
    let printed = text::print(m, &PrintOptions::default());
    let reparsed = text::parse_with(&printed, what, Some(&base))
        .unwrap_or_else(|d| panic!("{what}: its text does not re-parse: {d}\n{printed}"));
    verify::verify_module(&reparsed)
        .unwrap_or_else(|d| panic!("{what}: re-parsed text does not verify: {d}"));
    assert_eq!(
        text::print(&reparsed, &PrintOptions::default()),
        printed,
        "{what}: printing is not a fixed point"
    );
    let f = &m.funcs[0];
    let inputs: Vec<Tensor> = f
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| Tensor::random(&p.ty, 31 + i as u64).to_layout(p.ty.layout))
        .collect();
    // random integers may divide by zero: then the executable must fault too
    let want = interp::run(m, f, &inputs);
    for kernels in jit_util::kernel_choices() {
        let opts = Options {
            compile: CompileOptions {
                kernels,
                ..jit_util::opts()
            },
            ..Options::default()
        };
        let (exe, _) = smelt::compile(m, &opts)
            .unwrap_or_else(|e| panic!("{what} ({kernels:?}): compile failed: {e}\n{printed}"));
        let got = match (exe.run(&inputs), &want) {
            (Ok(got), Ok(_)) => got,
            (Err(_), Err(_)) => continue,
            (Err(e), Ok(_)) => panic!("{what} ({kernels:?}): run failed: {e}\n{printed}"),
            (Ok(_), Err(d)) => {
                panic!("{what} ({kernels:?}): ran where the interpreter failed: {d}")
            }
        };
        let want = want.as_ref().expect("the interpreter ran");
        assert_eq!(got.len(), want.len(), "{what}: result count");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.ty, w.ty, "{what} ({kernels:?}): result {i} type");
            let stats = ErrorStats::between_tensors(g, w).expect("same type");
            assert!(
                stats.relative <= TOLERANCE,
                "{what} ({kernels:?}): result {i} relative error {} (max abs {})\n{printed}",
                stats.relative,
                stats.max_abs
            );
        }
    }
}

/// `func`'s instruction `i` alone: its non-constant operands become parameters.
fn one_op(source: &Module, func: &Func, i: usize) -> (Module, Func) {
    let inst = &func.insts[i];
    let mut m = source.clone();
    m.funcs.clear();
    let mut b = FuncBuilder::new(&mut m, "one");
    let mut operands = Vec::new();
    let consts: Vec<_> = inst
        .operands
        .iter()
        .map(|&v| func.inst_of(v).filter(|d| matches!(d.op, Op::Const(_))))
        .collect();
    for (k, (&v, c)) in inst.operands.iter().zip(&consts).enumerate() {
        if c.is_none() {
            operands.push(Some(b.param(&format!("x{k}"), func.type_of(v).clone())));
        } else {
            operands.push(None);
        }
    }
    for (slot, c) in operands.iter_mut().zip(&consts) {
        if let Some(c) = c {
            *slot = Some(b.op(c.op.clone(), &[]).expect("a weight"));
        }
    }
    let operands: Vec<_> = operands.into_iter().map(|o| o.expect("operand")).collect();
    let y = b
        .op(inst.op.clone(), &operands)
        .expect("the instruction type-checks");
    b.finish(&[("y", y)]);
    let f = m.funcs[0].clone();
    (m, f)
}

/// Every variant of `func` with zero-size dims: one parameter axis at a time, then each
/// size zeroed everywhere at once.
fn variants(source: &Module, func: &Func) -> Vec<(String, Module)> {
    let original: Vec<TensorType> = func.params.iter().map(|p| p.ty.clone()).collect();
    let mut out = Vec::new();
    for (p, ty) in original.iter().enumerate() {
        for axis in 0..ty.rank() {
            if ty.dims[axis] == 0 {
                continue;
            }
            let mut params = original.clone();
            params[p].dims[axis] = 0;
            if let Some(m) = rebuild(source, func, &params, None) {
                out.push((
                    format!("@{} %{} axis {axis}", func.name, func.params[p].name),
                    m,
                ));
            }
        }
    }
    let sizes: BTreeSet<usize> = original
        .iter()
        .flat_map(|t| t.dims.iter().copied())
        .chain(
            func.insts
                .iter()
                .filter_map(|i| match i.op {
                    Op::Const(_) => Some(i.ty.dims.clone()),
                    _ => None,
                })
                .flatten(),
        )
        .filter(|&d| d > 1)
        .collect();
    for size in sizes {
        let params: Vec<TensorType> = original
            .iter()
            .map(|t| {
                let mut t = t.clone();
                t.dims
                    .iter_mut()
                    .filter(|d| **d == size)
                    .for_each(|d| *d = 0);
                t
            })
            .collect();
        if let Some(m) = rebuild(source, func, &params, Some(size)) {
            out.push((format!("@{} every axis of size {size}", func.name), m));
        }
    }
    out
}

/// Contractions over weights with an empty reduction or output, written out: K = 0
/// gives zeros plus the bias, an empty N or channel count an empty result.
const HAND_WRITTEN: &[(&str, &str)] = &[
    (
        "gemm K=0 with bias",
        "const @w : tensor<5x0xf32> = random<seed = 1, min = -1.0, max = 1.0>\n\
         const @b : tensor<5xf32> = random<seed = 2, min = -1.0, max = 1.0>\n\
         func @main(%x: tensor<3x0xf32>) -> tensor<3x5xf32> {\n  \
         %w = const @w : tensor<5x0xf32>\n  %b = const @b : tensor<5xf32>\n  \
         %y = gemm %x, %w, %b {trans_b = true} : tensor<3x5xf32>\n  \
         %r = relu %y : tensor<3x5xf32>\n  return %r : tensor<3x5xf32>\n}\n",
    ),
    (
        "matmul K=0 on a weight, 9 rows",
        "const @w : tensor<0x20xf32> = random<seed = 3, min = -1.0, max = 1.0>\n\
         func @main(%x: tensor<9x0xf32>) -> tensor<9x20xf32> {\n  \
         %w = const @w : tensor<0x20xf32>\n  %y = matmul %x, %w : tensor<9x20xf32>\n  \
         return %y : tensor<9x20xf32>\n}\n",
    ),
    (
        "matmul N=0 on a weight",
        "const @w : tensor<8x0xf32> = random<seed = 4, min = -1.0, max = 1.0>\n\
         func @main(%x: tensor<9x8xf32>) -> tensor<9x0xf32> {\n  \
         %w = const @w : tensor<8x0xf32>\n  %y = matmul %x, %w : tensor<9x0xf32>\n  \
         return %y : tensor<9x0xf32>\n}\n",
    ),
    (
        "conv2d with no input channels, bias and relu",
        "const @w : tensor<16x0x3x3xf32> = random<seed = 5, min = -1.0, max = 1.0>\n\
         const @b : tensor<16xf32> = random<seed = 6, min = -1.0, max = 1.0>\n\
         func @main(%x: tensor<1x0x6x6xf32>) -> tensor<1x16x6x6xf32> {\n  \
         %w = const @w : tensor<16x0x3x3xf32>\n  %b = const @b : tensor<16xf32>\n  \
         %y = conv2d %x, %w, %b {pads = [1, 1, 1, 1]} : tensor<1x16x6x6xf32>\n  \
         %r = relu %y : tensor<1x16x6x6xf32>\n  return %r : tensor<1x16x6x6xf32>\n}\n",
    ),
    (
        "conv2d with no output channels",
        "const @w : tensor<0x8x1x1xf32> = random<seed = 7, min = -1.0, max = 1.0>\n\
         func @main(%x: tensor<1x8x5x5xf32>) -> tensor<1x0x5x5xf32> {\n  \
         %w = const @w : tensor<0x8x1x1xf32>\n  %y = conv2d %x, %w : tensor<1x0x5x5xf32>\n  \
         return %y : tensor<1x0x5x5xf32>\n}\n",
    ),
    (
        "conv2d on an empty batch",
        "const @w : tensor<16x8x3x3xf32> = random<seed = 8, min = -1.0, max = 1.0>\n\
         func @main(%x: tensor<0x8x6x6xf32>) -> tensor<0x16x4x4xf32> {\n  \
         %w = const @w : tensor<16x8x3x3xf32>\n  %y = conv2d %x, %w : tensor<0x16x4x4xf32>\n  \
         %r = relu %y : tensor<0x16x4x4xf32>\n  return %r : tensor<0x16x4x4xf32>\n}\n",
    ),
];

/// Kinds the parse cases do not hold, on small full shapes (the weight-preparation ops
/// on weights, as const_fold meets them).
const SAMPLES: &str = "\
const @w : tensor<4x2x3x3xf32> = random<seed = 11, min = -1.0, max = 1.0>
const @c4 : tensor<4xf32> = random<seed = 12, min = 0.5, max = 1.5>
const @c2 : tensor<2xf32> = random<seed = 13, min = 0.5, max = 1.5>
func @samples(%x: tensor<3x5xf32>, %y: tensor<3x5xf32>, %p: tensor<3x5xi1>, %q: tensor<5xi1>) -> (a: tensor<3x5xf32>, b: tensor<3x5xi1>, c: tensor<3x5xi1>, s: tensor<4x1x1xf32>, t: tensor<4x1x1xf32>, u: tensor<4x2x3x3xf32>, v: tensor<4xf32>, z: tensor<4xf32>) {
  %ab = abs %x : tensor<3x5xf32>
  %l = log %ab : tensor<3x5xf32>
  %f = floor %l : tensor<3x5xf32>
  %c = ceil %x : tensor<3x5xf32>
  %r = round %y : tensor<3x5xf32>
  %s0 = add %f, %c : tensor<3x5xf32>
  %s1 = add %s0, %r : tensor<3x5xf32>
  %e = equal %x, %y : tensor<3x5xi1>
  %le = less_equal %x, %y : tensor<3x5xi1>
  %g = greater %x, %y : tensor<3x5xi1>
  %ge = greater_equal %x, %y : tensor<3x5xi1>
  %a1 = and %e, %le : tensor<3x5xi1>
  %x1 = xor %g, %p : tensor<3x5xi1>
  %x2 = xor %ge, %q : tensor<3x5xi1>
  %o = or %a1, %x1 : tensor<3x5xi1>
  %w = const @w : tensor<4x2x3x3xf32>
  %k = const @c4 : tensor<4xf32>
  %k2 = const @c2 : tensor<2xf32>
  %bs = bn_scale %k, %k : tensor<4x1x1xf32>
  %bt = bn_shift %k, %k, %k, %k : tensor<4x1x1xf32>
  %cs = channel_scale %w, %k : tensor<4x2x3x3xf32>
  %cv = channel_vector %k : tensor<4xf32>
  %sb = conv_shift_bias %w, %k2 : tensor<4xf32>
  return %s1, %o, %x2, %bs, %bt, %cs, %cv, %sb : tensor<3x5xf32>, tensor<3x5xi1>, tensor<3x5xi1>, tensor<4x1x1xf32>, tensor<4x1x1xf32>, tensor<4x2x3x3xf32>, tensor<4xf32>, tensor<4xf32>
}
";

/// Ops whose attributes empty a full input, and reshapes and transposes of empty
/// tensors (their attributes name the sizes, so the corpus variants cannot reach them).
const EMPTY_FROM_FULL: &str = "\
const @half : tensor<f32> = dense<0.5>
func @emptied(%x: tensor<4x6xf32>, %i: tensor<2x3xi64>, %z: tensor<0x3x2xf32>) -> (a: tensor<4x0xf32>, b: tensor<0x6xf32>, c: tensor<4x0xf32>, d: tensor<0x3xi64>, e: tensor<4x0xf32>, f: tensor<2x0x3xf32>, g: tensor<3x0xf32>, h: tensor<4x6xf32>) {
  %a = slice %x {starts = [0, 2], ends = [4, 2]} : tensor<4x0xf32>
  %b = tile %x {repeats = [0, 1]} : tensor<0x6xf32>
  %c = pad %x {pads = [0, -3, 0, -3]} : tensor<4x0xf32>
  %d = resize %i {sizes = [0, 3], scales = [0.5, 1.0], mode = nearest} : tensor<0x3xi64>
  %e = expand %a {shape = [4, 0]} : tensor<4x0xf32>
  %f = transpose %z {perm = [2, 0, 1]} : tensor<2x0x3xf32>
  %g = reshape %z {shape = [3, 0]} : tensor<3x0xf32>
  %v = const @half : tensor<f32>
  %h = pad %c, %v {pads = [0, 3, 0, 3]} : tensor<4x6xf32>
  return %a, %b, %c, %d, %e, %f, %g, %h : tensor<4x0xf32>, tensor<0x6xf32>, tensor<4x0xf32>, tensor<0x3xi64>, tensor<4x0xf32>, tensor<2x0x3xf32>, tensor<3x0xf32>, tensor<4x6xf32>
}
";

/// One function applying every attribute-free unary elementwise kind of the op table to
/// one input, so a new such op is reached here without an edit.
fn every_attribute_free_unary_op() -> String {
    let ty = "tensor<3x5xf32>";
    let names: Vec<&str> = OpKind::ALL
        .iter()
        .filter(|k| matches!(k.join(&Attrs::None), Some(Op::Unary(_))))
        .map(|k| k.name())
        .collect();
    let body: String = names
        .iter()
        .enumerate()
        .map(|(i, name)| format!("  %y{i} = {name} %x : {ty}\n"))
        .collect();
    let results: Vec<String> = (0..names.len()).map(|i| format!("y{i}: {ty}")).collect();
    let values: Vec<String> = (0..names.len()).map(|i| format!("%y{i}")).collect();
    let types = vec![ty; names.len()].join(", ");
    format!(
        "func @unary(%x: {ty}) -> ({}) {{\n{body}  return {} : {types}\n}}\n",
        results.join(", "),
        values.join(", ")
    )
}

#[test]
fn every_op_kind_agrees_on_zero_size_shapes() {
    let mut corpus: Vec<(String, Module)> = common::case_files("parse")
        .iter()
        .map(|path| {
            let name = common::case_name(path);
            let m = text::parse_file(path).unwrap_or_else(|d| panic!("{name}: {d}"));
            // a case with symbolic sizes is taken with every symbol at 6
            let m = common::at_every_symbol(&m, 6);
            (name, m)
        })
        .collect();
    corpus.push(("samples".into(), text::parse(SAMPLES, "samples").unwrap()));
    let unary = every_attribute_free_unary_op();
    corpus.push(("unary".into(), text::parse(&unary, "unary").unwrap()));
    let mut covered = BTreeSet::new();
    let mut count = 0;
    let mut check = |what: String, m: Module| {
        covered.extend(kinds_on_empty(&m));
        check_variant(&what, &m);
        count += 1;
    };
    for (name, source) in &corpus {
        for func in &source.funcs {
            for (what, m) in variants(source, func) {
                check(format!("{name} {what}"), m);
            }
            for i in 0..func.insts.len() {
                if matches!(func.insts[i].op, Op::Const(_)) {
                    continue;
                }
                let (m, f) = one_op(source, func, i);
                for (what, v) in variants(&m, &f) {
                    check(format!("{name} instruction {i} alone: {what}"), v);
                }
            }
        }
    }
    let emptied = text::parse(EMPTY_FROM_FULL, "emptied").unwrap();
    check("emptied".into(), emptied);
    for (what, src) in HAND_WRITTEN {
        check(what.to_string(), text::parse(src, what).unwrap());
    }
    let missing: Vec<&str> = OpKind::ALL
        .iter()
        .filter(|k| !covered.contains(k))
        .map(|k| k.name())
        .collect();
    assert!(
        missing.is_empty(),
        "no zero-size variant of {missing:?} ({count} variants checked)"
    );
}
