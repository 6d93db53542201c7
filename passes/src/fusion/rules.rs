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
//! - `var ?x: TYPE` declares a variable's type for the rule checker (free text).
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
//! attributes (left-hand side only; ops without attributes need no brackets).
//! Every variable of the right-hand side and of the guards must be bound by every
//! left-hand side; this is checked when the file is loaded.

use smelt_ir::diag::{Diagnostic, Diagnostics, Location};
use smelt_ir::op::{Arity, Conv2dAttrs, GemmAttrs, Op, Pool2dAttrs};
use smelt_ir::types::{Layout, F32};

use super::lang::{join_op, Attrs, OpKind};

/// The rule file built into smelt.
pub const BUILTIN_RULES: &str = include_str!("../../rules/builtin.rules");

/// The attributes of an op in a pattern.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrSpec {
    /// Any attributes (left-hand side only).
    Any,
    /// Bound to a variable.
    Var(String),
    /// Spelled out.
    Literal(Attrs),
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
                if let AttrSpec::Var(v) = attrs {
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
                    AttrSpec::Literal(a) => write!(f, "[{}]", literal_text(a))?,
                }
                for c in children {
                    write!(f, " {c}")?;
                }
                f.write_str(")")
            }
        }
    }
}

fn literal_text(a: &Attrs) -> String {
    match a {
        Attrs::Epsilon(e) => format!("epsilon={e}"),
        Attrs::Clip { min, max } => format!("min={min}, max={max}"),
        Attrs::Alpha(a) => format!("alpha={a}"),
        Attrs::HardSigmoid { alpha, beta } => format!("alpha={alpha}, beta={beta}"),
        Attrs::Axis(a) => format!("axis={a}"),
        other => format!("{other:?}"),
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

/// The built-in guard predicates.
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
        }
    }

    fn from_name(name: &str) -> Option<GuardKind> {
        [
            GuardKind::Const,
            GuardKind::Scalar,
            GuardKind::PerChannel,
            GuardKind::SingleConsumer,
            GuardKind::Rank,
            GuardKind::Unpadded,
            GuardKind::NotAfter,
        ]
        .into_iter()
        .find(|g| g.name() == name)
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

/// One fusion rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Unique name, e.g. `fold-bn-into-conv`.
    pub name: String,
    /// The family it belongs to, e.g. `fold-bn`.
    pub family: String,
    /// The law it relies on.
    pub law: Vec<String>,
    /// Declared variable types (`?x: tensor<N,C,H,W>`), for the rule checker.
    pub vars: Vec<String>,
    /// Alternative left-hand sides.
    pub lhs: Vec<PatternExpr>,
    /// What a match becomes.
    pub action: RuleAction,
    /// Predicates every match must satisfy.
    pub guards: Vec<Guard>,
    /// Where the rule is defined.
    pub location: Location,
}

/// The built-in rules, parsed from [`BUILTIN_RULES`].
pub fn builtin_rules() -> Vec<Rule> {
    // The built-in file is part of the binary and tested to load.
    load_rules(BUILTIN_RULES, "builtin.rules").expect("the built-in rule file loads")
}

