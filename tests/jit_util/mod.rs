//! Helpers shared by the JIT tests: random tensors, the interpreter oracle, comparison.
#![allow(dead_code)]

use smelt::{CompileOptions, Executable, Kernels};
use smelt_ir::weights::random_f32;
use smelt_ir::{interp, BinaryOp, ErrorStats, Module, PostOp, Tensor, TensorType, UnaryOp};

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
            if p.ty.dtype != smelt_ir::DType::F32 {
                return Tensor::random(&p.ty, seed + i as u64).to_layout(p.ty.layout);
            }
            let data = random_f32(seed + i as u64, p.ty.storage_len(), -1.0, 1.0);
            Tensor {
                ty: p.ty.clone(),
                data: data.into(),
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
    let mut outputs = Vec::new();
    for kernels in kernel_choices() {
        let o = CompileOptions { kernels, ..opts() };
        let exe = Executable::compile(module, None, &o)
            .unwrap_or_else(|e| panic!("{what} ({kernels:?}): compile failed: {e}"));
        let got = exe
            .run(inputs)
            .unwrap_or_else(|e| panic!("{what} ({kernels:?}): run failed: {e}"));
        assert_eq!(got.len(), want.len(), "{what}: output count");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.ty, w.ty, "{what}: output {i} type");
            let stats = ErrorStats::between_tensors(g, w).expect("same shape");
            assert!(
                stats.relative <= tol,
                "{what} ({kernels:?}): output {i} relative error {} > {tol} (max abs {}, rmse {})",
                stats.relative,
                stats.max_abs,
                stats.rmse
            );
        }
        outputs = got;
    }
    outputs
}

/// Every kernel choice this host runs, the portable one first: Cranelift code, the AVX2
/// micro-kernel (required on x86-64: the test machines have it, so its absence is a
/// failure, not a skip) and the AVX-512 one where the CPU has it.
pub fn kernel_choices() -> Vec<Kernels> {
    let mut choices = vec![Kernels::Cranelift];
    if cfg!(target_arch = "x86_64") {
        assert!(
            smelt::microkernels::has_avx2_fma(),
            "an x86-64 test machine without AVX2 + FMA"
        );
        choices.push(Kernels::Avx2);
    }
    if smelt::microkernels::has_avx512f() {
        choices.push(Kernels::Avx512);
    }
    // once per test binary: which choices ran, and which this host cannot run
    static REPORT: std::sync::Once = std::sync::Once::new();
    REPORT.call_once(|| {
        let all = [Kernels::Cranelift, Kernels::Avx2, Kernels::Avx512];
        let names = |ks: &mut dyn Iterator<Item = Kernels>| {
            ks.map(|k| k.name()).collect::<Vec<_>>().join(", ")
        };
        let missing = names(&mut all.into_iter().filter(|k| !choices.contains(k)));
        eprintln!(
            "kernel choices tested on this host: {}; not on this host: {}",
            names(&mut choices.iter().copied()),
            if missing.is_empty() { "none" } else { &missing }
        );
    });
    choices
}

/// Type shorthand.
pub fn f32t(dims: &[usize]) -> TensorType {
    TensorType::f32(dims.to_vec())
}

/// The residual tail's post-ops: `add(_, skip)` then `relu`.
pub fn add_relu() -> Vec<PostOp> {
    vec![
        PostOp::Binary {
            op: BinaryOp::Add,
            acc_is_lhs: true,
        },
        PostOp::Unary(UnaryOp::Relu),
    ]
}

/// A `SmeltTensorInfo` for the C API to fill in.
pub fn blank_tensor_info() -> smelt::capi::SmeltTensorInfo {
    smelt::capi::SmeltTensorInfo {
        name: std::ptr::null(),
        rank: 0,
        dims: std::ptr::null(),
        element_count: 0,
        layout: std::ptr::null(),
        element_type: smelt::capi::SmeltElementType::Bool,
    }
}

/// An executable compiled from IR text through the C API (which must succeed), with what
/// the C API reports of its first input and first output.
pub fn capi_from_text(
    src: &str,
) -> (
    *mut smelt::capi::SmeltExecutable,
    smelt::capi::SmeltTensorInfo,
    smelt::capi::SmeltTensorInfo,
) {
    use smelt::capi::{
        smelt_executable_from_text, smelt_executable_input, smelt_executable_output, SmeltStatus,
    };
    let mut exe = std::ptr::null_mut();
    // SAFETY: the text is readable for its length; `exe` is writable.
    let s = unsafe {
        smelt_executable_from_text(src.as_ptr().cast(), src.len(), std::ptr::null(), &mut exe)
    };
    assert_eq!(s, SmeltStatus::Ok);
    let (mut input, mut output) = (blank_tensor_info(), blank_tensor_info());
    // SAFETY: `exe` is live and `input` writable.
    let s = unsafe { smelt_executable_input(exe, 0, &mut input) };
    assert_eq!(s, SmeltStatus::Ok);
    // SAFETY: as above.
    let s = unsafe { smelt_executable_output(exe, 0, &mut output) };
    assert_eq!(s, SmeltStatus::Ok);
    (exe, input, output)
}

/// One typed run through the C API of an executable of one input and one output, the
/// buffers declared as `input_type` and `output_type`.
pub fn capi_run_one<I, O>(
    exe: *mut smelt::capi::SmeltExecutable,
    input: &mut [I],
    input_type: smelt::capi::SmeltElementType,
    output: &mut [O],
    output_type: smelt::capi::SmeltElementType,
) -> smelt::capi::SmeltStatus {
    use smelt::capi::{smelt_executable_run_typed, SmeltBuffer};
    let i = SmeltBuffer {
        data: input.as_mut_ptr().cast(),
        element_count: input.len(),
        element_type: input_type as i32,
    };
    let o = SmeltBuffer {
        data: output.as_mut_ptr().cast(),
        element_count: output.len(),
        element_type: output_type as i32,
    };
    // SAFETY: the buffers are live for their lengths and do not overlap; `exe` is the
    // caller's live executable.
    unsafe { smelt_executable_run_typed(exe, &i, 1, &o, 1) }
}
