//! `smelt bench`: compile a model, time warm runs, report latency percentiles, GFLOP/s
//! against this CPU's measured FMA peak, the compile time by stage, and optionally a
//! per-kernel profile.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use clap::{Args, ValueEnum};
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use smelt::dynamic::SharedModule;
use smelt::ir::diag::Location;
use smelt::ir::{Module, Tensor};
use smelt::models::{residual_tail, resnet, ResNetConfig, MAX_TAIL_SIZE};
use smelt::runtime::{Elements, ElementsMut, KernelProfile};
use smelt::{CompileOptions, ConvAlgorithm, DynamicExecutable, Executable, Layouts};

use super::out::{errln, out, outln};
use super::{FusionArgs, Kernels, ModelArgs};

/// The nominal f32x4 FMA peak of one core (2 pipes × 4 lanes × 2 flops × ≈3.1 GHz), used
/// only where the CPU has no FMA of the kernels' width to measure
/// ([`smelt::microkernels::fma_peak`]); the report then says `nominal`.
const NOMINAL_F32X4_PEAK_GFLOPS_PER_CORE: f64 = 50.0;

/// Most warm-up or timed runs `--warmup` and `--iterations` accept: a bound on the
/// samples kept and on the time a typo can ask for.
const MAX_RUNS: i64 = 1_000_000;

/// How 3×3 stride-1 convolutions are computed (`--conv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Conv {
    /// Winograd where the cost model expects it to win, direct elsewhere.
    Auto,
    /// The direct convolution everywhere.
    Direct,
}

/// How activations are laid out between kernels (`--layouts`; see [`smelt::Layouts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LayoutChoice {
    /// Channel blocks (NCHW16c) between pointwise convs where every reader and writer
    /// computes on them (with a micro-kernel), row-major elsewhere.
    Auto,
    /// Row-major (NCHW) everywhere.
    RowMajor,
}

impl LayoutChoice {
    fn layouts(self) -> Layouts {
        match self {
            LayoutChoice::Auto => Layouts::Auto,
            LayoutChoice::RowMajor => Layouts::RowMajor,
        }
    }
}

impl Conv {
    fn algorithm(self) -> ConvAlgorithm {
        match self {
            Conv::Auto => ConvAlgorithm::Auto,
            Conv::Direct => ConvAlgorithm::Direct,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Conv::Auto => "auto",
            Conv::Direct => "direct",
        }
    }
}

/// Arguments of `smelt bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// The model: a `.tir` or `.onnx` file, or a built-in network: `resnet18`, `resnet50`,
    /// `tail:C,HW` (the Conv3x3→BN→Add→Relu residual tail at C×HW×HW, e.g. `tail:64,56`).
    model: String,
    /// Pin a dynamic input dimension of an ONNX model, e.g. `--shape input=1x3x224x224`.
    #[arg(long = "shape", value_name = "NAME=DIMS")]
    shapes: Vec<String>,
    /// An input tensor: the parameter name and a .npy file (repeat for each input), for
    /// inputs whose values matter (token ids, masks, indices); the others get seeded
    /// random values.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// One more folder the files a model names may be read from (see `smelt run --help`).
    #[arg(long, value_name = "DIR")]
    allow_root: Option<PathBuf>,
    /// The memory budget, e.g. `32G` (see `smelt run --help`).
    #[arg(long, value_name = "BYTES", value_parser = super::parse_bytes)]
    memory_budget: Option<u64>,
    /// For a model with a dynamic batch: a bucket per power of two instead of copies of
    /// the batch-1 executable (see `smelt run --help`).
    #[arg(long)]
    batch_buckets: bool,
    /// Threads per run, the calling thread included (0: one per core).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1024))]
    threads: u16,
    /// Untimed runs before timing (at most a million).
    #[arg(long, default_value_t = 5, value_name = "W", value_parser = clap::value_parser!(u32).range(0..=MAX_RUNS))]
    warmup: u32,
    /// Timed runs (1 to a million: each keeps one sample).
    #[arg(long, default_value_t = 30, value_name = "I", value_parser = clap::value_parser!(u32).range(1..=MAX_RUNS))]
    iterations: u32,
    /// Kernel choice.
    #[arg(long, value_enum, default_value_t = Kernels::Auto)]
    kernels: Kernels,
    /// How 3×3 stride-1 convolutions are computed: `auto` (Winograd where the cost model
    /// expects it to win) or `direct` (the register-tiled direct convolution everywhere).
    #[arg(long, value_enum, default_value_t = Conv::Auto)]
    conv: Conv,
    /// How activations are laid out between kernels: `auto` (channel blocks between
    /// pointwise convs where they pay) or `row-major` (NCHW everywhere).
    #[arg(long, value_enum, default_value_t = LayoutChoice::Auto)]
    layouts: LayoutChoice,
    /// For a model whose batch is dynamic (and not pinned by `--shape`): the batch timed
    /// (default 1). Given inputs set the batch themselves.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: Option<u32>,
    /// For a model whose sequence length is dynamic (a symbol shared by inputs off their
    /// leading axis, not pinned by `--shape`): the length of the random inputs (default
    /// the shortest length bucket, 16). Given inputs set the length themselves.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    sequence: Option<u32>,
    /// Also time every kernel call (separate runs, after the timed ones).
    #[arg(long)]
    profile: bool,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    fusion: FusionArgs,
}