/// Parses a rule file. `file` names it in diagnostics (line:col).
pub fn load_rules(text: &str, file: &str) -> Result<Vec<Rule>, Diagnostics> {
    let mut rules: Vec<Rule> = Vec::new();
    let mut errors: Vec<Diagnostic> = Vec::new();
    let mut family = String::from("user");
    let mut current: Option<(Rule, Option<RuleAction>)> = None;

    let finish = |cur: Option<(Rule, Option<RuleAction>)>,
                  rules: &mut Vec<Rule>,
                  errors: &mut Vec<Diagnostic>| {
        let Some((mut rule, action)) = cur else {
            return;
        };
        let Some(action) = action else {
            errors.push(Diagnostic::error(
                "rule-syntax",
                format!("rule '{}' has no `rhs` or `apply` line", rule.name),
                rule.location.clone(),
            ));
            return;
        };
        if rule.lhs.is_empty() {
            errors.push(Diagnostic::error(
                "rule-syntax",
                format!("rule '{}' has no `lhs` line", rule.name),
                rule.location.clone(),
            ));
            return;
        }
        rule.action = action;
        match check_rule(&rule) {
            Ok(()) => {
                if rules.iter().any(|r| r.name == rule.name) {
                    errors.push(Diagnostic::error(
                        "rule-duplicate",
                        format!("rule '{}' is defined twice", rule.name),
                        rule.location.clone(),
                    ));
                } else {
                    rules.push(rule);
                }
            }
            Err(d) => errors.push(d),
        }
    };

    for (line_no, raw) in text.lines().enumerate() {
        let line_no = line_no as u32 + 1;
        let indent = raw.len() - raw.trim_start().len();
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (keyword, rest) = match line.find(char::is_whitespace) {
            Some(i) => (&line[..i], line[i..].trim_start()),
            None => (line, ""),
        };
        let rest_col = (raw.len() - rest.len()) as u32 + 1;
        let at = |col: u32| Location::file(file, line_no, col);
        let kw_loc = at(indent as u32 + 1);
        match keyword {
            "family" => {
                finish(current.take(), &mut rules, &mut errors);
                if rest.is_empty() {
                    errors.push(Diagnostic::error(
                        "rule-syntax",
                        "`family` needs a name",
                        kw_loc,
                    ));
                } else {
                    family = rest.to_string();
                }
            }
            "rule" => {
                finish(current.take(), &mut rules, &mut errors);
                let name_ok = !rest.is_empty()
                    && rest
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                if !name_ok {
                    errors.push(Diagnostic::error(
                        "rule-syntax",
                        format!("rule name '{rest}' must be letters, digits, '-' or '_'"),
                        at(rest_col),
                    ));
                }
                current = Some((
                    Rule {
                        name: rest.to_string(),
                        family: family.clone(),
                        law: Vec::new(),
                        vars: Vec::new(),
                        lhs: Vec::new(),
                        action: RuleAction::Absorb {
                            into: String::new(),
                        },
                        guards: Vec::new(),
                        location: kw_loc,
                    },
                    None,
                ));
            }
            "law" | "var" | "lhs" | "rhs" | "apply" | "guard" => {
                let Some((rule, action)) = current.as_mut() else {
                    errors.push(Diagnostic::error(
                        "rule-syntax",
                        format!("`{keyword}` outside a rule (start one with `rule NAME`)"),
                        kw_loc,
                    ));
                    continue;
                };
                let result = match keyword {
                    "law" => {
                        rule.law.push(rest.to_string());
                        Ok(())
                    }
                    "var" => {
                        rule.vars.push(rest.to_string());
                        Ok(())
                    }
                    "lhs" => {
                        parse_pattern(rest, file, line_no, rest_col).map(|p| rule.lhs.push(p))
                    }
                    "rhs" | "apply" if action.is_some() => Err(Diagnostic::error(
                        "rule-syntax",
                        format!("rule '{}' has a second `rhs`/`apply` line", rule.name),
                        kw_loc.clone(),
                    )),
                    "rhs" => parse_pattern(rest, file, line_no, rest_col)
                        .map(|p| *action = Some(RuleAction::Rewrite(p))),
                    "apply" => parse_apply(rest, at(rest_col)).map(|a| *action = Some(a)),
                    _ => parse_guard(rest, at(rest_col)).map(|g| rule.guards.push(g)),
                };
                if let Err(d) = result {
                    errors.push(d);
                }
            }
            other => errors.push(Diagnostic::error(
                "rule-syntax",
                format!(
                    "unknown keyword '{other}' (expected family, rule, law, var, lhs, rhs, apply or guard)"
                ),
                kw_loc,
            )),
        }
    }
    finish(current.take(), &mut rules, &mut errors);
    if errors.is_empty() {
        Ok(rules)
    } else {
        Err(Diagnostics(errors))
    }
}

