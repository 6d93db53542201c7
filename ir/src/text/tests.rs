//! Unit tests of the text form: round trips, print options, sidecars, error positions.

use super::*;
use crate::builder::FuncBuilder;
use crate::op::{Op, UnaryOp};
use crate::types::TensorType;
use crate::weights::AlignedBuf;

const TAIL: &str = r#"
const @w : tensor<4x2x1x1xf32> = random<seed = 3, min = -1.0, max = 1.0>
const @s : tensor<4xf32> = dense<[1.0, 2.0, 3.0, 4.0]>
func @tail(%x: tensor<1x2x3x3xf32>) -> tensor<1x4x3x3xf32> {
  %w = const @w : tensor<4x2x1x1xf32>
  %c = conv2d %x, %w : tensor<1x4x3x3xf32>
  %r = relu %c : tensor<1x4x3x3xf32>
  return %r : tensor<1x4x3x3xf32>
}
"#;

fn parse_ok(src: &str) -> Module {
    match parse(src, "t.tir") {
        Ok(m) => m,
        Err(e) => panic!("{}", e.render(Some(src))),
    }
}

fn parse_err(src: &str) -> Diagnostic {
    match parse(src, "t.tir") {
        Ok(_) => panic!("expected an error for:\n{src}"),
        Err(e) => e.0[0].clone(),
    }
}

#[test]
fn round_trip_renumbers_values_and_keeps_params() {
    let m = parse_ok(TAIL);
    let text = print(&m, &PrintOptions::default());
    assert!(text.contains("%0 = const @w"), "{text}");
    assert!(text.contains("%1 = conv2d %x, %0 :"), "{text}");
    assert!(text.contains("return %2 : tensor<1x4x3x3xf32>"), "{text}");
    let again = print(&parse_ok(&text), &PrintOptions::default());
    assert_eq!(text, again);
}

#[test]
fn locations_point_at_result_names_and_print_when_asked() {
    let m = parse_ok(TAIL);
    let f = &m.funcs[0];
    assert_eq!(f.insts[1].loc, Location::file("t.tir", 6, 3));
    let opts = PrintOptions {
        print_loc: true,
        ..Default::default()
    };
    let text = print(&m, &opts);
    assert!(
        text.contains("%1 = conv2d %x, %0 : tensor<1x4x3x3xf32> loc(\"t.tir\":6:3)"),
        "{text}"
    );
    // the printed loc overrides the position when parsed again (the text moved)
    let m2 = parse(&text, "other.tir").unwrap();
    assert_eq!(m2.funcs[0].insts[1].loc, Location::file("t.tir", 6, 3));
    assert_eq!(print(&m2, &opts), text);
}

#[test]
fn named_and_fused_locations_parse() {
    let src = r#"func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %a = relu %x : tensor<2xf32> loc("Relu_1")
  %b = tanh %a : tensor<2xf32> loc(fused["Relu_1", "m.tir":4:7, unknown])
  %c = sigmoid %b : tensor<2xf32> loc(unknown)
  return %c : tensor<2xf32>
}"#;
    let m = parse_ok(src);
    let insts = &m.funcs[0].insts;
    assert_eq!(insts[0].loc, Location::Name("Relu_1".into()));
    assert_eq!(
        insts[1].loc,
        Location::Fused(
            vec![
                Location::Name("Relu_1".into()),
                Location::file("m.tir", 4, 7),
                Location::Unknown
            ]
            .into()
        )
    );
    assert_eq!(insts[2].loc, Location::Unknown);
    let opts = PrintOptions {
        print_loc: true,
        ..Default::default()
    };
    let text = print(&m, &opts);
    assert!(text.contains("loc(unknown)"), "{text}");
    assert_eq!(print(&parse_ok(&text), &opts), text);
}

#[test]
fn elided_weights_print_a_hash_and_refuse_to_load() {
    let m = parse_ok(TAIL);
    let opts = PrintOptions {
        elide_weights: true,
        ..Default::default()
    };
    let text = print(&m, &opts);
    let w = m.weights.get(m.weights.lookup("w").unwrap()).unwrap();
    // 8 elements: small weights stay visible even when eliding
    assert!(text.contains("random<seed = 3"), "{text}");
    assert_eq!(w.ty.num_elements(), 8);

    let mut big = Module::default();
    let mut b = FuncBuilder::new(&mut big, "f");
    let values: Vec<f32> = (0..20).map(|i| i as f32).collect();
    let c = b.constant("big", TensorType::f32([20]), &values).unwrap();
    b.finish(&[("y", c)]);
    let text = print(&big, &opts);
    let hash = big
        .weights
        .get(crate::weights::WeightId(0))
        .unwrap()
        .content_hash();
    let want = format!("const @big : tensor<20xf32> = elided<\"{hash:016x}\">");
    assert!(text.contains(&want), "{text}");
    let e = parse(&text, "e.tir").unwrap_err();
    assert_eq!(e.0[0].code, "elided-weight");
    // without eliding, a computed weight prints dense and round-trips
    let plain = print(&big, &PrintOptions::default());
    assert!(plain.contains("dense<[0.0, 1.0, 2.0"), "{plain}");
    assert_eq!(print(&parse_ok(&plain), &PrintOptions::default()), plain);
}

