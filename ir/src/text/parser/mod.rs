//! Recursive-descent parser of the `.tir` text form into a verified [`Module`].
//!
//! Syntax errors stop the parse (one diagnostic); semantic errors in a statement
//! (undefined values, bad attributes, type mismatches) are collected and the parse goes
//! on, with the statement's result marked as poisoned so it causes no follow-up errors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::attr_dict::{AttrDict, AttrError};
use super::attrs::build_op;
use super::lexer::{lex, SourceMap, Tok, Token};
use crate::diag::{Diagnostic, Diagnostics};
use crate::graph::{Module, Value};
use crate::op::Op;

mod attr_values;
mod dims;
mod func;
mod inst;
mod types;
mod weights;

/// Deepest bracket nesting accepted (dense lists, fused locations): deeper input is an
/// error instead of a stack overflow.
pub const MAX_NESTING: usize = 32;
/// The parse stops after this many errors.
pub const MAX_ERRORS: usize = 20;

type PResult<T> = Result<T, Diagnostic>;

/// What a name in the function's scope stands for.
enum Slot {
    Val(Value),
    /// Its defining statement had an error: uses are silently poisoned too.
    Poisoned,
}

/// A `%name` as written, with its byte offset.
#[derive(Clone)]
struct Named {
    name: String,
    at: usize,
}

struct Parser<'a> {
    map: SourceMap<'a>,
    toks: Vec<Token>,
    pos: usize,
    base_dir: Option<&'a Path>,
    /// One more folder sidecars may be read from (see [`crate::files::Confinement`]).
    allowed_root: Option<&'a Path>,
    module: Module,
    errors: Vec<Diagnostic>,
    /// Sidecar files read so far, by name as written.
    sidecars: BTreeMap<String, Result<Vec<u8>, String>>,
    /// Weights whose declaration had an error: `const` ops reading them are poisoned
    /// instead of reported again.
    failed_weights: BTreeSet<String>,
    /// Uses of undefined names in the current function: (name, index into `errors`), so
    /// a later definition of the name can add "defined later" to the diagnostic.
    undefined_uses: Vec<(String, usize)>,
    /// Fresh symbols (`?` in a type) named so far: the next is `?{fresh_dims + 1}`.
    fresh_dims: usize,
}

/// Parses and verifies a module. `base_dir` is where `external<...>` sidecars are read
/// from, confined to it or to `opts.allowed_root`.
pub(crate) fn parse_module(
    src: &str,
    file: &str,
    base_dir: Option<&Path>,
    opts: &super::ParseOptions,
) -> Result<Module, Diagnostics> {
    let map = SourceMap::new(src, file);
    let toks = lex(&map)?;
    let mut module = Module::default();
    module.weights.set_memory_budget(opts.memory_budget);
    let mut p = Parser {
        map,
        toks,
        pos: 0,
        base_dir,
        allowed_root: opts.allowed_root.as_deref(),
        module,
        errors: Vec::new(),
        sidecars: BTreeMap::new(),
        failed_weights: BTreeSet::new(),
        undefined_uses: Vec::new(),
        fresh_dims: 0,
    };
    if let Err(e) = p.items() {
        p.errors.push(e);
    }
    if !p.errors.is_empty() {
        return Err(Diagnostics(p.errors));
    }
    crate::verify::verify_module(&p.module)?;
    Ok(p.module)
}

