//! `smelt dot`: Graphviz DOT of the thin-path tail before and after fusion is
//! snapshot-tested, well formed (every edge joins declared nodes), deterministic, and the
//! CLI writes the same text to a file with `-o`.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use smelt_ir::text::parse_with;
use smelt_ir::Module;
use smelt_passes::fusion::dot::to_dot;
use smelt_passes::fusion::FusionOptions;
use smelt_passes::{PassContext, PassManager};

const TAIL: &str = "tests/cases/fusion/conv_bn_add_relu_tail.tir";

fn load_tail() -> Module {
    let path = common::root().join(TAIL);
    let src = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let name = path.file_name().expect("a file name").to_string_lossy();
    parse_with(&src, &name, path.parent()).unwrap_or_else(|d| panic!("{d}"))
}

fn fused(module: &Module) -> Module {
    let mut m = module.clone();
    PassManager::default_pipeline(&FusionOptions::default())
        .run(&mut m, &mut PassContext::default())
        .expect("pipeline runs");
    m
}

/// Node ids declared (`  id [..];`) and edge endpoints (`  a -> b ...;`) of DOT text.
fn nodes_and_edges(dot: &str) -> (BTreeSet<String>, Vec<(String, String)>) {
    let mut nodes = BTreeSet::new();
    let mut edges = Vec::new();
    for line in dot.lines().map(str::trim) {
        if let Some((from, rest)) = line.split_once(" -> ") {
            let to = rest.split([' ', ';']).next().expect("a target");
            edges.push((from.to_string(), to.to_string()));
        } else if let Some((id, _)) = line.split_once(" [") {
            if !["node", "edge"].contains(&id) {
                nodes.insert(id.to_string());
            }
        }
    }
    (nodes, edges)
}

fn check_well_formed(dot: &str) {
    assert!(
        dot.starts_with("digraph \"tail\" {\n") && dot.ends_with("}\n"),
        "{dot}"
    );
    let (nodes, edges) = nodes_and_edges(dot);
    assert!(!edges.is_empty());
    for (a, b) in &edges {
        assert!(
            nodes.contains(a) && nodes.contains(b),
            "edge {a} -> {b}:\n{dot}"
        );
    }
}

#[test]
fn dot_of_the_tail_before_and_after_fusion() {
    let module = load_tail();
    let before = to_dot(&module);
    let after = to_dot(&fused(&module));
    check_well_formed(&before);
    check_well_formed(&after);
    // Before: conv, batch_norm, add and relu are separate boxes; after: one fused box
    // naming its post-ops and the four ops it merges, with the shortcut as a post edge.
    for op in ["conv2d", "batch_norm", "add", "relu"] {
        assert!(before.contains(&format!(" = {op}\\n")), "{op}:\n{before}");
    }
    assert_eq!(after.matches("fillcolor=lightblue").count(), 1, "{after}");
    assert!(after.contains("post [add(acc, y), relu]"), "{after}");
    assert_eq!(
        after.matches("conv_bn_add_relu_tail.tir\\\":").count(),
        4,
        "{after}"
    );
    assert_eq!(after.matches("label=\"post\"").count(), 1, "{after}");
    assert_eq!(to_dot(&module), before, "deterministic");
    common::snapshot_settings("dot").bind(|| {
        insta::assert_snapshot!("conv_bn_add_relu_tail.before", before);
        insta::assert_snapshot!("conv_bn_add_relu_tail.after", after);
    });
}

#[test]
fn cli_writes_the_fused_graph_to_a_file() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let out = dir.path().join("tail.dot");
    let run = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args([
            "dot",
            TAIL,
            "--fused",
            "-o",
            out.to_str().expect("utf-8 path"),
        ])
        .current_dir(common::root())
        .output()
        .expect("the smelt binary runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.stdout.is_empty(), "with -o nothing goes to stdout");
    let text = std::fs::read_to_string(&out).expect("the DOT file was written");
    // The CLI names the file as given, so compare structure, not the location text.
    let (nodes, edges) = nodes_and_edges(&text);
    let (want_nodes, want_edges) = nodes_and_edges(&to_dot(&fused(&load_tail())));
    assert_eq!((nodes, edges), (want_nodes, want_edges));
    let plain = Command::new(env!("CARGO_BIN_EXE_smelt"))
        .args(["dot", TAIL])
        .current_dir(common::root())
        .output()
        .expect("the smelt binary runs");
    assert!(plain.status.success());
    let text = String::from_utf8(plain.stdout).expect("utf-8");
    assert!(
        text.contains(" = batch_norm\\n"),
        "unfused by default:\n{text}"
    );
}
