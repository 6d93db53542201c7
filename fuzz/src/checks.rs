//! The properties every fuzz target checks, shared with the corpus replay test.
//!
//! Each `check_*` function takes the raw fuzzer input and returns `Err(description)` when
//! a property is violated; a panic inside the code under test is a crash in its own
//! right. The fuzz targets turn `Err` into a panic (so libFuzzer saves the input), and
//! `tests/fuzz_corpus.rs` (which includes this file with `#[path]`) replays the
//! committed corpus through the same functions. Rejecting bad input with a diagnostic is
//! never a violation: only panics, accepted input that breaks an invariant, and wrong
//! numbers are.

use arbitrary::Unstructured;
use smelt::{CompileOptions, Error, Executable, OptimizeOptions};
use smelt_ir::text::{self, PrintOptions};
use smelt_ir::verify::verify_module;
use smelt_ir::weights::random_f32;
use smelt_ir::{interp, Diagnostics, ErrorStats, Module, Tensor};
use smelt_passes::fusion::load_rules;

use crate::graph_gen::{generate, Case, GenError, GenOptions};

/// Relative error (FACTS.md: max |got − ref| / max |ref|) allowed between the fused or
/// JIT-compiled result and the interpreter.
pub const TOLERANCE: f64 = 1e-4;

/// Set this environment variable to let the differential target put NaN, ±inf, -0.0 and
/// subnormals into about one input in eight.
pub const SPECIAL_INPUTS_VAR: &str = "SMELT_FUZZ_SPECIAL_INPUTS";

/// Modules larger than this (elements of any value, or instructions) are only parsed
/// and printed, not optimized, so one fuzz input stays fast.
const PIPELINE_MAX_ELEMENTS: usize = 1 << 14;
const PIPELINE_MAX_INSTS: usize = 64;

/// What a check did with an input that broke nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The input was rejected with diagnostics (fine: that is the contract).
    Rejected,
    /// The input was accepted and every property held.
    Passed,
    /// Accepted, but a later stage said the case is unsupported (named): not a failure.
    Unsupported(String),
}

/// Parser + verifier: accepted text verifies, and print → parse → print is the identity
/// (with and without locations). Rejections carry diagnostics that render against the
/// source. Small accepted modules also go through the default pass pipeline.
pub fn check_tir(data: &[u8]) -> Result<Verdict, String> {
    let module = match text::parse_bytes(data, "fuzz.tir", None) {
        Ok(m) => m,
        Err(diags) => {
            check_diagnostics(&diags, Some(&String::from_utf8_lossy(data)))?;
            return Ok(Verdict::Rejected);
        }
    };
    verify_module(&module).map_err(|d| format!("parsed module fails the verifier: {d}"))?;
    check_round_trip(&module, "parsed")?;
    check_pipeline(&module)?;
    Ok(Verdict::Passed)
}

/// ONNX importer: an imported module verifies and round-trips through the text form;
/// a small one also goes through the default pipeline.
pub fn check_onnx(data: &[u8]) -> Result<Verdict, String> {
    let module = match smelt::onnx::import(data, &smelt::onnx::ImportOptions::default()) {
        Ok(m) => m,
        Err(Error::Onnx(diags)) => {
            check_diagnostics(&diags, None)?;
            return Ok(Verdict::Rejected);
        }
        Err(e) => {
            return Err(format!(
                "ONNX import failed with an error that is not an ONNX diagnostic: {e}"
            ))
        }
    };
    verify_module(&module).map_err(|d| format!("imported module fails the verifier: {d}"))?;
    if has_zero_dim(&module) {
        // Known gap (reported): ONNX may yield zero-sized tensors, which the IR and the
        // JIT handle but the text form refuses (`tensor<0xf32>` is a bad-type error).
        return Ok(Verdict::Unsupported(
            "zero-sized tensor: no text form".into(),
        ));
    }
    check_round_trip(&module, "imported")?;
    check_pipeline(&module)?;
    Ok(Verdict::Passed)
}

/// A small fixed module with every pattern the built-in rules know, for user rules to
/// rewrite: conv → bn → add → relu, gemm + bias + relu, x * sigmoid(x), clip, pooling.
const RULE_TARGET: &str = r#"
const @w : tensor<3x2x3x3xf32> = random<seed = 1, min = -0.5, max = 0.5>
const @g : tensor<3xf32> = random<seed = 2, min = 0.5, max = 1.5>
const @b : tensor<3xf32> = random<seed = 3, min = -0.5, max = 0.5>
const @m : tensor<3xf32> = random<seed = 4, min = -0.5, max = 0.5>
const @v : tensor<3xf32> = random<seed = 5, min = 0.1, max = 2.0>
const @fc : tensor<4x5xf32> = random<seed = 6, min = -0.5, max = 0.5>
const @fb : tensor<5xf32> = random<seed = 7, min = -0.5, max = 0.5>
const @pc : tensor<3x1x1xf32> = dense<[0.5, -0.5, 1.0]>

