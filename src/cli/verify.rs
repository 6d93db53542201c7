//! `smelt verify`: run a model unfused (interpreter), fused (interpreter) and fused (JIT),
//! compare, and on request compare layer by layer and bisect over the fusion sites.

use anyhow::{bail, Result};
use clap::Args;
use smelt::verify::{verify, verify_dynamic, VerifyOptions, DEFAULT_INPUT_RANGES, DEFAULT_RTOL};

use super::out::{out, outln};
use super::{dynamic_shape, read_inputs, refuse_sizes_for_symbols, FusionArgs, ModelArgs};

/// Arguments of `smelt verify`.
#[derive(Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// An input tensor: the parameter name and a .npy file (repeat for each input);
    /// inputs not given are seeded random values in [-1, 1].
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
    /// Seed of the random inputs (parameter i uses SEED + i).
    #[arg(long, value_name = "SEED", default_value_t = 0)]
    seed: u64,
    /// Largest relative error (max |got - ref| / max |ref| per output) that passes.
    #[arg(long, value_name = "X", default_value_t = DEFAULT_RTOL)]
    rtol: f64,
    /// Compare every intermediate that survives fusion with the unfused graph and name
    /// the first one that diverges (on the inputs of the first range whose outputs
    /// failed: [-1, 1], else the first failing --input-range).
    #[arg(long)]
    per_layer: bool,
    /// When fused and unfused disagree, find the first fusion site that makes them (on the
    /// inputs of the first range whose outputs failed, as `--per-layer`).
    #[arg(long)]
    bisect: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Skip the JIT (compare only the interpreter on the fused and unfused graphs).
    #[arg(long)]
    no_jit: bool,
    /// After the run on random inputs in [-1, 1], compare the outputs again on random
    /// inputs in [-X, X] for each X (default 20,1000; `--input-range 1` for none extra).
    #[arg(long, value_delimiter = ',', value_name = "X,...")]
    input_range: Option<Vec<f32>>,
    /// For a model whose batch is dynamic (and not pinned by `--shape`): the batch
    /// verified (default 1; given inputs set it). The model specialized at that batch is
    /// checked as always, and the dynamic executable's run too (`jit(dynamic)`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: Option<u32>,
    /// For a model whose sequence length is dynamic (a symbol shared by inputs off their
    /// leading axis, not pinned by `--shape`): the length of the random inputs (default
    /// the shortest length bucket, 16). Given inputs set the length themselves.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    sequence: Option<u32>,
    #[command(flatten)]
    fusion: FusionArgs,
}

/// Runs `smelt verify`; fails (exit code 1) when any comparison fails.
pub fn main(a: VerifyArgs) -> Result<()> {
    if !(a.rtol.is_finite() && a.rtol >= 0.0) {
        bail!("--rtol must be a finite number >= 0, got {}", a.rtol);
    }
    let opts = VerifyOptions {
        optimize: a.fusion.options(None)?,
        inputs: read_inputs(&a.inputs)?,
        seed: a.seed,
        rtol: a.rtol,
        per_layer: a.per_layer,
        bisect: a.bisect,
        jit: !a.no_jit,
        input_ranges: a
            .input_range
            .clone()
            .unwrap_or_else(|| DEFAULT_INPUT_RANGES.to_vec())
            .into_iter()
            .filter(|r| *r != 1.0)
            .collect(),
    };
    let compile = smelt::Options {
        optimize: opts.optimize.clone(),
        ..smelt::Options::default()
    };
    let dynamic = a.model.dynamic(&compile)?;
    let report = match dynamic {
        // a model with symbols besides batch and sequence is verified at its files' shapes
        Some(exe) if !exe.symbols().is_empty() => {
            refuse_sizes_for_symbols(
                &a.model.model,
                &exe,
                a.batch.is_some(),
                a.sequence.is_some(),
            )?;
            verify(&a.model.pinned_by_files(&exe, &opts.inputs)?.load()?, &opts)?
        }
        Some(exe) if !a.no_jit => {
            let (n, length) = dynamic_shape(
                &exe,
                &opts.inputs,
                a.batch.map(|b| b as usize),
                a.sequence.map(|s| s as usize),
            )?;
            verify_dynamic(&exe, n, length, &opts)?
        }
        _ => {
            if a.batch.is_some() || a.sequence.is_some() {
                bail!(
                    "--batch and --sequence apply to a model whose batch or sequence length \
                     is dynamic (and to the JIT); {} has none left unpinned",
                    a.model.model.display()
                );
            }
            verify(&a.model.load_at(&opts.inputs)?, &opts)?
        }
    };
    if a.json {
        outln!("{}", report.to_json());
    } else {
        out!("{}", report.to_text());
    }
    if !report.passed() {
        bail!("verification failed: {}", a.model.model.display());
    }
    Ok(())
}
