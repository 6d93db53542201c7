//! Slices of slices computed as one slice of their source: YOLO's stem (the four pixel
//! phases of the image, as slices of rows each read by slices of columns), chains with
//! negative steps, and a slice that something else reads too (kept). Each case runs
//! through the whole compiler against the interpreter on every kernel choice; the loop
//! dump says which buffers the slice kernels read.

mod jit_util;

use jit_util::{check_against_interp, opts, random_inputs};
use smelt::Executable;
use smelt_ir::text;

/// The `@slice_…` steps of `src` compiled (each line: the kernel and its buffers), after
/// checking every output against the interpreter.
fn slice_steps(what: &str, src: &str) -> Vec<String> {
    let m = text::parse(src, what).unwrap_or_else(|d| panic!("{what}: {d}"));
    check_against_interp(what, &m, &random_inputs(&m, 5), 1e-6);
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    exe.dump_loops()
        .lines()
        .filter(|l| l.starts_with("  @slice_"))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn the_pixel_phases_of_an_image_are_four_strided_reads_of_it() {
    let src = "
func @main(%x: tensor<1x3x8x10xf32>) -> (y: tensor<1x12x4x5xf32>) {
  %even = slice %x {starts = [0, 0, 0, 0], ends = [1, 3, 8, 10], steps = [1, 1, 2, 1]} : tensor<1x3x4x10xf32>
  %odd = slice %x {starts = [0, 0, 1, 0], ends = [1, 3, 8, 10], steps = [1, 1, 2, 1]} : tensor<1x3x4x10xf32>
  %a = slice %even {starts = [0, 0, 0, 0], ends = [1, 3, 4, 10], steps = [1, 1, 1, 2]} : tensor<1x3x4x5xf32>
  %b = slice %odd {starts = [0, 0, 0, 0], ends = [1, 3, 4, 10], steps = [1, 1, 1, 2]} : tensor<1x3x4x5xf32>
  %c = slice %even {starts = [0, 0, 0, 1], ends = [1, 3, 4, 10], steps = [1, 1, 1, 2]} : tensor<1x3x4x5xf32>
  %d = slice %odd {starts = [0, 0, 0, 1], ends = [1, 3, 4, 10], steps = [1, 1, 1, 2]} : tensor<1x3x4x5xf32>
  %y = concat %a, %b, %c, %d {axis = 1} : tensor<1x12x4x5xf32>
  return %y : tensor<1x12x4x5xf32>
}
";
    let steps = slice_steps("phases", src);
    assert_eq!(steps.len(), 4, "{steps:?}");
    assert!(steps.iter().all(|s| s.contains("(x, ")), "{steps:?}");
}

#[test]
fn chains_of_slices_with_negative_steps_compose() {
    // reversed, then every other element of the reversal, then a window of that
    let src = "
func @main(%x: tensor<2x20xf32>) -> (y: tensor<2x4xf32>) {
  %r = slice %x {starts = [0, 19], ends = [2, -1], steps = [1, -1]} : tensor<2x20xf32>
  %e = slice %r {starts = [0, 1], ends = [2, 20], steps = [1, 2]} : tensor<2x10xf32>
  %y = slice %e {starts = [1, 8], ends = [-1, 0], steps = [-1, -2]} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
";
    let steps = slice_steps("chain", src);
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert!(steps[0].contains("(x, "), "{steps:?}");
}

#[test]
fn a_slice_something_else_reads_is_kept() {
    let src = "
func @main(%x: tensor<4x6xf32>) -> (y: tensor<2x3xf32>, z: tensor<2x6xf32>) {
  %h = slice %x {starts = [0, 0], ends = [4, 6], steps = [2, 1]} : tensor<2x6xf32>
  %y = slice %h {starts = [0, 1], ends = [2, 6], steps = [1, 2]} : tensor<2x3xf32>
  %z = relu %h : tensor<2x6xf32>
  return %y, %z : tensor<2x3xf32>, tensor<2x6xf32>
}
";
    let steps = slice_steps("kept", src);
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(steps[1].starts_with("@slice_2x3(v"), "{steps:?}");
}

/// Every second column of rows long enough for vectors (9, 13 and 16 columns taken, so
/// the whole vectors end before the last one or two taken, and the odd phase's last read
/// is the source's last element): vectors of 4 from two loads and an even-lanes shuffle,
/// and the same values as the interpreter.
#[test]
fn every_second_column_is_copied_in_vectors() {
    for (cols, phase) in [(18usize, 0usize), (18, 1), (26, 1), (32, 0), (32, 1)] {
        let taken = (cols - phase).div_ceil(2);
        let src = format!(
            "
func @main(%x: tensor<2x3x{cols}xf32>) -> (y: tensor<2x3x{taken}xf32>) {{
  %y = slice %x {{starts = [0, 0, {phase}], ends = [2, 3, {cols}], steps = [1, 1, 2]}} : tensor<2x3x{taken}xf32>
  return %y : tensor<2x3x{taken}xf32>
}}
"
        );
        let what = format!("{cols} columns from {phase}");
        let m = text::parse(&src, &what).unwrap_or_else(|d| panic!("{what}: {d}"));
        check_against_interp(&what, &m, &random_inputs(&m, 7), 0.0);
        let exe = Executable::compile(&m, None, &opts()).expect("compiles");
        assert!(
            exe.dump_loops().contains("[0, 2, 4, 6])"),
            "{what}: no even-lanes shuffle\n{}",
            exe.dump_loops()
        );
    }
}
