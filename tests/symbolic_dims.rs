//! Symbolic dimensions in the IR (issue #23): a module written once with `N`, `H`, `W`
//! verifies and prints with expressions, and specializes at any sizes its inputs give —
//! bound and checked by name — into the module the type rules give at those sizes,
//! which the whole compiler (fusion + JIT) runs against the interpreter. The steps that
//! compute with sizes refuse a symbolic module, naming its symbols.

mod common;
mod jit_util;

use std::collections::BTreeMap;

use jit_util::{check_against_interp, random_inputs};
use smelt::{Error, Options};
use smelt_ir::symbolic::{self, specialize};
use smelt_ir::text::{self, PrintOptions};
use smelt_ir::{interp, ErrorStats, Module};

fn case() -> Module {
    let path = common::root().join("tests/cases/parse/symbolic_dims.tir");
    text::parse_file(&path).expect("the symbolic case parses")
}

fn shapes(pins: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
    pins.iter()
        .map(|(n, d)| (n.to_string(), d.to_vec()))
        .collect()
}

/// The case's inputs at batch `n`, image `h`×`w` and sequence `s` (3 rows of it).
fn case_shapes(n: usize, h: usize, w: usize, s: usize) -> BTreeMap<String, Vec<usize>> {
    shapes(&[
        ("x", &[n, 3, h, w]),
        ("gate", &[n, 8, 1, 1]),
        ("t", &[3, s, 16]),
        ("m", &[16, 4]),
    ])
}

#[test]
fn symbols_are_read_from_the_parameters_and_print_back_identically() {
    let m = case();
    let f = &m.funcs[0];
    let names: Vec<String> = f.symbols().iter().map(|s| s.to_string()).collect();
    assert_eq!(names, ["?1", "H", "N", "W", "max_len"]);
    assert!(f.is_symbolic());
    let printed = text::print(&m, &PrintOptions::default());
    let again = text::print(
        &text::parse(&printed, "printed").expect("printed text parses"),
        &PrintOptions::default(),
    );
    assert_eq!(printed, again);
    // the written type (H - 1) / 2 + 1 is the canonical (H + 1) / 2
    assert!(printed.contains("tensor<Nx8x((H + 1) / 2)x((W + 1) / 2)xf32>"));
    assert!(!printed.contains("(H - 1)"));
}

#[test]
fn specialization_gives_the_sizes_the_type_rules_give() {
    let m = case();
    for (h, w) in [(17, 20), (1, 1), (2, 3), (8, 8), (33, 7)] {
        let s = specialize(&m, &case_shapes(2, h, w, 5)).expect("specializes");
        let f = &s.funcs[0];
        assert!(!f.is_symbolic());
        let result = |i: usize| f.type_of(f.results[i].value).dims.clone();
        let (h2, w2) = (h.div_ceil(2), w.div_ceil(2));
        assert_eq!(result(0), [2, 8, h2.div_ceil(2), w2.div_ceil(2)], "{h}x{w}");
        assert_eq!(result(1), [2, 8 * h2 * w2], "{h}x{w}");
        assert_eq!(result(2), [2, 16, h2, w2], "{h}x{w}");
        assert_eq!(result(3), [3, 8, 16]);
        assert_eq!(result(4), [3, 5, 4]);
        smelt_ir::verify::verify_module(&s).expect("the specialized module verifies");
    }
}

#[test]
fn specialized_modules_run_through_the_whole_compiler_within_tolerance() {
    let m = case();
    for (n, h, w) in [(1, 9, 14), (3, 16, 5)] {
        let s = specialize(&m, &case_shapes(n, h, w, 7)).expect("specializes");
        let inputs = random_inputs(&s, 7);
        // every kernel choice, unfused, against the interpreter
        check_against_interp(&format!("symbolic at {n}x{h}x{w}"), &s, &inputs, 1e-5);
        // and the default pipeline: fusion, const_fold, dce, then the JIT
        let (exe, _) = smelt::compile(&s, &Options::default()).expect("compiles");
        let got = exe.run(&inputs).expect("runs");
        let want = interp::run(&s, &s.funcs[0], &inputs).expect("interprets");
        for (g, w) in got.iter().zip(&want) {
            let stats = ErrorStats::between_tensors(g, w).expect("same shapes");
            assert!(stats.relative <= 1e-5, "relative {}", stats.relative);
        }
    }
}

