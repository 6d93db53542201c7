//! The canonical printer: parameter names kept, every other value renumbered `%0, %1, …`,
//! weights in id order before the functions, attributes in a fixed order per op.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use super::attrs::{op_attrs, print_dict, unary_attrs};
use super::lexer::is_bare_name_char;
use super::PrintOptions;
use crate::diag::{quote, Location};
use crate::graph::{Func, Module, Value};
use crate::op::{Op, PostOp};
use crate::tensor::Tensor;
use crate::types::{Layout, F32};
use crate::weights::{Weight, WeightId, WeightOrigin, SMALL_CONSTANT_LIMIT};

/// Weights to print as `external<file, key>` instead of by their origin (set by
/// `write_module` for computed weights that go to the sidecar).
pub(crate) type ExternalOverrides = BTreeMap<WeightId, (String, String)>;

/// `%name` / `@name` spelling: bare when every character allows it, quoted otherwise.
pub(crate) fn sigil_name(sigil: char, name: &str) -> String {
    if !name.is_empty() && name.chars().all(is_bare_name_char) {
        format!("{sigil}{name}")
    } else {
        format!("{sigil}{}", quote(name))
    }
}

/// A result name in a signature: bare when it is an identifier, quoted otherwise.
fn result_name(name: &str) -> String {
    let mut chars = name.chars();
    let ident = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident {
        name.to_string()
    } else {
        quote(name)
    }
}

/// The logical elements of an f32 weight in row-major order.
fn logical_values(w: &Weight) -> Vec<f32> {
    match w.ty.layout {
        Layout::RowMajor => w.f32s().to_vec(),
        Layout::Blocked { .. } => Tensor {
            ty: w.ty.clone(),
            data: w.f32s().to_vec().into(),
        }
        .f32s_row_major(),
    }
}

fn dense(w: &Weight) -> String {
    if let Some(values) = w.elements().and_then(|e| e.to_i64s()) {
        // Integer and i1 weights are row-major integer lists (ids, masks, shapes).
        return match values.first() {
            Some(first) if values.iter().all(|v| v == first) => format!("dense<{first}>"),
            _ => {
                let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
                format!("dense<[{}]>", items.join(", "))
            }
        };
    }
    let values = match w.elements() {
        // f16 and bf16 weights print their exact f32 values, which parse back to them
        Some(e) if w.ty.dtype.is_narrow_float() => e.to_f32s().unwrap_or_default(),
        _ => logical_values(w),
    };
    match values.first() {
        Some(first) if values.iter().all(|v| v.to_bits() == first.to_bits()) => {
            format!("dense<{}>", F32(*first))
        }
        _ => {
            let items: Vec<String> = values.iter().map(|v| F32(*v).to_string()).collect();
            format!("dense<[{}]>", items.join(", "))
        }
    }
}

/// The initializer on the right of `const @w : T = `.
fn weight_init(id: WeightId, w: &Weight, opts: &PrintOptions, ext: &ExternalOverrides) -> String {
    if opts.elide_weights && w.ty.num_elements() > SMALL_CONSTANT_LIMIT {
        return format!("elided<\"{:016x}\">", w.content_hash());
    }
    if let Some((file, key)) = ext.get(&id) {
        return format!("external<{}, {}>", quote(file), quote(key));
    }
    match &w.origin {
        WeightOrigin::Inline | WeightOrigin::Computed => dense(w),
        WeightOrigin::Random { seed, min, max } => format!(
            "random<seed = {seed}, min = {}, max = {}>",
            F32(*min),
            F32(*max)
        ),
        WeightOrigin::External { file, key } => {
            format!("external<{}, {}>", quote(file), quote(key))
        }
    }
}

/// Prints a whole module.
pub(crate) fn print_module(m: &Module, opts: &PrintOptions, ext: &ExternalOverrides) -> String {
    let mut out = String::new();
    for (id, w) in m.weights.iter() {
        let _ = writeln!(
            out,
            "const {} : {} = {}",
            sigil_name('@', &w.name),
            w.ty,
            weight_init(id, w, opts, ext)
        );
    }
    for f in &m.funcs {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&print_func(m, f, opts));
    }
    out
}

