//! `smelt run`: compile a model, run it on `.npy` inputs, write each result as `.npy`.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use smelt::ir::interp;
use smelt::CompileOptions;

use super::dump::DumpArgs;
use super::out::{errln, outln};
use super::{inputs_for, read_inputs, FusionArgs, Kernels, ModelArgs};

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
    let module = a.model.load()?;
    let func = module
        .entry()
        .ok_or_else(|| anyhow!("{}: {}", a.model.model.display(), module.no_entry_reason()))?;
    let inputs = inputs_for(
        func.params.iter().map(|p| (p.name.as_str(), &p.ty)),
        read_inputs(&a.inputs)?,
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
        let opts = smelt::Options {
            optimize: a.fusion.options(None)?,
            compile: CompileOptions {
                threads: a.threads.map_or(0, usize::from),
                kernels: a.kernels.choice(),
                ..CompileOptions::default()
            },
            ..smelt::Options::default()
        };
        let (exe, cx) = smelt::compile(&module, &opts)?;
        for w in &cx.warnings {
            errln!("{w}");
        }
        a.dump.write(&exe)?;
        exe.run(&inputs)?
    };
    std::fs::create_dir_all(&a.output_dir)
        .with_context(|| format!("cannot create {}", a.output_dir.display()))?;
    for (r, t) in func.results.iter().zip(&outputs) {
        let path = a.output_dir.join(smelt::npy::file_name_for(&r.name));
        std::fs::write(&path, smelt::npy::encode(t))
            .with_context(|| format!("cannot write {}", path.display()))?;
        outln!("{} {} -> {}", r.name, t.ty, path.display());
    }
    Ok(())
}
