//! Fusion rules as data: the rule-file format, its loader, and the built-in rule file.
//!
//! # Format
//!
//! A rule file is a sequence of lines; `#` starts a comment line. A rule is a block that
//! starts with `rule NAME` and runs until the next `rule` or `family` line:
//!
//! ```text
//! family fold-bn
//!
//! rule fold-bn-into-conv
//!   law  bn(conv(x, w)) = conv(x, w * a, beta - mean * a),  a = gamma / sqrt(var + eps)
//!   lhs  (batch_norm[?eps] (conv2d[?c] ?x ?w) ?g ?b ?m ?v)
//!   rhs  (conv2d[?c] ?x (bn_fold_weight[?eps] ?w ?g ?v) (bn_fold_bias[?eps] ?g ?b ?m ?v))
//!   guard const ?w ?g ?b ?m ?v
//! ```
//!
//! - `family NAME` groups the rules that follow it.
//! - `law TEXT` states the algebraic law the rule relies on (free text, may repeat).
//! - `var ?x ?y: CONSTRAINT... [-- NOTE]` declares variables' constraints, each enforced:
//!   `const` (a compile-time constant), `positive` (every element > 0), `tensor` (any
//!   rank) or `tensor<D,...>` (rank = the number of dimensions; the dimension names and
//!   sizes are for readers, since the checker derives shapes from where a variable sits).
//!   The loader compiles them into guards (`const`, `positive`, `rank`; see [`VarDecl`]),
//!   so the matcher refuses a match that breaks one and every prover assumes them. Free
//!   text goes after `--`; anything else on a `var` line is an error at its token.
//! - `lhs PATTERN` is what to match; several `lhs` lines are alternatives sharing the rest
//!   (e.g. both operand orders of an `add`).
//! - `rhs PATTERN` is what the match equals, or `apply absorb ?y` merges the left-hand
//!   side's root (an elementwise op) into the anchor or fused op producing `?y` as one
//!   more post-op.
//! - `guard NAME ARGS...` is a named predicate that must hold (see [`GuardKind`]).
//!
//! Patterns are s-expressions over op mnemonics; `?name` is a variable. Every op's
//! attributes are one child, written in brackets after the mnemonic: `conv2d[?c]` binds
//! them to `?c`, `clip[min=0, max=6]` spells them out, and a bare `conv2d` matches any
//! attributes (left-hand side only; ops without attributes need no brackets). Spelled-out
//! attributes are read by the IR text form's own schema
//! (`smelt_ir::text::op_from_attributes`): the same keys, types, defaults and required keys
//! as `%y = clip %x {min = 0.0, max = 6.0}`, for every op; omitted keys take their
//! defaults. On a left-hand side the literal matches a payload with the same non-float
//! fields and float fields within a relative tolerance (`super::attr_match`, documented
//! in docs/rules.md), so a constant rounded differently by an exporter still matches.
//! On a right-hand side an attribute may take the value of a constant the left-hand side
//! binds (`layer_norm[axis=2, epsilon=?eps]`, see [`AttrSpec::Template`]). Every variable
//! of the right-hand side and of the guards must be bound by every left-hand side; this is
//! checked when the file is loaded.
//!
//! The rule data model is here; `load` reads a rule file, `pattern` parses its patterns and
//! `validate` checks each rule as it is loaded.

mod load;
mod pattern;
mod validate;

use smelt_ir::diag::Location;

use super::lang::{Attrs, OpKind};

pub use load::{load_rules, MAX_LHS_LINES, MAX_RULES, MAX_RULE_FILE_BYTES, VAR_CONSTRAINTS};
pub use pattern::{fill_template, parse_literal_attrs, parse_pattern, MAX_PATTERN_DEPTH};
pub use validate::{elementwise_kind, post_op_of};

/// The rule file built into smelt.
pub const BUILTIN_RULES: &str = include_str!("../../../rules/builtin.rules");

/// The attributes of an op in a pattern.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrSpec {
    /// Any attributes (left-hand side only).
    Any,
    /// Bound to a variable.
    Var(String),
    /// Spelled out.
    Literal(Attrs),
    /// Spelled out with values read from constants the left-hand side binds
    /// (`layer_norm[axis=2, epsilon=?eps]`; right-hand sides only): when the rule fires,
    /// each `?var` in the text becomes the value of its splat constant, and the text is
    /// read by the same schema as a literal.
    Template {
        /// The attribute text as written, `?var`s included.
        text: String,
        /// The variables it names, in order of appearance.
        holes: Vec<String>,
    },
}

