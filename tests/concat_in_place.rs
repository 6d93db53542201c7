//! Concatenations computed in place: where every operand is one contiguous run of the
//! result, the operands' kernels write into the result and no concat kernel runs. Each
//! case runs through the whole compiler against the interpreter (every kernel choice),
//! and the loop dump says which buffers were placed where — and, where placing would be
//! wrong (batch 2, an operand twice, a graph input, a fused post-op), that nothing was.

mod jit_util;

use jit_util::{check_against_interp, opts, random_inputs};
use smelt::microkernels::TileIsa;
use smelt::{Executable, OptimizeOptions};
use smelt_ir::{text, Layout, Op};
use smelt_passes::layout::assign_layouts;

/// The loop dump of `src` compiled, after checking every output against the interpreter.
fn compiled(what: &str, src: &str) -> String {
    let m = text::parse(src, what).unwrap_or_else(|d| panic!("{what}: {d}"));
    let inputs = random_inputs(&m, 7);
    check_against_interp(what, &m, &inputs, 1e-5);
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    exe.dump_loops().to_string()
}

/// The lines of the dump's "computed in place" section.
fn placed(dump: &str) -> Vec<String> {
    dump.split("computed in place:\n")
        .nth(1)
        .map(|s| s.lines().map(|l| l.trim().to_string()).collect())
        .unwrap_or_default()
}

/// Two branches of 1×1 convs and activations from one input, concatenated along the
/// channels; the first branch is computed long before the second (whose temporaries the
/// memory plan must not place over it), and the concatenation feeds a last conv.
const BRANCHES: &str = "
const @w1 : tensor<16x8x1x1xf32> = random<seed = 1, min = -0.5, max = 0.5>
const @w2 : tensor<16x8x1x1xf32> = random<seed = 2, min = -0.5, max = 0.5>
const @w3 : tensor<16x16x1x1xf32> = random<seed = 3, min = -0.5, max = 0.5>
const @w4 : tensor<16x32x1x1xf32> = random<seed = 4, min = -0.5, max = 0.5>
func @main(%x: tensor<Nx8x12x12xf32>) -> (y: tensor<Nx16x12x12xf32>) {
  %w1 = const @w1 : tensor<16x8x1x1xf32>
  %a = conv2d %x, %w1 : tensor<Nx16x12x12xf32>
  %ra = relu %a : tensor<Nx16x12x12xf32>
  %w2 = const @w2 : tensor<16x8x1x1xf32>
  %b = conv2d %x, %w2 : tensor<Nx16x12x12xf32>
  %sb = sigmoid %b : tensor<Nx16x12x12xf32>
  %w3 = const @w3 : tensor<16x16x1x1xf32>
  %c = conv2d %sb, %w3 : tensor<Nx16x12x12xf32>
  %tc = tanh %c : tensor<Nx16x12x12xf32>
  %both = concat %ra, %tc {axis = 1} : tensor<Nx32x12x12xf32>
  %w4 = const @w4 : tensor<16x32x1x1xf32>
  %y = conv2d %both, %w4 : tensor<Nx16x12x12xf32>
  return %y : tensor<Nx16x12x12xf32>
}
";

#[test]
fn batch_one_concatenations_are_computed_in_place() {
    let dump = compiled("branches", &BRANCHES.replace('N', "1"));
    let placed = placed(&dump);
    assert_eq!(placed.len(), 2, "{dump}");
    // the operands at 0 and at 16·144 elements
    assert!(placed[0].ends_with(" at 0"), "{placed:?}");
    assert!(placed[1].ends_with(" at 2304"), "{placed:?}");
    assert!(!dump.contains("@concat_"), "a concat kernel ran\n{dump}");
}

#[test]
fn runs_need_only_start_on_a_word() {
    // 3 floats, then 5: no cache-line alignment is needed, only the arena's 4-byte words
    let src = "
func @main(%x: tensor<1x3xf32>, %y: tensor<1x5xf32>) -> (z: tensor<1x8xf32>) {
  %a = relu %x : tensor<1x3xf32>
  %b = tanh %y : tensor<1x5xf32>
  %z = concat %a, %b {axis = 1} : tensor<1x8xf32>
  return %z : tensor<1x8xf32>
}
";
    let dump = compiled("words", src);
    assert_eq!(placed(&dump), ["v2 in v4 at 0", "v3 in v4 at 3"], "{dump}");
}

