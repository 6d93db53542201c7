//! `smelt run`: compile a model, run it on `.npy` inputs, write each result as `.npy`.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use smelt::dynamic::SharedModule;
use smelt::ir::{interp, Tensor};
use smelt::{CompileOptions, DynamicExecutable};

use super::dump::DumpArgs;
use super::out::{errln, outln};
use super::{
    dynamic_inputs, inputs_for, no_file_for_symbols, read_inputs, refuse_sizes_for_symbols,
    shape_pin, FusionArgs, Kernels, ModelArgs,
};

/// Arguments of `smelt run`.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// An input tensor: the parameter name and a .npy file (repeat for each input).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Fill inputs not given with seeded random values in [-1, 1].
    #[arg(long, value_name = "SEED")]
    random_inputs: Option<u64>,
    /// For a model whose batch is dynamic (and not pinned by `--shape`): the batch of the
    /// random inputs (default 1). Given inputs set the batch themselves.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: Option<u32>,
    /// For a model whose sequence length is dynamic (a symbol shared by inputs off their
    /// leading axis, not pinned by `--shape`): the length of the random inputs (default
    /// the shortest length bucket, 16). Given inputs set the length themselves.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    sequence: Option<u32>,
    /// Folder for the results, one NAME.npy per result.
    #[arg(long, value_name = "DIR")]
    output_dir: PathBuf,
    /// Run the reference interpreter on the unoptimized model instead of compiled code.
    #[arg(long)]
    interp: bool,
    /// Threads per run, the calling thread included; 0 (the default) means one per core.
    /// Results are bit-identical for every count. Compiled code only (not `--interp`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=1024))]
    threads: Option<u16>,
    /// Which code computes conv tiles: `auto` (the widest micro-kernel the CPU runs),
    /// `cranelift` (portable code only), `avx2` or `avx512`.
    #[arg(long, value_enum, default_value_t = Kernels::Auto)]
    kernels: Kernels,
    #[command(flatten)]
    fusion: FusionArgs,
    #[command(flatten)]
    dump: DumpArgs,
}

/// Runs `smelt run`.
pub fn main(a: RunArgs) -> Result<()> {
    let opts = smelt::Options {
        optimize: a.fusion.options(None)?,
        compile: CompileOptions {
            threads: a.threads.map_or(0, usize::from),
            kernels: a.kernels.choice(),
            ..CompileOptions::default()
        },
        ..smelt::Options::default()
    };
    if !a.interp {
        if let Some(exe) = a.model.dynamic(&opts)? {
            return run_dynamic(&a, &exe);
        }
    }
    if a.batch.is_some() || a.sequence.is_some() {
        bail!(
            "--batch and --sequence apply to a model whose batch or sequence length is \
             dynamic; {} has none left unpinned",
            a.model.model.display()
        );
    }
    let given = read_inputs(&a.inputs)?;
    let module = a.model.load_at(&given)?;
    let func = module
        .entry()
        .ok_or_else(|| anyhow!("{}: {}", a.model.model.display(), module.no_entry_reason()))?;
    let inputs = inputs_for(
        func.params.iter().map(|p| (p.name.as_str(), &p.ty)),
        given,
        a.random_inputs,
        &format!("@{}", func.name),
    )?;
    if a.interp && a.dump.any() {
        bail!("--dump-loops and --dump-clif show compiled code: drop --interp");
    }
    if a.interp && a.threads.is_some() {
        bail!("--threads sets the threads of compiled code; the interpreter runs on one: drop --interp");
    }
    let outputs = if a.interp {
        interp::run(&module, func, &inputs).map_err(|d| anyhow!("{d}"))?
    } else {
        let (exe, cx) = smelt::compile(&module, &opts)?;
        for w in &cx.warnings {
            errln!("{w}");
        }
        a.dump.write(&exe)?;
        exe.run(&inputs)?
    };
    let names: Vec<&str> = func.results.iter().map(|r| r.name.as_str()).collect();
    write_results(&a, &names, &outputs)
}

/// Runs a model whose batch is dynamic: compiled per bucket, run at the inputs' batch.
fn run_dynamic(a: &RunArgs, exe: &DynamicExecutable) -> Result<()> {
    if !exe.symbols().is_empty() {
        return run_shaped(a, exe);
    }
    let ((n, length), inputs) = dynamic_inputs(
        exe,
        read_inputs(&a.inputs)?,
        a.random_inputs,
        a.batch.map(|b| b as usize),
        a.sequence.map(|s| s as usize),
    )?;
    let outputs = exe.run(&inputs)?;
    if !exe.symbols().is_empty() {
        // the padding proof refused the sequence: it now compiles each length exactly
        report_shapes(exe);
        if a.dump.any() {
            return Err(dump_needs_pins(exe, &inputs));
        }
        let names: Vec<&str> = exe.output_names().iter().map(String::as_str).collect();
        return write_results(a, &names, &outputs);
    }
    for s in exe.specializations() {
        for w in &s.warnings {
            errln!("{w}");
        }
    }
    let plan = exe.chunk_plan(n, length)?;
    if a.dump.any() {
        // the code of the largest chunk's bucket (every chunk of its size runs it)
        a.dump.write(&*exe.bucket(plan[0].bucket, length)?)?;
    }
    let chunks: Vec<String> = plan
        .iter()
        .map(|c| match c.copies() {
            false => c.size.to_string(),
            true => format!("{} (copies of bucket {})", c.size, c.bucket),
        })
        .collect();
    let compiled: Vec<String> = exe
        .specializations()
        .iter()
        .map(|s| match s.length {
            Some(l) => format!("{}x{l}", s.batch),
            None => s.batch.to_string(),
        })
        .collect();
    match exe.length_buckets().is_empty() {
        true => errln!(
            "dynamic batch {n}: ran as chunks {} (buckets compiled: {})",
            chunks.join(" + "),
            compiled.join(", ")
        ),
        false => errln!(
            "dynamic batch {n}, sequence length {length}: ran as chunks {} (buckets \
             compiled, batch x length: {})",
            chunks.join(" + "),
            compiled.join(", ")
        ),
    }
    report_buckets(exe);
    report_shared_module(exe);
    let names: Vec<&str> = exe.output_names().iter().map(String::as_str).collect();
    write_results(a, &names, &outputs)
}

