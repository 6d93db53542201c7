//! The verifier: type, shape and SSA checks of modules, reported as diagnostics.
//!
//! Every function is checked for: parameters and results with unique, non-empty names;
//! types that are not absurd (size checked before anything else looks at them) and
//! layouts that fit their rank; operands defined before use (the body is a topological
//! order); operand counts; `const` ops naming existing weights; fused ops anchored on an
//! anchor op with one extra operand per binary post-op; and every instruction's recorded
//! type equal to what its op's type rule ([`Op::infer_type`]) gives.

use std::collections::BTreeSet;

use crate::diag::{Diagnostic, Diagnostics, Location};
use crate::graph::{Func, Module};
use crate::op::Op;
use crate::types::{Layout, TensorType};

/// At most this many errors are reported per module; more would only be noise.
pub const MAX_VERIFY_ERRORS: usize = 50;

struct Report {
    errors: Vec<Diagnostic>,
    warnings: Vec<Diagnostic>,
}

impl Report {
    fn error(&mut self, code: &'static str, message: String, loc: &Location) {
        if self.errors.len() < MAX_VERIFY_ERRORS {
            self.errors
                .push(Diagnostic::error(code, message, loc.clone()));
        }
    }

    fn into_result(self) -> Result<Vec<Diagnostic>, Diagnostics> {
        if self.errors.is_empty() {
            Ok(self.warnings)
        } else {
            Err(Diagnostics(self.errors))
        }
    }
}