#[test]
fn batch_two_concatenations_copy() {
    // each image's channels are a run of their own: the operands are not contiguous
    let dump = compiled("branches at batch 2", &BRANCHES.replace('N', "2"));
    assert!(placed(&dump).is_empty(), "{dump}");
    assert!(dump.contains("@concat_"), "no concat kernel\n{dump}");
}

#[test]
fn concatenations_of_whole_channel_blocks_stay_in_blocks() {
    // the convs write channel blocks, so the concatenation of their 16-channel results
    // is one of blocks (at batch 2 a kernel copies each image's runs of blocks; at batch
    // 1 the operands are placed in it), and the last conv reads blocks
    for n in ["1", "2"] {
        let mut m = text::parse(&BRANCHES.replace('N', n), "branches").expect("parses");
        // fused first, as compiling does: the activations join their convs
        smelt::optimize(&mut m, &OptimizeOptions::default(), None).expect("optimizes");
        let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
        let concat = laid
            .insts
            .iter()
            .find(|i| matches!(i.op, Op::Concat { .. }))
            .expect("a concat");
        assert_ne!(
            concat.ty.layout,
            Layout::RowMajor,
            "batch {n}: {}",
            concat.ty
        );
    }
    // with 8 channels per operand (not whole blocks) it is row-major
    let narrow = "
const @w1 : tensor<8x8x1x1xf32> = random<seed = 1, min = -0.5, max = 0.5>
const @w2 : tensor<8x8x1x1xf32> = random<seed = 2, min = -0.5, max = 0.5>
const @w4 : tensor<16x16x1x1xf32> = random<seed = 4, min = -0.5, max = 0.5>
func @main(%x: tensor<1x8x12x12xf32>) -> (y: tensor<1x16x12x12xf32>) {
  %w1 = const @w1 : tensor<8x8x1x1xf32>
  %a = conv2d %x, %w1 : tensor<1x8x12x12xf32>
  %ra = relu %a : tensor<1x8x12x12xf32>
  %w2 = const @w2 : tensor<8x8x1x1xf32>
  %b = conv2d %x, %w2 : tensor<1x8x12x12xf32>
  %sb = sigmoid %b : tensor<1x8x12x12xf32>
  %both = concat %ra, %sb {axis = 1} : tensor<1x16x12x12xf32>
  %w4 = const @w4 : tensor<16x16x1x1xf32>
  %y = conv2d %both, %w4 : tensor<1x16x12x12xf32>
  return %y : tensor<1x16x12x12xf32>
}
";
    let mut m = text::parse(narrow, "narrow").expect("parses");
    check_against_interp("narrow", &m, &random_inputs(&m, 3), 1e-5);
    smelt::optimize(&mut m, &OptimizeOptions::default(), None).expect("optimizes");
    let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target()));
    let concat_ty = laid
        .as_ref()
        .unwrap_or(&m.funcs[0])
        .insts
        .iter()
        .find(|i| matches!(i.op, Op::Concat { .. }))
        .map(|i| i.ty.clone())
        .expect("a concat");
    assert_eq!(concat_ty.layout, Layout::RowMajor, "{concat_ty}");
}

#[test]
fn results_inside_a_concatenation_and_the_concatenation_as_a_result() {
    // an operand that is also a result, a concat that is a result, and a concat of a
    // concat (placed twice over: a chain of parents)
    let src = "
func @main(%x: tensor<1x4x8x8xf32>) -> (a: tensor<1x4x8x8xf32>, inner: tensor<1x8x8x8xf32>, outer: tensor<1x12x8x8xf32>) {
  %a = relu %x : tensor<1x4x8x8xf32>
  %b = sigmoid %x : tensor<1x4x8x8xf32>
  %inner = concat %a, %b {axis = 1} : tensor<1x8x8x8xf32>
  %c = tanh %x : tensor<1x4x8x8xf32>
  %outer = concat %inner, %c {axis = 1} : tensor<1x12x8x8xf32>
  return %a, %inner, %outer : tensor<1x4x8x8xf32>, tensor<1x8x8x8xf32>, tensor<1x12x8x8xf32>
}
";
    let dump = compiled("nested", src);
    assert_eq!(placed(&dump).len(), 4, "{dump}");
    assert!(!dump.contains("@concat_"), "a concat kernel ran\n{dump}");
}

