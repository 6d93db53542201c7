//! The `smelt` command line: optimize, run and demonstrate the fusion compiler.

mod demo;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use smelt::ir::text::{self, PrintOptions};
use smelt::ir::{interp, Module, Tensor};
use smelt::passes::fusion::load_rules;
use smelt::OptimizeOptions;

/// smelt — a fusion compiler for neural-network inference.
#[derive(Parser)]
#[command(name = "smelt", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the optimization pipeline on a model and print (or write) the result.
    Opt(OptArgs),
    /// Compile a model and run it on inputs from .npy files; write each result as .npy.
    Run(RunArgs),
    /// Build a small ResNet-style network in code and show every stage working on it.
    Demo,
}

/// Options choosing and configuring fusion, shared by every command that compiles.
#[derive(Args, Clone, Debug, Default)]
struct FusionArgs {
    /// Disable every fusion rewrite (BN, add and activations stay separate ops).
    #[arg(long)]
    no_fuse: bool,
    /// Rules not to run (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    disable_rules: Vec<String>,
    /// Run only these rules (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    only_rules: Option<Vec<String>>,
    /// Load extra fusion rules from a rule file.
    #[arg(long, value_name = "FILE")]
    rules: Vec<PathBuf>,
}

impl FusionArgs {
    fn options(&self, passes: Option<Vec<String>>) -> Result<OptimizeOptions> {
        let mut opts = OptimizeOptions {
            passes,
            ..OptimizeOptions::default()
        };
        opts.fusion.enabled = !self.no_fuse;
        opts.fusion.disabled_rules = self.disable_rules.clone();
        opts.fusion.only_rules = self.only_rules.clone();
        for path in &self.rules {
            let src = read_text(path)?;
            let rules = load_rules(&src, &path.display().to_string())
                .map_err(|d| anyhow!("{}", d.render(Some(&src)).trim_end()))?;
            opts.fusion.extra_rules.extend(rules);
        }
        Ok(opts)
    }
}

#[derive(Args)]
struct OptArgs {
    /// The model (.tir).
    file: PathBuf,
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
}

#[derive(Args)]
struct RunArgs {
    /// The model (.tir).
    model: PathBuf,
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
    #[command(flatten)]
    fusion: FusionArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Opt(a) => opt(a),
        Command::Run(a) => run(a),
        Command::Demo => demo::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", format!("{e:#}").trim_end());
            ExitCode::FAILURE
        }
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Loads a model; IR diagnostics are rendered with the caret excerpt of the source.
fn load(path: &Path) -> Result<Module> {
    smelt::load_model(path).map_err(|e| match &e {
        smelt::Error::Ir(diags) => {
            let src = std::fs::read(path)
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            anyhow!("{}", diags.render(src.as_deref()).trim_end())
        }
        _ => anyhow!(e),
    })
}

fn opt(a: OptArgs) -> Result<()> {
    let mut module = load(&a.file)?;
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
        if a.print_ir_after_all { Some(&mut dump) } else { None },
    )?;
    for w in &cx.warnings {
        eprintln!("{w}");
    }
    if a.report {
        for r in &cx.fusion_reports {
            eprint!("{}", r.to_text());
        }
    }
    print!("{after_all}");
    match &a.output {
        Some(out) => text::write_module(&module, out, &print_opts)
            .with_context(|| format!("cannot write {}", out.display()))?,
        None if !a.print_ir_after_all => print!("{}", text::print(&module, &print_opts)),
        None => {}
    }
    Ok(())
}

/// Parses `NAME=FILE.npy` arguments into tensors by name.
fn read_inputs(args: &[String]) -> Result<Vec<(String, Tensor)>> {
    args.iter()
        .map(|arg| {
            let (name, file) = arg
                .split_once('=')
                .ok_or_else(|| anyhow!("--input '{arg}' must look like NAME=FILE.npy"))?;
            let bytes = std::fs::read(file).with_context(|| format!("cannot read {file}"))?;
            let t = smelt::npy::decode(&bytes).map_err(|e| anyhow!("{file}: {e}"))?;
            Ok((name.to_string(), t))
        })
        .collect()
}

fn run(a: RunArgs) -> Result<()> {
    let module = load(&a.model)?;
    let func = module
        .entry()
        .ok_or_else(|| anyhow!("{}: no function @main, and more than one function", a.model.display()))?;
    let mut given = read_inputs(&a.inputs)?;
    for (name, _) in &given {
        if !func.params.iter().any(|p| &p.name == name) {
            let known: Vec<_> = func.params.iter().map(|p| format!("%{}", p.name)).collect();
            bail!("@{} has no parameter %{name} (parameters: {})", func.name, known.join(", "));
        }
    }
    let mut inputs = Vec::new();
    for (i, p) in func.params.iter().enumerate() {
        let t = match given.iter().position(|(n, _)| n == &p.name) {
            Some(k) => given.swap_remove(k).1,
            None => match a.random_inputs {
                Some(seed) => Tensor::new(
                    p.ty.dims.clone(),
                    smelt::ir::weights::random_f32(seed + i as u64, p.ty.num_elements(), -1.0, 1.0),
                )
                .map_err(|e| anyhow!(e))?,
                None => bail!(
                    "missing input %{}: {} (pass --input {}=FILE.npy, or --random-inputs SEED)",
                    p.name,
                    p.ty,
                    p.name
                ),
            },
        };
        if t.ty.dims != p.ty.dims {
            bail!("input %{} must have shape {}, the .npy file has {:?}", p.name, p.ty, t.ty.dims);
        }
        inputs.push(t.to_layout(p.ty.layout));
    }
    let outputs = if a.interp {
        interp::run(&module, func, &inputs).map_err(|d| anyhow!("{d}"))?
    } else {
        let opts = a.fusion.options(None)?;
        let (exe, _) = smelt::compile(&module, &opts)?;
        exe.run(&inputs)?
    };
    std::fs::create_dir_all(&a.output_dir)
        .with_context(|| format!("cannot create {}", a.output_dir.display()))?;
    for (r, t) in func.results.iter().zip(&outputs) {
        let path = a.output_dir.join(smelt::npy::file_name_for(&r.name));
        std::fs::write(&path, smelt::npy::encode(t))
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("{} {} -> {}", r.name, t.ty, path.display());
    }
    Ok(())
}
