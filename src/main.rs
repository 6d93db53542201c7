//! The `smelt` command line: import, optimize, run and demonstrate the fusion compiler.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    Opt(cli::opt::OptArgs),
    /// Compile a model and run it on inputs from .npy files; write each result as .npy.
    Run(cli::run::RunArgs),
    /// Convert an ONNX model to smelt's text IR.
    Import(cli::import::ImportArgs),
    /// Check the fused model against the unfused one (interpreter and JIT); per layer; bisect.
    Verify(cli::verify::VerifyArgs),
    /// Time a model (file or built-in: resnet18, resnet50, tail:C,HW): latency, GFLOP/s, compile time.
    Bench(cli::bench::BenchArgs),
    /// Check fusion rules numerically (built-in, or those of FILE); exit 1 if one is unsound.
    CheckRules(cli::check_rules::CheckRulesArgs),
    /// Explain fusion: what fused (rules, merged ops), what a guard refused and why, what lost in extraction.
    Explain(cli::explain::ExplainArgs),
    /// Write Graphviz DOT of a model's graph, as loaded or after fusion (--fused).
    Dot(cli::dot::DotArgs),
    /// Build a small ResNet-style network in code and show every stage working on it.
    Demo(cli::demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help`, `--version` and usage errors: clap's own `exit` would panic on a
        // stdout it cannot write, so the text is printed here, like any other output.
        Err(e) => {
            return match e.print() {
                Ok(()) => ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)),
                Err(w) if w.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::FAILURE,
                Err(w) => {
                    cli::out::stderr(format_args!("{}\n", cli::out::WriteFailed(w)));
                    ExitCode::FAILURE
                }
            };
        }
    };
    let result = match cli.command {
        Command::Opt(a) => cli::opt::main(a),
        Command::Run(a) => cli::run::main(a),
        Command::Import(a) => cli::import::main(a),
        Command::Verify(a) => cli::verify::main(a),
        Command::Bench(a) => cli::bench::main(a),
        Command::CheckRules(a) => cli::check_rules::main(a),
        Command::Explain(a) => cli::explain::main(a),
        Command::Dot(a) => cli::dot::main(a),
        Command::Demo(a) => cli::demo::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that closed the pipe wants no more output, not a message about it.
        Err(e)
            if e.downcast_ref::<cli::out::WriteFailed>()
                .is_some_and(|w| w.is_closed_pipe()) =>
        {
            ExitCode::FAILURE
        }
        Err(e) => {
            cli::out::stderr(format_args!("{}\n", error_text(&e)));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, skipping causes whose text the message already contains
/// (smelt's errors often quote their source, e.g. `path: No such file or directory`).
fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text.trim_end().to_string()
}