fn parse_apply(rest: &str, loc: Location) -> Result<RuleAction, Diagnostic> {
    let words: Vec<&str> = rest.split_whitespace().collect();
    match words.as_slice() {
        ["absorb", var] if is_var(var) => Ok(RuleAction::Absorb {
            into: var.to_string(),
        }),
        _ => Err(Diagnostic::error(
            "rule-syntax",
            format!("unknown applier '{rest}' (expected `apply absorb ?var`)"),
            loc,
        )),
    }
}

fn parse_guard(rest: &str, loc: Location) -> Result<Guard, Diagnostic> {
    let mut words = rest.split_whitespace();
    let name = words.next().unwrap_or("");
    let kind = GuardKind::from_name(name).ok_or_else(|| {
        Diagnostic::error(
            "rule-syntax",
            format!(
                "unknown guard '{name}' (expected const, scalar, per-channel, single-consumer, \
                 rank, unpadded or not-after)"
            ),
            loc.clone(),
        )
    })?;
    let mut args = Vec::new();
    for w in words {
        if is_var(w) {
            args.push(GuardArg::Var(w.to_string()));
        } else if let Ok(n) = w.parse::<f64>() {
            args.push(GuardArg::Number(n));
        } else if let Some(k) = OpKind::from_name(w) {
            args.push(GuardArg::Op(k));
        } else {
            return Err(Diagnostic::error(
                "rule-syntax",
                format!("guard argument '{w}' is neither a ?variable, a number nor an op name"),
                loc,
            ));
        }
    }
    let count = |f: fn(&GuardArg) -> bool| args.iter().filter(|a| f(a)).count();
    let vars = count(|a| matches!(a, GuardArg::Var(_)));
    let nums = count(|a| matches!(a, GuardArg::Number(_)));
    let ops = count(|a| matches!(a, GuardArg::Op(_)));
    let ok = match kind {
        GuardKind::Const => vars >= 1 && nums == 0 && ops == 0,
        GuardKind::Scalar => vars == 1 && (1..=2).contains(&nums) && ops == 0,
        GuardKind::PerChannel => (1..=2).contains(&vars) && nums == 0 && ops == 0,
        GuardKind::SingleConsumer | GuardKind::Unpadded => vars == 1 && nums == 0 && ops == 0,
        GuardKind::Rank => vars == 1 && nums == 1 && ops == 0,
        GuardKind::NotAfter => vars == 1 && nums == 0 && ops == 1,
    };
    if !ok {
        return Err(Diagnostic::error(
            "rule-syntax",
            format!(
                "guard '{name}' takes {}",
                match kind {
                    GuardKind::Const => "one or more ?variables",
                    GuardKind::Scalar => "a ?variable, a value and an optional tolerance",
                    GuardKind::PerChannel =>
                        "one or two ?variables (the constant, the tensor; default the result)",
                    GuardKind::SingleConsumer | GuardKind::Unpadded => "one ?variable",
                    GuardKind::Rank => "a ?variable and a rank",
                    GuardKind::NotAfter => "a ?variable and an op name",
                }
            ),
            loc,
        ));
    }
    Ok(Guard { kind, args })
}

