//! The thin path through every stage: `.tir` text → IR → e-graph fusion → one fused op →
//! loop IR → Cranelift → native code, checked against the reference interpreter.

mod common;

use smelt::ir::text::{self, PrintOptions};
use smelt::ir::weights::random_f32;
use smelt::ir::{interp, ErrorStats, Op, Tensor};
use smelt::{CompileOptions, Executable, OptimizeOptions};

fn inputs(func: &smelt::ir::Func) -> Vec<Tensor> {
    func.params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let data = random_f32(100 + i as u64, p.ty.num_elements(), -1.0, 1.0);
            Tensor::new(p.ty.dims.clone(), data).unwrap()
        })
        .collect()
}

#[test]
fn residual_tail_fuses_into_one_kernel_and_matches_the_interpreter() {
    for path in common::case_files("thin_path") {
        let name = common::case_name(&path);
        // Parse under the bare file name so locations (and snapshots) don't depend on
        // where the repository is checked out.
        let src = std::fs::read_to_string(&path).expect("case file is readable");
        let file = format!("{name}.tir");
        let module = text::parse_with(&src, &file, path.parent())
            .unwrap_or_else(|e| panic!("{name}: {}", e.render(Some(&src))));
        let func = module.entry().expect("one function");
        let inputs = inputs(func);
        let reference = interp::run(&module, func, &inputs).expect("interpreter runs");

        let mut fused = module.clone();
        smelt::optimize(&mut fused, &OptimizeOptions::default(), None).expect("optimizes");
        let ffunc = fused.entry().expect("one function");
        let computing: Vec<&Op> = ffunc
            .insts
            .iter()
            .map(|i| &i.op)
            .filter(|op| !matches!(op, Op::Const(_)))
            .collect();
        assert_eq!(
            computing.len(),
            1,
            "{name}: expected one fused op, got {computing:?}"
        );
        assert!(matches!(computing[0], Op::Fused(f) if f.post_ops.len() == 2));

        let printed = text::print(
            &fused,
            &PrintOptions {
                print_loc: true,
                elide_weights: true,
            },
        );
        common::snapshot_settings("thin_path")
            .bind(|| insta::assert_snapshot!(name.clone(), printed));

        let opts = CompileOptions {
            verify: true,
            ..CompileOptions::default()
        };
        let exe = Executable::compile(&fused, None, &opts).expect("compiles");
        let got = exe.run(&inputs).expect("runs");
        assert_eq!(got.len(), reference.len());
        for (g, r) in got.iter().zip(&reference) {
            let e = ErrorStats::between_tensors(g, r).unwrap();
            assert!(e.relative <= 1e-5, "{name}: JIT vs interpreter {e:?}");
        }
        // The fused graph run by the interpreter agrees too (fusion itself is sound).
        let fused_ref = interp::run(&fused, ffunc, &inputs).expect("interpreter runs fused");
        let e = ErrorStats::between_tensors(&fused_ref[0], &reference[0]).unwrap();
        assert!(
            e.relative <= 1e-5,
            "{name}: fused vs unfused interpreter {e:?}"
        );
    }
}