/// Names of every value of `f` as printed: parameters verbatim, the rest numbered in
/// order, skipping numbers that a parameter already uses as its name.
fn value_names(f: &Func) -> Vec<String> {
    let taken: BTreeSet<&str> = f.params.iter().map(|p| p.name.as_str()).collect();
    let mut names: Vec<String> = f.params.iter().map(|p| sigil_name('%', &p.name)).collect();
    let mut next = 0usize;
    for _ in &f.insts {
        while taken.contains(next.to_string().as_str()) {
            next += 1;
        }
        names.push(format!("%{next}"));
        next += 1;
    }
    names
}

fn loc_suffix(loc: &Location, opts: &PrintOptions) -> String {
    if opts.print_loc {
        format!(" loc({loc})")
    } else {
        String::new()
    }
}

/// Prints one function (weights are printed by [`print_module`]).
pub(crate) fn print_func(m: &Module, f: &Func, opts: &PrintOptions) -> String {
    let names = value_names(f);
    let name = |v: Value| -> String {
        names
            .get(v.index())
            .cloned()
            .unwrap_or_else(|| format!("%<undefined {}>", v.0))
    };
    let ty = |v: Value| -> String {
        match f.def(v) {
            Some(_) => f.type_of(v).to_string(),
            None => "tensor<?>".to_string(),
        }
    };
    let mut out = String::new();
    let params: Vec<String> = f
        .params
        .iter()
        .map(|p| format!("{}: {}", sigil_name('%', &p.name), p.ty))
        .collect();
    let default_names = f
        .results
        .iter()
        .enumerate()
        .all(|(i, r)| r.name == format!("result{i}"));
    let sig = if default_names {
        let tys: Vec<String> = f.results.iter().map(|r| ty(r.value)).collect();
        if tys.len() == 1 {
            tys[0].clone()
        } else {
            format!("({})", tys.join(", "))
        }
    } else {
        let items: Vec<String> = f
            .results
            .iter()
            .map(|r| format!("{}: {}", result_name(&r.name), ty(r.value)))
            .collect();
        format!("({})", items.join(", "))
    };
    let _ = writeln!(
        out,
        "func {}({}) -> {sig}{} {{",
        sigil_name('@', &f.name),
        params.join(", "),
        loc_suffix(&f.loc, opts)
    );
    for (i, inst) in f.insts.iter().enumerate() {
        let operands: Vec<String> = inst.operands.iter().map(|v| name(*v)).collect();
        let body = match &inst.op {
            Op::Const(id) => {
                let w = m
                    .weights
                    .get(*id)
                    .map(|w| sigil_name('@', &w.name))
                    .unwrap_or_else(|| format!("@<missing weight {}>", id.0));
                format!("const {w}")
            }
            Op::Fused(fused) => {
                let n_anchor = operands.len().saturating_sub(fused.num_post_operands());
                let mut extra = operands[n_anchor..].iter();
                let posts: Vec<String> = fused
                    .post_ops
                    .iter()
                    .map(|p| match p {
                        PostOp::Unary(u) => format!("{}{}", u.name(), print_dict(&unary_attrs(*u))),
                        PostOp::Binary { op, acc_is_lhs } => {
                            let v = extra.next().cloned().unwrap_or_else(|| "%?".into());
                            if *acc_is_lhs {
                                format!("{}(_, {v})", op.name())
                            } else {
                                format!("{}({v}, _)", op.name())
                            }
                        }
                    })
                    .collect();
                format!(
                    "fused {}{}{} post [{}]",
                    fused.anchor.name(),
                    operand_list(&operands[..n_anchor]),
                    print_dict(&op_attrs(&fused.anchor, inst.ty.rank())),
                    posts.join(", ")
                )
            }
            op => format!(
                "{}{}{}",
                op.name(),
                operand_list(&operands),
                print_dict(&op_attrs(op, inst.ty.rank()))
            ),
        };
        let _ = writeln!(
            out,
            "  {} = {body} : {}{}",
            name(f.inst_value(i)),
            inst.ty,
            loc_suffix(&inst.loc, opts)
        );
    }
    if f.results.is_empty() {
        out.push_str("  return\n");
    } else {
        let vals: Vec<String> = f.results.iter().map(|r| name(r.value)).collect();
        let tys: Vec<String> = f.results.iter().map(|r| ty(r.value)).collect();
        let _ = writeln!(out, "  return {} : {}", vals.join(", "), tys.join(", "));
    }
    out.push_str("}\n");
    out
}

fn operand_list(operands: &[String]) -> String {
    if operands.is_empty() {
        String::new()
    } else {
        format!(" {}", operands.join(", "))
    }
}