/// Says which buckets do not run batches as copies of themselves, and how each length
/// bucket runs a shorter length (its products stopping at the run's length, or why
/// not).
fn report_buckets(exe: &DynamicExecutable) {
    for s in exe.specializations() {
        if let Some(Err(why)) = &s.copies {
            errln!(
                "bucket {} does not run batches as copies of itself: {why}",
                s.batch
            );
        }
        let Some(length) = s.length else { continue };
        match &s.valid_rows {
            Some(Ok(())) => errln!(
                "length bucket {}x{length}: products stop at each run's length (the rows \
                 past it cleared)",
                s.batch
            ),
            Some(Err(why)) => errln!(
                "length bucket {}x{length}: computes every padded row ({why})",
                s.batch
            ),
            None => {}
        }
    }
}

/// Says where the buckets' modules came from: the model fused once with symbolic sizes,
/// or an import and fusion per bucket, and why.
fn report_shared_module(exe: &DynamicExecutable) {
    match exe.shared_module() {
        SharedModule::Pending => {}
        SharedModule::Symbolic { ms } => errln!(
            "fused once with symbolic sizes ({ms:.1} ms); each bucket specialized that module"
        ),
        SharedModule::PerBucket { reason, .. } => {
            errln!("each bucket was imported and fused at its own sizes: {reason}")
        }
    }
}

/// Writes each result as `NAME.npy` into the output folder.
fn write_results(a: &RunArgs, names: &[&str], outputs: &[Tensor]) -> Result<()> {
    std::fs::create_dir_all(&a.output_dir)
        .with_context(|| format!("cannot create {}", a.output_dir.display()))?;
    for (name, t) in names.iter().zip(outputs) {
        let path = a.output_dir.join(smelt::npy::file_name_for(name));
        std::fs::write(&path, smelt::npy::encode(t))
            .with_context(|| format!("cannot write {}", path.display()))?;
        outln!("{name} {} -> {}", t.ty, path.display());
    }
    Ok(())
}

/// Runs a model with symbols besides the batch (an image's height and width) at the
/// sizes of its `--input` files: compiled for exactly those sizes.
fn run_shaped(a: &RunArgs, exe: &DynamicExecutable) -> Result<()> {
    refuse_sizes_for_symbols(&a.model.model, exe, a.batch.is_some(), a.sequence.is_some())?;
    let mut given = read_inputs(&a.inputs)?;
    let mut inputs = Vec::with_capacity(exe.inputs().len());
    for info in exe.inputs() {
        let Some(k) = given.iter().position(|(n, _)| *n == info.name) else {
            return Err(no_file_for_symbols(exe, info));
        };
        inputs.push(given.swap_remove(k).1);
    }
    if let Some((extra, _)) = given.first() {
        bail!("the model has no input named {extra}");
    }
    if a.dump.any() {
        return Err(dump_needs_pins(exe, &inputs));
    }
    let outputs = exe.run(&inputs)?;
    report_shapes(exe);
    report_buckets(exe);
    report_shared_module(exe);
    let names: Vec<&str> = exe.output_names().iter().map(String::as_str).collect();
    write_results(a, &names, &outputs)
}

/// Prints the warnings of each specialization of a model with symbols and the sizes
/// each was compiled for.
fn report_shapes(exe: &DynamicExecutable) {
    let specializations = exe.specializations();
    for w in specializations.iter().flat_map(|s| &s.warnings) {
        errln!("{w}");
    }
    let sizes: Vec<String> = specializations
        .iter()
        .map(|s| {
            let values: Vec<String> = exe
                .symbols()
                .iter()
                .zip(&s.symbols)
                .map(|(name, v)| format!("{name}={v}"))
                .collect();
            values.join(" ")
        })
        .collect();
    errln!(
        "symbols {}: compiled for {}",
        exe.symbols().join(", "),
        sizes.join("; ")
    );
}

/// The error for `--dump-*` on a model compiled per set of sizes: a dump is of one
/// executable, which `--shape` flags at these inputs' sizes compile.
fn dump_needs_pins(exe: &DynamicExecutable, inputs: &[Tensor]) -> anyhow::Error {
    let pins: Vec<String> = exe
        .inputs()
        .iter()
        .zip(inputs)
        .map(|(i, t)| format!("--shape {}", shape_pin(&i.name, &t.ty.dims)))
        .collect();
    anyhow!(
        "--dump-* dumps one executable, and this model compiles one per set of sizes: pin \
         the inputs' sizes ({})",
        pins.join(" ")
    )
}