/// Builds op `name` from `key = value, ...` written as in a text-form attribute
/// dictionary (without the braces): the text form's one attribute schema (keys, types,
/// defaults, required keys), for other front ends such as the rule language's
/// `op[key = value]`. `Err` holds a message and its byte offset in `text`.
pub(crate) fn op_from_attributes(name: &str, text: &str) -> Result<Op, (String, usize)> {
    // the closing brace ends the entries, as in a dictionary
    let src = format!("{text}}}");
    let map = SourceMap::new(&src, "attributes");
    let toks = lex(&map).map_err(|d| (d.message.clone(), 0))?;
    let mut p = Parser {
        map,
        toks,
        pos: 0,
        base_dir: None,
        allowed_root: None,
        module: Module::default(),
        errors: Vec::new(),
        sidecars: BTreeMap::new(),
        failed_weights: BTreeSet::new(),
        undefined_uses: Vec::new(),
        fresh_dims: 0,
    };
    let entries = p
        .attr_entries(Tok::RBrace, "bad-attribute")
        .map_err(|d| (d.message.clone(), 0))?;
    if *p.peek() != Tok::Eof {
        return Err((
            format!("unexpected {} after the attributes", p.peek().describe()),
            p.at(),
        ));
    }
    let owner = format!("'{name}'");
    let mut dict = AttrDict::new(&owner, 0, entries);
    let at_error = |e: AttrError| (e.message, e.at.min(text.len()));
    let op = build_op(name, &mut dict)
        .map_err(at_error)?
        .ok_or_else(|| (format!("unknown op '{name}'"), 0))?;
    dict.finish().map_err(at_error)?;
    Ok(op)
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn peek_nth(&self, n: usize) -> &Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].tok
    }

    fn at(&self) -> usize {
        self.toks[self.pos].start
    }

    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn is_ident(&self, word: &str) -> bool {
        matches!(self.peek(), Tok::Ident(w) if w == word)
    }

    fn unexpected(&self, what: &str) -> Diagnostic {
        let found = self.peek();
        let msg = if *found == Tok::Eof {
            format!("unexpected end of file: expected {what}")
        } else {
            format!("expected {what}, found {}", found.describe())
        };
        self.map.error(self.at(), msg)
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        if self.peek() == tok {
            self.bump();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, tok: Tok, what: &str) -> PResult<usize> {
        if *self.peek() == tok {
            Ok(self.bump().start)
        } else {
            Err(self.unexpected(what))
        }
    }

    fn expect_keyword(&mut self, word: &str, what: &str) -> PResult<usize> {
        if self.is_ident(word) {
            Ok(self.bump().start)
        } else {
            Err(self.unexpected(what))
        }
    }

    fn expect_ident(&mut self, what: &str) -> PResult<Named> {
        match self.peek().clone() {
            Tok::Ident(name) => Ok(Named {
                name,
                at: self.bump().start,
            }),
            _ => Err(self.unexpected(what)),
        }
    }

    fn expect_value(&mut self, what: &str) -> PResult<Named> {
        match self.peek().clone() {
            Tok::Value(name) => Ok(Named {
                name,
                at: self.bump().start,
            }),
            _ => Err(self.unexpected(what)),
        }
    }

    fn expect_global(&mut self, what: &str) -> PResult<Named> {
        match self.peek().clone() {
            Tok::Global(name) => Ok(Named {
                name,
                at: self.bump().start,
            }),
            _ => Err(self.unexpected(what)),
        }
    }

    fn expect_string(&mut self, what: &str) -> PResult<String> {
        match self.peek().clone() {
            Tok::Str(s) => {
                self.bump();
                Ok(s)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn diag(&self, code: &'static str, message: impl Into<String>, at: usize) -> Diagnostic {
        Diagnostic::error(code, message, self.map.loc(at))
    }

    fn attr_diag(&self, e: AttrError, code: &'static str) -> Diagnostic {
        self.diag(code, e.message, e.at)
    }

    /// Records a semantic error; fails once there are too many.
    fn report(&mut self, d: Diagnostic) -> PResult<()> {
        self.errors.push(d);
        if self.errors.len() >= MAX_ERRORS {
            return Err(self.diag(
                "too-many-errors",
                format!("stopping after {MAX_ERRORS} errors"),
                self.at(),
            ));
        }
        Ok(())
    }

    fn items(&mut self) -> PResult<()> {
        self.declared_weights_fit()?;
        loop {
            match self.peek() {
                Tok::Eof => return Ok(()),
                Tok::Ident(k) if k == "const" => self.weight_decl()?,
                Tok::Ident(k) if k == "func" => self.func()?,
                _ => return Err(self.unexpected("'const' or 'func' at the top level")),
            }
        }
    }
}
