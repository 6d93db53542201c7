//! Graphviz DOT of a module's functions, written by hand and deterministic: one node per
//! parameter, op and result; fused ops list their post-ops and the user names of the ops
//! they merge; `const` ops are small dashed boxes naming their weight.

use std::fmt::Write as _;

use smelt_ir::diag::Location;
use smelt_ir::graph::{Func, Module};
use smelt_ir::op::{Op, PostOp};
use smelt_ir::types::TensorType;

/// Quotes `s` as a DOT string (`\n` in `s` stays a line break of the label).
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `1x8x10x10 f32` (the type without the `tensor<>` wrapper).
fn short_type(t: &TensorType) -> String {
    let s = t.to_string();
    s.strip_prefix("tensor<")
        .and_then(|x| x.strip_suffix('>'))
        .map_or(s.clone(), str::to_string)
}

/// The post-op list of a fused op: `add(_, %skip), relu`-style names without operands.
fn post_ops_text(posts: &[PostOp]) -> String {
    posts
        .iter()
        .map(|p| match p {
            PostOp::Unary(u) => u.name().to_string(),
            PostOp::Binary { op, acc_is_lhs } => {
                if *acc_is_lhs {
                    format!("{}(acc, y)", op.name())
                } else {
                    format!("{}(y, acc)", op.name())
                }
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lines naming where an op comes from: one per merged op for a fused location.
fn location_lines(loc: &Location) -> Vec<String> {
    match loc {
        Location::Unknown => Vec::new(),
        Location::Fused(parts) => parts.iter().map(|p| format!("  {p}")).collect(),
        other => vec![other.to_string()],
    }
}

fn write_func(out: &mut String, module: &Module, func: &Func, prefix: &str) {
    let id = |v: usize| format!("{prefix}v{v}");
    let n_params = func.params.len();
    for (i, p) in func.params.iter().enumerate() {
        let label = format!("%{}\n{}", p.name, short_type(&p.ty));
        let _ = writeln!(out, "  {} [shape=oval, label={}];", id(i), quoted(&label));
    }
    for (i, inst) in func.insts.iter().enumerate() {
        let v = n_params + i;
        let ty = short_type(&inst.ty);
        let (attrs, label) = match &inst.op {
            Op::Const(w) => {
                let name = module
                    .weights
                    .get(*w)
                    .map_or_else(|| format!("weight {}", w.0), |w| w.name.clone());
                (
                    "shape=box, style=dashed, fontsize=9",
                    format!("%{i} = const @{name}\n{ty}"),
                )
            }
            Op::Fused(f) => {
                let mut label = format!(
                    "%{i} = fused {}\npost [{}]\n{ty}",
                    f.anchor.name(),
                    post_ops_text(&f.post_ops)
                );
                let merged = location_lines(&inst.loc);
                if !merged.is_empty() {
                    label.push_str("\nmerges:");
                    for m in merged {
                        label.push('\n');
                        label.push_str(&m);
                    }
                }
                (
                    "shape=box, style=\"rounded,filled\", fillcolor=lightblue",
                    label,
                )
            }
            other => {
                let mut label = format!("%{i} = {}\n{ty}", other.name());
                for m in location_lines(&inst.loc) {
                    label.push('\n');
                    label.push_str(&m);
                }
                ("shape=box, style=rounded", label)
            }
        };
        let _ = writeln!(out, "  {} [{attrs}, label={}];", id(v), quoted(&label));
    }
    for (r, result) in func.results.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {prefix}r{r} [shape=doubleoctagon, label={}];",
            quoted(&format!("return {}", result.name))
        );
    }
    for (i, inst) in func.insts.iter().enumerate() {
        let v = n_params + i;
        let post_from = match &inst.op {
            Op::Fused(f) => inst.operands.len().saturating_sub(f.num_post_operands()),
            _ => inst.operands.len(),
        };
        for (k, operand) in inst.operands.iter().enumerate() {
            let style = if k >= post_from {
                " [style=dashed, label=\"post\"]"
            } else {
                ""
            };
            let _ = writeln!(out, "  {} -> {}{style};", id(operand.index()), id(v));
        }
    }
    for (r, result) in func.results.iter().enumerate() {
        let _ = writeln!(out, "  {} -> {prefix}r{r};", id(result.value.index()));
    }
}

/// The module as one DOT digraph; with several functions, each is a cluster.
pub fn to_dot(module: &Module) -> String {
    let mut out = String::new();
    let title = match module.funcs.as_slice() {
        [f] => f.name.clone(),
        _ => "module".to_string(),
    };
    let _ = writeln!(out, "digraph {} {{", quoted(&title));
    let _ = writeln!(out, "  rankdir=TB;");
    let _ = writeln!(out, "  node [fontname=\"Helvetica\", fontsize=10];");
    let _ = writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=8];");
    if let [f] = module.funcs.as_slice() {
        write_func(&mut out, module, f, "");
    } else {
        for (i, f) in module.funcs.iter().enumerate() {
            let _ = writeln!(out, "  subgraph {} {{", quoted(&format!("cluster_{i}")));
            let _ = writeln!(out, "  label={};", quoted(&format!("@{}", f.name)));
            write_func(&mut out, module, f, &format!("f{i}_"));
            let _ = writeln!(out, "  }}");
        }
    }
    out.push_str("}\n");
    out
}