fn is_var(w: &str) -> bool {
    w.len() > 1
        && w.starts_with('?')
        && w[1..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A token of a pattern with its column (1-based, in characters of the line).
#[derive(Debug)]
enum Token<'a> {
    Open(u32),
    Close(u32),
    Atom(&'a str, u32),
}

fn tokenize<'a>(
    text: &'a str,
    file: &str,
    line: u32,
    col0: u32,
) -> Result<Vec<Token<'a>>, Diagnostic> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    let col = |i: usize| col0 + text[..i].chars().count() as u32;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'(' {
            out.push(Token::Open(col(i)));
            i += 1;
        } else if c == b')' {
            out.push(Token::Close(col(i)));
            i += 1;
        } else {
            let start = i;
            let mut depth = 0usize;
            while i < bytes.len() {
                let b = bytes[i];
                if b == b'[' {
                    depth += 1;
                } else if b == b']' {
                    if depth == 0 {
                        return Err(Diagnostic::error(
                            "rule-syntax",
                            "unmatched ']'",
                            Location::file(file, line, col(i)),
                        ));
                    }
                    depth -= 1;
                } else if depth == 0 && (b.is_ascii_whitespace() || b == b'(' || b == b')') {
                    break;
                }
                i += 1;
            }
            if depth > 0 {
                return Err(Diagnostic::error(
                    "rule-syntax",
                    "unterminated '[' (attributes end with ']')",
                    Location::file(file, line, col(start)),
                ));
            }
            out.push(Token::Atom(&text[start..i], col(start)));
        }
    }
    Ok(out)
}

/// Parses one pattern written on one line, starting at column `col0`.
pub fn parse_pattern(
    text: &str,
    file: &str,
    line: u32,
    col0: u32,
) -> Result<PatternExpr, Diagnostic> {
    let tokens = tokenize(text, file, line, col0)?;
    let at = |col: u32| Location::file(file, line, col);
    let mut pos = 0;
    let expr = parse_expr(&tokens, &mut pos, &at, col0)?;
    if let Some(t) = tokens.get(pos) {
        let c = match t {
            Token::Open(c) | Token::Close(c) | Token::Atom(_, c) => *c,
        };
        return Err(Diagnostic::error(
            "rule-syntax",
            "unexpected text after the pattern",
            at(c),
        ));
    }
    Ok(expr)
}

fn parse_expr(
    tokens: &[Token],
    pos: &mut usize,
    at: &dyn Fn(u32) -> Location,
    end_col: u32,
) -> Result<PatternExpr, Diagnostic> {
    let Some(tok) = tokens.get(*pos) else {
        return Err(Diagnostic::error(
            "rule-syntax",
            "expected a pattern",
            at(end_col),
        ));
    };
    *pos += 1;
    match tok {
        Token::Close(c) => Err(Diagnostic::error("rule-syntax", "unexpected ')'", at(*c))),
        Token::Atom(a, c) => {
            if is_var(a) {
                Ok(PatternExpr::Var(a.to_string()))
            } else {
                Err(Diagnostic::error(
                    "rule-syntax",
                    format!("'{a}' is not a ?variable; ops are written (op operands...)"),
                    at(*c),
                ))
            }
        }
        Token::Open(open_col) => {
            let Some(Token::Atom(head, head_col)) = tokens.get(*pos) else {
                return Err(Diagnostic::error(
                    "rule-syntax",
                    "expected an op name after '('",
                    at(*open_col),
                ));
            };
            *pos += 1;
            let (name, attr_text) = match head.find('[') {
                Some(i) => (&head[..i], Some(&head[i + 1..head.len() - 1])),
                None => (*head, None),
            };
            let kind = OpKind::from_name(name).ok_or_else(|| {
                Diagnostic::error("rule-syntax", format!("unknown op '{name}'"), at(*head_col))
            })?;
            let attrs = match attr_text {
                None => match kind.default_attrs() {
                    Some(a) => AttrSpec::Literal(a),
                    None => AttrSpec::Any,
                },
                Some(t) if is_var(t.trim()) => AttrSpec::Var(t.trim().to_string()),
                Some(t) => AttrSpec::Literal(
                    parse_literal_attrs(kind, t)
                        .map_err(|m| Diagnostic::error("rule-syntax", m, at(*head_col)))?,
                ),
            };
            let mut children = Vec::new();
            loop {
                match tokens.get(*pos) {
                    Some(Token::Close(_)) => {
                        *pos += 1;
                        break;
                    }
                    Some(_) => children.push(parse_expr(tokens, pos, at, end_col)?),
                    None => {
                        return Err(Diagnostic::error(
                            "rule-syntax",
                            "unclosed '(' (missing ')')",
                            at(*open_col),
                        ))
                    }
                }
            }
            let arity = kind_arity(kind);
            if let Some(arity) = arity {
                if !arity.accepts(children.len()) {
                    return Err(Diagnostic::error(
                        "rule-syntax",
                        format!(
                            "'{name}' takes {arity} operands, the pattern gives {}",
                            children.len()
                        ),
                        at(*head_col),
                    ));
                }
            }
            Ok(PatternExpr::Op {
                kind,
                attrs,
                children,
            })
        }
    }
}