/// Milliseconds spent compiling, by stage.
struct CompileBreakdown {
    /// Each stage by name, in the order it ran: `load`, each pass (including the
    /// verification after it), `lower`, `codegen`; for a dynamic batch, `interface` (the
    /// model's declared inputs read) and each bucket compiled, `bucket_<size>` (`bucket_<size>x<length>` with a
    /// sequence length).
    parts: Vec<(String, f64)>,
    /// Everything from reading the model to a runnable executable.
    total_ms: f64,
}

/// One kernel call's profile, aggregated over the profiled runs (median time).
struct CallProfile {
    profile: KernelProfile,
    median_ms: f64,
}

/// Everything `smelt bench` measured.
struct Report {
    model: String,
    gflop: f64,
    /// What the kernels execute per run (differs from `gflop` where Winograd computes).
    executed_gflop: f64,
    threads: usize,
    /// Lanes of the widest FMA the conv tiles use (4: Cranelift's f32x4).
    lanes: usize,
    compile: CompileBreakdown,
    kernels: (usize, usize),
    arena_bytes: usize,
    samples_ms: Vec<f64>,
    profile: Option<Vec<CallProfile>>,
    /// For a model whose batch is dynamic: how the timed batch ran.
    dynamic: Option<DynamicRun>,
}

/// How a run of a dynamic-batch model was split.
struct DynamicRun {
    batch: usize,
    chunks: Vec<usize>,
    max_bucket: usize,
    largest_chunk: usize,
}