#[test]
fn inputs_sharing_a_symbol_must_agree_and_errors_name_input_and_dimension() {
    let m = case();
    let mut pins = case_shapes(2, 8, 8, 5);
    pins.insert("gate".into(), vec![3, 8, 1, 1]);
    let e = specialize(&m, &pins).unwrap_err().to_string();
    assert!(
        e.contains("input %gate dimension 0 is 3, but input %x dimension 0 made N = 2"),
        "{e}"
    );

    let mut pins = case_shapes(2, 8, 8, 5);
    pins.remove("t");
    let e = specialize(&m, &pins).unwrap_err().to_string();
    assert!(
        e.contains("input %t") && e.contains("give its shape"),
        "{e}"
    );

    let mut pins = case_shapes(2, 8, 8, 5);
    pins.insert("nope".into(), vec![1]);
    let e = specialize(&m, &pins).unwrap_err().to_string();
    assert!(e.contains("no input named %nope"), "{e}");

    let mut pins = case_shapes(2, 8, 8, 5);
    pins.insert("m".into(), vec![16, 5]);
    let e = specialize(&m, &pins).unwrap_err().to_string();
    assert!(e.contains("input %m dimension 1 is 5"), "{e}");

    let mut pins = case_shapes(2, 8, 8, 5);
    pins.insert("x".into(), vec![2, 3, 8]);
    let e = specialize(&m, &pins).unwrap_err().to_string();
    assert!(e.contains("input %x has rank 3"), "{e}");
}

