//! Deep graphs must not overflow the stack: a chain of 100 000 relus goes through every
//! stage — build, verify, print, parse, interpreter, each pass of the pipeline,
//! lowering, compile and run — on a thread with a 2 MiB stack (what Rust gives test
//! threads and many hosts give their workers), so any recursion over graph depth shows.
//!
//! A stack overflow aborts the whole process, so each stage runs in a child process (this
//! same test binary, running the ignored `deep_stage_worker` test) and the parent reports
//! which stage died and how.

use std::process::Command;

use smelt::OptimizeOptions;
use smelt::{CompileOptions, Executable};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::text::{self, PrintOptions};
use smelt_ir::verify::verify_module;
use smelt_ir::{interp, Module, Op, Tensor, TensorType, UnaryOp};

/// Depth of the chain.
const DEPTH: usize = 100_000;
/// Stack of the thread each stage runs on.
const STACK_BYTES: usize = 2 << 20;
const STAGE_VAR: &str = "SMELT_DEEP_STAGE";

/// `y = relu(relu(...relu(x)))`, `DEPTH` deep, built with the builder.
fn relu_chain() -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "deep");
    let mut v = b.param("x", TensorType::f32([1, 4]));
    for _ in 0..DEPTH {
        v = b.op(Op::Unary(UnaryOp::Relu), &[v]).expect("relu");
    }
    b.finish(&[("y", v)]);
    m
}

fn input() -> Tensor {
    Tensor::new([1, 4], vec![-1.0, 0.5, -3.0, 2.0]).expect("input")
}

fn check_output(out: &[Tensor]) {
    let d = out[0].f32s();
    assert_eq!(d, &[0.0, 0.5, 0.0, 2.0]);
}

fn optimized(passes: &[&str]) -> Module {
    let mut m = relu_chain();
    let opts = OptimizeOptions {
        passes: Some(passes.iter().map(|s| s.to_string()).collect()),
        ..OptimizeOptions::default()
    };
    smelt::optimize(&mut m, &opts, None).expect("optimize");
    verify_module(&m).expect("optimized module verifies");
    m
}

/// Runs one stage; panics (or overflows) on failure.
fn run_stage(stage: &str) {
    match stage {
        "build" => assert_eq!(relu_chain().funcs[0].insts.len(), DEPTH),
        "verify" => {
            verify_module(&relu_chain()).expect("verifies");
        }
        "print" => {
            let text = text::print(&relu_chain(), &PrintOptions::default());
            assert!(text.lines().count() > DEPTH);
        }
        "parse" => {
            let text = text::print(&relu_chain(), &PrintOptions::default());
            let m = text::parse(&text, "deep.tir").expect("parses");
            assert_eq!(m.funcs[0].insts.len(), DEPTH);
        }
        "interp" => {
            let m = relu_chain();
            check_output(&interp::run(&m, &m.funcs[0], &[input()]).expect("runs"));
        }
        "fusion" => {
            optimized(&["fusion"]);
        }
        "const_fold" => {
            optimized(&["const_fold"]);
        }
        "dce" => {
            optimized(&["dce"]);
        }
        "lower" => {
            let m = relu_chain();
            smelt_passes::lower::lower(&m, &m.funcs[0]).expect("lowers");
        }
        "jit" => {
            let m = relu_chain();
            let exe = Executable::compile(
                &m,
                None,
                &CompileOptions {
                    threads: 1,
                    ..CompileOptions::default()
                },
            )
            .expect("compiles");
            check_output(&exe.run(&[input()]).expect("runs"));
        }
        other => panic!("unknown stage {other}"),
    }
}

#[test]
#[ignore = "worker of the deep-graph tests: run in a child process by each of them"]
fn deep_stage_worker() {
    let stage = std::env::var(STAGE_VAR).expect("SMELT_DEEP_STAGE names the stage");
    let handle = std::thread::Builder::new()
        .name(format!("deep-{stage}"))
        .stack_size(STACK_BYTES)
        .spawn(move || run_stage(&stage))
        .expect("spawn");
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Runs `stage` in a child process and fails with its exit status and stderr tail.
fn in_child(stage: &str) {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args([
            "deep_stage_worker",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(STAGE_VAR, stage)
        .output()
        .expect("run the worker");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "stage '{stage}' on a {DEPTH}-deep relu chain with a {} MiB stack failed ({}):\n{}\n{}",
        STACK_BYTES >> 20,
        out.status,
        tail(&stdout),
        tail(&stderr)
    );
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[test]
fn deep_chain_builds() {
    in_child("build");
}

#[test]
fn deep_chain_verifies() {
    in_child("verify");
}

#[test]
fn deep_chain_prints() {
    in_child("print");
}

#[test]
fn deep_chain_parses() {
    in_child("parse");
}

#[test]
fn deep_chain_interprets() {
    in_child("interp");
}

#[test]
fn deep_chain_fuses() {
    in_child("fusion");
}

#[test]
fn deep_chain_const_folds() {
    in_child("const_fold");
}

#[test]
fn deep_chain_dce() {
    in_child("dce");
}

#[test]
fn deep_chain_lowers() {
    in_child("lower");
}

#[test]
fn deep_chain_compiles_and_runs() {
    in_child("jit");
}