/// Runs `smelt bench`.
pub fn main(a: BenchArgs) -> Result<()> {
    let start = Instant::now();
    let opts = smelt::Options {
        optimize: a.fusion.options(None)?,
        compile: CompileOptions {
            threads: usize::from(a.threads),
            conv: a.conv.algorithm(),
            kernels: a.kernels.choice(),
            layouts: a.layouts.layouts(),
            ..CompileOptions::default()
        },
        ..smelt::Options::default()
    };
    let mut a = a;
    // the input files, read once whichever way the model is timed
    let mut given = super::read_inputs(&a.inputs)?;
    if let Some(exe) = model_args(&a)
        .map(|m| m.dynamic(&opts))
        .transpose()?
        .flatten()
    {
        match bench_dynamic_or_pin(&a, &exe, given, start)? {
            None => return Ok(()),
            Some(pinned) => {
                a.shapes.extend(pinned.shapes);
                (a.batch, a.sequence) = (None, None);
                given = pinned.inputs;
            }
        }
    }
    if a.batch.is_some() || a.sequence.is_some() {
        bail!(
            "--batch and --sequence apply to a model whose batch or sequence length is \
             dynamic; {} has none left unpinned",
            a.model
        );
    }
    let module = match model_args(&a) {
        Some(file) => file.load_at(&given)?,
        None => load(&a)?,
    };
    let load_ms = ms_since(start);
    let gflop = module_flops(&module)? as f64 / 1e9;
    let (exe, cx) = smelt::compile(&module, &opts)?;
    for w in &cx.warnings {
        errln!("{w}");
    }
    let times = exe.compile_times();
    let mut parts = vec![("load".to_string(), load_ms)];
    parts.extend(cx.pass_ms.iter().map(|&(pass, ms)| (pass.to_string(), ms)));
    parts.push(("lower".into(), times.lower_ms));
    parts.push(("codegen".into(), times.codegen_ms));
    let compile = CompileBreakdown {
        parts,
        total_ms: ms_since(start),
    };

    let inputs = super::inputs_for(
        exe.inputs().iter().map(|i| (i.name.as_str(), &i.ty)),
        given,
        Some(1),
        "the model",
    )?;
    let samples_ms = time_runs(&exe, &inputs, a.warmup as usize, a.iterations as usize)?;
    let profile = if a.profile {
        let profiled = || Ok(exe.run_profiled(&inputs)?.1);
        Some(profile_runs(profiled, a.iterations.clamp(1, 10) as usize)?)
    } else {
        None
    };
    let report = Report {
        model: a.model.clone(),
        gflop,
        executed_gflop: exe.executed_flops() as f64 / 1e9,
        threads: threads(&a),
        lanes: lanes(&a),
        compile,
        kernels: exe.kernel_counts(),
        arena_bytes: exe.arena_bytes(),
        samples_ms,
        profile,
        dynamic: None,
    };
    report.print(&a)
}

/// How a model with dynamic sizes is timed as one executable instead: the `--shape` pins
/// of its inputs and the inputs to time it on.
struct Pinned {
    shapes: Vec<String>,
    inputs: Vec<(String, Tensor)>,
}

/// Benchmarks a model with dynamic sizes as a [`DynamicExecutable`] (`None`: done), or
/// says how to time it as one executable: a model with image sizes at its files'
/// shapes, and a sequence the padding proof refuses (each length compiled exactly) at
/// its inputs' shapes.
fn bench_dynamic_or_pin(
    a: &BenchArgs,
    exe: &DynamicExecutable,
    given: Vec<(String, Tensor)>,
    start: Instant,
) -> Result<Option<Pinned>> {
    let interface_ms = ms_since(start);
    if !exe.symbols().is_empty() {
        super::refuse_sizes_for_symbols(
            Path::new(&a.model),
            exe,
            a.batch.is_some(),
            a.sequence.is_some(),
        )?;
        let shapes = model_args(a)
            .map(|m| m.pinned_by_files(exe, &given))
            .transpose()?
            .map(|m| m.shapes)
            .unwrap_or_default();
        return Ok(Some(Pinned {
            shapes,
            inputs: given,
        }));
    }
    let ((n, length), inputs) = super::dynamic_inputs(
        exe,
        given,
        Some(1),
        a.batch.map(|b| b as usize),
        a.sequence.map(|s| s as usize),
    )?;
    // compiles what the run needs: a sequence the padding proof refuses turns into a
    // symbol compiled exactly here
    exe.warm_up(n, length)?;
    if exe.symbols().is_empty() {
        let run = DynamicBench {
            start,
            interface_ms,
            batch: n,
            length,
        };
        bench_dynamic(a, exe, &run, &inputs)?;
        return Ok(None);
    }
    for w in exe.specializations().iter().flat_map(|s| &s.warnings) {
        errln!("{w}");
    }
    let names = exe.inputs().iter().map(|i| i.name.clone());
    Ok(Some(Pinned {
        shapes: names
            .clone()
            .zip(&inputs)
            .map(|(name, t)| super::shape_pin(&name, &t.ty.dims))
            .collect(),
        inputs: names.zip(inputs).collect(),
    }))
}

