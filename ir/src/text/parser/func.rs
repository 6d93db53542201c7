//! Functions: signatures, bodies, results, and the `loc(...)` source locations of
//! functions and statements.

use std::collections::HashMap;

use super::{Named, PResult, Parser, Slot, MAX_NESTING};
use crate::diag::{quote, Location};
use crate::graph::{Func, FuncResult, Param, Value};
use crate::text::lexer::Tok;
use crate::types::TensorType;

/// A result of the signature: optional name, type, offset of the type.
struct SigResult {
    name: Option<Named>,
    ty: TensorType,
    ty_at: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn opt_loc(&mut self) -> PResult<Option<Location>> {
        if !self.is_ident("loc") {
            return Ok(None);
        }
        self.bump();
        self.expect(Tok::LParen, "'(' after loc")?;
        let l = self.loc_item(0)?;
        self.expect(Tok::RParen, "')' to close loc(...)")?;
        Ok(Some(l))
    }

    fn loc_item(&mut self, depth: usize) -> PResult<Location> {
        let at = self.at();
        match self.peek().clone() {
            Tok::Str(s) => {
                self.bump();
                if !self.eat(&Tok::Colon) {
                    return Ok(Location::Name(s.into()));
                }
                let line = self.small_int("a line number", u32::MAX as u64)? as u32;
                self.expect(Tok::Colon, "':' and the column")?;
                let col = self.small_int("a column number", u32::MAX as u64)? as u32;
                Ok(Location::file(&s, line, col))
            }
            Tok::Ident(w) if w == "unknown" => {
                self.bump();
                Ok(Location::Unknown)
            }
            Tok::Ident(w) if w == "fused" => {
                if depth >= MAX_NESTING {
                    return Err(self.diag(
                        "too-deep",
                        format!("locations nested deeper than {MAX_NESTING} levels"),
                        at,
                    ));
                }
                self.bump();
                self.expect(Tok::LBracket, "'[' after fused")?;
                let mut parts = Vec::new();
                if !self.eat(&Tok::RBracket) {
                    loop {
                        parts.push(self.loc_item(depth + 1)?);
                        if self.eat(&Tok::Comma) {
                            continue;
                        }
                        self.expect(Tok::RBracket, "',' or ']' in fused[...]")?;
                        break;
                    }
                }
                Ok(Location::Fused(parts.into()))
            }
            _ => {
                Err(self
                    .unexpected("a location: \"file\":line:col, \"name\", fused[...] or unknown"))
            }
        }
    }

    /// `-> T`, `-> (T, ...)` or `-> (name: T, ...)`.
    fn signature(&mut self) -> PResult<Vec<SigResult>> {
        if !self.eat(&Tok::LParen) {
            let (ty, ty_at) = self.parse_type()?;
            return Ok(vec![SigResult {
                name: None,
                ty,
                ty_at,
            }]);
        }
        let mut out = Vec::new();
        if self.eat(&Tok::RParen) {
            return Ok(out);
        }
        loop {
            let name = match (self.peek().clone(), self.peek_nth(1)) {
                (Tok::Ident(n) | Tok::Str(n), Tok::Colon) => {
                    let at = self.bump().start;
                    self.bump();
                    Some(Named { name: n, at })
                }
                _ => None,
            };
            let (ty, ty_at) = self.parse_type()?;
            out.push(SigResult { name, ty, ty_at });
            if self.eat(&Tok::Comma) {
                continue;
            }
            self.expect(Tok::RParen, "',' or ')' in the result list")?;
            return Ok(out);
        }
    }

