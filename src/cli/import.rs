//! `smelt import`: convert an ONNX model to `.tir` text.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use smelt::ir::text::{self, PrintOptions};

use super::out::out;
use super::ModelArgs;

/// Arguments of `smelt import`.
#[derive(Args)]
pub struct ImportArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Write the module here (large weights go to a .safetensors beside it); default: stdout.
    #[arg(short, long, value_name = "OUT.tir")]
    output: Option<PathBuf>,
    /// Print large weights as a content hash instead of their values.
    #[arg(long)]
    elide_weights: bool,
    /// Print each op's location (the ONNX node name).
    #[arg(long)]
    print_loc: bool,
}

/// Runs `smelt import`.
pub fn main(a: ImportArgs) -> Result<()> {
    let module = a.model.load_symbolic()?;
    let opts = PrintOptions {
        print_loc: a.print_loc,
        elide_weights: a.elide_weights,
    };
    match &a.output {
        Some(out) => text::write_module(&module, out, &opts)
            .with_context(|| format!("cannot write {}", out.display()))?,
        None => out!("{}", text::print(&module, &opts)),
    }
    Ok(())
}
