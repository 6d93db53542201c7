//! What a loaded rule must satisfy: variables bound, appliers well-formed, operand counts
//! from the op table; and the post-op an elementwise root becomes.

use smelt_ir::diag::Diagnostic;
use smelt_ir::op::{Arity, Op, Role};

use super::{AttrSpec, GuardArg, GuardKind, PatternExpr, Rule, RuleAction};
use crate::fusion::lang::OpKind;

/// The operands a kind takes, from the op table (`None`: `fused`, not checked in patterns).
pub(super) fn kind_arity(kind: OpKind) -> Option<Arity> {
    kind.arity()
}

/// The elementwise operator at a pattern root, as a post-op of a fused op, if it is one.
pub fn elementwise_kind(kind: OpKind) -> bool {
    kind.role() == Role::Elementwise
}

/// Checks a parsed rule: variables bound, appliers well-formed.
pub(super) fn check_rule(rule: &Rule) -> Result<(), Diagnostic> {
    let err = |m: String| Diagnostic::error("rule-unbound", m, rule.location.clone());
    for (i, lhs) in rule.lhs.iter().enumerate() {
        if matches!(lhs, PatternExpr::Var(_)) {
            return Err(Diagnostic::error(
                "rule-syntax",
                format!(
                    "rule '{}': a left-hand side must be an op, not a bare variable",
                    rule.name
                ),
                rule.location.clone(),
            ));
        }
        if has_template(lhs) {
            return Err(Diagnostic::error(
                "rule-syntax",
                format!(
                    "rule '{}': attribute values from `?variables` are for right-hand sides \
                     (a left-hand side binds an op's attributes with `op[?a]`)",
                    rule.name
                ),
                rule.location.clone(),
            ));
        }
        let bound = lhs.vars();
        let mut needed: Vec<String> = Vec::new();
        match &rule.action {
            RuleAction::Rewrite(rhs) => {
                needed.extend(rhs.vars());
                if let Some(kind) = any_attrs(rhs) {
                    return Err(Diagnostic::error(
                        "rule-syntax",
                        format!(
                            "rule '{}': right-hand side op '{}' needs its attributes: bind them \
                             in the left-hand side ({}[?a] ...) and write {}[?a]",
                            rule.name,
                            kind.name(),
                            kind.name(),
                            kind.name()
                        ),
                        rule.location.clone(),
                    ));
                }
            }
            RuleAction::Absorb { into } => {
                needed.push(into.clone());
                let PatternExpr::Op { kind, children, .. } = lhs else {
                    unreachable!("checked above")
                };
                if !elementwise_kind(*kind) {
                    return Err(Diagnostic::error(
                        "rule-syntax",
                        format!(
                            "rule '{}': `apply absorb` needs an elementwise op at the \
                             left-hand side root, found '{}'",
                            rule.name,
                            kind.name()
                        ),
                        rule.location.clone(),
                    ));
                }
                if !children
                    .iter()
                    .any(|c| matches!(c, PatternExpr::Var(v) if v == into))
                {
                    return Err(Diagnostic::error(
                        "rule-syntax",
                        format!(
                            "rule '{}': {into} must be an operand of the left-hand side root",
                            rule.name
                        ),
                        rule.location.clone(),
                    ));
                }
            }
        }
        for g in &rule.guards {
            for a in &g.args {
                if let GuardArg::Var(v) = a {
                    needed.push(v.clone());
                }
            }
        }
        needed.extend(rule.vars.iter().flat_map(|d| d.names.iter().cloned()));
        // Guards on attributes vs on tensors: `unpadded` reads conv attributes, every
        // other guard a tensor value, and a guard on the wrong kind would never hold.
        let attr_vars = attribute_vars(lhs);
        for g in &rule.guards {
            for a in &g.args {
                let GuardArg::Var(v) = a else { continue };
                let on_attrs = attr_vars.contains(v);
                let wants_attrs = g.kind == GuardKind::Unpadded;
                if bound.contains(v) && on_attrs != wants_attrs {
                    let what = if on_attrs {
                        format!("{v} is an op's attributes (bound in brackets, `op[{v}]`), not a tensor")
                    } else {
                        format!("{v} is a tensor, not an op's attributes (`conv2d[{v}]`)")
                    };
                    return Err(Diagnostic::error(
                        "rule-guard",
                        format!(
                            "rule '{}': guard `{}` cannot hold: {what}",
                            rule.name,
                            g.kind.name()
                        ),
                        rule.location.clone(),
                    ));
                }
            }
        }
        if let Some(v) = needed.iter().find(|v| !bound.contains(v)) {
            let which = if rule.lhs.len() > 1 {
                format!("left-hand side {}", i + 1)
            } else {
                "the left-hand side".to_string()
            };
            return Err(err(format!(
                "rule '{}' uses {v}, which {which} does not bind",
                rule.name
            )));
        }
    }
    Ok(())
}

/// The variables bound to attributes (`op[?a]`) in `p`.
fn attribute_vars(p: &PatternExpr) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(p: &PatternExpr, out: &mut Vec<String>) {
        if let PatternExpr::Op {
            attrs, children, ..
        } = p
        {
            if let AttrSpec::Var(v) = attrs {
                out.push(v.clone());
            }
            for c in children {
                walk(c, out);
            }
        }
    }
    walk(p, &mut out);
    out
}

/// Whether `p` spells attributes with `?variable` values anywhere.
fn has_template(p: &PatternExpr) -> bool {
    match p {
        PatternExpr::Var(_) => false,
        PatternExpr::Op {
            attrs, children, ..
        } => matches!(attrs, AttrSpec::Template { .. }) || children.iter().any(has_template),
    }
}

fn any_attrs(p: &PatternExpr) -> Option<OpKind> {
    match p {
        PatternExpr::Var(_) => None,
        PatternExpr::Op {
            kind,
            attrs,
            children,
        } => {
            if *attrs == AttrSpec::Any {
                return Some(*kind);
            }
            children.iter().find_map(any_attrs)
        }
    }
}

/// The post-op an elementwise op becomes.
pub fn post_op_of(op: &Op, acc_is_lhs: bool) -> Option<smelt_ir::op::PostOp> {
    match op {
        Op::Unary(u) => Some(smelt_ir::op::PostOp::Unary(*u)),
        Op::Binary(b) => Some(smelt_ir::op::PostOp::Binary {
            op: *b,
            acc_is_lhs: acc_is_lhs || b.is_commutative(),
        }),
        _ => None,
    }
}