    pub(super) fn func(&mut self) -> PResult<()> {
        let kw_at = self.expect_keyword("func", "'func'")?;
        let name = self.expect_global("a function name like @main")?;
        if self.module.func(&name.name).is_some() {
            self.report(self.diag(
                "duplicate-name",
                format!("function @{} is defined twice", name.name),
                name.at,
            ))?;
        }
        let mut func = Func {
            name: name.name,
            params: Vec::new(),
            insts: Vec::new(),
            results: Vec::new(),
            loc: self.map.loc(kw_at),
        };
        let mut env: HashMap<String, Slot> = HashMap::new();
        self.undefined_uses.clear();
        self.expect(Tok::LParen, "'(' and the parameter list")?;
        if !self.eat(&Tok::RParen) {
            loop {
                let p = self.expect_value("a parameter like %x: tensor<...>")?;
                self.expect(Tok::Colon, "':' and the parameter's type")?;
                let (ty, _) = self.parse_type()?;
                if env.contains_key(&p.name) {
                    self.report(self.diag(
                        "redefined-value",
                        format!("parameter %{} is defined twice", p.name),
                        p.at,
                    ))?;
                } else {
                    env.insert(p.name.clone(), Slot::Val(Value(func.params.len() as u32)));
                }
                func.params.push(Param { name: p.name, ty });
                if self.eat(&Tok::Comma) {
                    continue;
                }
                self.expect(Tok::RParen, "',' or ')' after the parameter")?;
                break;
            }
        }
        self.expect(Tok::Arrow, "'->' and the result types")?;
        let sig = self.signature()?;
        for (i, r) in sig.iter().enumerate() {
            if let Some(n) = &r.name {
                if sig[..i]
                    .iter()
                    .any(|o| o.name.as_ref().is_some_and(|o| o.name == n.name))
                {
                    self.report(self.diag(
                        "duplicate-name",
                        format!("result name {} is used twice", quote(&n.name)),
                        n.at,
                    ))?;
                }
            }
        }
        if let Some(l) = self.opt_loc()? {
            func.loc = l;
        }
        self.expect(Tok::LBrace, "'{' to open the function body")?;
        loop {
            match self.peek() {
                Tok::Value(_) => self.statement(&mut func, &mut env)?,
                Tok::Ident(k) if k == "return" => break,
                _ => return Err(self.unexpected("an instruction '%name = op ...' or 'return'")),
            }
        }
        let ret_at = self.bump().start;
        let mut values = Vec::new();
        if matches!(self.peek(), Tok::Value(_)) {
            loop {
                values.push(self.expect_value("a returned value")?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        let mut types = Vec::new();
        if !values.is_empty() {
            self.expect(Tok::Colon, "':' and the types of the returned values")?;
            for i in 0..values.len() {
                if i > 0 {
                    self.expect(Tok::Comma, "',' and the next returned type")?;
                }
                types.push(self.parse_type()?);
            }
        }
        self.expect(Tok::RBrace, "'}' to close the function body")?;
        self.results(&mut func, &env, &sig, &values, &types, ret_at)?;
        self.module.funcs.push(func);
        Ok(())
    }

    fn results(
        &mut self,
        func: &mut Func,
        env: &HashMap<String, Slot>,
        sig: &[SigResult],
        values: &[Named],
        types: &[(TensorType, usize)],
        ret_at: usize,
    ) -> PResult<()> {
        if values.len() != sig.len() {
            return self.report(self.diag(
                "type-mismatch",
                format!(
                    "return gives {} values, but the signature declares {} results",
                    values.len(),
                    sig.len()
                ),
                ret_at,
            ));
        }
        for (i, ((v, (ty, ty_at)), s)) in values.iter().zip(types).zip(sig).enumerate() {
            let value = match env.get(&v.name) {
                Some(Slot::Val(value)) => *value,
                Some(Slot::Poisoned) => continue,
                None => {
                    self.report(self.diag(
                        "undefined-value",
                        format!("undefined value %{}", v.name),
                        v.at,
                    ))?;
                    continue;
                }
            };
            let actual = func.type_of(value).clone();
            if *ty != actual {
                self.report(self.diag(
                    "type-mismatch",
                    format!("%{} has type {actual}, but return says {ty}", v.name),
                    *ty_at,
                ))?;
            } else if s.ty != actual {
                self.report(self.diag(
                    "type-mismatch",
                    format!(
                        "result {i} is declared {} in the signature, but %{} has type {actual}",
                        s.ty, v.name
                    ),
                    s.ty_at,
                ))?;
            }
            func.results.push(FuncResult {
                name: s
                    .name
                    .as_ref()
                    .map_or_else(|| format!("result{i}"), |n| n.name.clone()),
                value,
            });
        }
        Ok(())
    }
}