/// The compile breakdown's part for the model's symbolic import and passes, made once
/// for every bucket (named `symbolic`), or for trying them (`symbolic_refused`).
fn shared_module_part(exe: &DynamicExecutable) -> Option<(&'static str, f64)> {
    match exe.shared_module() {
        SharedModule::Pending => None,
        SharedModule::Symbolic { ms } => Some(("symbolic", ms)),
        SharedModule::PerBucket { ms, .. } => Some(("symbolic_refused", ms)),
    }
}

/// What a dynamic model's bench is of: its batch and length, when it started and how
/// long reading its interface took.
struct DynamicBench {
    start: Instant,
    interface_ms: f64,
    batch: usize,
    length: usize,
}

/// Benchmarks a model whose batch is dynamic at `--batch` (default 1): the buckets that
/// batch needs are compiled first (the compile time), then whole runs are timed.
fn bench_dynamic(
    a: &BenchArgs,
    exe: &DynamicExecutable,
    run: &DynamicBench,
    inputs: &[Tensor],
) -> Result<()> {
    let (n, length, start) = (run.batch, run.length, run.start);
    let mut parts = vec![("interface".to_string(), run.interface_ms)];
    if let Some((name, ms)) = shared_module_part(exe) {
        parts.push((name.to_string(), ms));
    }
    for s in exe.specializations() {
        for w in &s.warnings {
            errln!("{w}");
        }
        let name = match s.length {
            Some(l) => format!("bucket_{}x{l}", s.batch),
            None => format!("bucket_{}", s.batch),
        };
        parts.push((name, s.compile_ms));
    }
    let compile = CompileBreakdown {
        parts,
        total_ms: ms_since(start),
    };
    let plan = exe.chunk_plan(n, length)?;
    let chunks: Vec<usize> = plan.iter().map(|c| c.size).collect();
    let largest = exe.bucket(plan[0].bucket, length)?;
    // a chunk run as copies of its bucket holds an arena per copy or per thread
    let copies = plan[0].size / plan[0].bucket.max(1);
    let (written, executed) = exe.flops(n, length)?;
    let samples_ms = time_dynamic_runs(exe, inputs, a.warmup as usize, a.iterations as usize)?;
    // the bucket that runs the batch, at the run's valid rows
    let profile = match a.profile {
        true => {
            let runs = a.iterations.clamp(1, 10) as usize;
            let profiled = || {
                exe.profile(inputs)
                    .map_err(|e| anyhow!("{e} (e.g. {})", shape_example(exe)))
            };
            Some(profile_runs(profiled, runs)?)
        }
        false => None,
    };
    let report = Report {
        model: a.model.clone(),
        gflop: written as f64 / 1e9,
        executed_gflop: executed as f64 / 1e9,
        threads: threads(a),
        lanes: lanes(a),
        compile,
        kernels: largest.kernel_counts(),
        arena_bytes: largest.copies_arena_bytes(copies),
        samples_ms,
        profile,
        dynamic: Some(DynamicRun {
            batch: n,
            chunks,
            max_bucket: *exe.bucket_sizes().last().unwrap_or(&1),
            largest_chunk: exe.largest_chunk()?,
        }),
    };
    report.print(a)
}

