//! `smelt demo`: builds a small ResNet-style network in code and walks it through every
//! stage — fusion, Cranelift compilation, runs fused vs unfused, verification.

use std::time::Instant;

use super::out::{out, outln};
use anyhow::{anyhow, Result};
use clap::Args;
use smelt::ir::text::{self, PrintOptions};
use smelt::ir::{interp, Module, Op, Tensor};
use smelt::models::{residual_tail, resnet, ResNetConfig};
use smelt::verify::{verify, VerifyOptions};
use smelt::{Executable, OptimizeOptions};

const RUNS: usize = 30;
/// Seed of the demo's input (the same values `smelt verify --seed 1` uses).
const INPUT_SEED: u64 = 1;

/// Arguments of `smelt demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Threads per run of the compiled network, the calling thread included; 0 (the
    /// default) means one per core. Results are bit-identical for every count.
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1024))]
    threads: u16,
}

/// Runs `smelt demo`.
pub fn run(a: DemoArgs) -> Result<()> {
    let cfg = ResNetConfig::demo();
    outln!("smelt demo: a ResNet-style network built in code (seeded random weights)\n");

    outln!("1. the thin path: one residual tail, Conv3x3 -> BatchNorm -> Add -> Relu");
    let tail = residual_tail(8, 8, 7).map_err(|d| anyhow!("{d}"))?;
    let shown = PrintOptions {
        print_loc: false,
        elide_weights: true,
    };
    outln!("{}", indent(&text::print(&tail, &shown)));
    let mut fused_tail = tail.clone();
    smelt::optimize(&mut fused_tail, &OptimizeOptions::default(), None)?;
    outln!("   after fusion (e-graph), const_fold and dce:");
    outln!("{}", indent(&text::print(&fused_tail, &shown)));

    let module = resnet(&cfg).map_err(|d| anyhow!("{d}"))?;
    let func = module
        .entry()
        .ok_or_else(|| anyhow!("demo network has no entry"))?;
    let flops: u64 = func
        .insts
        .iter()
        .map(|i| {
            let ops: Vec<_> = i.operands.iter().map(|v| func.type_of(*v)).collect();
            i.op.flops(&ops, &i.ty)
        })
        .sum();
    outln!(
        "2. the network: @{}({}) -> {}, {} ops ({}), {:.1} MFLOP",
        func.name,
        func.params
            .iter()
            .map(|p| format!("%{}: {}", p.name, p.ty))
            .collect::<Vec<_>>()
            .join(", "),
        func.type_of(func.results[0].value),
        func.insts
            .iter()
            .filter(|i| !matches!(i.op, Op::Const(_)))
            .count(),
        op_histogram(&module),
        flops as f64 / 1e6
    );

    let mut fused = module.clone();
    let t = Instant::now();
    let cx = smelt::optimize(&mut fused, &OptimizeOptions::default(), None)?;
    let fuse_ms = t.elapsed().as_secs_f64() * 1e3;
    outln!("\n3. fusion ({fuse_ms:.1} ms):");
    for r in &cx.fusion_reports {
        let first_lines: String = r.to_text().lines().map(|l| format!("   {l}\n")).collect();
        out!("{first_lines}");
    }
    outln!(
        "   after const_fold and dce: {} ops ({})",
        count_ops(&fused),
        op_histogram(&fused)
    );

    let mut unfused = module.clone();
    let mut no_fuse = OptimizeOptions::default();
    no_fuse.fusion.enabled = false;
    smelt::optimize(&mut unfused, &no_fuse, None)?;

    let opts = smelt::CompileOptions {
        threads: usize::from(a.threads),
        ..smelt::CompileOptions::default()
    };
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let exe_fused = Executable::compile(&fused, None, &opts)?;
    let exe_unfused = Executable::compile(&unfused, None, &opts)?;
    let tiles = match opts.kernels.tile_isa() {
        Some(isa) => format!(
            "Cranelift loop nests calling the {} micro-kernels for conv tiles",
            isa.name()
        ),
        None => "Cranelift code only (no micro-kernel for this CPU)".to_string(),
    };
    outln!("\n4. Cranelift JIT ({tiles}):");
    for (name, exe) in [("fused", &exe_fused), ("unfused", &exe_unfused)] {
        let (kernels, calls) = exe.kernel_counts();
        let times = exe.compile_times();
        outln!(
            "   {name:8} {kernels:3} kernels, {calls:3} calls per run, compiled in {:.1} ms (lower {:.1}, codegen {:.1}), scratch {} KiB",
            times.total_ms,
            times.lower_ms,
            times.codegen_ms,
            exe.arena_bytes() / 1024
        );
    }

    let p = &func.params[0];
    let input = Tensor::random(&p.ty, INPUT_SEED);
    let inputs = [input];
    let t = Instant::now();
    interp::run(&module, func, &inputs).map_err(|d| anyhow!("{d}"))?;
    let interp_ms = t.elapsed().as_secs_f64() * 1e3;
    let fused_ms = median_ms(&exe_fused, &inputs)?;
    let unfused_ms = median_ms(&exe_unfused, &inputs)?;
    outln!(
        "\n5. run (median of {RUNS}, after warm-up, {threads} thread{}):",
        if threads == 1 { "" } else { "s" }
    );
    outln!("   JIT fused     {fused_ms:8.3} ms");
    outln!(
        "   JIT unfused   {unfused_ms:8.3} ms   (speedup from fusion: {:.2}x)",
        unfused_ms / fused_ms
    );
    outln!("   interpreter   {interp_ms:8.3} ms   (one run, unfused, f64 accumulation)");

    outln!("\n6. smelt verify: interpreter on the unfused network vs interpreter and JIT on the fused one:");
    let report = verify(
        &module,
        &VerifyOptions {
            seed: INPUT_SEED,
            per_layer: true,
            ..VerifyOptions::default()
        },
    )?;
    outln!("{}", indent(&report.to_text()));
    if !report.passed() {
        return Err(anyhow!(
            "verification failed: relative error above {}",
            report.rtol
        ));
    }
    outln!(
        "\nall stages agree (tolerance {:e} relative, every intermediate too).",
        report.rtol
    );
    Ok(())
}

fn median_ms(exe: &Executable, inputs: &[Tensor]) -> Result<f64> {
    for _ in 0..3 {
        exe.run(inputs)?;
    }
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        exe.run(inputs)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[RUNS / 2])
}

fn count_ops(m: &Module) -> usize {
    m.funcs
        .iter()
        .flat_map(|f| &f.insts)
        .filter(|i| !matches!(i.op, Op::Const(_)))
        .count()
}

fn op_histogram(m: &Module) -> String {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for inst in m.funcs.iter().flat_map(|f| &f.insts) {
        let name = match &inst.op {
            Op::Const(_) => continue,
            Op::Fused(f) => format!("fused {}", f.anchor.name()),
            op => op.name().to_string(),
        };
        *counts.entry(name).or_default() += 1;
    }
    counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("   | {l}\n"))
        .collect::<String>()
        .trim_end()
        .to_string()
}
