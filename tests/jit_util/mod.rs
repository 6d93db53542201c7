//! Helpers shared by the JIT tests: random tensors, the interpreter oracle, comparison.
#![allow(dead_code)]

use smelt::runtime::{CompileOptions, Executable};
use smelt_ir::weights::random_f32;
use smelt_ir::{interp, ErrorStats, Module, Tensor, TensorType};

/// Compile options for tests: Cranelift's verifier on for every generated function.
pub fn opts() -> CompileOptions {
    CompileOptions {
        verify: true,
        ..CompileOptions::default()
    }
}

/// A row-major tensor of `dims` with values in [-1, 1] from `seed`.
pub fn random(dims: &[usize], seed: u64) -> Tensor {
    let n = dims.iter().product();
    Tensor::new(dims.to_vec(), random_f32(seed, n, -1.0, 1.0)).expect("valid shape")
}

/// Random inputs for every parameter of the module's only function.
pub fn random_inputs(module: &Module, seed: u64) -> Vec<Tensor> {
    let f = &module.funcs[0];
    f.params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let data = random_f32(seed + i as u64, p.ty.storage_len(), -1.0, 1.0);
            Tensor {
                ty: p.ty.clone(),
                data,
            }
        })
        .collect()
}

/// Compiles the module's only function, runs it on `inputs` and checks every output
/// against the interpreter within `tol` relative error (FACTS.md's definition).
/// Returns the JIT outputs.
pub fn check_against_interp(
    what: &str,
    module: &Module,
    inputs: &[Tensor],
    tol: f64,
) -> Vec<Tensor> {
    let func = &module.funcs[0];
    let want = interp::run(module, func, inputs)
        .unwrap_or_else(|d| panic!("{what}: interpreter failed: {d}"));
    let exe = Executable::compile(module, None, &opts())
        .unwrap_or_else(|e| panic!("{what}: compile failed: {e}"));
    let got = exe
        .run(inputs)
        .unwrap_or_else(|e| panic!("{what}: run failed: {e}"));
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.ty, w.ty, "{what}: output {i} type");
        let stats = ErrorStats::between_tensors(g, w).expect("same shape");
        assert!(
            stats.relative <= tol,
            "{what}: output {i} relative error {} > {tol} (max abs {}, rmse {})",
            stats.relative,
            stats.max_abs,
            stats.rmse
        );
    }
    got
}

/// Type shorthand.
pub fn f32t(dims: &[usize]) -> TensorType {
    TensorType::f32(dims.to_vec())
}
