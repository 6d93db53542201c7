//! GFLOP/s of the fused Conv3x3→(BN folded)→Add→ReLU tail; prints, never asserts on time.
//! Run: `cargo test --release --test jit_bench -- --ignored --nocapture`
//! (`SMELT_BENCH_THREADS=1,2` picks thread counts; `SMELT_BENCH_PROFILE=1` adds the
//! slowest kernels of each network).

mod jit_util;

use std::time::Instant;

use jit_util::{opts, random_inputs};
use smelt::runtime::{Elements, ElementsMut};
use smelt::{CompileOptions, Executable};
use smelt_ir::Module;

/// Times `exe` on random inputs: (min, median) seconds over `iters` runs after warm-up.
fn time_runs(exe: &Executable, m: &Module, iters: usize) -> (f64, f64) {
    let inputs = random_inputs(m, 1);
    let ins: Vec<Elements> = inputs.iter().map(|t| Elements::of(&t.data)).collect();
    let mut outs: Vec<Vec<f32>> = exe.outputs().map(|o| vec![0.0f32; o.len()]).collect();
    let mut ws = exe.workspace();
    let mut times = Vec::new();
    for i in 0..iters + 3 {
        let mut slices: Vec<ElementsMut> = outs.iter_mut().map(|o| o.into()).collect();
        let t = Instant::now();
        exe.run_with(&ins, &mut slices, &mut ws).expect("runs");
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    (times[0], times[times.len() / 2])
}

fn compile_optimized(m: &Module, threads: usize) -> Executable {
    let mut m = m.clone();
    smelt::optimize(&mut m, &smelt::OptimizeOptions::default(), None).expect("optimizes");
    let o = CompileOptions { threads, ..opts() };
    Executable::compile(&m, None, &o).expect("compiles")
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn fused_tail_gflops() {
    let filter = std::env::var("SMELT_BENCH_THREADS").unwrap_or_else(|_| "1,2".into());
    for threads in filter.split(',').filter_map(|t| t.parse::<usize>().ok()) {
        for (c, hw) in [(64, 56), (128, 28), (256, 14), (512, 7)] {
            let m = smelt::models::residual_tail(c, hw, 7).expect("tail");
            let exe = compile_optimized(&m, threads);
            let (best, median) = time_runs(&exe, &m, 30);
            let flops = 2.0 * (c * c * 9 * hw * hw) as f64;
            println!(
                "threads {threads} C{c} {hw}x{hw}: min {:.3} ms ({:.1} GFLOP/s), median {:.3} ms; compile {:.2} ms",
                best * 1e3,
                flops / best / 1e9,
                median * 1e3,
                exe.compile_times().total_ms
            );
        }
    }
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn resnet_end_to_end() {
    let filter = std::env::var("SMELT_BENCH_THREADS").unwrap_or_else(|_| "1,2".into());
    for threads in filter.split(',').filter_map(|t| t.parse::<usize>().ok()) {
        for (name, cfg) in [
            ("resnet18", smelt::models::ResNetConfig::resnet18()),
            ("resnet50", smelt::models::ResNetConfig::resnet50()),
        ] {
            let m = smelt::models::resnet(&cfg).expect("model");
            let exe = compile_optimized(&m, threads);
            let (best, median) = time_runs(&exe, &m, 8);
            let (kernels, calls) = exe.kernel_counts();
            println!(
                "threads {threads} {name}: min {:.1} ms, median {:.1} ms; compile {:.1} ms ({kernels} kernels, {calls} calls)",
                best * 1e3,
                median * 1e3,
                exe.compile_times().total_ms
            );
            if std::env::var("SMELT_BENCH_PROFILE").is_ok() {
                let inputs = random_inputs(&m, 1);
                let mut prof = Vec::new();
                for _ in 0..3 {
                    prof = exe.run_profiled(&inputs).expect("runs").1;
                }
                let mut rows: Vec<_> = prof.iter().collect();
                rows.sort_by_key(|p| std::cmp::Reverse(p.ns));
                for p in rows.iter().take(12) {
                    println!(
                        "  {:8.3} ms {:6.1} GFLOP/s  {}  ({})",
                        p.ns as f64 / 1e6,
                        p.flops as f64 / p.ns.max(1) as f64,
                        p.kernel,
                        p.op
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "writes a conv kernel's disassembly to $SMELT_DISASM for inspection"]
fn dump_conv_disassembly() {
    let path = std::env::var("SMELT_DISASM").expect("set SMELT_DISASM to an output file");
    // SMELT_DISASM_MODEL picks another model file
    let mut m = match std::env::var("SMELT_DISASM_MODEL") {
        Ok(file) => smelt::load_model(std::path::Path::new(&file), &Default::default())
            .expect("model loads"),
        Err(_) => smelt::models::residual_tail(64, 56, 7).expect("tail"),
    };
    smelt::optimize(&mut m, &smelt::OptimizeOptions::default(), None).expect("optimizes");
    // the layouts `Executable::compile` would choose on this host
    let tiles = smelt::Kernels::Auto.tile_isa();
    let micro = tiles.map(smelt::microkernels::TileIsa::target);
    let laid_out = smelt_passes::layout::assign_layouts(&m.funcs[0], micro);
    let func = laid_out.as_ref().unwrap_or(&m.funcs[0]);
    let opts = smelt_passes::lower::LowerOptions {
        micro,
        ..Default::default()
    };
    let p = smelt_passes::lower::lower_with(&m, func, &opts).expect("lowers");
    // SMELT_DISASM_KERNEL picks the first kernel whose name contains it
    let wanted = std::env::var("SMELT_DISASM_KERNEL").unwrap_or_else(|_| "conv2d".into());
    let conv = p
        .kernels
        .iter()
        .find(|k| k.name.contains(&wanted))
        .expect("a kernel of that name");
    let target = smelt::codegen::TargetDesc {
        tiles,
        ..smelt::codegen::TargetDesc::host().expect("x86-64 host")
    };
    let text = smelt::codegen::disassemble(conv, &target).expect("compiles");
    std::fs::write(path, text).expect("writable");
}