func @main(%x: tensor<1x2x5x5xf32>, %skip: tensor<1x3x5x5xf32>, %a: tensor<2x4xf32>) -> (y: tensor<1x3x5x5xf32>, z: tensor<2x5xf32>, p: tensor<1x3x2x2xf32>) {
  %w = const @w : tensor<3x2x3x3xf32>
  %g = const @g : tensor<3xf32>
  %b = const @b : tensor<3xf32>
  %m = const @m : tensor<3xf32>
  %v = const @v : tensor<3xf32>
  %c = conv2d %x, %w {pads = [1, 1, 1, 1]} : tensor<1x3x5x5xf32>
  %n = batch_norm %c, %g, %b, %m, %v : tensor<1x3x5x5xf32>
  %s = add %n, %skip : tensor<1x3x5x5xf32>
  %y = relu %s : tensor<1x3x5x5xf32>
  %fc = const @fc : tensor<4x5xf32>
  %fb = const @fb : tensor<5xf32>
  %h = gemm %a, %fc : tensor<2x5xf32>
  %hb = add %h, %fb : tensor<2x5xf32>
  %sg = sigmoid %hb : tensor<2x5xf32>
  %sl = mul %hb, %sg : tensor<2x5xf32>
  %z = clip %sl {min = 0.0, max = 6.0} : tensor<2x5xf32>
  %pp = max_pool2d %y {kernel = [2, 2], strides = [2, 2]} : tensor<1x3x2x2xf32>
  %pc = const @pc : tensor<3x1x1xf32>
  %p = sub %pp, %pc : tensor<1x3x2x2xf32>
  return %y, %z, %p : tensor<1x3x5x5xf32>, tensor<2x5xf32>, tensor<1x3x2x2xf32>
}
"#;

/// Rule-file loader: loading never panics; loaded rules (renamed so they cannot clash
/// with the built-in ones) run in the fusion pass on a fixed module without panicking,
/// and whatever the pipeline returns verifies and has no cycle. User rules may state
/// false laws, so values are not compared here.
pub fn check_rules(data: &[u8]) -> Result<Verdict, String> {
    let Ok(src) = std::str::from_utf8(data) else {
        return Ok(Verdict::Rejected);
    };
    let rules = match load_rules(src, "fuzz.rules") {
        Ok(r) => r,
        Err(diags) => {
            check_diagnostics(&diags, Some(src))?;
            return Ok(Verdict::Rejected);
        }
    };
    let target =
        text::parse(RULE_TARGET, "rule_target.tir").map_err(|d| format!("RULE_TARGET: {d}"))?;
    let mut opts = OptimizeOptions::default();
    // Fuzzed rules are mostly wrong; the point is that the pass survives them.
    opts.fusion.allow_unchecked_rules = true;
    opts.fusion.extra_rules = rules
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.name = format!("fuzz-{i}-{}", r.name);
            r
        })
        .collect();
    let mut module = target.clone();
    match smelt::optimize(&mut module, &opts, None) {
        Ok(_) => {
            check_verified_acyclic(&module, "optimized with user rules")?;
            Ok(Verdict::Passed)
        }
        Err(e) => Ok(Verdict::Unsupported(format!(
            "pipeline refused the rules: {e}"
        ))),
    }
}

/// Differential: a random valid graph (see [`crate::graph_gen`]) round-trips through the
/// text form; the default pipeline (fusion, const_fold, dce) keeps it verified, acyclic
/// and equal to the interpreter's result within [`TOLERANCE`]; and the JIT-compiled
/// unoptimized and optimized modules agree with the interpreter within [`TOLERANCE`].
pub fn check_differential(data: &[u8]) -> Result<Verdict, String> {
    let mut u = Unstructured::new(data);
    // NaN/inf inputs only on request: the JIT does not propagate NaN yet (see
    // fuzz/README.md), and every such case would hide the other findings.
    let special_inputs =
        u.arbitrary::<u8>().unwrap_or(0) < 32 && std::env::var_os(SPECIAL_INPUTS_VAR).is_some();
    let opts = GenOptions {
        special_inputs,
        ..GenOptions::default()
    };
    let case = generate(&mut u, &opts).map_err(|GenError::Rejected(m)| {
        format!("the builder rejected a generated instruction: {m}")
    })?;
    check_case(&case, true)
}

