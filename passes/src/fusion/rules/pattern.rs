//! Patterns: the s-expression tokenizer and parser, with literal attributes.

use smelt_ir::diag::{Diagnostic, Location};

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

/// How deep a pattern may nest ops (the built-in rules nest 5): deeper patterns are
/// refused, so no recursion over a pattern can overflow the stack, and a rewrite's
/// right-hand side cannot add unbounded chains to the e-graph per match.
pub const MAX_PATTERN_DEPTH: usize = 32;

/// Parses one pattern written on one line, starting at column `col0`.
pub fn parse_pattern(
    text: &str,
    file: &str,
    line: u32,
    col0: u32,
) -> Result<PatternExpr, Diagnostic> {
    let tokens = tokenize(text, file, line, col0)?;
    let at = |col: u32| Location::file(file, line, col);
    // parse_expr recurses once per '(' and so do the walks of every later stage: the
    // depth is bounded here, before any of them runs
    let mut depth = 0usize;
    for t in &tokens {
        match t {
            Token::Open(c) => {
                depth += 1;
                if depth > MAX_PATTERN_DEPTH {
                    return Err(Diagnostic::error(
                        "rule-limit",
                        format!("the pattern nests more than {MAX_PATTERN_DEPTH} ops deep"),
                        at(*c),
                    ));
                }
            }
            Token::Close(_) => depth = depth.saturating_sub(1),
            Token::Atom(..) => {}
        }
    }
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
                Some(t) if t.contains('?') => template_attrs(kind, t).map_err(|m| {
                    let col = *head_col + name.chars().count() as u32 + 1;
                    Diagnostic::error("rule-syntax", m, at(col))
                })?,
                // the caret goes on the attributes (after `name[`), not on the op name
                Some(t) => AttrSpec::Literal(parse_literal_attrs(kind, t).map_err(|m| {
                    let col = *head_col + name.chars().count() as u32 + 1;
                    Diagnostic::error("rule-syntax", m, at(col))
                })?),
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

/// Attribute text with `?var` values (`axis = 2, epsilon = ?eps`): the variables, and a
/// check that the text reads as `kind`'s attributes once they are numbers.
fn template_attrs(kind: OpKind, text: &str) -> Result<AttrSpec, String> {
    let holes = template_holes(text);
    if holes.iter().any(|h| !is_var(h)) {
        return Err(format!("'{text}': a `?` must start a variable name"));
    }
    parse_literal_attrs(kind, &fill_template(text, &|_| 1.0))?;
    Ok(AttrSpec::Template {
        text: text.to_string(),
        holes,
    })
}

/// `text` with each `?name` replaced by what `with` makes of it: the one scan of
/// attribute templates.
fn map_holes(text: &str, mut with: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('?') {
        out.push_str(&rest[..i]);
        let tail = &rest[i + 1..];
        let len = tail
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push_str(&with(&format!("?{}", &tail[..len])));
        rest = &tail[len..];
    }
    out.push_str(rest);
    out
}

/// The `?name`s of attribute text, in order, each once.
pub fn template_holes(text: &str) -> Vec<String> {
    let mut holes: Vec<String> = Vec::new();
    map_holes(text, |name| {
        if !holes.iter().any(|h| h == name) {
            holes.push(name.to_string());
        }
        String::new()
    });
    holes
}

/// `text` with each `?name` replaced by `value(name)`, written so it reads back as the
/// same f32 (the shortest form that round-trips).
pub fn fill_template(text: &str, value: &dyn Fn(&str) -> f32) -> String {
    map_holes(text, |name| format!("{:?}", value(name)))
}

/// The payload of `kind[text]`, `text` written as in the text form's attribute
/// dictionaries (`epsilon = 1.0e-3`, `min = 0, max = 6`): parsed by the text form's own
/// schema (`smelt_ir::text::op_from_attributes`), so the keys, types, defaults and
/// required keys of a rule's attributes are those of the IR text.
pub fn parse_literal_attrs(kind: OpKind, text: &str) -> Result<Attrs, String> {
    if kind == OpKind::Fused {
        return Err(
            "attributes of 'fused' cannot be spelled out in a rule; bind them to a ?variable"
                .into(),
        );
    }
    let op = smelt_ir::text::op_from_attributes(kind.name(), text).map_err(|(m, _)| m)?;
    op.split()
        .map(|(_, attrs)| attrs)
        .ok_or_else(|| format!("'{}' has no attribute payload", kind.name()))
}
