//! Concatenations computed in place: where every operand is one contiguous run of the
//! result, the operands' kernels write into the result and no concat kernel runs. Each
//! case runs through the whole compiler against the interpreter (every kernel choice),
//! and the loop dump says which buffers were placed where — and, where placing would be
//! wrong (batch 2, an operand twice, a graph input, a fused post-op), that nothing was.

mod jit_util;

use jit_util::{check_against_interp, opts, random_inputs};
use smelt::Executable;
use smelt_ir::text;

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

/// Two branches of convs and elementwise ops from one input, concatenated along the
/// channels; the first branch is computed long before the second (whose temporaries the
/// memory plan must not place over it), and the concatenation feeds a last conv.
const BRANCHES: &str = "
const @w1 : tensor<16x8x3x3xf32> = random<seed = 1, min = -0.5, max = 0.5>
const @w2 : tensor<16x8x1x1xf32> = random<seed = 2, min = -0.5, max = 0.5>
const @w3 : tensor<16x16x3x3xf32> = random<seed = 3, min = -0.5, max = 0.5>
const @w4 : tensor<8x32x1x1xf32> = random<seed = 4, min = -0.5, max = 0.5>
func @main(%x: tensor<Nx8x12x12xf32>) -> (y: tensor<Nx8x12x12xf32>) {
  %w1 = const @w1 : tensor<16x8x3x3xf32>
  %a = conv2d %x, %w1 {pads = [1, 1, 1, 1]} : tensor<Nx16x12x12xf32>
  %ra = relu %a : tensor<Nx16x12x12xf32>
  %w2 = const @w2 : tensor<16x8x1x1xf32>
  %b = conv2d %x, %w2 : tensor<Nx16x12x12xf32>
  %sb = sigmoid %b : tensor<Nx16x12x12xf32>
  %w3 = const @w3 : tensor<16x16x3x3xf32>
  %c = conv2d %sb, %w3 {pads = [1, 1, 1, 1]} : tensor<Nx16x12x12xf32>
  %tc = tanh %c : tensor<Nx16x12x12xf32>
  %both = concat %ra, %tc {axis = 1} : tensor<Nx32x12x12xf32>
  %w4 = const @w4 : tensor<8x32x1x1xf32>
  %y = conv2d %both, %w4 : tensor<Nx8x12x12xf32>
  return %y : tensor<Nx8x12x12xf32>
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
fn batch_two_concatenations_copy() {
    // each image's channels are a run of their own: the operands are not contiguous
    let dump = compiled("branches at batch 2", &BRANCHES.replace('N', "2"));
    assert!(placed(&dump).is_empty(), "{dump}");
    assert!(dump.contains("@concat_"), "no concat kernel\n{dump}");
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
        // a run that does not start on a cache line (3 elements of 4 bytes)
        (
            "unaligned",
            "
func @main(%x: tensor<1x3xf32>, %y: tensor<1x5xf32>) -> (z: tensor<1x8xf32>) {
  %a = relu %x : tensor<1x3xf32>
  %b = relu %y : tensor<1x5xf32>
  %z = concat %a, %b {axis = 1} : tensor<1x8xf32>
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