/// `--shape` options pinning a dynamic model's inputs (batch 1, length 128), for
/// messages that ask for them.
fn shape_example(exe: &DynamicExecutable) -> String {
    exe.inputs()
        .iter()
        .map(|i| {
            format!(
                "--shape {}={}",
                i.name,
                i.shape_text().replace('N', "1").replace('S', "128")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The threads a run uses (0: one per core).
fn threads(a: &BenchArgs) -> usize {
    match usize::from(a.threads) {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// Lanes of the widest FMA the conv tiles use.
fn lanes(a: &BenchArgs) -> usize {
    a.kernels
        .choice()
        .tile_isa()
        .map_or(4, |isa| isa.fma_lanes() as usize)
}

/// The model file as `ModelArgs`, or `None` for a built-in network.
/// (The one place that tells a built-in network's name from a file's.)
fn model_args(a: &BenchArgs) -> Option<ModelArgs> {
    let builtin =
        matches!(a.model.as_str(), "resnet18" | "resnet50") || a.model.starts_with("tail:");
    (!builtin).then(|| ModelArgs {
        model: PathBuf::from(&a.model),
        shapes: a.shapes.clone(),
        allow_root: a.allow_root.clone(),
        memory_budget: a.memory_budget,
        batch_buckets: a.batch_buckets,
    })
}

/// The model named on the command line: a file ([`model_args`]) or a built-in network.
fn load(a: &BenchArgs) -> Result<Module> {
    if let Some(file) = model_args(a) {
        return file.load();
    }
    if !a.shapes.is_empty() {
        bail!(
            "--shape applies to ONNX files, not to the built-in {}",
            a.model
        );
    }
    match a.model.as_str() {
        "resnet18" => resnet(&ResNetConfig::resnet18()).map_err(|d| anyhow!("{d}")),
        "resnet50" => resnet(&ResNetConfig::resnet50()).map_err(|d| anyhow!("{d}")),
        name => {
            let spec = name.strip_prefix("tail:").unwrap_or(name);
            let (c, hw) = parse_tail(spec).ok_or_else(|| {
                anyhow!("'{name}': a tail is tail:C,HW with C and HW between 1 and {MAX_TAIL_SIZE}, e.g. tail:64,56"
                )
            })?;
            residual_tail(c, hw, 1).map_err(|d| anyhow!("{d}"))
        }
    }
}

/// Parses `C,HW`.
fn parse_tail(spec: &str) -> Option<(usize, usize)> {
    let (c, hw) = spec.split_once(',')?;
    let size = |s: &str| {
        s.trim()
            .parse()
            .ok()
            .filter(|n: &usize| (1..=MAX_TAIL_SIZE).contains(n))
    };
    let (c, hw) = (size(c)?, size(hw)?);
    Some((c, hw))
}

/// Floating-point operations of one run of the entry function as written (before
/// fusion, so fused and unfused runs are compared on the same work).
fn module_flops(module: &Module) -> Result<u64> {
    let func = module
        .entry()
        .ok_or_else(|| anyhow!(module.no_entry_reason()))?;
    Ok(func.flops())
}

/// `warmup` untimed runs, then the wall time of each of `iterations` runs, on caller-owned
/// buffers and one workspace (no allocation inside the timed region).
fn time_runs(
    exe: &Executable,
    inputs: &[Tensor],
    warmup: usize,
    iterations: usize,
) -> Result<Vec<f64>> {
    let ins: Vec<Elements> = inputs.iter().map(|t| Elements::of(&t.data)).collect();
    let mut out_bufs: Vec<Tensor> = exe.outputs().map(|o| Tensor::zeros(&o.ty)).collect();
    let mut outs: Vec<ElementsMut> = out_bufs
        .iter_mut()
        .map(|t| ElementsMut::of(&mut t.data))
        .collect();
    let mut ws = exe.workspace();
    for _ in 0..warmup {
        exe.run_with(&ins, &mut outs, &mut ws)?;
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        exe.run_with(&ins, &mut outs, &mut ws)?;
        samples.push(ms_since(t));
    }
    Ok(samples)
}

/// `warmup` untimed runs of a dynamic-batch model, then the wall time of each of
/// `iterations` runs on caller-owned buffers (the buckets are compiled before).
fn time_dynamic_runs(
    exe: &DynamicExecutable,
    inputs: &[Tensor],
    warmup: usize,
    iterations: usize,
) -> Result<Vec<f64>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| &t.ty.dims[..]).collect();
    let ins: Vec<Elements> = inputs.iter().map(|t| Elements::of(&t.data)).collect();
    // planned once, as an embedder running one batch repeatedly would
    let plan = exe.plan(&shapes)?;
    let mut out_bufs: Vec<Tensor> = plan.output_types().iter().map(Tensor::zeros).collect();
    let mut outs: Vec<ElementsMut> = out_bufs
        .iter_mut()
        .map(|t| ElementsMut::of(&mut t.data))
        .collect();
    for _ in 0..warmup {
        exe.run_planned(&plan, &shapes, &ins, &mut outs)?;
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        exe.run_planned(&plan, &shapes, &ins, &mut outs)?;
        samples.push(ms_since(t));
    }
    Ok(samples)
}

/// Profiles `runs` runs of `profiled` and keeps, per kernel call, the median of its
/// times.
fn profile_runs(
    profiled: impl Fn() -> Result<Vec<KernelProfile>>,
    runs: usize,
) -> Result<Vec<CallProfile>> {
    let mut calls: Vec<(KernelProfile, Vec<f64>)> = Vec::new();
    for run in 0..runs {
        let profile = profiled()?;
        if run == 0 {
            calls = profile.into_iter().map(|p| (p, Vec::new())).collect();
            continue; // the first profiled run warms the profiling path up
        }
        if profile.len() != calls.len() {
            bail!("profiled runs disagree on the number of kernel calls");
        }
        for ((_, times), p) in calls.iter_mut().zip(profile) {
            times.push(p.ns as f64 / 1e6);
        }
    }
    Ok(calls
        .into_iter()
        .map(|(profile, mut times)| {
            if times.is_empty() {
                times.push(profile.ns as f64 / 1e6);
            }
            CallProfile {
                median_ms: percentile(&mut times, 0.5),
                profile,
            }
        })
        .collect())
}

/// The `q`-quantile (0..=1) of `samples`, interpolating linearly between order statistics.
fn percentile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (samples.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    samples[lo] + (samples[hi] - samples[lo]) * (pos - lo as f64)
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl Report {
    fn quantile(&self, q: f64) -> f64 {
        percentile(&mut self.samples_ms.clone(), q)
    }

    /// Effective GFLOP/s at the median latency: the model's flops as written (a direct
    /// convolution's count) over the time.
    fn gflops(&self) -> f64 {
        self.gflop / (self.quantile(0.5) / 1e3)
    }

    /// Executed GFLOP/s at the median latency: what the kernels compute over the time,
    /// the rate comparable with the machine's peak.
    fn executed_gflops(&self) -> f64 {
        self.executed_gflop / (self.quantile(0.5) / 1e3)
    }

    /// The kernel choice, and what `auto` resolved to on this CPU.
    fn kernels_name(&self, a: &BenchArgs) -> String {
        match (a.kernels, self.lanes) {
            (Kernels::Auto, 4) => "auto (cranelift)".into(),
            (Kernels::Auto, 8) => "auto (avx2)".into(),
            (Kernels::Auto, _) => "auto (avx512)".into(),
            (k, _) => k.name().into(),
        }
    }

    /// The FMA peak of the vectors the conv tiles use, on every thread's core, and how it
    /// was obtained: `measured` on this CPU, or `nominal` where it has no FMA of that width.
    fn peak(&self) -> (f64, &'static str) {
        let (per_core, source) = match smelt::microkernels::fma_peak(self.lanes) {
            Some(p) => (p.gflops_per_core, "measured"),
            None => (
                NOMINAL_F32X4_PEAK_GFLOPS_PER_CORE * (self.lanes / 4) as f64,
                "nominal",
            ),
        };
        (per_core * self.threads as f64, source)
    }

    fn text(&self, a: &BenchArgs) -> String {
        let mut s = String::new();
        let c = &self.compile;
        let parts: Vec<String> = c
            .parts
            .iter()
            .map(|(p, ms)| format!("{p} {ms:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "model    {} ({:.3} GFLOP per run)",
            self.model, self.gflop
        );
        let _ = writeln!(s, "compile  {:.1} ms = {}", c.total_ms, parts.join(" + "));
        if let Some(d) = &self.dynamic {
            let chunks: Vec<String> = d.chunks.iter().map(usize::to_string).collect();
            let _ = writeln!(
                s,
                "dynamic  batch {} run as chunks {} (buckets: powers of two up to {}; \
                 chunks of at most {}, whose memory fits the cache)",
                d.batch,
                chunks.join(" + "),
                d.max_bucket,
                d.largest_chunk
            );
        }
        let _ = writeln!(
            s,
            "code     {} kernels, {} calls per run, {:.2} MB scratch",
            self.kernels.0,
            self.kernels.1,
            self.arena_bytes as f64 / 1e6
        );
        let _ = writeln!(
            s,
            "latency  median {:.3} ms, p10 {:.3}, p90 {:.3} ({} runs after {} warm-up; {} thread{}, {}, kernels {}, conv {}, layouts {})",
            self.quantile(0.5),
            self.quantile(0.1),
            self.quantile(0.9),
            self.samples_ms.len(),
            a.warmup,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            if a.fusion.no_fuse { "unfused" } else { "fused" },
            self.kernels_name(a),
            a.conv.name(),
            a.layouts.layouts().name()
        );
        let (peak, peak_source) = self.peak();
        let _ = writeln!(
            s,
            "speed    {:.1} GFLOP/s effective (the model's flops as written); {:.1} executed \
             = {:.1}% of the f32x{} peak ({:.0} GFLOP/s {} on {} core{})",
            self.gflops(),
            self.executed_gflops(),
            100.0 * self.executed_gflops() / peak,
            self.lanes,
            peak,
            peak_source,
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        );
        if let Some(calls) = &self.profile {
            s.push_str(&profile_table(calls));
        }
        s
    }

    fn print(&self, a: &BenchArgs) -> Result<()> {
        if a.json {
            outln!("{}", self.json(a)?);
        } else {
            out!("{}", self.text(a));
        }
        Ok(())
    }

    fn json(&self, a: &BenchArgs) -> Result<String> {
        let executed_gflops = self.executed_gflops();
        let (peak, peak_source) = self.peak();
        let view = BenchJson {
            model: &self.model,
            threads: self.threads,
            kernels: self.kernels_name(a),
            conv: a.conv.name(),
            layouts: a.layouts.layouts().name(),
            fuse: !a.fusion.no_fuse,
            warmup: a.warmup as usize,
            iterations: self.samples_ms.len(),
            gflop: six_digits(self.gflop),
            median_ms: six_digits(self.quantile(0.5)),
            p10_ms: six_digits(self.quantile(0.1)),
            p90_ms: six_digits(self.quantile(0.9)),
            min_ms: six_digits(self.quantile(0.0)),
            gflops: six_digits(self.gflops()),
            executed_gflop: six_digits(self.executed_gflop),
            executed_gflops: six_digits(executed_gflops),
            peak_gflops: six_digits(peak),
            peak_source,
            peak_percent: six_digits(100.0 * executed_gflops / peak),
            compile_ms: six_digits(self.compile.total_ms),
            compile_parts: CompileParts(&self.compile),
            distinct_kernels: self.kernels.0,
            kernel_calls: self.kernels.1,
            arena_bytes: self.arena_bytes,
            samples_ms: self.samples_ms.iter().map(|&ms| six_digits(ms)).collect(),
            batch: self.dynamic.as_ref().map(|d| d.batch),
            chunks: self.dynamic.as_ref().map(|d| d.chunks.clone()),
            profile: self.profile.as_ref().map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        let p = &c.profile;
                        CallJson {
                            kernel: &p.kernel,
                            op: &p.op,
                            loc: &p.loc,
                            ms: six_digits(c.median_ms),
                            flops: p.flops,
                            bytes: p.bytes,
                            gflops: six_digits(p.flops as f64 / (c.median_ms * 1e6)),
                            gbps: six_digits(p.bytes as f64 / (c.median_ms * 1e6)),
                        }
                    })
                    .collect()
            }),
        };
        Ok(serde_json::to_string(&view)?)
    }
}

/// The `--json` report, fields in output order (docs/json.md). Times are milliseconds;
/// non-finite numbers (a zero-time run's rates) become null.
#[derive(Serialize)]
struct BenchJson<'a> {
    model: &'a str,
    threads: usize,
    kernels: String,
    conv: &'static str,
    layouts: &'static str,
    fuse: bool,
    warmup: usize,
    iterations: usize,
    gflop: f64,
    median_ms: f64,
    p10_ms: f64,
    p90_ms: f64,
    min_ms: f64,
    gflops: f64,
    executed_gflop: f64,
    executed_gflops: f64,
    peak_gflops: f64,
    peak_source: &'static str,
    peak_percent: f64,
    compile_ms: f64,
    compile_parts: CompileParts<'a>,
    distinct_kernels: usize,
    kernel_calls: usize,
    arena_bytes: usize,
    samples_ms: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    batch: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chunks: Option<Vec<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    profile: Option<Vec<CallJson<'a>>>,
}

/// One kernel call of `--profile`: median time, work and the rates they give.
#[derive(Serialize)]
struct CallJson<'a> {
    kernel: &'a str,
    op: &'a str,
    loc: &'a Location,
    ms: f64,
    flops: u64,
    bytes: u64,
    gflops: f64,
    gbps: f64,
}