/// The differential properties on one generated case; `jit` also compiles and runs it.
pub fn check_case(case: &Case, jit: bool) -> Result<Verdict, String> {
    let module = &case.module;
    let shown = || text::print(module, &PrintOptions::default());
    verify_module(module).map_err(|d| format!("generated module fails the verifier: {d}"))?;
    check_round_trip(module, "generated")?;
    let func = &module.funcs[0];
    let want = interp::run(module, func, &case.inputs)
        .map_err(|d| format!("interpreter failed on a verified module: {d}\n{}", shown()))?;
    let mut optimized = module.clone();
    smelt::optimize(&mut optimized, &OptimizeOptions::default(), None)
        .map_err(|e| format!("the default pipeline failed: {e}\n{}", shown()))?;
    check_verified_acyclic(&optimized, "optimized")?;
    let shown_opt = || text::print(&optimized, &PrintOptions::default());
    let got = interp::run(&optimized, &optimized.funcs[0], &case.inputs).map_err(|d| {
        format!(
            "interpreter failed on the optimized module: {d}\n{}\n{}",
            shown(),
            shown_opt()
        )
    })?;
    compare("optimized (interpreter)", &got, &want)
        .map_err(|m| format!("{m}\nbefore:\n{}\nafter:\n{}", shown(), shown_opt()))?;
    if !jit {
        return Ok(Verdict::Passed);
    }
    let mut verdict = Verdict::Passed;
    for (what, m) in [("unoptimized", module), ("optimized", &optimized)] {
        let compile_opts = CompileOptions {
            verify: true,
            threads: 1,
            ..CompileOptions::default()
        };
        let exe = match Executable::compile(m, None, &compile_opts) {
            Ok(exe) => exe,
            Err(e) => match unsupported(&e) {
                Some(reason) => {
                    verdict = Verdict::Unsupported(format!("{what}: {reason}"));
                    continue;
                }
                None => {
                    return Err(format!(
                        "JIT compile of the {what} module failed: {e}\n{}",
                        text::print(m, &PrintOptions::default())
                    ))
                }
            },
        };
        let got = exe.run(&case.inputs).map_err(|e| {
            format!(
                "JIT run of the {what} module failed: {e}\n{}",
                text::print(m, &PrintOptions::default())
            )
        })?;
        compare(&format!("JIT ({what})"), &got, &want).map_err(|msg| {
            format!(
                "{msg}\ninputs: {}\n{}",
                describe_inputs(&case.inputs),
                text::print(m, &PrintOptions::default())
            )
        })?;
    }
    Ok(verdict)
}

/// The reason, when a compile error only says the case is not supported yet.
fn unsupported(e: &Error) -> Option<String> {
    match e {
        Error::Unsupported(m) => Some(m.clone()),
        Error::Ir(d) if d.0.iter().all(|d| d.code == "unsupported") => Some(d.to_string()),
        _ => None,
    }
}

/// Compares result lists element by element with [`ErrorStats`].
pub fn compare(what: &str, got: &[Tensor], want: &[Tensor]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} results, the interpreter gives {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let stats =
            ErrorStats::between_tensors(g, w).map_err(|m| format!("{what}: result {i}: {m}"))?;
        // NaN relative error (cannot happen today) must fail too.
        if stats.relative.is_nan() || stats.relative > TOLERANCE {
            let worst = worst_element(&g.f32s_row_major(), &w.f32s_row_major());
            return Err(format!(
                "{what}: result {i} ({}) differs from the interpreter: relative error {:e} > {TOLERANCE:e} \
                 (max abs {:e}, rmse {:e}); worst element {worst}",
                w.ty, stats.relative, stats.max_abs, stats.rmse
            ));
        }
    }
    Ok(())
}

fn worst_element(got: &[f32], want: &[f32]) -> String {
    let mut worst = (0, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = if g.is_nan() && w.is_nan() || g == w {
            0.0
        } else if g.is_nan() || w.is_nan() {
            f64::INFINITY
        } else {
            (g as f64 - w as f64).abs()
        };
        if d > worst.1 || worst.1.is_nan() {
            worst = (i, d);
        }
    }
    let i = worst.0;
    format!(
        "#{i}: got {:?}, interpreter {:?}",
        got.get(i).copied().unwrap_or(f32::NAN),
        want.get(i).copied().unwrap_or(f32::NAN)
    )
}

