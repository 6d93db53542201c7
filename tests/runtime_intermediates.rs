//! `Executable::run_keeping`: with `keep_intermediates`, every value a run computed comes
//! back in definition order, named by its IR value and location, row-major, and equal to
//! the reference interpreter's value of the same instruction — fused and unfused, through
//! pools, gemm, flatten (an aliased buffer) and blocked layouts.

use smelt::ir::text::parse;
use smelt::ir::weights::random_f32;
use smelt::ir::{interp, ErrorStats, Layout, Location, Module, Op, Tensor};
use smelt::models::{resnet, ResNetConfig};
use smelt::{CompileOptions, Error, Executable, OptimizeOptions};

const KEEP: CompileOptions = CompileOptions {
    conv: smelt::ConvAlgorithm::Auto,
    kernels: smelt::Kernels::Auto,
    verify: true,
    keep_intermediates: true,
    threads: 2,
    layouts: smelt::Layouts::Auto,
};

fn random_inputs(module: &Module, seed: u64) -> Vec<Tensor> {
    let func = module.entry().unwrap();
    func.params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let t = Tensor::new(
                p.ty.dims.clone(),
                random_f32(seed + i as u64, p.ty.num_elements(), -1.0, 1.0),
            )
            .unwrap();
            t.to_layout(p.ty.layout)
        })
        .collect()
}

/// Compiles `module` keeping intermediates and checks every value against the
/// interpreter on the same module; returns how many values were compared.
fn check_against_interpreter(module: &Module, what: &str) -> usize {
    let func = module.entry().unwrap();
    let inputs = random_inputs(module, 5);
    let exe = Executable::compile(module, None, &KEEP).unwrap();
    let (outputs, values) = exe.run_keeping(&inputs).unwrap();
    assert_eq!(
        outputs,
        exe.run(&inputs).unwrap(),
        "{what}: run_keeping's outputs differ from run's"
    );
    let reference = interp::run_keep_all(module, func, &inputs).unwrap();

    let computed: Vec<usize> = (0..func.insts.len())
        .filter(|&i| !matches!(func.insts[i].op, Op::Const(_)))
        .collect();
    let got: Vec<usize> = values.iter().map(|v| v.inst).collect();
    assert_eq!(
        got, computed,
        "{what}: one value per non-constant instruction, in order"
    );
    for v in &values {
        let inst = &func.insts[v.inst];
        assert_eq!(v.value, func.inst_value(v.inst), "{what}: %{}", v.inst);
        assert_eq!(v.op, inst.op.name());
        assert_eq!(v.loc, inst.loc);
        assert_eq!(v.tensor.ty.dims, inst.ty.dims, "{what}: %{}", v.value.0);
        assert_eq!(
            v.tensor.ty.layout,
            Layout::RowMajor,
            "{what}: %{}",
            v.value.0
        );
        let want = &reference[v.value.index()];
        let e = ErrorStats::between_tensors(&v.tensor, want).unwrap();
        assert!(
            e.relative <= 1e-5,
            "{what}: %{} ({} at {}) is off: {e:?}",
            v.inst,
            v.op,
            v.loc
        );
    }
    values.len()
}

#[test]
fn intermediates_of_the_demo_network_equal_the_interpreter_fused_and_unfused() {
    let module = resnet(&ResNetConfig::demo()).unwrap();
    let mut fused = module.clone();
    smelt::optimize(&mut fused, &OptimizeOptions::default(), None).unwrap();
    let mut unfused = module.clone();
    let mut no_fuse = OptimizeOptions::default();
    no_fuse.fusion.enabled = false;
    smelt::optimize(&mut unfused, &no_fuse, None).unwrap();

    let n_fused = check_against_interpreter(&fused, "fused");
    let n_unfused = check_against_interpreter(&unfused, "unfused");
    assert!(
        n_fused >= 5 && n_unfused > n_fused,
        "fusion merges layers: {n_fused} fused values, {n_unfused} unfused"
    );
    // Every value of the fused network names the user ops it came from.
    let exe = Executable::compile(&fused, None, &KEEP).unwrap();
    let (_, values) = exe.run_keeping(&random_inputs(&fused, 1)).unwrap();
    assert!(values.iter().all(|v| v.loc != Location::Unknown));
    assert!(values
        .iter()
        .any(|v| v.op == "fused" && matches!(v.loc, Location::Fused(_))));
}

#[test]
fn blocked_values_come_back_row_major_and_aliases_hold_their_own_shape() {
    let module = parse(
        "func @main(%x: tensor<1x6x3x3xf32>) -> tensor<2x27xf32> {\n\
         \x20 %0 = reorder %x {layout = nchw8c} : tensor<1x6x3x3xf32, nchw8c>\n\
         \x20 %1 = reorder %0 {layout = row_major} : tensor<1x6x3x3xf32>\n\
         \x20 %2 = relu %1 : tensor<1x6x3x3xf32>\n\
         \x20 %3 = reshape %2 {shape = [2, 27]} : tensor<2x27xf32>\n\
         \x20 %4 = tanh %3 : tensor<2x27xf32>\n\
         \x20 return %4 : tensor<2x27xf32>\n\
         }\n",
        "blocked.tir",
    )
    .unwrap();
    assert_eq!(check_against_interpreter(&module, "blocked"), 5);
    let inputs = random_inputs(&module, 5);
    let exe = Executable::compile(&module, None, &KEEP).unwrap();
    let (_, values) = exe.run_keeping(&inputs).unwrap();
    // The blocked value is the input, exactly (a reorder only moves elements).
    assert_eq!(values[0].tensor.data, inputs[0].data);
    assert_eq!(values[0].op, "reorder");
}

#[test]
fn run_keeping_needs_keep_intermediates() {
    let module = resnet(&ResNetConfig::demo()).unwrap();
    let exe = Executable::compile(&module, None, &CompileOptions::default()).unwrap();
    match exe.run_keeping(&random_inputs(&module, 1)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("keep_intermediates"), "{m}"),
        other => panic!("expected an InvalidArgument error, got {other:?}"),
    }
    // Input mistakes are caught as in `run`.
    let exe = Executable::compile(&module, None, &KEEP).unwrap();
    assert!(matches!(
        exe.run_keeping(&[]),
        Err(Error::InvalidArgument(_))
    ));
}
