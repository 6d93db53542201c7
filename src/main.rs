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
    /// Build a small ResNet-style network in code and show every stage working on it.
    Demo,
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Opt(a) => cli::opt::main(a),
        Command::Run(a) => cli::run::main(a),
        Command::Import(a) => cli::import::main(a),
        Command::Demo => cli::demo::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", format!("{e:#}").trim_end());
            ExitCode::FAILURE
        }
    }
}