#[test]
fn operands_that_cannot_be_placed_are_copied() {
    let cases = [
        // the same operand twice
        (
            "twice",
            "
func @main(%x: tensor<1x4x8x8xf32>) -> (y: tensor<1x8x8x8xf32>) {
  %a = relu %x : tensor<1x4x8x8xf32>
  %y = concat %a, %a {axis = 1} : tensor<1x8x8x8xf32>
  return %y : tensor<1x8x8x8xf32>
}
",
        ),
        // a graph input
        (
            "input",
            "
func @main(%x: tensor<1x4x8x8xf32>) -> (y: tensor<1x8x8x8xf32>) {
  %a = relu %x : tensor<1x4x8x8xf32>
  %y = concat %x, %a {axis = 1} : tensor<1x8x8x8xf32>
  return %y : tensor<1x8x8x8xf32>
}
",
        ),
        // an operand in two concatenations: placed in the first only
        (
            "shared",
            "
func @main(%x: tensor<1x4x8x8xf32>) -> (y: tensor<1x8x8x8xf32>, z: tensor<1x8x8x8xf32>) {
  %a = relu %x : tensor<1x4x8x8xf32>
  %b = tanh %x : tensor<1x4x8x8xf32>
  %y = concat %a, %b {axis = 1} : tensor<1x8x8x8xf32>
  %c = sigmoid %x : tensor<1x4x8x8xf32>
  %z = concat %c, %a {axis = 1} : tensor<1x8x8x8xf32>
  return %y, %z : tensor<1x8x8x8xf32>, tensor<1x8x8x8xf32>
}
",
        ),
        // a run that does not start on a 4-byte word (3 one-byte elements)
        (
            "unaligned",
            "
func @main(%x: tensor<1x3xf32>, %y: tensor<1x5xf32>) -> (z: tensor<1x8xf32>) {
  %a = cast %x {to = i1} : tensor<1x3xi1>
  %b = cast %y {to = i1} : tensor<1x5xi1>
  %c = concat %a, %b {axis = 1} : tensor<1x8xi1>
  %z = cast %c {to = f32} : tensor<1x8xf32>
  return %z : tensor<1x8xf32>
}
",
        ),
    ];
    for (what, src) in cases {
        let dump = compiled(what, src);
        assert!(
            dump.contains("@concat_"),
            "{what}: no concat kernel\n{dump}"
        );
        let placed = placed(&dump);
        let want = usize::from(what == "shared") * 2;
        assert_eq!(placed.len(), want, "{what}: {placed:?}");
    }
}

#[test]
fn the_type_rule_keeps_blocks_only_for_whole_blocks_along_the_blocked_axis() {
    // every declared type here is the one the type rule infers (parsing verifies it)
    let src = "
func @cb(%a: tensor<1x16x4x4xf32, nchw16c>, %b: tensor<1x32x4x4xf32, nchw16c>, %c: tensor<1x16x4x4xf32>, %d: tensor<1x8x4x4xf32, nchw16c>) -> (blocks: tensor<1x48x4x4xf32, nchw16c>, rows: tensor<1x16x8x4xf32>, mixed: tensor<1x32x4x4xf32>, partial: tensor<1x24x4x4xf32>) {
  %0 = concat %a, %b {axis = 1} : tensor<1x48x4x4xf32, nchw16c>
  %1 = concat %a, %a {axis = 2} : tensor<1x16x8x4xf32>
  %2 = concat %a, %c {axis = 1} : tensor<1x32x4x4xf32>
  %3 = concat %a, %d {axis = 1} : tensor<1x24x4x4xf32>
  return %0, %1, %2, %3 : tensor<1x48x4x4xf32, nchw16c>, tensor<1x16x8x4xf32>, tensor<1x32x4x4xf32>, tensor<1x24x4x4xf32>
}
";
    text::parse(src, "rule").unwrap_or_else(|d| panic!("{d}"));
    // and a blocked result declared where the rule says row-major is refused
    let wrong = src.replace(
        "%1 = concat %a, %a {axis = 2} : tensor<1x16x8x4xf32>",
        "%1 = concat %a, %a {axis = 2} : tensor<1x16x8x4xf32, nchw16c>",
    );
    let e = text::parse(&wrong, "wrong").expect_err("a wrong layout verifies");
    assert!(e.to_string().contains("concat"), "{e}");
}
