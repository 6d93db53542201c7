//! The dims of a tensor type, read from the source text: numbers, symbols and
//! parenthesized expressions over them.
//!
//! ```text
//! dims  := (dim 'x')* DTYPE
//! dim   := INT | NAME | STRING | '?' | '?' INT | '(' expr ')'
//! expr  := term (('+' | '-') term)*
//! term  := unary ('*' unary | '/' INT)*
//! unary := '-' unary | INT | NAME | STRING | '?' INT | '(' expr ')'
//! ```
//!
//! A `NAME` between the `x`s is letters, digits and `_` without an `x` (the separator);
//! inside parentheses it may hold an `x`. Other names are quoted. A bare `?` is a fresh
//! symbol, named `?1`, `?2`, ... in the order the file writes them; `/` is floor
//! division by a positive integer. The lexer has already accepted these characters (as
//! names, numbers, strings and `DimPunct` tokens), so the dims are read from the text
//! and the token position then moves past them.

use super::{PResult, Parser, MAX_NESTING};
use crate::op::Dim;
use crate::symbolic::DimExpr;
use crate::text::attr_dict::AttrLit;
use crate::text::lexer::lex_string;

/// A position in the dims text, the diagnostic's code and what went wrong there.
type DimError = (usize, &'static str, String);

/// A cursor over the source text of one type's dims.
struct Cursor<'s> {
    src: &'s str,
    pos: usize,
    /// Parentheses and signs open around the position: bounded by [`MAX_NESTING`], so
    /// the recursive descent's stack is too.
    depth: usize,
}

impl<'s> Cursor<'s> {
    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(|b| b == b' ' || b == b'\t') {
            self.pos += 1;
        }
    }

    fn take_while(&mut self, ok: impl Fn(u8) -> bool) -> &'s str {
        let start = self.pos;
        while self.peek().is_some_and(&ok) {
            self.pos += 1;
        }
        &self.src[start..self.pos]
    }

    fn eat(&mut self, b: u8) -> bool {
        self.skip_spaces();
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
}

fn overflow(at: usize) -> DimError {
    (at, "too-large", "the size is too large".into())
}

fn bad(at: usize, message: impl Into<String>) -> DimError {
    (at, "bad-type", message.into())
}