/// A pattern: a variable or an op applied to sub-patterns.
#[derive(Clone, Debug, PartialEq)]
pub enum PatternExpr {
    /// `?name`.
    Var(String),
    /// `(kind[attrs] children...)`.
    Op {
        /// The op.
        kind: OpKind,
        /// Its attributes.
        attrs: AttrSpec,
        /// Its operands.
        children: Vec<PatternExpr>,
    },
}

impl PatternExpr {
    /// Every variable, in first-seen order (attribute variables included).
    pub fn vars(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_vars(&mut out);
        out
    }

    fn collect_vars(&self, out: &mut Vec<String>) {
        match self {
            PatternExpr::Var(v) => {
                if !out.contains(v) {
                    out.push(v.clone());
                }
            }
            PatternExpr::Op {
                attrs, children, ..
            } => {
                let named: &[String] = match attrs {
                    AttrSpec::Var(v) => std::slice::from_ref(v),
                    AttrSpec::Template { holes, .. } => holes,
                    AttrSpec::Any | AttrSpec::Literal(_) => &[],
                };
                for v in named {
                    if !out.contains(v) {
                        out.push(v.clone());
                    }
                }
                for c in children {
                    c.collect_vars(out);
                }
            }
        }
    }
}

impl std::fmt::Display for PatternExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatternExpr::Var(v) => f.write_str(v),
            PatternExpr::Op {
                kind,
                attrs,
                children,
            } => {
                write!(f, "({}", kind.name())?;
                match attrs {
                    AttrSpec::Any => {}
                    AttrSpec::Var(v) => write!(f, "[{v}]")?,
                    AttrSpec::Literal(Attrs::None) => {}
                    AttrSpec::Literal(a) => write!(f, "[{}]", literal_text(*kind, a))?,
                    AttrSpec::Template { text, .. } => write!(f, "[{}]", text.trim())?,
                }
                for c in children {
                    write!(f, " {c}")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// A literal payload as the rule language writes it: the text form's attribute
/// dictionary body (one schema for both).
fn literal_text(kind: OpKind, a: &Attrs) -> String {
    match kind.join(a) {
        Some(op) => smelt_ir::text::attributes_text(&op),
        // a payload the kind cannot take never loads; printed raw for debugging
        None => format!("{a:?}"),
    }
}

/// What a rule does with a match.
#[derive(Clone, Debug, PartialEq)]
pub enum RuleAction {
    /// The match equals this pattern.
    Rewrite(PatternExpr),
    /// Merge the left-hand side's root (an elementwise op) into the anchor or fused op
    /// producing the named variable, as one more post-op.
    Absorb {
        /// The variable bound to the anchor's value.
        into: String,
    },
}

/// The built-in guard predicates. docs/rules.md has the reference (a test fails when a
/// guard here is missing from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardKind {
    /// `const ?a ?b ...`: every argument is known at compile time.
    Const,
    /// `scalar ?c VALUE [TOLERANCE]`: `?c` is a constant whose every element is within
    /// TOLERANCE (relative, default 1e-6) of VALUE.
    Scalar,
    /// `per-channel ?v ?y`: `?v` is a constant with one value per channel of `?y`
    /// (shape `[C]`, `[C,1,1]` or `[1,C,1,1]` against `?y`'s `[N,C,H,W]`); with one
    /// argument, per channel of the matched op's result.
    PerChannel,
    /// `single-consumer ?v`: the value of `?v` has exactly one consumer in the input.
    SingleConsumer,
    /// `rank ?x N`: `?x` has rank N.
    Rank,
    /// `unpadded ?c`: the conv attributes `?c` have no padding.
    Unpadded,
    /// `not-after ?x OP`: `?x` is not computed by an `OP` (another rule covers that case).
    NotAfter,
    /// `positive ?v`: `?v` is a constant whose every element is a number > 0 (on a graph
    /// only a constant's values are known; a computed value is refused). The provers
    /// assume it: the sampler draws `?v` positive, the exact provers over `?v > 0`.
    Positive,
    /// `single-value ?s`: `?s` is a constant of one element (a scalar of any rank whose
    /// dims are all 1), whatever its value; the checker draws it as `[1]`.
    SingleValue,
}

impl GuardKind {
    /// The name used in rule files.
    pub fn name(self) -> &'static str {
        match self {
            GuardKind::Const => "const",
            GuardKind::Scalar => "scalar",
            GuardKind::PerChannel => "per-channel",
            GuardKind::SingleConsumer => "single-consumer",
            GuardKind::Rank => "rank",
            GuardKind::Unpadded => "unpadded",
            GuardKind::NotAfter => "not-after",
            GuardKind::Positive => "positive",
            GuardKind::SingleValue => "single-value",
        }
    }

    /// Every guard.
    pub const ALL: [GuardKind; 9] = [
        GuardKind::Const,
        GuardKind::Scalar,
        GuardKind::PerChannel,
        GuardKind::SingleConsumer,
        GuardKind::Rank,
        GuardKind::Unpadded,
        GuardKind::NotAfter,
        GuardKind::Positive,
        GuardKind::SingleValue,
    ];

    fn from_name(name: &str) -> Option<GuardKind> {
        GuardKind::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// An argument of a guard.
#[derive(Clone, Debug, PartialEq)]
pub enum GuardArg {
    /// A pattern variable.
    Var(String),
    /// A number.
    Number(f64),
    /// An op mnemonic.
    Op(OpKind),
}

/// A named predicate a match must satisfy.
#[derive(Clone, Debug, PartialEq)]
pub struct Guard {
    /// Which predicate.
    pub kind: GuardKind,
    /// Its arguments.
    pub args: Vec<GuardArg>,
}

/// A `var` line: variables and the constraints they are declared with. Each constraint
/// compiles to a guard the loader appends to the rule ([`VarDecl::guards`]): `const` to
/// `guard const`, `positive` to `guard positive`, `tensor<D,...>` to `guard rank`; plain
/// `tensor` constrains nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct VarDecl {
    /// The variables declared (`?g ?b`).
    pub names: Vec<String>,
    /// `const`: a compile-time constant.
    pub constant: bool,
    /// `positive`: every element > 0.
    pub positive: bool,
    /// The dimensions of `tensor<D,...>` as written (`None` for plain `tensor`).
    pub dims: Option<Vec<String>>,
    /// The free text after `--`.
    pub note: String,
}

impl VarDecl {
    /// The guards this declaration stands for.
    pub fn guards(&self) -> Vec<Guard> {
        let vars = || self.names.iter().map(|v| GuardArg::Var(v.clone()));
        let mut out = Vec::new();
        if self.constant {
            out.push(Guard {
                kind: GuardKind::Const,
                args: vars().collect(),
            });
        }
        for v in vars() {
            if self.positive {
                out.push(Guard {
                    kind: GuardKind::Positive,
                    args: vec![v.clone()],
                });
            }
            if let Some(dims) = &self.dims {
                out.push(Guard {
                    kind: GuardKind::Rank,
                    args: vec![v, GuardArg::Number(dims.len() as f64)],
                });
            }
        }
        out
    }
}

impl Rule {
    /// The variables a `positive` guard (or a `var ... positive` line) constrains.
    pub fn positive_vars(&self) -> Vec<String> {
        self.guards
            .iter()
            .filter(|g| g.kind == GuardKind::Positive)
            .flat_map(|g| &g.args)
            .filter_map(|a| match a {
                GuardArg::Var(v) => Some(v.clone()),
                GuardArg::Number(_) | GuardArg::Op(_) => None,
            })
            .collect()
    }
}

/// One fusion rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Unique name, e.g. `fold-bn-into-conv`.
    pub name: String,
    /// The family it belongs to, e.g. `fold-bn`.
    pub family: String,
    /// The law it relies on.
    pub law: Vec<String>,
    /// The `var` lines, as written; their constraints are also in `guards`.
    pub vars: Vec<VarDecl>,
    /// Alternative left-hand sides.
    pub lhs: Vec<PatternExpr>,
    /// What a match becomes.
    pub action: RuleAction,
    /// Predicates every match must satisfy.
    pub guards: Vec<Guard>,
    /// Where the rule is defined.
    pub location: Location,
}

