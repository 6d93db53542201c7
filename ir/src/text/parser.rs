//! Recursive-descent parser of the `.tir` text form into a verified [`Module`].
//!
//! Syntax errors stop the parse (one diagnostic); semantic errors in a statement
//! (undefined values, bad attributes, type mismatches) are collected and the parse goes
//! on, with the statement's result marked as poisoned so it causes no follow-up errors.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use super::attrs::{build_op, suggest, to_f32, Attr, AttrDict, AttrError, AttrLit};
use super::lexer::{lex, SourceMap, Tok, Token};
use crate::diag::{quote, Diagnostic, Diagnostics, Location};
use crate::graph::{Func, FuncResult, Inst, Module, Param, Value};
use crate::op::{FusedOp, Op, PostOp};
use crate::tensor::Tensor;
use crate::types::{DType, Layout, TensorType};
use crate::weights::{random_f32, AlignedBuf, WeightOrigin};

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

enum PostSyntax {
    Unary {
        name: Named,
        attrs: AttrDict,
    },
    Binary {
        name: Named,
        operand: Named,
        acc_is_lhs: bool,
    },
}

/// One `%r = ...` statement as written, before names and types are resolved.
struct OpSyntax {
    result: Named,
    mnemonic: Named,
    weight: Option<Named>,
    anchor: Option<Named>,
    operands: Vec<Named>,
    attrs: AttrDict,
    post: Vec<PostSyntax>,
    ty: TensorType,
    ty_at: usize,
    loc: Option<Location>,
}

/// Number literals with their source offsets.
type Literals = Vec<(AttrLit, usize)>;

/// A weight initializer as written; dense literals keep their offsets and are converted
/// once the weight's element type is known.
enum Init {
    Dense { values: Literals, splat: bool },
    Random { seed: u64, min: f32, max: f32 },
    External { file: String, key: String },
    Elided,
}

/// The logical row-major elements of a weight declaration, by element type.
enum WeightValues {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

/// The value of an integer literal (not a float) when it fits an i64.
fn lit_to_i64(lit: &AttrLit) -> Option<i64> {
    match lit {
        AttrLit::Num {
            negative,
            text,
            is_float: false,
        } => if *negative {
            format!("-{text}")
        } else {
            text.clone()
        }
        .parse()
        .ok(),
        _ => None,
    }
}

/// A result of the signature: optional name, type, offset of the type.
struct SigResult {
    name: Option<Named>,
    ty: TensorType,
    ty_at: usize,
}

struct Parser<'a> {
    map: SourceMap<'a>,
    toks: Vec<Token>,
    pos: usize,
    base_dir: Option<&'a Path>,
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
}