impl Parser<'_> {
    /// The dims and the element type's word (with its offset) after `tensor<`; the
    /// token position ends on the `,` or `>` after the element type.
    pub(super) fn parse_dims(&mut self) -> PResult<(Vec<usize>, (String, usize))> {
        let src = self.map.src();
        let mut c = Cursor {
            src,
            pos: self.at(),
            depth: 0,
        };
        let read = self.read_dims(&mut c);
        // move the tokens past what was read (a token never straddles the `,` or `>`)
        while self.pos + 1 < self.toks.len() && self.toks[self.pos].start < c.pos {
            self.pos += 1;
        }
        read.map_err(|(at, code, message)| self.diag(code, message, at))
    }

    fn read_dims(&mut self, c: &mut Cursor) -> Result<(Vec<usize>, (String, usize)), DimError> {
        let mut dims = Vec::new();
        loop {
            let at = c.pos;
            let word_start = c.peek();
            let expr = match word_start {
                Some(b'0'..=b'9') => {
                    let digits = c.take_while(|b| b.is_ascii_digit());
                    let n: u64 = digits.parse().map_err(|_| {
                        (at, "too-large", format!("dimension {digits} is too large"))
                    })?;
                    if n >= 1 << 62 {
                        return Err((at, "too-large", format!("dimension {digits} is too large")));
                    }
                    DimExpr::constant(n as i64)
                }
                Some(b) if b.is_ascii_alphabetic() || b == b'_' => {
                    let word =
                        c.take_while(|b| (b.is_ascii_alphanumeric() || b == b'_') && b != b'x');
                    if c.peek() != Some(b'x') {
                        // the last word is the element type (it may hold no 'x')
                        let rest = c.take_while(|b| b.is_ascii_alphanumeric() || b == b'_');
                        return Ok((dims, (format!("{word}{rest}"), at)));
                    }
                    DimExpr::symbol(word)
                }
                // the dimension's own parentheses: nesting counts inside them
                Some(b'(') => {
                    c.pos += 1;
                    let e = self.expr(c)?;
                    if !c.eat(b')') {
                        return Err(bad(c.pos, "expected ')' to close the dimension"));
                    }
                    e
                }
                Some(b'?' | b'"') => self.symbol_atom(c)?,
                _ => {
                    return Err(bad(
                        at,
                        "expected a dimension (a number, a symbol, '?' or a parenthesized \
                         expression) or an element type, as in tensor<Nx3xf32>",
                    ))
                }
            };
            if c.peek() != Some(b'x') {
                return Err(bad(
                    c.pos,
                    "expected 'x' and the next dimension or the element type right after \
                     a dimension, as in tensor<Nx3xf32>",
                ));
            }
            c.pos += 1;
            let negative = expr.as_constant().is_some_and(|n| n < 0);
            let d = Dim::from_expr(expr);
            if negative {
                return Err(bad(at, "a dimension cannot be negative"));
            }
            if d.is_unrepresentable() {
                return Err(bad(
                    at,
                    format!(
                        "the dimension is too complex: more than {} terms or {} nested divisions",
                        crate::symbolic::MAX_TERMS,
                        crate::symbolic::MAX_DEPTH
                    ),
                ));
            }
            dims.push(d.stored());
        }
    }

    /// A symbolic size in an attribute list (`?1`, `"name"`, `(expression)`), as
    /// [`AttrLit::Size`]; the token position moves past it.
    pub(super) fn size_attr(&mut self) -> PResult<(AttrLit, usize)> {
        let at = self.at();
        let mut c = Cursor {
            src: self.map.src(),
            pos: at,
            depth: 0,
        };
        let read = self.unary(&mut c);
        while self.pos + 1 < self.toks.len() && self.toks[self.pos].start < c.pos {
            self.pos += 1;
        }
        let e = read.map_err(|(at, code, message)| self.diag(code, message, at))?;
        let negative = e.as_constant().is_some_and(|n| n < 0);
        let d = Dim::from_expr(e);
        if negative || d.is_unrepresentable() {
            return Err(self.diag(
                "bad-attribute",
                "a size must be a non-negative size no more complex than a type's",
                at,
            ));
        }
        Ok((AttrLit::Size(d.stored()), at))
    }

    /// `?`, `?N` or a quoted name.
    fn symbol_atom(&mut self, c: &mut Cursor) -> Result<DimExpr, DimError> {
        let at = c.pos;
        if c.peek() == Some(b'"') {
            let (name, end) = lex_string(&self.map, at).map_err(|d| bad(at, d.message))?;
            c.pos = end;
            if name.is_empty() {
                return Err(bad(at, "a symbol's name cannot be empty"));
            }
            return Ok(DimExpr::symbol(&name));
        }
        c.pos += 1;
        let digits = c.take_while(|b| b.is_ascii_digit());
        if digits.is_empty() {
            self.fresh_dims += 1;
            return Ok(DimExpr::symbol(&format!("?{}", self.fresh_dims)));
        }
        Ok(DimExpr::symbol(&format!("?{digits}")))
    }

    fn expr(&mut self, c: &mut Cursor) -> Result<DimExpr, DimError> {
        let mut e = self.term(c)?;
        loop {
            let at = c.pos;
            if c.eat(b'+') {
                e = e.add(&self.term(c)?).ok_or_else(|| overflow(at))?;
            } else if c.eat(b'-') {
                e = e.sub(&self.term(c)?).ok_or_else(|| overflow(at))?;
            } else {
                return Ok(e);
            }
        }
    }

    fn term(&mut self, c: &mut Cursor) -> Result<DimExpr, DimError> {
        let mut e = self.unary(c)?;
        loop {
            let at = c.pos;
            if c.eat(b'*') {
                e = e.mul(&self.unary(c)?).ok_or_else(|| overflow(at))?;
            } else if c.eat(b'/') {
                c.skip_spaces();
                let k_at = c.pos;
                let k = self
                    .unary(c)?
                    .as_constant()
                    .filter(|&k| k > 0)
                    .ok_or_else(|| bad(k_at, "'/' divides by a positive integer only"))?;
                e = e.floor_div(k as u64).ok_or_else(|| overflow(at))?;
            } else {
                return Ok(e);
            }
        }
    }

    fn unary(&mut self, c: &mut Cursor) -> Result<DimExpr, DimError> {
        c.skip_spaces();
        let at = c.pos;
        let nests = matches!(c.peek(), Some(b'-' | b'('));
        if nests {
            c.depth += 1;
            if c.depth > MAX_NESTING {
                return Err((
                    at,
                    "too-deep",
                    format!("a size nests more than {MAX_NESTING} deep"),
                ));
            }
        }
        let e = self.unary_at(c, at);
        c.depth -= usize::from(nests);
        e
    }

    fn unary_at(&mut self, c: &mut Cursor, at: usize) -> Result<DimExpr, DimError> {
        match c.peek() {
            Some(b'-') => {
                c.pos += 1;
                self.unary(c)?.scale(-1).ok_or_else(|| overflow(at))
            }
            Some(b'0'..=b'9') => {
                let digits = c.take_while(|b| b.is_ascii_digit());
                match digits.parse::<i64>() {
                    Ok(n) if n < 1 << 62 => Ok(DimExpr::constant(n)),
                    _ => Err((at, "too-large", format!("{digits} is too large"))),
                }
            }
            Some(b) if b.is_ascii_alphabetic() || b == b'_' => {
                let word = c.take_while(|b| b.is_ascii_alphanumeric() || b == b'_');
                Ok(DimExpr::symbol(word))
            }
            Some(b'(') => {
                c.pos += 1;
                let e = self.expr(c)?;
                if !c.eat(b')') {
                    return Err(bad(c.pos, "expected ')'"));
                }
                Ok(e)
            }
            Some(b'?' | b'"') => self.symbol_atom(c),
            _ => Err(bad(at, "expected a number, a symbol or '('")),
        }
    }
}
