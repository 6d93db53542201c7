//! Property tests on random graphs built with `FuncBuilder` (the differential fuzzer's
//! generator, fed by proptest's bytes): the text form round-trips, the default pipeline
//! (fusion, const_fold, dce) preserves the interpreter's results within 1e-4 relative
//! error, and extraction never returns a graph with a cycle.

#[allow(dead_code)]
#[path = "../fuzz/src/checks.rs"]
mod checks;
#[allow(dead_code)]
#[path = "../fuzz/src/graph_gen.rs"]
mod graph_gen;

use arbitrary::Unstructured;
use graph_gen::{generate, Case, GenError, GenOptions};
use proptest::prelude::*;
use smelt::OptimizeOptions;
use smelt_ir::text::{self, PrintOptions};
use smelt_ir::Module;

fn case_from(bytes: &[u8], opts: &GenOptions) -> Case {
    generate(&mut Unstructured::new(bytes), opts).unwrap_or_else(|GenError::Rejected(m)| {
        panic!("the builder rejected a generated instruction: {m}")
    })
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Failures print the module; no regression files are written into tests/.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Instruction by instruction equality of the entry functions (ops, operands, types,
/// parameters, results) — locations aside, which the parser fills in.
fn same_structure(a: &Module, b: &Module) -> Result<(), String> {
    let (fa, fb) = (&a.funcs[0], &b.funcs[0]);
    if fa.params != fb.params {
        return Err(format!("params differ: {:?} vs {:?}", fa.params, fb.params));
    }
    if fa.results != fb.results {
        return Err(format!(
            "results differ: {:?} vs {:?}",
            fa.results, fb.results
        ));
    }
    if fa.insts.len() != fb.insts.len() {
        return Err(format!(
            "{} vs {} instructions",
            fa.insts.len(),
            fb.insts.len()
        ));
    }
    for (i, (x, y)) in fa.insts.iter().zip(&fb.insts).enumerate() {
        if x.op != y.op || x.operands != y.operands || x.ty != y.ty {
            return Err(format!("instruction {i} differs: {x:?} vs {y:?}"));
        }
    }
    if a.weights.len() != b.weights.len() {
        return Err(format!(
            "{} vs {} weights",
            a.weights.len(),
            b.weights.len()
        ));
    }
    for ((ia, wa), (ib, wb)) in a.weights.iter().zip(b.weights.iter()) {
        if ia != ib || wa.ty != wb.ty || wa.data.as_bytes() != wb.data.as_bytes() {
            return Err(format!("weight {} differs from {}", wa.name, wb.name));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn print_parse_round_trip_on_random_modules(bytes in proptest::collection::vec(any::<u8>(), 8..400)) {
        let case = case_from(&bytes, &GenOptions::default());
        let printed = text::print(&case.module, &PrintOptions::default());
        let parsed = text::parse(&printed, "random.tir")
            .unwrap_or_else(|d| panic!("printed module does not parse: {}\n{printed}", d.render(Some(&printed))));
        prop_assert_eq!(&text::print(&parsed, &PrintOptions::default()), &printed);
        if let Err(m) = same_structure(&case.module, &parsed) {
            panic!("parse(print(m)) differs from m: {m}\n{printed}");
        }
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn fusion_preserves_semantics_on_random_graphs(bytes in proptest::collection::vec(any::<u8>(), 8..400)) {
        let case = case_from(&bytes, &GenOptions::default());
        if let Err(m) = checks::check_case(&case, false) {
            panic!("{m}");
        }
    }

    #[test]
    fn extraction_never_returns_a_cycle(bytes in proptest::collection::vec(any::<u8>(), 8..600)) {
        let opts = GenOptions { max_steps: 16, ..GenOptions::default() };
        let case = case_from(&bytes, &opts);
        let mut optimized = case.module.clone();
        smelt::optimize(&mut optimized, &OptimizeOptions::default(), None)
            .unwrap_or_else(|e| panic!("pipeline failed: {e}\n{}", text::print(&case.module, &PrintOptions::default())));
        if let Err(m) = checks::check_verified_acyclic(&optimized, "optimized") {
            panic!("{m}");
        }
    }
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn jit_agrees_with_the_interpreter_on_random_graphs(bytes in proptest::collection::vec(any::<u8>(), 8..400)) {
        let case = case_from(&bytes, &GenOptions::default());
        if let Err(m) = checks::check_case(&case, true) {
            panic!("{m}");
        }
    }
}

/// Deterministic pseudo-random byte strings for the coverage test below.
fn byte_strings(count: usize, len: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| {
            smelt_ir::weights::random_f32(i as u64 * 977 + 5, len, 0.0, 255.99)
                .into_iter()
                .map(|v| v as u8)
                .collect()
        })
        .collect()
}

#[test]
fn the_generator_covers_the_op_table_and_fusion_fires() {
    use std::collections::BTreeMap;
    let mut before: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut after: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut insts = 0;
    let cases = 300;
    for bytes in byte_strings(cases, 256) {
        let case = case_from(&bytes, &GenOptions::default());
        insts += case.module.funcs[0].insts.len();
        for i in &case.module.funcs[0].insts {
            *before.entry(i.op.name()).or_default() += 1;
        }
        let mut optimized = case.module.clone();
        smelt::optimize(&mut optimized, &OptimizeOptions::default(), None).expect("optimize");
        for i in &optimized.funcs[0].insts {
            *after.entry(i.op.name()).or_default() += 1;
        }
    }
    let wanted = [
        "conv2d",
        "batch_norm",
        "gemm",
        "matmul",
        "max_pool2d",
        "avg_pool2d",
        "global_avg_pool",
        "layer_norm",
        "softmax",
        "concat",
        "flatten",
        "reshape",
        "transpose",
        "relu",
        "clip",
        "leaky_relu",
        "sigmoid",
        "tanh",
        "erf",
        "gelu",
        "hard_sigmoid",
        "hard_swish",
        "silu",
        "add",
        "sub",
        "mul",
        "div",
        "min",
        "max",
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|n| !before.contains_key(n))
        .collect();
    assert!(
        missing.is_empty(),
        "never generated: {missing:?} (generated: {before:?})"
    );
    assert!(
        insts >= cases * 4,
        "graphs are too small: {insts} instructions in {cases} cases"
    );
    let fused = after.get("fused").copied().unwrap_or(0);
    assert!(
        fused >= cases / 4,
        "fusion fired only {fused} times: {after:?}"
    );
    let bn_after = after.get("batch_norm").copied().unwrap_or(0);
    assert!(
        bn_after < before["batch_norm"],
        "no batch norm was folded: {bn_after} of {}",
        before["batch_norm"]
    );
}