fn parse_literal_attrs(kind: OpKind, text: &str) -> Result<Attrs, String> {
    let mut fields: Vec<(String, f64)> = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("attribute '{part}' must be written key=value"))?;
        let v: f64 = v
            .trim()
            .parse()
            .map_err(|_| format!("attribute value '{}' is not a number", v.trim()))?;
        fields.push((k.trim().to_string(), v));
    }
    let get = |key: &str| -> Result<f64, String> {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("'{}' needs attribute '{key}'", kind.name()))
    };
    let allowed: &[&str] = match kind {
        OpKind::BatchNorm
        | OpKind::BnFoldWeight
        | OpKind::BnFoldBias
        | OpKind::BnScale
        | OpKind::BnShift => &["epsilon"],
        OpKind::Gemm => &["alpha", "beta", "trans_a", "trans_b"],
        OpKind::Clip => &["min", "max"],
        OpKind::LeakyRelu => &["alpha"],
        OpKind::HardSigmoid => &["alpha", "beta"],
        OpKind::Flatten | OpKind::Concat | OpKind::Softmax => &["axis"],
        _ => &[],
    };
    if let Some((k, _)) = fields.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(if allowed.is_empty() {
            format!(
                "attributes of '{}' cannot be spelled out in a rule; bind them to a ?variable",
                kind.name()
            )
        } else {
            format!(
                "'{}' has no attribute '{k}' (it has {})",
                kind.name(),
                allowed.join(", ")
            )
        });
    }
    let f = |v: f64| F32(v as f32);
    let axis = |v: f64| -> Result<usize, String> {
        if v >= 0.0 && v.fract() == 0.0 && v < 64.0 {
            Ok(v as usize)
        } else {
            Err(format!("axis {v} must be a small non-negative integer"))
        }
    };
    Ok(match kind {
        OpKind::BatchNorm
        | OpKind::BnFoldWeight
        | OpKind::BnFoldBias
        | OpKind::BnScale
        | OpKind::BnShift => Attrs::Epsilon(f(get("epsilon")?)),
        OpKind::Gemm => {
            let def = GemmAttrs::default();
            let or =
                |key: &str, d: f64| fields.iter().find(|(k, _)| k == key).map_or(d, |(_, v)| *v);
            let flag = |key: &str| -> Result<bool, String> {
                match or(key, 0.0) {
                    0.0 => Ok(false),
                    1.0 => Ok(true),
                    v => Err(format!("gemm {key} must be 0 or 1, got {v}")),
                }
            };
            Attrs::Gemm(GemmAttrs {
                alpha: f(or("alpha", def.alpha.0 as f64)),
                beta: f(or("beta", def.beta.0 as f64)),
                trans_a: flag("trans_a")?,
                trans_b: flag("trans_b")?,
            })
        }
        OpKind::Clip => Attrs::Clip {
            min: f(get("min")?),
            max: f(get("max")?),
        },
        OpKind::LeakyRelu => Attrs::Alpha(f(get("alpha")?)),
        OpKind::HardSigmoid => Attrs::HardSigmoid {
            alpha: f(get("alpha")?),
            beta: f(get("beta")?),
        },
        OpKind::Flatten | OpKind::Concat | OpKind::Softmax => Attrs::Axis(axis(get("axis")?)?),
        _ if allowed.is_empty() && fields.is_empty() => match kind.default_attrs() {
            Some(a) => a,
            None => {
                return Err(format!(
                    "attributes of '{}' cannot be spelled out in a rule; bind them to a ?variable",
                    kind.name()
                ))
            }
        },
        _ => return Err(format!("bad attributes for '{}'", kind.name())),
    })
}

