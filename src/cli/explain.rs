//! `smelt explain`: why each op fused or did not — rules, guard refusals, lost fusions,
//! op counts before fusion and after the whole pipeline.

use anyhow::Result;
use clap::Args;
use smelt::passes::fusion::{explain_json, explain_text};

use super::out::{errln, out, outln};
use super::{FusionArgs, ModelArgs};

/// Arguments of `smelt explain`.
#[derive(Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print one JSON object (`ops_before`, `ops_after`, `sites`, `near_misses`, `lost`,
    /// `functions`) instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    fusion: FusionArgs,
}

/// Runs `smelt explain`: the default pipeline on the model, then its fusion reports.
pub fn main(a: ExplainArgs) -> Result<()> {
    let mut module = a.model.load_symbolic()?;
    let opts = a.fusion.options(None)?;
    let cx = smelt::optimize(&mut module, &opts, None)?;
    for w in &cx.warnings {
        errln!("{w}");
    }
    if a.json {
        outln!("{}", explain_json(&cx.fusion_reports));
    } else {
        out!("{}", explain_text(&cx.fusion_reports));
    }
    Ok(())
}