/// Checks every function of `m`. Returns the warnings when there is no error.
pub fn verify_module(m: &Module) -> Result<Vec<Diagnostic>, Diagnostics> {
    let mut r = Report {
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let mut names = BTreeSet::new();
    for f in &m.funcs {
        if f.name.is_empty() {
            r.error(
                "duplicate-name",
                "a function has an empty name".into(),
                &f.loc,
            );
        } else if !names.insert(f.name.as_str()) {
            r.error(
                "duplicate-name",
                format!("function @{} is defined twice", f.name),
                &f.loc,
            );
        }
        check_func(m, f, &mut r);
    }
    r.into_result()
}

/// Checks one function of `m`. Returns the warnings when there is no error.
pub fn verify_func(m: &Module, f: &Func) -> Result<Vec<Diagnostic>, Diagnostics> {
    let mut r = Report {
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    check_func(m, f, &mut r);
    r.into_result()
}

/// A type's size and layout, checked before anything uses its dimensions.
fn check_type(t: &TensorType) -> Result<(), (&'static str, String)> {
    t.check_size().map_err(|m| ("too-large", m))?;
    if let Layout::Blocked { axis, block } = t.layout {
        if axis as usize >= t.rank() || block == 0 {
            return Err((
                "bad-type",
                format!(
                    "layout blocked<{axis},{block}> does not fit a rank-{} tensor",
                    t.rank()
                ),
            ));
        }
    }
    Ok(())
}

fn check_func(m: &Module, f: &Func, r: &mut Report) {
    let mut param_names = BTreeSet::new();
    for p in &f.params {
        if p.name.is_empty() {
            r.error(
                "redefined-value",
                format!("function @{} has a parameter with an empty name", f.name),
                &f.loc,
            );
        } else if !param_names.insert(p.name.as_str()) {
            r.error(
                "redefined-value",
                format!("parameter %{} of @{} is defined twice", p.name, f.name),
                &f.loc,
            );
        }
        if let Err((code, msg)) = check_type(&p.ty) {
            r.error(code, format!("parameter %{}: {msg}", p.name), &f.loc);
        }
    }
    // Values whose type may be used by later checks (defined and not absurd).
    let mut usable: Vec<bool> = f.params.iter().map(|p| check_type(&p.ty).is_ok()).collect();
    for i in 0..f.insts.len() {
        let ok = check_inst(m, f, i, &usable, r);
        usable.push(ok);
    }
    let mut result_names = BTreeSet::new();
    for (i, res) in f.results.iter().enumerate() {
        if res.name.is_empty() {
            r.error(
                "duplicate-name",
                format!("result {i} of @{} has an empty name", f.name),
                &f.loc,
            );
        } else if !result_names.insert(res.name.as_str()) {
            r.error(
                "duplicate-name",
                format!("result name \"{}\" of @{} is used twice", res.name, f.name),
                &f.loc,
            );
        }
        if res.value.index() >= f.num_values() {
            r.error(
                "undefined-value",
                format!(
                    "result {i} of @{} refers to value {}, which does not exist",
                    f.name, res.value.0
                ),
                &f.loc,
            );
        }
    }
    if f.results.is_empty() {
        r.warnings.push(Diagnostic::warning(
            "no-results",
            format!("function @{} returns nothing", f.name),
            f.loc.clone(),
        ));
    }
}

/// Checks instruction `i`; returns whether its result type can be trusted by later checks.
fn check_inst(m: &Module, f: &Func, i: usize, usable: &[bool], r: &mut Report) -> bool {
    let inst = &f.insts[i];
    let loc = &inst.loc;
    let name = inst.op.name();
    if let Err((code, msg)) = check_type(&inst.ty) {
        r.error(code, format!("result of '{name}': {msg}"), loc);
        return false;
    }
    let defined_before = f.params.len() + i;
    let mut operands_ok = true;
    for (k, v) in inst.operands.iter().enumerate() {
        if v.index() >= defined_before {
            let why = if v.index() < f.num_values() {
                "which is defined later (the body must be in definition order)"
            } else {
                "which does not exist"
            };
            r.error(
                "undefined-value",
                format!("operand {k} of '{name}' is value {}, {why}", v.0),
                loc,
            );
            operands_ok = false;
        } else if !usable[v.index()] {
            // Its definition already has an error; do not pile on.
            operands_ok = false;
        }
    }
    if !operands_ok {
        return false;
    }
    if !inst.op.arity().accepts(inst.operands.len()) {
        r.error(
            "wrong-arity",
            format!(
                "'{name}' takes {} operands, got {}",
                inst.op.arity(),
                inst.operands.len()
            ),
            loc,
        );
        return false;
    }
    if let Op::Const(id) = &inst.op {
        if m.weights.get(*id).is_none() {
            r.error(
                "unknown-weight",
                format!("'const' reads weight {}, which does not exist", id.0),
                loc,
            );
            return false;
        }
    }
    if let Op::Fused(fused) = &inst.op {
        if !fused.anchor.is_anchor() {
            r.error(
                "bad-fused-op",
                format!("'{}' cannot anchor a fused op", fused.anchor.name()),
                loc,
            );
            return false;
        }
    }
    let types: Vec<&TensorType> = inst.operands.iter().map(|v| f.type_of(*v)).collect();
    match inst.op.infer_type(&types, &|id| m.weights.type_of(id)) {
        Err(msg) => {
            r.error("type-mismatch", msg, loc);
            false
        }
        Ok(t) if t != inst.ty => {
            r.error(
                "type-mismatch",
                format!("'{name}' gives {t}, but its recorded type is {}", inst.ty),
                loc,
            );
            // Later uses are checked against the recorded type.
            true
        }
        Ok(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::FuncBuilder;
    use crate::graph::{FuncResult, Inst, Value};
    use crate::op::{BinaryOp, FusedOp, PostOp, UnaryOp};
    use crate::types::TensorType;

    fn small() -> Module {
        let mut m = Module::default();
        let mut b = FuncBuilder::new(&mut m, "f");
        let x = b.param("x", TensorType::f32([2, 3]));
        let y = b.op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        let z = b.op(Op::Binary(BinaryOp::Add), &[y, x]).unwrap();
        b.finish(&[("z", z)]);
        m
    }

    #[test]
    fn built_module_verifies() {
        assert_eq!(verify_module(&small()).unwrap(), vec![]);
    }

    #[test]
    fn use_before_definition_is_reported() {
        let mut m = small();
        m.funcs[0].insts[0].operands = vec![Value(2)];
        let e = verify_module(&m).unwrap_err();
        assert_eq!(e.0[0].code, "undefined-value");
        assert!(
            e.0[0].message.contains("defined later"),
            "{}",
            e.0[0].message
        );
    }

    #[test]
    fn recorded_type_must_match_the_rule() {
        let mut m = small();
        m.funcs[0].insts[1].ty = TensorType::f32([3, 2]);
        let e = verify_module(&m).unwrap_err();
        assert_eq!(e.0.len(), 1);
        assert_eq!(e.0[0].code, "type-mismatch");
    }

    #[test]
    fn absurd_types_are_rejected_before_use() {
        let mut m = small();
        m.funcs[0].params[0].ty = TensorType::f32([999_999_999, 999_999_999]);
        let e = verify_module(&m).unwrap_err();
        assert_eq!(e.0[0].code, "too-large");
        // the instructions using the parameter are not checked against a bogus type
        assert_eq!(e.0.len(), 1, "{e}");
    }

    #[test]
    fn wrong_arity_missing_weight_and_fused_checks() {
        let mut m = small();
        let f = &mut m.funcs[0];
        f.insts[0].operands = vec![];
        f.insts.push(Inst {
            op: Op::Const(crate::weights::WeightId(9)),
            operands: vec![],
            ty: TensorType::f32([1]),
            loc: Location::Unknown,
        });
        f.insts.push(Inst {
            op: Op::Fused(FusedOp {
                anchor: Box::new(Op::Unary(UnaryOp::Relu)),
                post_ops: vec![PostOp::Unary(UnaryOp::Relu)],
            }),
            operands: vec![Value(0)],
            ty: TensorType::f32([2, 3]),
            loc: Location::Unknown,
        });
        let codes: Vec<&str> = verify_module(&m)
            .unwrap_err()
            .0
            .iter()
            .map(|d| d.code)
            .collect();
        assert_eq!(codes, vec!["wrong-arity", "unknown-weight", "bad-fused-op"]);
    }

    #[test]
    fn result_names_are_unique_and_values_exist() {
        let mut m = small();
        let f = &mut m.funcs[0];
        f.results.push(FuncResult {
            name: "z".into(),
            value: Value(40),
        });
        let codes: Vec<&str> = verify_module(&m)
            .unwrap_err()
            .0
            .iter()
            .map(|d| d.code)
            .collect();
        assert_eq!(codes, vec!["duplicate-name", "undefined-value"]);
    }

    #[test]
    fn no_results_is_a_warning() {
        let mut m = small();
        m.funcs[0].results.clear();
        let w = verify_module(&m).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].code, "no-results");
    }
}
