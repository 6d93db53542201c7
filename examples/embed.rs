//! Embedding smelt as a Rust library: load (here, build) a model, compile it once with
//! `smelt::compile` (the whole pipeline, with its options), read the fusion report, and
//! run the one executable from several threads at once, checking every thread's outputs
//! against the reference interpreter and against each other (they must be
//! bit-identical). `.ci/run` runs it:
//!
//! ```sh
//! cargo run --release --example embed
//! ```

use std::process::ExitCode;

use smelt::ir::{interp, ErrorStats, Tensor};
use smelt::CompileOptions;

fn main() -> ExitCode {
    match embed() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("embed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn embed() -> Result<(), Box<dyn std::error::Error>> {
    // A ResNet residual tail (conv3x3 → BN → add → relu) with seeded weights; a model
    // file would come from `smelt::load_model(path, &Default::default())`.
    let model = smelt::models::residual_tail(32, 14, 7)?;

    // Compile once through the whole pipeline (fusion, const_fold, dce, layouts,
    // lowering, Cranelift, memory plan) and read what fused; the executable is shared by
    // every thread that runs it.
    let opts = smelt::Options {
        compile: CompileOptions {
            threads: 2,
            ..CompileOptions::default()
        },
        ..smelt::Options::default()
    };
    let (exe, report) = smelt::compile(&model, &opts)?;
    for r in &report.fusion_reports {
        println!(
            "fusion of @{}: {} ops before, {} after ({})",
            r.func,
            r.ops_before.values().sum::<usize>(),
            r.ops_after.values().sum::<usize>(),
            r.stop_reason
        );
    }
    let inputs: Vec<Tensor> = exe
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, info)| {
            let n = info.ty.num_elements();
            let data = smelt::ir::weights::random_f32(100 + i as u64, n, -1.0, 1.0);
            Tensor::new(info.ty.dims.clone(), data)
        })
        .collect::<Result<_, _>>()?;
    let want = interp::run(&model, &model.funcs[0], &inputs)?;

    let results: Vec<Vec<Tensor>> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..4).map(|_| s.spawn(|| exe.run(&inputs))).collect();
        runs.into_iter()
            .map(|h| h.join().map_err(|_| "a run thread panicked".to_string()))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, String>>()
    })?;
    for (t, got) in results.iter().enumerate() {
        if got.len() != want.len() {
            return Err(
                format!("thread {t}: {} outputs, expected {}", got.len(), want.len()).into(),
            );
        }
        for (g, w) in got.iter().zip(&want) {
            let stats = ErrorStats::between_tensors(g, w)?;
            if stats.relative > 1e-5 {
                return Err(format!("thread {t}: relative error {:e}", stats.relative).into());
            }
        }
        if got.iter().zip(&results[0]).any(|(a, b)| a.data != b.data) {
            return Err(format!("thread {t}'s outputs differ from thread 0's").into());
        }
    }
    println!("4 threads ran one executable: outputs bit-identical, within 1e-5 of the interpreter");
    Ok(())
}