/// The built-in rules, parsed from [`BUILTIN_RULES`] once per process (parsing took
/// ≈ 0.4 ms, twice per compile).
pub fn builtin_rules() -> Vec<Rule> {
    static PARSED: std::sync::OnceLock<Vec<Rule>> = std::sync::OnceLock::new();
    PARSED
        .get_or_init(|| {
            // The built-in file is part of the binary and tested to load.
            load_rules(BUILTIN_RULES, "builtin.rules").expect("the built-in rule file loads")
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_rules_load() {
        let rules = builtin_rules();
        for name in ["fold-bn-into-conv", "absorb-add", "absorb-relu"] {
            assert!(rules.iter().any(|r| r.name == name), "missing {name}");
        }
    }

    #[test]
    fn unbound_variable_is_rejected_with_location() {
        let text = "rule bad\n  lhs (relu ?x)\n  rhs (sigmoid ?y)\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0.len(), 1);
        assert_eq!(err.0[0].code, "rule-unbound");
        assert!(err.0[0].message.contains("?y"), "{}", err.0[0].message);
        // at the use, not at the `rule` line
        assert_eq!(err.0[0].location, Location::file("u.rules", 3, 16));
        let text = "rule bad\n  lhs (relu ?x)\n  rhs (relu ?x)\n  guard const ?xx\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0[0].location, Location::file("u.rules", 4, 15));
    }

    #[test]
    fn attribute_values_from_constants_are_for_right_hand_sides_only() {
        // on a right-hand side: loads, and the text reads as the op's attributes
        let ok = "rule r\n  lhs (add ?x ?e)\n  rhs (leaky_relu[alpha=?e] ?x)\n  guard const ?e\n";
        let rules = load_rules(ok, "u.rules").expect("loads");
        let RuleAction::Rewrite(PatternExpr::Op { attrs, .. }) = &rules[0].action else {
            panic!("a rewrite");
        };
        assert_eq!(
            *attrs,
            AttrSpec::Template {
                text: "alpha=?e".into(),
                holes: vec!["?e".into()]
            }
        );
        // unbound, on a left-hand side, or not an attribute of the op: load errors
        for (text, says) in [
            (
                "rule r\n  lhs (relu ?x)\n  rhs (leaky_relu[alpha=?e] ?x)\n",
                "?e",
            ),
            (
                "rule r\n  lhs (leaky_relu[alpha=?e] ?x)\n  rhs (relu ?x)\n",
                "right-hand sides",
            ),
            (
                "rule r\n  lhs (add ?x ?e)\n  rhs (leaky_relu[slope=?e] ?x)\n",
                "slope",
            ),
        ] {
            let err = load_rules(text, "u.rules").unwrap_err();
            assert!(err.to_string().contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_syntax_error_is_reported_once_without_a_cascade() {
        let text = "rule r\n  lhs (relu ?x\n  rhs ?x\nrule s\n  lhs (relu ?y)\n  rhs ?y\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert_eq!(err.0[0].location, Location::file("u.rules", 2, 7));
        // a later rule's own mistake is still reported
        let text = "rule r\n  lhs (relu ?x\n  rhs ?x\nrule s\n  rhs ?y\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0.len(), 2, "{err}");
        assert!(err.0[1].message.contains("no `lhs`"), "{err}");
    }

    #[test]
    fn an_attribute_error_points_at_the_attributes() {
        let text = "rule r\n  lhs (clip[min=0, maxx=6] ?x)\n  rhs ?x\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        // `  lhs (clip[`: the attributes start at column 13
        assert_eq!(err.0[0].location, Location::file("u.rules", 2, 13));
    }

    #[test]
    fn a_guard_on_the_wrong_kind_of_variable_is_a_load_error() {
        let text =
            "rule r\n  lhs (leaky_relu[?a] ?x)\n  rhs (leaky_relu[?a] ?x)\n  guard scalar ?a 3\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0[0].code, "rule-guard");
        assert!(err.0[0].message.contains("attributes"), "{err}");
        // the caret on the guard's variable, not on the rule line
        assert_eq!(err.0[0].location, Location::file("u.rules", 4, 16), "{err}");
        let text =
            "rule r\n  lhs (conv2d[?c] ?x ?w)\n  rhs (conv2d[?c] ?x ?w)\n  guard unpadded ?x\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0[0].code, "rule-guard");
    }

    #[test]
    fn var_lines_compile_to_guards() {
        let text = "rule r\n  var ?x: tensor<N, C>  -- a note: any text\n  \
                    var ?a ?b: const positive tensor\n  lhs (add (mul ?x ?a) ?b)\n  rhs ?x\n";
        let rule = &load_rules(text, "u.rules").unwrap()[0];
        assert_eq!(rule.vars.len(), 2);
        assert_eq!(rule.vars[0].dims, Some(vec!["N".into(), "C".into()]));
        assert_eq!(rule.vars[0].note, "a note: any text");
        let guards: Vec<String> = rule
            .guards
            .iter()
            .map(|g| format!("{} {:?}", g.kind.name(), g.args))
            .collect();
        assert_eq!(
            guards,
            [
                "rank [Var(\"?x\"), Number(2.0)]",
                "const [Var(\"?a\"), Var(\"?b\")]",
                "positive [Var(\"?a\")]",
                "positive [Var(\"?b\")]",
            ]
        );
        assert_eq!(rule.positive_vars(), ["?a", "?b"]);
    }

    /// A malformed var line is one error, its caret on the offending token.
    #[test]
    fn a_malformed_var_line_is_one_error_at_its_token() {
        for (line, col, says) in [
            // the old free-text style: the first word that is no constraint
            (
                "  var ?x: tensor of activations\n",
                18,
                "unknown constraint 'of'",
            ),
            ("  var ?x tensor\n", 7, "needs `:`"),
            ("  var x: tensor\n", 7, "'x' is not a ?variable"),
            ("  var ?x: const\n", 16, "names its type"),
            ("  var ?x: tensor<N,C\n", 11, "no closing"),
            ("  var ?x: tensor<N,,C>\n", 11, "dimension ''"),
            ("  var ?x: positive tensor positive\n", 27, "said twice"),
            ("  var ?y: tensor\n", 7, "?y"),
        ] {
            let text = format!("rule r\n{line}  lhs (relu ?x)\n  rhs (relu ?x)\n");
            let err = load_rules(&text, "u.rules").unwrap_err();
            assert_eq!(err.0.len(), 1, "{line}: {err}");
            assert!(err.0[0].message.contains(says), "{line}: {err}");
            assert_eq!(
                err.0[0].location,
                Location::file("u.rules", 2, col),
                "{line}: {err}"
            );
        }
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let text = "rule r\n  lhs (relu ?x\n  rhs ?x\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert_eq!(err.0[0].location, Location::file("u.rules", 2, 7));
        let text = "rule r\n  lhs (frobnicate ?x)\n  rhs ?x\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert!(err.0[0].message.contains("unknown op 'frobnicate'"));
        assert_eq!(err.0[0].location, Location::file("u.rules", 2, 8));
        let text = "rule r\n  lhs (add ?x)\n  rhs ?x\n";
        let err = load_rules(text, "u.rules").unwrap_err();
        assert!(err.0[0].message.contains("takes 2 operands"), "{err}");
    }

    #[test]
    fn literal_attributes_parse_and_print() {
        let p = parse_pattern("(min (max ?x ?z) ?six)", "f", 1, 1).unwrap();
        assert_eq!(p.to_string(), "(min (max ?x ?z) ?six)");
        let p = parse_pattern("(clip[min=0, max=6] ?x)", "f", 1, 1).unwrap();
        assert_eq!(p.to_string(), "(clip[min = 0.0, max = 6.0] ?x)");
        // every op's attributes are spelled as in the text form, defaults filled in
        let p = parse_pattern("(conv2d[groups = 2] ?x ?w)", "f", 1, 1).unwrap();
        assert_eq!(p.to_string(), "(conv2d[groups = 2] ?x ?w)");
        let err = parse_pattern("(clip[min=0] ?x)", "f", 1, 1).unwrap_err();
        assert!(err.message.contains("max"), "{}", err.message);
        let err = parse_pattern("(clip[min=0, max=6, beta=1] ?x)", "f", 1, 1).unwrap_err();
        assert!(
            err.message.contains("unknown attribute 'beta'"),
            "{}",
            err.message
        );
    }

    /// docs/rules.md documents every guard, as a `guard NAME` heading.
    #[test]
    fn every_guard_is_in_the_rule_reference() {
        let doc = include_str!("../../../../docs/rules.md");
        for g in GuardKind::ALL {
            let heading = format!("### `guard {}", g.name());
            assert!(doc.contains(&heading), "docs/rules.md has no {heading}");
        }
    }

    /// docs/rules.md documents every `var` constraint, as a row of its table.
    #[test]
    fn every_var_constraint_is_in_the_rule_reference() {
        let doc = include_str!("../../../../docs/rules.md");
        for c in VAR_CONSTRAINTS {
            let row = format!("| `{c}` |");
            assert!(doc.contains(&row), "docs/rules.md has no row {row}");
        }
    }

    #[test]
    fn absorb_needs_an_elementwise_root() {
        let text = "rule r\n  lhs (conv2d ?x ?w)\n  apply absorb ?x\n";
        assert!(load_rules(text, "u").is_err());
        let text = "rule r\n  lhs (relu ?y)\n  apply absorb ?y\n";
        assert_eq!(load_rules(text, "u").unwrap().len(), 1);
    }
}