/// The compile time by stage as one object, `<stage>_ms` for each stage in the order it
/// ran (see [`CompileBreakdown::parts`]). Pass names are known only at run time, so this
/// is a serde map rather than a struct; its entries keep pipeline order.
struct CompileParts<'a>(&'a CompileBreakdown);

impl Serialize for CompileParts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let c = self.0;
        let mut map = serializer.serialize_map(Some(c.parts.len()))?;
        for (stage, ms) in &c.parts {
            map.serialize_entry(&format!("{stage}_ms"), &six_digits(*ms))?;
        }
        map.end()
    }
}

/// `v` rounded to six significant digits: far below timing noise, and it keeps the
/// output short. Non-finite values pass through (serde_json writes them as null).
fn six_digits(v: f64) -> f64 {
    if v.is_finite() {
        format!("{v:.5e}").parse().unwrap_or(v)
    } else {
        v
    }
}

/// The per-call table of `--profile`, in execution order, with totals.
fn profile_table(calls: &[CallProfile]) -> String {
    let total: f64 = calls.iter().map(|c| c.median_ms).sum();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n  #   time ms      %  GFLOP/s    GB/s  op / user nodes"
    );
    for (i, c) in calls.iter().enumerate() {
        let p = &c.profile;
        let secs = c.median_ms / 1e3;
        let _ = writeln!(
            s,
            "{i:>3} {:>9.3} {:>6.1} {:>8.1} {:>7.1}  {}  {}",
            c.median_ms,
            100.0 * c.median_ms / total.max(f64::MIN_POSITIVE),
            p.flops as f64 / secs / 1e9,
            p.bytes as f64 / secs / 1e9,
            p.op,
            shorten(&p.loc.to_string(), 70)
        );
    }
    let _ = writeln!(
        s,
        "    {total:>9.3}  total of the kernel calls (median per call)"
    );
    s
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let head: String = s.chars().take(max.saturating_sub(1)).collect();
        format!("{head}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_order_statistics() {
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(percentile(&mut v, 0.0), 1.0);
        assert_eq!(percentile(&mut v, 1.0), 4.0);
        assert_eq!(percentile(&mut v, 0.5), 2.5);
        assert!((percentile(&mut v, 0.1) - 1.3).abs() < 1e-12);
    }

    #[test]
    fn json_numbers_keep_six_significant_digits() {
        assert_eq!(six_digits(1.234_567_89), 1.234_57);
        assert_eq!(six_digits(987_654_321.0), 987_654_000.0);
        assert!(six_digits(f64::NAN).is_nan());
    }

    #[test]
    fn tail_specs_parse() {
        assert_eq!(parse_tail("64,56"), Some((64, 56)));
        assert_eq!(parse_tail("64"), None);
        assert_eq!(parse_tail("0,56"), None);
        assert_eq!(parse_tail("100000,100000"), None, "beyond MAX_TAIL_SIZE");
    }
}