/// Parses and verifies a module. `base_dir` is where `external<...>` sidecars are read from.
pub(crate) fn parse_module(
    src: &str,
    file: &str,
    base_dir: Option<&Path>,
) -> Result<Module, Diagnostics> {
    let map = SourceMap::new(src, file);
    let toks = lex(&map)?;
    let mut p = Parser {
        map,
        toks,
        pos: 0,
        base_dir,
        module: Module::default(),
        errors: Vec::new(),
        sidecars: BTreeMap::new(),
        failed_weights: BTreeSet::new(),
        undefined_uses: Vec::new(),
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
    // ---- token helpers ----

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

    // ---- module ----

    fn items(&mut self) -> PResult<()> {
        loop {
            match self.peek() {
                Tok::Eof => return Ok(()),
                Tok::Ident(k) if k == "const" => self.weight_decl()?,
                Tok::Ident(k) if k == "func" => self.func()?,
                _ => return Err(self.unexpected("'const' or 'func' at the top level")),
            }
        }
    }

    // ---- literals ----

    /// `-`? (integer | float | inf | nan)
    fn number_lit(&mut self) -> PResult<(AttrLit, usize)> {
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

    fn small_int(&mut self, what: &str, max: u64) -> PResult<u64> {
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

    // ---- types ----

    fn parse_layout(&mut self) -> PResult<Layout> {
        let what = "a layout (row_major, nchw8c, oihw8o or blocked<axis,block>)";
        let word = self.expect_ident(what)?;
        let block_of = |digits: &str| -> Option<u8> {
            digits
                .parse::<u8>()
                .ok()
                .filter(|b| *b > 0 && digits.bytes().all(|c| c.is_ascii_digit()))
        };
        let bad_block = |p: &Self| {
            p.diag(
                "bad-type",
                format!("bad layout '{}': the block must be 1 to 255", word.name),
                word.at,
            )
        };
        match word.name.as_str() {
            "row_major" => Ok(Layout::RowMajor),
            "blocked" => {
                self.expect(Tok::Lt, "'<' as in blocked<axis,block>")?;
                let axis = self.small_int("the blocked axis", u8::MAX as u64)? as u8;
                self.expect(Tok::Comma, "',' as in blocked<axis,block>")?;
                let block = self.small_int("the block size", u8::MAX as u64)? as u8;
                self.expect(Tok::Gt, "'>' to close blocked<axis,block>")?;
                if block == 0 {
                    return Err(bad_block(self));
                }
                Ok(Layout::Blocked { axis, block })
            }
            n => {
                let (axis, digits) = if let Some(d) =
                    n.strip_prefix("nchw").and_then(|r| r.strip_suffix('c'))
                {
                    (1, d)
                } else if let Some(d) = n.strip_prefix("oihw").and_then(|r| r.strip_suffix('o')) {
                    (0, d)
                } else {
                    return Err(self
                        .diag("bad-type", format!("unknown layout '{n}'"), word.at)
                        .with_note(
                            "layouts are row_major, nchwNc, oihwNo or blocked<axis,block>",
                        ));
                };
                match block_of(digits) {
                    Some(block) => Ok(Layout::Blocked { axis, block }),
                    None => Err(bad_block(self)),
                }
            }
        }
    }

    fn dim(&self, text: &str, at: usize) -> PResult<usize> {
        match text.parse::<u64>() {
            Ok(0) => Err(self.diag(
                "bad-type",
                "dimension 0: every dimension must be at least 1",
                at,
            )),
            Ok(n) => usize::try_from(n)
                .map_err(|_| self.diag("too-large", format!("dimension {text} is too large"), at)),
            Err(_) => Err(self.diag("too-large", format!("dimension {text} is too large"), at)),
        }
    }

    /// `tensor<D0xD1x...xDTYPE[, LAYOUT]>`; `tensor<f32>` is a scalar.
    fn parse_type(&mut self) -> PResult<(TensorType, usize)> {
        let at = self.at();
        if !self.is_ident("tensor") {
            return Err(self.unexpected("a tensor type like tensor<1x3xf32>"));
        }
        self.bump();
        self.expect(Tok::Lt, "'<' after 'tensor'")?;
        let mut dims = Vec::new();
        let dtype_word = match self.peek().clone() {
            Tok::Ident(word) => {
                let t = self.bump();
                (word, t.start)
            }
            Tok::Int(first) => {
                let t = self.bump();
                dims.push(self.dim(&first, t.start)?);
                let next = self.toks[self.pos].clone();
                match &next.tok {
                    Tok::Ident(rest) if next.start == t.end && rest.starts_with('x') => {
                        self.bump();
                        // `x64x56xf32`: dimensions, then the element type, split on 'x'.
                        let pieces: Vec<&str> = rest[1..].split('x').collect();
                        let mut off = next.start + 1;
                        let last = pieces.len() - 1;
                        for (i, piece) in pieces.iter().enumerate() {
                            if i == last {
                                break;
                            }
                            if piece.is_empty() || !piece.bytes().all(|b| b.is_ascii_digit()) {
                                return Err(self.diag(
                                    "bad-type",
                                    format!("bad dimension '{piece}': expected a positive integer"),
                                    off,
                                ));
                            }
                            dims.push(self.dim(piece, off)?);
                            off += piece.len() + 1;
                        }
                        (pieces[last].to_string(), off)
                    }
                    _ => {
                        return Err(self.map.error(
                            next.start,
                            format!(
                                "expected 'x' and the next dimension or the element type right after {first}, as in tensor<1x3xf32>"
                            ),
                        ))
                    }
                }
            }
            _ => {
                return Err(self.unexpected(
                    "dimensions and an element type, as in tensor<1x3xf32> or tensor<f32>",
                ))
            }
        };
        let dtype = DType::from_name(&dtype_word.0).ok_or_else(|| {
            self.diag(
                "bad-type",
                format!(
                    "unknown element type '{}' (expected f32 or i64)",
                    dtype_word.0
                ),
                dtype_word.1,
            )
        })?;
        let mut layout = Layout::RowMajor;
        if self.eat(&Tok::Comma) {
            let layout_at = self.at();
            layout = self.parse_layout()?;
            if let Layout::Blocked { axis, .. } = layout {
                if axis as usize >= dims.len() {
                    return Err(self.diag(
                        "bad-type",
                        format!(
                            "layout blocks axis {axis}, but the tensor has rank {}",
                            dims.len()
                        ),
                        layout_at,
                    ));
                }
            }
        }
        if *self.peek() != Tok::Gt {
            return Err(self.unexpected("'>' to close the tensor type (unterminated type)"));
        }
        self.bump();
        let ty = TensorType {
            dtype,
            dims,
            layout,
        };
        ty.check_size().map_err(|m| self.diag("too-large", m, at))?;
        Ok((ty, at))
    }

    // ---- attributes ----

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
    fn attr_entries(&mut self, close: Tok, code: &'static str) -> PResult<Vec<Attr>> {
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

    // ---- locations ----

    fn opt_loc(&mut self) -> PResult<Option<Location>> {
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
                Ok(Location::Fused(parts))
            }
            _ => {
                Err(self
                    .unexpected("a location: \"file\":line:col, \"name\", fused[...] or unknown"))
            }
        }
    }

    // ---- weights ----

    fn dense_values(&mut self, depth: usize, out: &mut Literals) -> PResult<()> {
        let at = self.at();
        if self.eat(&Tok::LBracket) {
            if depth >= MAX_NESTING {
                return Err(self.diag(
                    "too-deep",
                    format!("brackets nested deeper than {MAX_NESTING} levels"),
                    at,
                ));
            }
            if self.eat(&Tok::RBracket) {
                return Ok(());
            }
            loop {
                self.dense_values(depth + 1, out)?;
                if self.eat(&Tok::Comma) {
                    continue;
                }
                self.expect(Tok::RBracket, "',' or ']' in the dense list")?;
                return Ok(());
            }
        }
        out.push(self.number_lit()?);
        Ok(())
    }

    fn weight_init(&mut self) -> PResult<(Init, usize)> {
        let kind =
            self.expect_ident("the weight's data: dense<...>, random<...> or external<...>")?;
        let open = |p: &mut Self| p.expect(Tok::Lt, &format!("'<' after {}", kind.name));
        let init = match kind.name.as_str() {
            "dense" => {
                open(self)?;
                let splat = *self.peek() != Tok::LBracket;
                let mut values = Vec::new();
                self.dense_values(0, &mut values)?;
                self.expect(Tok::Gt, "'>' to close dense<...>")?;
                Init::Dense { values, splat }
            }
            "random" => {
                open(self)?;
                let entries = self.attr_entries(Tok::Gt, "bad-weight")?;
                let mut d = AttrDict::new("random<...>", kind.at, entries);
                let r = (|| {
                    let (seed, min, max) = (d.u64("seed")?, d.f32("min")?, d.f32("max")?);
                    Ok::<_, AttrError>((seed, min, max))
                })()
                .map_err(|e| self.attr_diag(e, "bad-weight"))?;
                d.finish().map_err(|e| self.attr_diag(e, "bad-weight"))?;
                match r {
                    (Some(seed), Some(min), Some(max)) => Init::Random {
                        seed,
                        min: min.0,
                        max: max.0,
                    },
                    _ => {
                        return Err(self.diag(
                            "bad-weight",
                            "random<...> needs seed, min and max",
                            kind.at,
                        ))
                    }
                }
            }
            "external" => {
                open(self)?;
                let file = self.expect_string("the sidecar file name as a string")?;
                self.expect(Tok::Comma, "',' and the tensor's name in the sidecar")?;
                let key = self.expect_string("the tensor's name as a string")?;
                self.expect(Tok::Gt, "'>' to close external<...>")?;
                Init::External { file, key }
            }
            "elided" => {
                open(self)?;
                self.expect_string("the content hash as a string")?;
                self.expect(Tok::Gt, "'>' to close elided<...>")?;
                Init::Elided
            }
            other => {
                return Err(self.diag(
                    "bad-weight",
                    format!(
                        "unknown weight data '{other}': expected dense<...>, random<...> or external<...>"
                    ),
                    kind.at,
                ))
            }
        };
        Ok((init, kind.at))
    }

    fn load_external(
        &mut self,
        file: &str,
        key: &str,
        ty: &TensorType,
    ) -> Result<Vec<f32>, String> {
        let Some(base) = self.base_dir else {
            return Err(
                "external weights are read relative to the .tir file's directory, \
                        which is unknown for text parsed from memory: parse the file itself \
                        or give a base directory"
                    .into(),
            );
        };
        let bytes = self.sidecars.entry(file.to_string()).or_insert_with(|| {
            std::fs::read(base.join(file))
                .map_err(|e| format!("cannot read sidecar {}: {e}", quote(file)))
        });
        let bytes = bytes.as_ref().map_err(|e| e.clone())?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| {
            format!(
                "sidecar {} is not a valid safetensors file: {e}",
                quote(file)
            )
        })?;
        let view = st.tensor(key).map_err(|_| {
            let mut names = st.names();
            names.sort();
            let shown: Vec<String> = names.iter().take(8).map(|n| quote(n)).collect();
            let more = if names.len() > 8 { ", ..." } else { "" };
            format!(
                "sidecar {} has no tensor {} (it has {}{more})",
                quote(file),
                quote(key),
                shown.join(", ")
            )
        })?;
        if view.dtype() != Dtype::F32 {
            return Err(format!(
                "tensor {} in {} has dtype {:?}; only F32 is supported",
                quote(key),
                quote(file),
                view.dtype()
            ));
        }
        if view.shape() != ty.dims.as_slice() {
            return Err(format!(
                "tensor {} in {} has shape {:?}, but {ty} needs {:?}",
                quote(key),
                quote(file),
                view.shape(),
                ty.dims
            ));
        }
        let data = view.data();
        if data.len() != ty.num_elements() * 4 {
            return Err(format!(
                "tensor {} in {} has {} bytes, expected {}",
                quote(key),
                quote(file),
                data.len(),
                ty.num_elements() * 4
            ));
        }
        Ok(data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// `const @name : TYPE = INIT`
    fn weight_decl(&mut self) -> PResult<()> {
        self.expect_keyword("const", "'const'")?;
        let name = self.expect_global("a weight name like @w0")?;
        self.expect(Tok::Colon, "':' and the weight's type")?;
        let (ty, ty_at) = self.parse_type()?;
        self.expect(Tok::Eq, "'=' and the weight's data")?;
        let (init, init_at) = self.weight_init()?;
        let redefined = self.module.weights.lookup(&name.name).is_some();
        if !redefined {
            // Until it is added successfully, uses of the name are poisoned, not reported.
            self.failed_weights.insert(name.name.clone());
        }
        match self.weight_data(&name, &ty, ty_at, init, init_at) {
            Ok((values, origin)) => {
                let data = match values {
                    WeightValues::I64(values) => AlignedBuf::from_i64(&values),
                    WeightValues::F32(values) => AlignedBuf::from_f32(&match ty.layout {
                        Layout::RowMajor => values,
                        Layout::Blocked { .. } => {
                            Tensor {
                                ty: ty.with_layout(Layout::RowMajor),
                                data: values,
                            }
                            .to_layout(ty.layout)
                            .data
                        }
                    }),
                };
                match self.module.weights.add(name.name.clone(), ty, data, origin) {
                    Ok(_) => {
                        self.failed_weights.remove(&name.name);
                    }
                    Err(m) => self.report(self.diag("bad-weight", m, name.at))?,
                }
            }
            Err(d) => self.report(d)?,
        }
        Ok(())
    }

    /// The logical row-major values and origin of a weight declaration.
    fn weight_data(
        &mut self,
        name: &Named,
        ty: &TensorType,
        ty_at: usize,
        init: Init,
        init_at: usize,
    ) -> PResult<(WeightValues, WeightOrigin)> {
        if self.module.weights.lookup(&name.name).is_some() {
            return Err(self.diag(
                "duplicate-name",
                format!("weight @{} is defined twice", name.name),
                name.at,
            ));
        }
        let n = ty.num_elements();
        if ty.dtype == DType::I64 {
            // i64 weights (shape tensors an importer returns) are written as integer lists.
            return match init {
                Init::Dense { values, splat }
                    if ty.layout == Layout::RowMajor && (values.len() == n || splat) =>
                {
                    let mut ints = Vec::with_capacity(values.len());
                    for (lit, at) in &values {
                        ints.push(lit_to_i64(lit).ok_or_else(|| {
                            self.diag(
                                "bad-weight",
                                "an i64 weight holds integers in i64 range (no floats, no fractions)".to_string(),
                                *at,
                            )
                        })?);
                    }
                    if splat && ints.len() == 1 {
                        ints = vec![ints[0]; n];
                    }
                    Ok((WeightValues::I64(ints), WeightOrigin::Inline))
                }
                _ => Err(self.diag(
                    "bad-weight",
                    format!(
                        "weight @{} has type {ty}: i64 weights are row-major dense<[...]> lists of {n} integers",
                        name.name
                    ),
                    ty_at,
                )),
            };
        }
        match init {
            Init::Dense { values, splat } => {
                let mut floats = Vec::with_capacity(values.len());
                for (lit, at) in &values {
                    floats.push(
                        to_f32("dense", lit, *at).map_err(|e| self.attr_diag(e, "bad-weight"))?,
                    );
                }
                if splat && floats.len() == 1 {
                    Ok((WeightValues::F32(vec![floats[0]; n]), WeightOrigin::Inline))
                } else if floats.len() == n {
                    Ok((WeightValues::F32(floats), WeightOrigin::Inline))
                } else {
                    Err(self.diag(
                        "bad-weight",
                        format!(
                            "dense<...> has {} elements, but {ty} has {n}",
                            floats.len()
                        ),
                        init_at,
                    ))
                }
            }
            Init::Random { seed, min, max } => {
                if !(min.is_finite() && max.is_finite() && min <= max) {
                    return Err(self.diag(
                        "bad-weight",
                        format!("random<...> needs finite min <= max, got min = {min}, max = {max}"),
                        init_at,
                    ));
                }
                Ok((
                    WeightValues::F32(random_f32(seed, n, min, max)),
                    WeightOrigin::Random { seed, min, max },
                ))
            }
            Init::External { file, key } => match self.load_external(&file, &key, ty) {
                Ok(values) => Ok((
                    WeightValues::F32(values),
                    WeightOrigin::External { file, key },
                )),
                Err(m) => Err(self.diag("bad-weight", m, init_at)),
            },
            Init::Elided => Err(self
                .diag(
                    "elided-weight",
                    format!(
                        "the data of weight @{} was elided when this text was printed; it cannot be loaded",
                        name.name
                    ),
                    init_at,
                )
                .with_note("print the module without elide_weights (--elide-weights) to get loadable text")),
        }
    }

    // ---- functions ----

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

    fn func(&mut self) -> PResult<()> {
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

    // ---- statements ----

    fn post_op(&mut self) -> PResult<PostSyntax> {
        let name = self.expect_ident("a post-op like relu or add(_, %v)")?;
        if !self.eat(&Tok::LParen) {
            let entries = if self.eat(&Tok::LBrace) {
                self.attr_entries(Tok::RBrace, "bad-attribute")?
            } else {
                Vec::new()
            };
            let owner = format!("post-op '{}'", name.name);
            let attrs = AttrDict::new(&owner, name.at, entries);
            return Ok(PostSyntax::Unary { name, attrs });
        }
        let arg = |p: &mut Self| -> PResult<Option<Named>> {
            if p.is_ident("_") {
                p.bump();
                Ok(None)
            } else {
                p.expect_value("'_' (the accumulator) or a value").map(Some)
            }
        };
        let lhs = arg(self)?;
        self.expect(Tok::Comma, "',' between the two operands of the post-op")?;
        let rhs = arg(self)?;
        self.expect(Tok::RParen, "')' to close the post-op's operands")?;
        match (lhs, rhs) {
            (None, Some(operand)) => Ok(PostSyntax::Binary {
                name,
                operand,
                acc_is_lhs: true,
            }),
            (Some(operand), None) => Ok(PostSyntax::Binary {
                name,
                operand,
                acc_is_lhs: false,
            }),
            _ => Err(self.map.error(
                name.at,
                format!(
                    "binary post-op '{}' needs exactly one '_' (the accumulator) and one value, as in {}(_, %v)",
                    name.name, name.name
                ),
            )),
        }
    }

    fn op_syntax(&mut self) -> PResult<OpSyntax> {
        let result = self.expect_value("a result name")?;
        self.expect(Tok::Eq, "'=' after the result name")?;
        let mnemonic = self.expect_ident("an op name")?;
        let mut weight = None;
        let mut anchor = None;
        if mnemonic.name == "const" {
            weight = Some(self.expect_global("a weight name like @w0 after 'const'")?);
        } else if mnemonic.name == "fused" {
            anchor = Some(self.expect_ident("the fused op's anchor, e.g. conv2d")?);
        }
        let mut operands = Vec::new();
        if weight.is_none() && matches!(self.peek(), Tok::Value(_)) {
            loop {
                operands.push(self.expect_value("an operand")?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        let owner = anchor.as_ref().unwrap_or(&mnemonic);
        let (owner_name, owner_at) = (format!("'{}'", owner.name), owner.at);
        let entries = if self.eat(&Tok::LBrace) {
            self.attr_entries(Tok::RBrace, "bad-attribute")?
        } else {
            Vec::new()
        };
        let attrs = AttrDict::new(&owner_name, owner_at, entries);
        let mut post = Vec::new();
        if anchor.is_some() {
            self.expect_keyword("post", "'post [...]' with the fused op's post-ops")?;
            self.expect(Tok::LBracket, "'[' and the post-op list")?;
            if !self.eat(&Tok::RBracket) {
                loop {
                    post.push(self.post_op()?);
                    if self.eat(&Tok::Comma) {
                        continue;
                    }
                    self.expect(Tok::RBracket, "',' or ']' in the post-op list")?;
                    break;
                }
            }
        }
        self.expect(Tok::Colon, "':' and the result type")?;
        let (ty, ty_at) = self.parse_type()?;
        let loc = self.opt_loc()?;
        Ok(OpSyntax {
            result,
            mnemonic,
            weight,
            anchor,
            operands,
            attrs,
            post,
            ty,
            ty_at,
            loc,
        })
    }

    fn statement(&mut self, func: &mut Func, env: &mut HashMap<String, Slot>) -> PResult<()> {
        let s = self.op_syntax()?;
        if env.contains_key(&s.result.name) {
            return self.report(
                self.diag(
                    "redefined-value",
                    format!("value %{} is already defined", s.result.name),
                    s.result.at,
                )
                .with_note("each value is assigned exactly once; pick a new name"),
            );
        }
        let result = s.result.name.clone();
        let (line, col) = self.map.line_col(s.result.at);
        for (name, index) in &self.undefined_uses {
            if *name == result {
                if let Some(d) = self.errors.get_mut(*index) {
                    d.notes.push(format!(
                        "%{name} is defined later, on line {line} column {col}; a value must be defined before its first use"
                    ));
                }
            }
        }
        let post_operands = s.post.iter().filter_map(|p| match p {
            PostSyntax::Binary { operand, .. } => Some(operand),
            PostSyntax::Unary { .. } => None,
        });
        let first_undefined = s
            .operands
            .iter()
            .chain(post_operands)
            .find(|n| !env.contains_key(&n.name))
            .map(|n| n.name.clone());
        match self.build_inst(s, func, env) {
            Ok(inst) => {
                env.insert(result, Slot::Val(Value(func.num_values() as u32)));
                func.insts.push(inst);
            }
            Err(d) => {
                env.insert(result, Slot::Poisoned);
                if let Some(d) = d {
                    if let (Some(name), "undefined-value") = (first_undefined, d.code) {
                        self.undefined_uses.push((name, self.errors.len()));
                    }
                    self.report(d)?;
                }
            }
        }
        Ok(())
    }

    /// The op named `name` with its attributes checked.
    fn simple_op(&self, name: &Named, mut attrs: AttrDict) -> Result<Op, Diagnostic> {
        match build_op(&name.name, &mut attrs) {
            Err(e) => Err(self.attr_diag(e, "bad-attribute")),
            Ok(None) => {
                let d = self.diag("unknown-op", format!("unknown op '{}'", name.name), name.at);
                Err(match suggest(&name.name) {
                    Some(s) => d.with_note(format!("did you mean '{s}'?")),
                    None => d,
                })
            }
            Ok(Some(op)) => {
                attrs
                    .finish()
                    .map_err(|e| self.attr_diag(e, "bad-attribute"))?;
                Ok(op)
            }
        }
    }

    /// Resolves names and checks the op; `Err(None)` when an operand is poisoned.
    fn build_inst(
        &self,
        s: OpSyntax,
        func: &Func,
        env: &HashMap<String, Slot>,
    ) -> Result<Inst, Option<Diagnostic>> {
        let mut extra_operands = Vec::new();
        let (op, arity_op, arity_at) = if let Some(w) = &s.weight {
            s.attrs
                .finish()
                .map_err(|e| Some(self.attr_diag(e, "bad-attribute")))?;
            if self.failed_weights.contains(&w.name) {
                return Err(None);
            }
            let id = self.module.weights.lookup(&w.name).ok_or_else(|| {
                Some(
                    self.diag("unknown-weight", format!("unknown weight @{}", w.name), w.at)
                        .with_note("weights are declared at the top, before the functions: const @w : tensor<...> = dense<...>"),
                )
            })?;
            (Op::Const(id), None, s.mnemonic.at)
        } else if let Some(anchor_name) = &s.anchor {
            let anchor = self.simple_op(anchor_name, s.attrs).map_err(Some)?;
            if !anchor.is_anchor() {
                return Err(Some(
                    self.diag(
                        "bad-fused-op",
                        format!("'{}' cannot anchor a fused op", anchor_name.name),
                        anchor_name.at,
                    )
                    .with_note("anchors are conv2d, gemm, matmul, layer_norm, max_pool2d, avg_pool2d and global_avg_pool"),
                ));
            }
            let mut post_ops = Vec::new();
            for p in s.post {
                post_ops.push(self.post_op_of(p, &mut extra_operands)?);
            }
            let arity_op = anchor.clone();
            (
                Op::Fused(FusedOp {
                    anchor: Box::new(anchor),
                    post_ops,
                }),
                Some(arity_op),
                anchor_name.at,
            )
        } else {
            (
                self.simple_op(&s.mnemonic, s.attrs).map_err(Some)?,
                None,
                s.mnemonic.at,
            )
        };
        let arity_of = arity_op.as_ref().unwrap_or(&op);
        if !arity_of.arity().accepts(s.operands.len()) {
            return Err(Some(self.diag(
                "wrong-arity",
                format!(
                    "'{}' takes {} operands, got {}",
                    arity_of.name(),
                    arity_of.arity(),
                    s.operands.len()
                ),
                arity_at,
            )));
        }
        let mut operands = Vec::new();
        for n in s.operands.iter().chain(&extra_operands) {
            match env.get(&n.name) {
                Some(Slot::Val(v)) => operands.push(*v),
                Some(Slot::Poisoned) => return Err(None),
                None => {
                    return Err(Some(self.diag(
                        "undefined-value",
                        format!("undefined value %{}", n.name),
                        n.at,
                    )))
                }
            }
        }
        let types: Vec<&TensorType> = operands.iter().map(|v| func.type_of(*v)).collect();
        let weights = &self.module.weights;
        let inferred = op
            .infer_type(&types, &|id| weights.type_of(id))
            .map_err(|m| Some(self.diag("type-mismatch", m, s.mnemonic.at)))?;
        if inferred != s.ty {
            return Err(Some(self.diag(
                "type-mismatch",
                format!(
                    "'{}' gives {inferred}, but the declared type is {}",
                    s.anchor.as_ref().unwrap_or(&s.mnemonic).name,
                    s.ty
                ),
                s.ty_at,
            )));
        }
        Ok(Inst {
            op,
            operands,
            ty: s.ty,
            loc: s.loc.unwrap_or_else(|| self.map.loc(s.result.at)),
        })
    }

    fn post_op_of(
        &self,
        p: PostSyntax,
        extra: &mut Vec<Named>,
    ) -> Result<PostOp, Option<Diagnostic>> {
        let not_elementwise = |name: &Named| {
            Some(self.diag(
                "bad-fused-op",
                format!(
                    "'{}' is not an elementwise op and cannot be a post-op",
                    name.name
                ),
                name.at,
            ))
        };
        match p {
            PostSyntax::Unary { name, attrs } => {
                let op = self.simple_op(&name, attrs).map_err(Some)?;
                if let Op::Unary(u) = op {
                    Ok(PostOp::Unary(u))
                } else if let Op::Binary(_) = op {
                    Err(Some(self.diag(
                        "bad-fused-op",
                        format!(
                            "'{0}' takes two operands: write {0}(_, %v) or {0}(%v, _), where _ is the accumulator",
                            name.name
                        ),
                        name.at,
                    )))
                } else {
                    Err(not_elementwise(&name))
                }
            }
            PostSyntax::Binary {
                name,
                operand,
                acc_is_lhs,
            } => {
                let owner = format!("post-op '{}'", name.name);
                let op = self
                    .simple_op(&name, AttrDict::new(&owner, name.at, Vec::new()))
                    .map_err(Some)?;
                if let Op::Binary(op) = op {
                    extra.push(operand);
                    Ok(PostOp::Binary { op, acc_is_lhs })
                } else if let Op::Unary(_) = op {
                    Err(Some(self.diag(
                        "bad-fused-op",
                        format!("'{}' takes one operand: write it without (...)", name.name),
                        name.at,
                    )))
                } else {
                    Err(not_elementwise(&name))
                }
            }
        }
    }
}