fn describe_inputs(inputs: &[Tensor]) -> String {
    inputs
        .iter()
        .map(|t| {
            let shown: Vec<String> = t.f32s().iter().take(16).map(|v| format!("{v:?}")).collect();
            format!(
                "{} [{}{}]",
                t.ty,
                shown.join(", "),
                if t.data.len() > 16 { ", …" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Diagnostics are non-empty, have codes and messages, and render against the source.
fn check_diagnostics(diags: &Diagnostics, src: Option<&str>) -> Result<(), String> {
    if diags.0.is_empty() {
        return Err("rejected without any diagnostic".into());
    }
    for d in &diags.0 {
        if d.code.is_empty() || d.message.trim().is_empty() {
            return Err(format!("a diagnostic without code or message: {d:?}"));
        }
    }
    let rendered = diags.render(src);
    if rendered.trim().is_empty() {
        return Err("diagnostics render to nothing".into());
    }
    Ok(())
}

/// print → parse → print gives the same text, with and without locations.
fn check_round_trip(module: &Module, what: &str) -> Result<(), String> {
    for print_loc in [false, true] {
        let opts = PrintOptions {
            print_loc,
            elide_weights: false,
        };
        let printed = text::print(module, &opts);
        let reparsed = text::parse(&printed, "printed.tir").map_err(|d| {
            format!(
                "the {what} module prints text that does not parse (print_loc = {print_loc}):\n{}\n{printed}",
                d.render(Some(&printed))
            )
        })?;
        let again = text::print(&reparsed, &opts);
        if again != printed {
            return Err(format!(
                "print -> parse -> print of the {what} module is not the identity (print_loc = {print_loc}):\n--- first\n{printed}\n--- second\n{again}"
            ));
        }
    }
    Ok(())
}

/// The module verifies and every operand is defined before its use (no cycle).
pub fn check_verified_acyclic(module: &Module, what: &str) -> Result<(), String> {
    verify_module(module).map_err(|d| {
        format!(
            "the {what} module fails the verifier: {d}\n{}",
            text::print(module, &PrintOptions::default())
        )
    })?;
    for f in &module.funcs {
        for (i, inst) in f.insts.iter().enumerate() {
            let own = f.params.len() + i;
            if let Some(v) = inst.operands.iter().find(|v| v.index() >= own) {
                return Err(format!(
                    "the {what} function @{} uses %{} in instruction {i} (value %{own}) before defining it",
                    f.name,
                    v.index()
                ));
            }
        }
    }
    Ok(())
}

/// Whether any parameter, instruction or weight type has a zero dimension.
fn has_zero_dim(module: &Module) -> bool {
    module.funcs.iter().any(|f| {
        f.params
            .iter()
            .map(|p| &p.ty)
            .chain(f.insts.iter().map(|i| &i.ty))
            .any(|t| t.dims.contains(&0))
    }) || module.weights.iter().any(|(_, w)| w.ty.dims.contains(&0))
}

fn is_small(module: &Module) -> bool {
    module.funcs.iter().all(|f| {
        f.insts.len() <= PIPELINE_MAX_INSTS
            && f.params
                .iter()
                .map(|p| &p.ty)
                .chain(f.insts.iter().map(|i| &i.ty))
                .all(|t| {
                    t.checked_num_elements()
                        .is_some_and(|n| n <= PIPELINE_MAX_ELEMENTS)
                })
    }) && module
        .weights
        .iter()
        .all(|(_, w)| w.ty.num_elements() <= PIPELINE_MAX_ELEMENTS)
}

/// For small modules: the default pipeline succeeds, keeps the module verified and
/// acyclic, and the interpreter runs the entry function before and after with results
/// of the same types. (Values are compared only in the differential target, whose
/// inputs are numerically tame; arbitrary text may fold weights by huge factors.)
fn check_pipeline(module: &Module) -> Result<(), String> {
    if !is_small(module) {
        return Ok(());
    }
    let mut optimized = module.clone();
    if let Err(e) = smelt::optimize(&mut optimized, &OptimizeOptions::default(), None) {
        return Err(format!(
            "the default pipeline failed on a verified module: {e}\n{}",
            text::print(module, &PrintOptions::default())
        ));
    }
    check_verified_acyclic(&optimized, "optimized")?;
    let Some(func) = module.entry() else {
        return Ok(());
    };
    let Some(after) = optimized.func(&func.name) else {
        return Err(format!("the pipeline lost function @{}", func.name));
    };
    let inputs: Vec<Tensor> = func
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| Tensor {
            ty: p.ty.clone(),
            data: random_f32(i as u64 + 1, p.ty.storage_len(), -1.0, 1.0).into(),
        })
        .collect();
    let want = interp::run(module, func, &inputs).map_err(|d| {
        format!(
            "interpreter failed on a verified module: {d}\n{}",
            text::print(module, &PrintOptions::default())
        )
    })?;
    let got = interp::run(&optimized, after, &inputs).map_err(|d| {
        format!(
            "interpreter failed on the optimized module: {d}\n{}",
            text::print(&optimized, &PrintOptions::default())
        )
    })?;
    let types = |ts: &[Tensor]| ts.iter().map(|t| t.ty.dims.clone()).collect::<Vec<_>>();
    if types(&got) != types(&want) {
        return Err(format!(
            "the pipeline changed result shapes: {:?} -> {:?}",
            types(&want),
            types(&got)
        ));
    }
    Ok(())
}