#[test]
fn an_input_declared_by_an_expression_is_checked_once_its_symbols_are_bound() {
    let src = "func @f(%a: tensor<Nx4xf32>, %b: tensor<(2*N + 1)x4xf32>) -> (c: tensor<(3*N + 1)x4xf32>) {\n  %0 = concat %a, %b {axis = 0} : tensor<(3*N + 1)x4xf32>\n  return %0 : tensor<(3*N + 1)x4xf32>\n}\n";
    let m = text::parse(src, "expr.tir").expect("parses");
    let s = specialize(&m, &shapes(&[("a", &[3, 4]), ("b", &[7, 4])])).expect("7 = 2·3 + 1");
    assert_eq!(s.funcs[0].insts[0].ty.dims, [10, 4]);
    let e = specialize(&m, &shapes(&[("a", &[3, 4]), ("b", &[6, 4])]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("input %b dimension 0 is 6, but 2*N + 1 = 7"),
        "{e}"
    );
    // an expression of one symbol no other input gives binds it when it is linear
    let alone = "func @f(%b: tensor<(2*N + 1)x4xf32>) -> (c: tensor<(2*N + 1)x4xf32>) {\n  %0 = relu %b : tensor<(2*N + 1)x4xf32>\n  return %0 : tensor<(2*N + 1)x4xf32>\n}\n";
    let m = text::parse(alone, "alone.tir").expect("parses");
    let bound = symbolic::bind_symbols(&m.funcs[0], &shapes(&[("b", &[7, 4])])).expect("N = 3");
    assert_eq!(bound.get("N"), Some(&3));
    let e = specialize(&m, &shapes(&[("b", &[6, 4])]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("input %b dimension 0 is 6") && e.contains("no size of N gives 6"),
        "{e}"
    );
    // two symbols in one dimension wait for another input, and none gives them
    let two = "func @f(%b: tensor<(N*M)x4xf32>) -> (c: tensor<(N*M)x4xf32>) {\n  %0 = relu %b : tensor<(N*M)x4xf32>\n  return %0 : tensor<(N*M)x4xf32>\n}\n";
    let m = text::parse(two, "two.tir").expect("parses");
    let e = specialize(&m, &shapes(&[("b", &[6, 4])]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no input gives alone"), "{e}");
}

#[test]
fn a_size_too_small_for_a_window_is_an_error_naming_the_instruction() {
    let src = "const @w : tensor<2x1x5x5xf32> = random<seed = 3, min = -1.0, max = 1.0>\nfunc @f(%x: tensor<1x1xHxHxf32>) -> (y: tensor<1x2x(H - 4)x(H - 4)xf32>) {\n  %w = const @w : tensor<2x1x5x5xf32>\n  %0 = conv2d %x, %w : tensor<1x2x(H - 4)x(H - 4)xf32>\n  return %0 : tensor<1x2x(H - 4)x(H - 4)xf32>\n}\n";
    let m = text::parse(src, "window.tir").expect("parses");
    let ok = specialize(&m, &shapes(&[("x", &[1, 1, 9, 9])])).expect("a 9×9 image fits");
    assert_eq!(ok.funcs[0].insts[1].ty.dims, [1, 2, 5, 5]);
    let e = specialize(&m, &shapes(&[("x", &[1, 1, 3, 3])]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("H = 3") && e.contains("conv2d"), "{e}");
    assert!(e.contains("window.tir:4:"), "{e}");
}

#[test]
fn steps_that_compute_with_sizes_refuse_a_symbolic_module_naming_its_symbols() {
    let m = case();
    let inputs = random_inputs(
        &specialize(&m, &case_shapes(1, 4, 4, 2)).expect("specializes"),
        1,
    );
    let e = interp::run(&m, &m.funcs[0], &inputs).unwrap_err();
    assert_eq!(e.code, "symbolic-sizes");
    assert!(e.message.contains("the interpreter") && e.message.contains("H, N, W"));
    // the passes run (fusion decides once for every size), code generation refuses
    match smelt::compile(&m, &Options::default()) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains("compiling needs known sizes"), "{msg}")
        }
        other => panic!("expected compile's refusal, got {:?}", other.map(|_| ())),
    }
    let mut layout =
        smelt_passes::PassManager::from_names(&["layout"], &Default::default()).expect("exists");
    match layout.run(&mut m.clone(), &mut Default::default()) {
        Err(smelt_passes::PassError::SymbolicSizes(msg)) => {
            assert!(msg.contains("the layout pass needs known sizes"), "{msg}")
        }
        other => panic!("expected the layout pass's refusal, got {other:?}"),
    }
}

#[test]
fn a_module_fused_once_specializes_at_every_size_like_one_fused_per_size() {
    let m = case();
    let mut fused = m.clone();
    smelt::optimize(&mut fused, &Default::default(), None).expect("the passes run");
    assert!(fused.funcs[0].is_symbolic());
    let kinds = |m: &Module| -> Vec<&'static str> {
        m.funcs[0].insts.iter().map(|i| i.op.name()).collect()
    };
    for (n, h, w) in [(1, 6, 6), (2, 13, 9)] {
        let pins = case_shapes(n, h, w, 4);
        let once = specialize(&fused, &pins).expect("the fused module specializes");
        let mut per_size = specialize(&m, &pins).expect("specializes");
        smelt::optimize(&mut per_size, &Default::default(), None).expect("the passes run");
        assert_eq!(kinds(&once), kinds(&per_size), "at {n}x{h}x{w}");
        let inputs = random_inputs(&once, 3);
        let a = interp::run(&once, &once.funcs[0], &inputs).expect("interprets");
        let b = interp::run(&per_size, &per_size.funcs[0], &inputs).expect("interprets");
        assert_eq!(a, b, "at {n}x{h}x{w}");
    }
}

#[test]
fn the_cli_specializes_a_symbolic_model_at_its_pinned_shapes() {
    let path = common::root().join("tests/cases/parse/symbolic_dims.tir");
    let path = path.to_str().unwrap();
    let out = common::smelt(&[
        "verify",
        path,
        "--shape",
        "x=2x3x13x10",
        "--shape",
        "gate=2x8x1x1",
        "--shape",
        "t=3x6x16",
        "--shape",
        "m=16x4",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        common::stdout(&out).contains("PASS"),
        "{}",
        common::stdout(&out)
    );
    // at the shapes of its input files
    let dir = tempfile::tempdir().unwrap();
    let s = specialize(&case(), &case_shapes(1, 9, 6, 4)).expect("specializes");
    let mut args = vec!["run".to_string(), path.to_string()];
    for (p, t) in s.funcs[0].params.iter().zip(random_inputs(&s, 5)) {
        let file = dir.path().join(format!("{}.npy", p.name));
        std::fs::write(&file, smelt::npy::encode(&t)).unwrap();
        args.extend(["--input".into(), format!("{}={}", p.name, file.display())]);
    }
    args.extend([
        "--output-dir".into(),
        dir.path().join("out").display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = common::smelt(&args);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        common::stdout(&out).contains("y tensor<1x8x3x2xf32>"),
        "{}",
        common::stdout(&out)
    );
    // a file missing for an input with symbolic sizes is named with both remedies
    let n = args.len();
    let only_x = [args[0], args[1], args[2], args[3], args[n - 2], args[n - 1]];
    let out = common::smelt(&only_x);
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert!(
        err.contains("--input gate=FILE.npy") && err.contains("--shape gate="),
        "{err}"
    );
    // without pins, the error names the symbols and says what to do
    let out = common::smelt(&["verify", path]);
    assert!(!out.status.success());
    let err = common::stderr(&out);
    assert!(
        err.contains("input 'x'")
            && err.contains("--input x=FILE.npy")
            && err.contains("--shape x="),
        "{err}"
    );
}

#[test]
fn printing_does_not_depend_on_the_interning_order() {
    // symbols and expressions interned in another order by an earlier parse
    let other = "func @g(%a: tensor<Wx(W + 7)xHxf32>) -> (b: tensor<Wx(W + 7)xHxf32>) {\n  %0 = relu %a : tensor<Wx(W + 7)xHxf32>\n  return %0 : tensor<Wx(W + 7)xHxf32>\n}\n";
    let _ = text::parse(other, "other.tir").expect("parses");
    let a = text::print(&case(), &PrintOptions::default());
    let b = text::print(&case(), &PrintOptions::default());
    assert_eq!(a, b);
    assert_eq!(symbolic::Name("W").to_string(), "W");
}

#[test]
fn numbers_in_the_range_of_symbolic_handles_are_too_large_never_symbols() {
    // intern some symbols first, so low handles exist in this process
    let _ = case();
    let huge = 1usize << 63;
    let e = smelt_ir::Tensor::new(vec![huge, 2], vec![]).unwrap_err();
    assert!(e.contains("too large"), "{e}");
    let t = smelt_ir::TensorType::f32(vec![huge]);
    assert!(t.check_known_size().is_err());
    let pins = shapes(&[("x", &[huge, 3, 8, 8]), ("gate", &[huge, 8, 1, 1])]);
    let e = symbolic::bind_symbols(&case().funcs[0], &pins).unwrap_err();
    assert!(e.contains("too large to be a size"), "{e}");
    let src = "func @f(%a: tensor<9223372036854775808xf32>) -> tensor<1xf32> {\n  return %a : tensor<1xf32>\n}\n";
    let d = text::parse(src, "huge.tir").unwrap_err();
    assert_eq!(d.0[0].code, "too-large");
}

#[test]
fn symbolic_size_attributes_specialize_and_a_resize_derives_its_scale() {
    let path = common::root().join("tests/cases/parse/symbolic_size_attributes.tir");
    let m = text::parse_file(&path).expect("parses");
    for (n, h, w) in [(2, 5, 7), (1, 3, 3)] {
        let pins = shapes(&[("x", &[n, 8, h, w]), ("up", &[n, 8, 2 * h, 2 * w])]);
        let s = specialize(&m, &pins).expect("specializes");
        let f = &s.funcs[0];
        assert_eq!(
            f.insts[0].op,
            smelt_ir::Op::Reshape {
                shape: vec![n, 8 * h * w]
            }
        );
        match &f.insts[3].op {
            smelt_ir::Op::Resize(r) => {
                assert_eq!(r.sizes, [n, 8, 2 * h, 2 * w]);
                let scales: Vec<f32> = r.scales.iter().map(|s| s.0).collect();
                assert_eq!(scales, [1.0, 1.0, 2.0, 2.0]);
            }
            other => panic!("expected the resize, got {other:?}"),
        }
        let inputs = random_inputs(&s, 11);
        check_against_interp(
            &format!("size attributes at {n}x{h}x{w}"),
            &s,
            &inputs,
            1e-5,
        );
    }
}

/// Hostile text: the symbolic case with bytes inside its types replaced by the
/// characters the dims grammar gives meaning to. Every mutant parses or fails with a
/// diagnostic (never a panic), and one that parses prints text that parses back to the
/// same print.
#[test]
fn mutated_symbolic_types_parse_or_fail_with_a_diagnostic() {
    let path = common::root().join("tests/cases/parse/symbolic_dims.tir");
    let src = std::fs::read_to_string(&path).unwrap();
    let spans: Vec<(usize, usize)> = src
        .match_indices("tensor<")
        .map(|(i, _)| (i + 7, i + 7 + src[i + 7..].find('>').unwrap()))
        .collect();
    let alphabet = b"()?*/-+x\"0123456789NHW_ ,";
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let (mut parsed, mut refused) = (0, 0);
    for _ in 0..3000 {
        let mut bytes = src.clone().into_bytes();
        for _ in 0..1 + next(3) {
            let (a, b) = spans[next(spans.len())];
            bytes[a + next(b - a)] = alphabet[next(alphabet.len())];
        }
        let text = String::from_utf8(bytes).unwrap();
        match text::parse(&text, "mutant.tir") {
            Ok(m) => {
                parsed += 1;
                let printed = text::print(&m, &PrintOptions::default());
                let again = text::parse(&printed, "printed.tir")
                    .unwrap_or_else(|d| panic!("{printed}\ndoes not parse back: {d}"));
                assert_eq!(text::print(&again, &PrintOptions::default()), printed);
            }
            Err(d) => {
                refused += 1;
                assert!(!d.0.is_empty());
            }
        }
    }
    // both outcomes happen: the mutations reach the grammar, not only its errors
    assert!(
        parsed > 0 && refused > 0,
        "parsed {parsed}, refused {refused}"
    );
}

/// The C API binds a `.tir` model's symbolic sizes from `SmeltOptions.input_shapes`, and
/// names the input and dimension of a pin that breaks them.
#[test]
fn the_c_api_specializes_symbolic_text_at_its_input_shapes() {
    use smelt::capi::{
        smelt_executable_destroy, smelt_executable_from_text, smelt_executable_input,
        smelt_last_error, smelt_options_default, SmeltStatus,
    };
    let src = std::fs::read_to_string(common::root().join("tests/cases/parse/symbolic_dims.tir"))
        .unwrap();
    let compile = |pins: &str| {
        let pins = std::ffi::CString::new(pins).unwrap();
        let mut opts = smelt_options_default();
        opts.input_shapes = pins.as_ptr();
        let mut exe = std::ptr::null_mut();
        // SAFETY: the text is readable for its length, `opts` and `pins` live across the
        // call, `exe` is writable.
        let status =
            unsafe { smelt_executable_from_text(src.as_ptr().cast(), src.len(), &opts, &mut exe) };
        (status, exe)
    };
    let (status, exe) = compile("x=2x3x11x9;gate=2x8x1x1;t=3x5x16;m=16x4");
    assert_eq!(status, SmeltStatus::Ok);
    let mut info = jit_util::blank_tensor_info();
    // SAFETY: `exe` is live and `info` writable.
    let status = unsafe { smelt_executable_input(exe, 0, &mut info) };
    assert_eq!(status, SmeltStatus::Ok);
    // SAFETY: the library's dims outlive the executable's use here.
    let dims = unsafe { std::slice::from_raw_parts(info.dims, info.rank) };
    assert_eq!(dims, [2, 3, 11, 9]);
    assert_eq!(smelt_executable_destroy(exe), SmeltStatus::Ok);
    let (status, exe) = compile("x=2x3x11x9;gate=3x8x1x1;t=3x5x16;m=16x4");
    assert_eq!(status, SmeltStatus::Ir);
    assert!(exe.is_null());
    // SAFETY: the last error is a NUL-terminated string of this thread.
    let e = unsafe { std::ffi::CStr::from_ptr(smelt_last_error()) }.to_string_lossy();
    assert!(e.contains("input %gate dimension 0 is 3"), "{e}");
}
