//! Patterns: the s-expression tokenizer and parser, with literal attributes.

use smelt_ir::diag::{Diagnostic, Location};
use smelt_ir::op::GemmAttrs;
use smelt_ir::types::F32;

use super::validate::kind_arity;
use super::{AttrSpec, PatternExpr};
use crate::fusion::lang::{Attrs, OpKind};

pub(super) fn is_var(w: &str) -> bool {
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

pub(super) fn parse_literal_attrs(kind: OpKind, text: &str) -> Result<Attrs, String> {
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
