//! The rule-file loader: `rule`/`family` blocks and their `law`, `var`, `lhs`, `rhs`,
//! `apply` and `guard` lines.

use smelt_ir::diag::{Diagnostic, Diagnostics, Location};

use super::pattern::{is_var, parse_pattern};
use super::validate::check_rule;
use super::{Guard, GuardArg, GuardKind, Rule, RuleAction, VarDecl};
use crate::fusion::lang::OpKind;

/// The largest rule file loaded: 16 MiB (the built-in rules are a few KiB).
pub const MAX_RULE_FILE_BYTES: u64 = 16 << 20;

/// The most rules one file defines: every rule is tried at every e-graph node on every
/// iteration, so a file of a quarter million trivial rules is a denial of service.
pub const MAX_RULES: usize = 4096;

/// The most `lhs` lines (patterns matched together) one rule has.
pub const MAX_LHS_LINES: usize = 64;

/// Parses a rule file. `file` names it in diagnostics (line:col).
pub fn load_rules(text: &str, file: &str) -> Result<Vec<Rule>, Diagnostics> {
    if text.len() as u64 > MAX_RULE_FILE_BYTES {
        return Err(Diagnostic::error(
            "rule-limit",
            format!(
                "the rule file is {} bytes, more than the limit of {MAX_RULE_FILE_BYTES}",
                text.len()
            ),
            Location::file(file, 1, 1),
        )
        .into());
    }
    let mut rules: Vec<Rule> = Vec::new();
    // names seen, so a duplicate is found in constant time (not by a scan per rule)
    let mut names: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut errors: Vec<Diagnostic> = Vec::new();
    let mut family = String::from("user");
    let mut current: Option<(Rule, Option<RuleAction>)> = None;
    // Errors reported before the current rule started: a rule with an error of its own
    // is not checked as a whole, since a missing `lhs` or an unbound variable would only
    // repeat the first mistake (one error per mistake).
    let mut errors_before_rule = 0usize;

    let mut finish = |cur: Option<(Rule, Option<RuleAction>)>,
                      rules: &mut Vec<Rule>,
                      errors: &mut Vec<Diagnostic>,
                      errors_before: usize| {
        let Some((mut rule, action)) = cur else {
            return;
        };
        if errors.len() > errors_before {
            return;
        }
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
                if !names.insert(rule.name.clone()) {
                    errors.push(Diagnostic::error(
                        "rule-duplicate",
                        format!("rule '{}' is defined twice", rule.name),
                        rule.location.clone(),
                    ));
                } else {
                    rules.push(rule);
                }
            }
            Err(mut d) => {
                if let Some(at) = variable_use(text, file, &rule, &d) {
                    d.location = at;
                }
                errors.push(d)
            }
        }
    };

    for (line_no, raw) in text.lines().enumerate() {
        let line_no = line_no as u32 + 1;
        // past the limits, nothing more is read: one error, not one per line
        let over = if rules.len() > MAX_RULES {
            Some(format!("the file defines more than {MAX_RULES} rules"))
        } else {
            current
                .as_ref()
                .filter(|(r, _)| r.lhs.len() > MAX_LHS_LINES)
                .map(|(r, _)| {
                    format!(
                        "rule '{}' has more than {MAX_LHS_LINES} `lhs` lines",
                        r.name
                    )
                })
        };
        if let Some(m) = over {
            errors.push(Diagnostic::error(
                "rule-limit",
                m,
                Location::file(file, line_no, 1),
            ));
            return Err(Diagnostics(errors));
        }
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
                finish(current.take(), &mut rules, &mut errors, errors_before_rule);
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
                finish(current.take(), &mut rules, &mut errors, errors_before_rule);
                errors_before_rule = errors.len();
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
                    "var" => parse_var(rest, file, line_no, rest_col).map(|decl| {
                        rule.guards.extend(decl.guards());
                        rule.vars.push(decl);
                    }),
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
    finish(current.take(), &mut rules, &mut errors, errors_before_rule);
    if errors.is_empty() {
        Ok(rules)
    } else {
        Err(Diagnostics(errors))
    }
}

/// Where the variable of a `rule-unbound` or `rule-guard` error is used, so the caret
/// sits on it: for an unbound variable the first `rhs`, `apply` or `guard` line of the
/// rule (after its `rule` line, before the next block) with that variable as a whole
/// token, for a guard on the wrong kind of variable the first line of that guard with
/// it; at its column. `None` for other errors or when no use is found.
fn variable_use(text: &str, file: &str, rule: &Rule, d: &Diagnostic) -> Option<Location> {
    let (var, lines): (&str, Vec<String>) = match d.code {
        "rule-unbound" => (
            d.message.split_once(" uses ")?.1.split(',').next()?.trim(),
            vec!["rhs".into(), "apply".into(), "guard".into(), "var".into()],
        ),
        "rule-guard" => {
            let guard = d.message.split_once("guard `")?.1.split('`').next()?;
            let var = d.message.split_once("cannot hold: ")?.1;
            (
                var.split_whitespace().next()?,
                vec![format!("guard {guard} "), "var".into()],
            )
        }
        _ => return None,
    };
    let Location::File { line, .. } = &rule.location else {
        return None;
    };
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for (i, raw) in text.lines().enumerate().skip(*line as usize) {
        let trimmed = raw.trim_start();
        if trimmed.starts_with("rule ") || trimmed.starts_with("family ") {
            break;
        }
        if !lines.iter().any(|k| trimmed.starts_with(k.as_str())) {
            continue;
        }
        let mut from = 0;
        while let Some(pos) = raw[from..].find(var) {
            let start = from + pos;
            let end = start + var.len();
            if !raw[end..].starts_with(is_word) {
                let col = raw[..start].chars().count() as u32 + 1;
                return Some(Location::file(file, i as u32 + 1, col));
            }
            from = end;
        }
    }
    None
}