/// A representative op of each kind, to read its arity from the op table.
fn representative_op(kind: OpKind) -> Option<Op> {
    let f = F32(1.0);
    let pool = Pool2dAttrs {
        kernel: [1, 1],
        strides: [1, 1],
        pads: [0; 4],
        dilations: [1, 1],
        ceil_mode: false,
        layout: smelt_ir::Layout::RowMajor,
    };
    let attrs = match kind {
        OpKind::Conv2d => Attrs::Conv2d(Conv2dAttrs::default()),
        OpKind::BatchNorm
        | OpKind::BnFoldWeight
        | OpKind::BnFoldBias
        | OpKind::BnScale
        | OpKind::BnShift => Attrs::Epsilon(f),
        OpKind::Clip => Attrs::Clip { min: f, max: f },
        OpKind::LeakyRelu => Attrs::Alpha(f),
        OpKind::HardSigmoid => Attrs::HardSigmoid { alpha: f, beta: f },
        OpKind::LayerNorm => Attrs::LayerNorm {
            axis: 0,
            epsilon: f,
        },
        OpKind::MaxPool2d => Attrs::Pool(pool),
        OpKind::AvgPool2d => Attrs::AvgPool {
            pool,
            count_include_pad: false,
        },
        OpKind::Flatten | OpKind::Concat | OpKind::Softmax => Attrs::Axis(0),
        OpKind::Reshape | OpKind::Transpose => Attrs::Dims(vec![]),
        OpKind::Gemm => Attrs::Gemm(GemmAttrs::default()),
        OpKind::Reorder => Attrs::Layout(Layout::RowMajor),
        // A fused op's arity depends on its post-ops: not checked in patterns.
        OpKind::Fused => return None,
        OpKind::Relu
        | OpKind::Sigmoid
        | OpKind::Tanh
        | OpKind::Erf
        | OpKind::Gelu
        | OpKind::HardSwish
        | OpKind::Silu
        | OpKind::Add
        | OpKind::Sub
        | OpKind::Mul
        | OpKind::Div
        | OpKind::Min
        | OpKind::Max
        | OpKind::GlobalAvgPool
        | OpKind::MatMul
        | OpKind::ChannelScale
        | OpKind::ChannelVector
        | OpKind::ConvShiftBias => Attrs::None,
    };
    join_op(kind, &attrs)
}

fn kind_arity(kind: OpKind) -> Option<Arity> {
    representative_op(kind).map(|op| op.arity())
}

/// The elementwise operator at a pattern root, as a post-op of a fused op, if it is one.
pub fn elementwise_kind(kind: OpKind) -> bool {
    matches!(
        representative_op(kind),
        Some(Op::Unary(_)) | Some(Op::Binary(_))
    )
}

/// Checks a parsed rule: variables bound, appliers well-formed.
fn check_rule(rule: &Rule) -> Result<(), Diagnostic> {
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
        assert_eq!(err.0[0].location, Location::file("u.rules", 1, 1));
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
        assert_eq!(p.to_string(), "(clip[min=0.0, max=6.0] ?x)");
        assert!(parse_pattern("(conv2d[groups=2] ?x ?w)", "f", 1, 1).is_err());
    }

    #[test]
    fn absorb_needs_an_elementwise_root() {
        let text = "rule r\n  lhs (conv2d ?x ?w)\n  apply absorb ?x\n";
        assert!(load_rules(text, "u").is_err());
        let text = "rule r\n  lhs (relu ?y)\n  apply absorb ?y\n";
        assert_eq!(load_rules(text, "u").unwrap().len(), 1);
    }
}
