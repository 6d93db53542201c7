//! `smelt opt`: run the pass pipeline and print or write the result.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use smelt::ir::text::{self, PrintOptions};
use smelt::ir::Module;

use super::dump::DumpArgs;
use super::out::{err, errln, out};
use super::{FusionArgs, ModelArgs};

/// Arguments of `smelt opt`.
#[derive(Args)]
pub struct OptArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Passes to run, comma-separated (default: fusion,const_fold,dce).
    #[arg(long, value_delimiter = ',', value_name = "PASS,...")]
    passes: Option<Vec<String>>,
    /// Print the module after every pass.
    #[arg(long)]
    print_ir_after_all: bool,
    /// Print each op's location (file:line:col or node name; the merged list for fused ops).
    #[arg(long)]
    print_loc: bool,
    /// Print large weights as a content hash instead of their values.
    #[arg(long)]
    elide_weights: bool,
    /// Write the result here (and large computed weights to a .safetensors beside it).
    #[arg(short, long, value_name = "OUT.tir")]
    output: Option<PathBuf>,
    /// Print the fusion report to stderr.
    #[arg(long)]
    report: bool,
    #[command(flatten)]
    fusion: FusionArgs,
    /// Compile the result and show the kernels (`--dump-loops`, `--dump-clif DIR`).
    #[command(flatten)]
    dump: DumpArgs,
}

/// Runs `smelt opt`.
pub fn main(a: OptArgs) -> Result<()> {
    let mut module = a.model.load_symbolic()?;
    let opts = a.fusion.options(a.passes.clone())?;
    let print_opts = PrintOptions {
        print_loc: a.print_loc,
        elide_weights: a.elide_weights,
    };
    let mut after_all = String::new();
    let mut dump = |pass: &str, m: &Module| {
        after_all.push_str(&format!("// -----// IR after {pass} //----- //\n"));
        after_all.push_str(&text::print(m, &print_opts));
    };
    let cx = smelt::optimize(
        &mut module,
        &opts,
        if a.print_ir_after_all {
            Some(&mut dump)
        } else {
            None
        },
    )?;
    for w in &cx.warnings {
        errln!("{w}");
    }
    if a.report {
        for r in &cx.fusion_reports {
            err!("{}", r.to_text());
        }
    }
    out!("{after_all}");
    match &a.output {
        Some(out) => text::write_module(&module, out, &print_opts)
            .with_context(|| format!("cannot write {}", out.display()))?,
        None if !a.print_ir_after_all => out!("{}", text::print(&module, &print_opts)),
        None => {}
    }
    if a.dump.any() {
        let exe = smelt::Executable::compile(&module, None, &smelt::CompileOptions::default())?;
        a.dump.write(&exe)?;
    }
    Ok(())
}