/// Every constraint a `var` line takes, as docs/rules.md's table heads them (a test fails
/// when one is missing there); `tensor<D,...>` stands for any dimension list.
pub const VAR_CONSTRAINTS: [&str; 4] = ["tensor", "tensor<D,...>", "const", "positive"];

/// The grammar of a `var` line, for its errors.
const VAR_GRAMMAR: &str = "`var ?x ?y: [const] [positive] tensor[<D,...>] [-- note]`";

/// Reads a `var` line's text after the keyword: `?x ?y: CONSTRAINT... [-- NOTE]`. An
/// error points at the offending token (`col` is the column of `rest`'s first character).
fn parse_var(rest: &str, file: &str, line: u32, col: u32) -> Result<VarDecl, Diagnostic> {
    let at = |byte: usize| Location::file(file, line, col + rest[..byte].chars().count() as u32);
    let fail = |byte: usize, what: String| {
        Err(Diagnostic::error(
            "rule-syntax",
            format!("{what}; a var line is {VAR_GRAMMAR}"),
            at(byte),
        ))
    };
    let (body, note) = match rest.find("--") {
        Some(i) => (&rest[..i], rest[i + 2..].trim().to_string()),
        None => (rest, String::new()),
    };
    let Some(colon) = body.find(':') else {
        return fail(0, "a var line needs `:` after its variables".into());
    };
    // the tokens of a span of `body`, each with its byte offset in `rest`
    let tokens = |from: usize, to: usize| -> Vec<(usize, &str)> {
        let mut out = Vec::new();
        let text = &body[from..to];
        let mut i = 0;
        while i < text.len() {
            let tail = &text[i..];
            let skip = tail.len() - tail.trim_start().len();
            i += skip;
            if i >= text.len() {
                break;
            }
            let tail = &text[i..];
            // `tensor<N, C>` is one token, spaces inside the brackets included
            let len = if tail.starts_with("tensor<") {
                tail.find('>').map_or(tail.len(), |j| j + 1)
            } else {
                tail.find(char::is_whitespace).unwrap_or(tail.len())
            };
            out.push((from + i, &tail[..len]));
            i += len;
        }
        out
    };
    let mut decl = VarDecl {
        names: Vec::new(),
        constant: false,
        positive: false,
        dims: None,
        note,
    };
    for (byte, name) in tokens(0, colon) {
        if !is_var(name) {
            return fail(byte, format!("'{name}' is not a ?variable"));
        }
        decl.names.push(name.to_string());
    }
    if decl.names.is_empty() {
        return fail(colon, "no ?variable before `:`".into());
    }
    let mut typed = false;
    for (byte, token) in tokens(colon + 1, body.len()) {
        let repeated = match token {
            "const" => std::mem::replace(&mut decl.constant, true),
            "positive" => std::mem::replace(&mut decl.positive, true),
            "tensor" => std::mem::replace(&mut typed, true),
            t if t.starts_with("tensor<") => {
                let Some(inner) = t.strip_prefix("tensor<").and_then(|t| t.strip_suffix('>'))
                else {
                    return fail(byte, format!("'{t}' has no closing `>`"));
                };
                let dims: Vec<String> = inner.split(',').map(|d| d.trim().to_string()).collect();
                let well_formed = |d: &String| {
                    !d.is_empty() && d.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                };
                if let Some(bad) = dims.iter().find(|d| !well_formed(d)) {
                    return fail(
                        byte,
                        format!("dimension '{bad}' of '{t}' is not a name or a size"),
                    );
                }
                decl.dims = Some(dims);
                std::mem::replace(&mut typed, true)
            }
            other => {
                return fail(
                    byte,
                    format!(
                        "unknown constraint '{other}' (expected {}; free text goes after `--`)",
                        VAR_CONSTRAINTS.join(", ")
                    ),
                )
            }
        };
        if repeated {
            return fail(byte, format!("'{token}' is said twice"));
        }
    }
    if !typed {
        return fail(
            body.len(),
            "a var line names its type: `tensor` or `tensor<D,...>`".into(),
        );
    }
    Ok(decl)
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
                 rank, unpadded, not-after or positive)"
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
        GuardKind::SingleConsumer
        | GuardKind::Unpadded
        | GuardKind::Positive
        | GuardKind::SingleValue => vars == 1 && nums == 0 && ops == 0,
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
                    GuardKind::SingleConsumer
                    | GuardKind::Unpadded
                    | GuardKind::Positive
                    | GuardKind::SingleValue => "one ?variable",
                    GuardKind::Rank => "a ?variable and a rank",
                    GuardKind::NotAfter => "a ?variable and an op name",
                }
            ),
            loc,
        ));
    }
    Ok(Guard { kind, args })
}