#[test]
fn splat_and_nested_dense_weights() {
    let src = r#"
const @a : tensor<2x2xf32> = dense<[[1.0, -2], [3.5e1, -0.0]]>
const @b : tensor<3xf32> = dense<7.0>
const @c : tensor<f32> = dense<-inf>
func @f(%x: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = const @a : tensor<2x2xf32>
  %1 = add %x, %0 : tensor<2x2xf32>
  return %1 : tensor<2x2xf32>
}"#;
    let m = parse_ok(src);
    let a = m.weights.get(m.weights.lookup("a").unwrap()).unwrap();
    assert_eq!(a.f32s(), &[1.0, -2.0, 35.0, -0.0]);
    assert!(a.f32s()[3].is_sign_negative());
    let b = m.weights.get(m.weights.lookup("b").unwrap()).unwrap();
    assert_eq!(b.f32s(), &[7.0, 7.0, 7.0]);
    let text = print(&m, &PrintOptions::default());
    assert!(text.contains("dense<[1.0, -2.0, 35.0, -0.0]>"), "{text}");
    assert!(text.contains("@b : tensor<3xf32> = dense<7.0>"), "{text}");
    assert!(text.contains("@c : tensor<f32> = dense<-inf>"), "{text}");
}

#[test]
fn blocked_weights_are_written_by_logical_values() {
    let src = r#"
const @w : tensor<1x3x1x1xf32, nchw4c> = dense<[1.0, 2.0, 3.0]>
func @f(%x: tensor<1x3x1x1xf32, nchw4c>) -> tensor<1x3x1x1xf32, nchw4c> {
  %0 = const @w : tensor<1x3x1x1xf32, nchw4c>
  return %0 : tensor<1x3x1x1xf32, nchw4c>
}"#;
    let m = parse_ok(src);
    let w = m.weights.get(crate::weights::WeightId(0)).unwrap();
    assert_eq!(w.f32s(), &[1.0, 2.0, 3.0, 0.0]);
    let text = print(&m, &PrintOptions::default());
    assert!(text.contains("dense<[1.0, 2.0, 3.0]>"), "{text}");
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("smelt-text-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn write_module_puts_big_computed_weights_in_a_sidecar() {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", TensorType::f32([2, 16]));
    let values: Vec<f32> = (0..32).map(|i| i as f32 * 0.5).collect();
    let c = b
        .constant("folded", TensorType::f32([2, 16]), &values)
        .unwrap();
    let small = b
        .constant("tiny", TensorType::f32([2]), &[1.0, 2.0])
        .unwrap();
    let y = b.op(Op::Binary(crate::op::BinaryOp::Add), &[x, c]).unwrap();
    let y = b.op(Op::Binary(crate::op::BinaryOp::Mul), &[y, small]);
    assert!(y.is_err(), "[2,16] * [2] does not broadcast");
    let z = b.op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    b.finish(&[("y", z)]);

    let dir = temp_dir("sidecar");
    let path = dir.join("model.tir");
    write_module(&m, &path, &PrintOptions::default()).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(
            "const @folded : tensor<2x16xf32> = external<\"model.safetensors\", \"folded\">"
        ),
        "{text}"
    );
    assert!(
        text.contains("const @tiny : tensor<2xf32> = dense<[1.0, 2.0]>"),
        "{text}"
    );
    let back = parse_file(&path).unwrap();
    let w = back
        .weights
        .get(back.weights.lookup("folded").unwrap())
        .unwrap();
    assert_eq!(w.f32s(), &values[..]);
    // writing the re-read module again keeps the external tensor in the sidecar
    write_module(&back, &path, &PrintOptions::default()).unwrap();
    let again = parse_file(&path).unwrap();
    assert_eq!(print(&again, &PrintOptions::default()), text);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn external_weights_report_clear_errors() {
    let dir = temp_dir("external");
    let data: Vec<u8> = [1.0f32, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let view = TensorView::new(Dtype::F32, vec![3], &data).unwrap();
    let bytes = safetensors::serialize(vec![("v", view)], None).unwrap();
    std::fs::write(dir.join("w.safetensors"), bytes).unwrap();
    let case = |decl: &str| {
        let src = format!(
            "{decl}\nfunc @f(%x: tensor<3xf32>) -> tensor<3xf32> {{\n  return %x : tensor<3xf32>\n}}\n"
        );
        parse_with(&src, "t.tir", Some(&dir))
    };
    let ok = case(r#"const @v : tensor<3xf32> = external<"w.safetensors", "v">"#).unwrap();
    assert_eq!(
        ok.weights.get(crate::weights::WeightId(0)).unwrap().f32s(),
        &[1.0, 2.0, 3.0]
    );
    for (decl, needle) in [
        (
            r#"const @v : tensor<4xf32> = external<"w.safetensors", "v">"#,
            "has shape [3]",
        ),
        (
            r#"const @v : tensor<3xf32> = external<"w.safetensors", "nope">"#,
            "has no tensor \"nope\" (it has \"v\")",
        ),
        (
            r#"const @v : tensor<3xf32> = external<"missing.safetensors", "v">"#,
            "cannot read sidecar",
        ),
    ] {
        let e = case(decl).unwrap_err();
        assert_eq!(e.0[0].code, "bad-weight");
        assert!(e.0[0].message.contains(needle), "{}", e.0[0].message);
    }
    std::fs::write(dir.join("junk.safetensors"), b"not a safetensors file").unwrap();
    let e = case(r#"const @v : tensor<3xf32> = external<"junk.safetensors", "v">"#).unwrap_err();
    assert!(
        e.0[0].message.contains("not a valid safetensors file"),
        "{}",
        e.0[0].message
    );
    // no directory: a clear error, not a read relative to the working directory
    let e = parse(
        "const @v : tensor<3xf32> = external<\"w.safetensors\", \"v\">",
        "t.tir",
    )
    .unwrap_err();
    assert!(e.0[0].message.contains("directory"), "{}", e.0[0].message);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn error_positions_and_caret() {
    let src = "func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = relux %x : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}\n";
    let d = parse_err(src);
    assert_eq!(d.code, "unknown-op");
    assert_eq!(d.location, Location::file("t.tir", 2, 8));
    assert_eq!(d.notes, vec!["did you mean 'relu'?".to_string()]);
    let r = d.render(Some(src));
    assert!(r.contains("2 |   %0 = relux %x"), "{r}");
    assert!(r.contains("  |        ^"), "{r}");
}

#[test]
fn several_semantic_errors_are_reported_together() {
    let src = "func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
  %a = relu %y : tensor<2xf32>
  %b = relu %a : tensor<2xf32>
  %c = tanh %x : tensor<3xf32>
  %c = tanh %x : tensor<2xf32>
  return %x : tensor<2xf32>
}";
    let e = parse(src, "t.tir").unwrap_err();
    let codes: Vec<&str> = e.0.iter().map(|d| d.code).collect();
    // %b uses the poisoned %a: no second error for it
    assert_eq!(
        codes,
        vec!["undefined-value", "type-mismatch", "redefined-value"]
    );
}

#[test]
fn non_utf8_bytes_are_located() {
    let mut bytes = b"func @f(%x: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = relu %x \xff".to_vec();
    bytes.extend_from_slice(b" : tensor<2xf32>\n}");
    let e = parse_bytes(&bytes, "b.tir", None).unwrap_err();
    assert_eq!(e.0[0].code, "bad-encoding");
    assert_eq!(e.0[0].location, Location::file("b.tir", 2, 16));
}

#[test]
fn deep_nesting_and_huge_numbers_are_errors() {
    let deep = format!(
        "const @a : tensor<1xf32> = dense<{}1.0{}>",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert_eq!(parse_err(&deep).code, "too-deep");
    let huge = "func @f(%x: tensor<1x1x4x4xf32>) -> tensor<1x1x4x4xf32> {\n  %0 = max_pool2d %x {kernel = [99999999999999999999999, 1]} : tensor<1x1x4x4xf32>\n  return %0 : tensor<1x1x4x4xf32>\n}";
    let d = parse_err(huge);
    assert_eq!(d.code, "bad-attribute");
    assert!(d.message.contains("too large"), "{}", d.message);
    let dim = "func @f(%x: tensor<99999999999999999999999xf32>) -> tensor<f32> {\n  return %x : tensor<f32>\n}";
    assert_eq!(parse_err(dim).code, "too-large");
}

#[test]
fn truncated_input_never_panics() {
    let full = "const @w : tensor<2xf32> = dense<[1.0, 2.0]>\nfunc @f(%x: tensor<2xf32>, %y: tensor<f32>) -> (out: tensor<f32>) {\n  %0 = const @w : tensor<2xf32>\n  %1 = fused matmul %x, %0 post [add(_, %y), clip {min = 0.0, max = 6.0}] : tensor<f32> loc(fused[\"a\", \"b\":1:2])\n  return %1 : tensor<f32>\n}\n";
    // the full text is fine (matmul of two vectors is a scalar)
    parse_ok(full);
    for end in 0..full.len() {
        if !full.is_char_boundary(end) {
            continue;
        }
        let cut = &full[..end];
        if let Err(e) = parse(cut, "t.tir") {
            let _ = e.render(Some(cut));
        }
    }
}

#[test]
fn weights_are_interned_and_printed_once() {
    let mut m = Module::default();
    let id = m
        .weights
        .add(
            "k",
            TensorType::f32([2]),
            AlignedBuf::from_f32(&[1.0, 2.0]),
            crate::weights::WeightOrigin::Inline,
        )
        .unwrap();
    let mut b = FuncBuilder::new(&mut m, "f");
    let c = b.op(Op::Const(id), &[]).unwrap();
    b.finish(&[("result0", c)]);
    let text = print(&m, &PrintOptions::default());
    assert_eq!(
        text,
        "const @k : tensor<2xf32> = dense<[1.0, 2.0]>\n\nfunc @f() -> tensor<2xf32> {\n  %0 = const @k : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}\n"
    );
}

#[test]
fn numbered_params_do_not_collide_with_renumbered_values() {
    let src = "func @f(%0: tensor<2xf32>, %2: tensor<2xf32>) -> tensor<2xf32> {
  %a = relu %0 : tensor<2xf32>
  %b = add %a, %2 : tensor<2xf32>
  %c = relu %b : tensor<2xf32>
  return %c : tensor<2xf32>
}";
    let text = print(&parse_ok(src), &PrintOptions::default());
    assert!(text.contains("%1 = relu %0"), "{text}");
    assert!(text.contains("%3 = add %1, %2"), "{text}");
    assert!(text.contains("%4 = relu %3"), "{text}");
    assert_eq!(print(&parse_ok(&text), &PrintOptions::default()), text);
}

#[test]
fn corrupted_input_never_panics() {
    let src = r#"const @w : tensor<2x1x1x1xf32, oihw2o> = dense<[[1.0], [2.0]]>
const @r : tensor<2xf32> = random<seed = 1, min = -1.0, max = 1.0>
func @f(%x: tensor<1x1x3x3xf32>, %"s k": tensor<1x2x3x3xf32>) -> (y: tensor<1x2x3x3xf32>) {
  %0 = const @w : tensor<2x1x1x1xf32, oihw2o>
  %1 = reorder %0 {layout = row_major} : tensor<2x1x1x1xf32>
  %2 = fused conv2d %x, %1 {pads = [0, 0, 0, 0]} post [add(_, %"s k"), clip {min = -inf, max = 6.0}] : tensor<1x2x3x3xf32> loc(fused["a", "b":1:2])
  return %2 : tensor<1x2x3x3xf32>
}
"#;
    parse_ok(src);
    let replacements = [
        "",
        "[",
        "]",
        "<",
        ">",
        "{",
        "}",
        "(",
        ")",
        "%",
        "@",
        "\"",
        "-",
        "9",
        "99999999999",
        "x",
        "0",
        ",",
        ":",
        "_",
        "\\",
        "é",
        "loc(",
        "fused[",
    ];
    let chars: Vec<(usize, char)> = src.char_indices().collect();
    for (i, &(at, c)) in chars.iter().enumerate() {
        // every position with a few replacements, all replacements at every 7th position
        let picks: Vec<&str> = if i % 7 == 0 {
            replacements.to_vec()
        } else {
            vec![replacements[i % replacements.len()]]
        };
        for r in picks {
            let mutated = format!("{}{}{}", &src[..at], r, &src[at + c.len_utf8()..]);
            if let Err(e) = parse(&mutated, "m.tir") {
                assert!(!e.0.is_empty());
                let _ = e.render(Some(&mutated));
            }
        }
    }
}

#[test]
fn columns_count_characters_across_checkpoints() {
    // non-ASCII text spanning several checkpoint strides, on two lines: every column
    // must equal the naive count from its line start
    let src = format!("é{}\n{}ü end", "ab€".repeat(300), "x".repeat(700));
    let map = lexer::SourceMap::new(&src, "t.tir");
    let second = src.find('\n').unwrap() + 1;
    for (offset, _) in src.char_indices().chain([(src.len(), ' ')]) {
        let start = if offset >= second { second } else { 0 };
        let want = src[start..offset].chars().count() as u32 + 1;
        let line = if offset >= second { 2 } else { 1 };
        assert_eq!(map.line_col(offset), (line, want), "offset {offset}");
    }
}
