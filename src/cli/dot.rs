//! `smelt dot`: Graphviz DOT of a model's graph, before or after fusion.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use smelt::passes::fusion::dot::to_dot;

use super::out::{errln, out};
use super::{FusionArgs, ModelArgs};

/// Arguments of `smelt dot`.
#[derive(Args)]
pub struct DotArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Draw the graph after the optimization pipeline (fusion, const_fold, dce) instead of
    /// the graph as loaded.
    #[arg(long)]
    fused: bool,
    /// Write the DOT text here instead of to stdout.
    #[arg(short, long, value_name = "FILE.dot")]
    output: Option<PathBuf>,
    #[command(flatten)]
    fusion: FusionArgs,
}

/// Runs `smelt dot`.
pub fn main(a: DotArgs) -> Result<()> {
    let mut module = a.model.load_symbolic()?;
    if a.fused {
        let opts = a.fusion.options(None)?;
        let cx = smelt::optimize(&mut module, &opts, None)?;
        for w in &cx.warnings {
            errln!("{w}");
        }
    }
    let text = to_dot(&module);
    match &a.output {
        Some(path) => std::fs::write(path, text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => out!("{text}"),
    }
    Ok(())
}
