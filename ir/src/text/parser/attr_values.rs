//! Number literals and attribute values: numbers, booleans, integer lists, layouts and
//! `{key = value}` entries.

use super::{PResult, Parser};
use crate::text::attr_dict::{Attr, AttrLit};
use crate::text::lexer::Tok;

fn looks_like_layout(name: &str) -> bool {
    let digits_between = |pre: &str, suf: char| {
        name.strip_prefix(pre)
            .and_then(|r| r.strip_suffix(suf))
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    name == "row_major"
        || name == "blocked"
        || digits_between("nchw", 'c')
        || digits_between("oihw", 'o')
}

impl<'a> Parser<'a> {
    /// `-`? (integer | float | inf | nan)
    pub(super) fn number_lit(&mut self) -> PResult<(AttrLit, usize)> {
        let at = self.at();
        let negative = self.eat(&Tok::Minus);
        let lit = match self.peek().clone() {
            Tok::Int(text) => AttrLit::Num {
                negative,
                text,
                is_float: false,
            },
            Tok::Float(text) => AttrLit::Num {
                negative,
                text,
                is_float: true,
            },
            Tok::Ident(w) if w == "inf" || w == "nan" || w == "NaN" => AttrLit::NonFinite {
                negative,
                nan: w != "inf",
            },
            _ => return Err(self.unexpected("a number")),
        };
        self.bump();
        Ok((lit, at))
    }

    pub(super) fn small_int(&mut self, what: &str, max: u64) -> PResult<u64> {
        let at = self.at();
        match self.peek().clone() {
            Tok::Int(text) => {
                self.bump();
                match text.parse::<u64>() {
                    Ok(n) if n <= max => Ok(n),
                    _ => Err(self.diag(
                        "parse-error",
                        format!("{what} {text} is too large (at most {max})"),
                        at,
                    )),
                }
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn scalar_attr(&mut self) -> PResult<(AttrLit, usize)> {
        let at = self.at();
        match self.peek().clone() {
            Tok::Minus | Tok::Int(_) | Tok::Float(_) => self.number_lit(),
            Tok::Ident(w) if w == "inf" || w == "nan" || w == "NaN" => self.number_lit(),
            Tok::Ident(w) if w == "true" || w == "false" => {
                self.bump();
                Ok((AttrLit::Bool(w == "true"), at))
            }
            Tok::Ident(w) if looks_like_layout(&w) => {
                Ok((AttrLit::Layout(self.parse_layout()?), at))
            }
            Tok::Ident(w) => {
                self.bump();
                Ok((AttrLit::Word(w), at))
            }
            Tok::LParen | Tok::DimPunct('?') | Tok::Str(_) => self.size_attr(),
            Tok::LBracket => Err(self.map.error(at, "nested lists are not attribute values")),
            _ => Err(self.unexpected("an attribute value (number, true/false, [list] or layout)")),
        }
    }

    fn attr_value(&mut self) -> PResult<(AttrLit, usize)> {
        let at = self.at();
        if !self.eat(&Tok::LBracket) {
            return self.scalar_attr();
        }
        let mut items = Vec::new();
        if self.eat(&Tok::RBracket) {
            return Ok((AttrLit::List(items), at));
        }
        loop {
            items.push(self.scalar_attr()?);
            if self.eat(&Tok::Comma) {
                continue;
            }
            self.expect(Tok::RBracket, "',' or ']' in the list")?;
            return Ok((AttrLit::List(items), at));
        }
    }

    /// `key = value, ...` up to `close` (the opener is already consumed).
    pub(super) fn attr_entries(&mut self, close: Tok, code: &'static str) -> PResult<Vec<Attr>> {
        let mut entries: Vec<Attr> = Vec::new();
        if self.eat(&close) {
            return Ok(entries);
        }
        loop {
            let key = self.expect_ident("an attribute name")?;
            if entries.iter().any(|a| a.key == key.name) {
                return Err(self.diag(
                    code,
                    format!("attribute '{}' is given twice", key.name),
                    key.at,
                ));
            }
            self.expect(Tok::Eq, "'=' after the attribute name")?;
            let (value, value_at) = self.attr_value()?;
            entries.push(Attr {
                key: key.name,
                key_at: key.at,
                value,
                value_at,
            });
            if self.eat(&Tok::Comma) {
                continue;
            }
            if self.eat(&close) {
                return Ok(entries);
            }
            return Err(
                self.unexpected(&format!("',' or {} after the attribute", close.describe()))
            );
        }
    }
}
