//! Lexer of the `.tir` text form: source text → tokens with byte spans.

use crate::diag::{Diagnostic, Location};
use std::sync::Arc;

/// One token kind. Keywords and op names are plain identifiers; the parser decides.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_]*`.
    Ident(String),
    /// Decimal digits without sign, kept as text so the parser can range-check them.
    Int(String),
    /// A decimal with a fraction and/or exponent, without sign.
    Float(String),
    /// `%name` or `%"quoted name"` (the name without `%` and quotes).
    Value(String),
    /// `@name` or `@"quoted name"`.
    Global(String),
    /// `"..."` with escapes resolved.
    Str(String),
    LParen,
    RParen,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Lt,
    Gt,
    Comma,
    Colon,
    Eq,
    Arrow,
    Minus,
    /// `?`, `+`, `*` and `/`: only inside a tensor type's symbolic dims.
    DimPunct(char),
    /// End of input.
    Eof,
}

impl Tok {
    /// How the token is named in "expected X, found Y" messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::Int(s) | Tok::Float(s) => format!("number {s}"),
            Tok::Value(s) => format!("value %{s}"),
            Tok::Global(s) => format!("@{s}"),
            Tok::Str(s) => format!("string {}", crate::diag::quote(s)),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::LBrace => "'{'".into(),
            Tok::RBrace => "'}'".into(),
            Tok::LBracket => "'['".into(),
            Tok::RBracket => "']'".into(),
            Tok::Lt => "'<'".into(),
            Tok::Gt => "'>'".into(),
            Tok::Comma => "','".into(),
            Tok::Colon => "':'".into(),
            Tok::Eq => "'='".into(),
            Tok::Arrow => "'->'".into(),
            Tok::Minus => "'-'".into(),
            Tok::DimPunct(c) => format!("'{c}'"),
            Tok::Eof => "end of file".into(),
        }
    }
}

/// A token and where it is: `start..end` in bytes of the source.
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    pub start: usize,
    pub end: usize,
}

/// Maps byte offsets of one source text to 1-based line and character column.
///
/// Every op's location is computed while parsing, so one query must cost O(1) however
/// long its line is: counting the characters from the line start instead made a model
/// written on one 8 MB line parse in quadratic time (issue 19, row 7).
pub(crate) struct SourceMap<'a> {
    src: &'a str,
    file: Arc<str>,
    line_starts: Vec<usize>,
    /// Empty when the source is ASCII (a column is then a byte difference); otherwise
    /// entry `k` is the number of characters starting before byte `k * CHAR_STRIDE`, so
    /// a character index costs one lookup and a scan of under `CHAR_STRIDE` bytes.
    char_checkpoints: Vec<usize>,
}

/// Bytes between two entries of [`SourceMap::char_checkpoints`].
const CHAR_STRIDE: usize = 256;

/// Whether a byte starts a UTF-8 character (is not a continuation byte).
fn starts_char(b: u8) -> bool {
    b & 0xC0 != 0x80
}

impl<'a> SourceMap<'a> {
    pub(crate) fn new(src: &'a str, file: &str) -> SourceMap<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        let mut char_checkpoints = Vec::new();
        if !src.is_ascii() {
            let mut chars = 0;
            for chunk in src.as_bytes().chunks(CHAR_STRIDE) {
                char_checkpoints.push(chars);
                chars += chunk.iter().filter(|&&b| starts_char(b)).count();
            }
            // an entry for the end too, so `offset == len` on a stride boundary finds one
            char_checkpoints.push(chars);
        }
        SourceMap {
            src,
            file: file.into(),
            line_starts,
            char_checkpoints,
        }
    }

    /// The number of characters starting before byte `offset` (at most the length).
    fn char_index(&self, offset: usize) -> usize {
        if self.char_checkpoints.is_empty() {
            return offset;
        }
        let k = offset / CHAR_STRIDE;
        let Some(&before) = self.char_checkpoints.get(k) else {
            return offset;
        };
        let tail = &self.src.as_bytes()[k * CHAR_STRIDE..offset];
        before + tail.iter().filter(|&&b| starts_char(b)).count()
    }

    /// Line and column (both from 1; the column counts characters) of a byte offset.
    pub(crate) fn line_col(&self, offset: usize) -> (u32, u32) {
        let offset = offset.min(self.src.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let col = self.char_index(offset) - self.char_index(start);
        (
            u32::try_from(line + 1).unwrap_or(u32::MAX),
            u32::try_from(col + 1).unwrap_or(u32::MAX),
        )
    }

    /// The file location of a byte offset.
    /// The source text.
    pub(crate) fn src(&self) -> &'a str {
        self.src
    }

    pub(crate) fn loc(&self, offset: usize) -> Location {
        let (line, col) = self.line_col(offset);
        Location::File {
            file: self.file.clone(),
            line,
            col,
        }
    }

    /// A `parse-error` at a byte offset.
    pub(crate) fn error(&self, offset: usize, message: impl Into<String>) -> Diagnostic {
        Diagnostic::error("parse-error", message, self.loc(offset))
    }
}

/// Characters allowed in an unquoted `%name` or `@name`.
pub(crate) fn is_bare_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '-')
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits the source into tokens, ending with one [`Tok::Eof`] placed right after the
/// last token (so "unexpected end of file" points at a line that exists).
pub(crate) fn lex(map: &SourceMap) -> Result<Vec<Token>, Diagnostic> {
    let src = map.src;
    let bytes = src.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if src[i..].starts_with("//") {
            i = src[i..].find('\n').map_or(src.len(), |n| i + n);
            continue;
        }
        let start = i;
        let punct = match c {
            b'(' => Some(Tok::LParen),
            b')' => Some(Tok::RParen),
            b'{' => Some(Tok::LBrace),
            b'}' => Some(Tok::RBrace),
            b'[' => Some(Tok::LBracket),
            b']' => Some(Tok::RBracket),
            b'<' => Some(Tok::Lt),
            b'>' => Some(Tok::Gt),
            b',' => Some(Tok::Comma),
            b':' => Some(Tok::Colon),
            b'=' => Some(Tok::Eq),
            b'?' | b'+' | b'*' | b'/' => Some(Tok::DimPunct(c as char)),
            _ => None,
        };
        let (tok, end) = if let Some(t) = punct {
            (t, i + 1)
        } else if c == b'-' {
            if bytes.get(i + 1) == Some(&b'>') {
                (Tok::Arrow, i + 2)
            } else {
                (Tok::Minus, i + 1)
            }
        } else if c.is_ascii_digit() {
            lex_number(src, i)
        } else if is_ident_start(c as char) {
            let end = scan(src, i, is_ident_char);
            (Tok::Ident(src[i..end].to_string()), end)
        } else if c == b'"' {
            let (s, end) = lex_string(map, i)?;
            (Tok::Str(s), end)
        } else if c == b'%' || c == b'@' {
            let (name, end) = lex_name(map, i)?;
            if c == b'%' {
                (Tok::Value(name), end)
            } else {
                (Tok::Global(name), end)
            }
        } else {
            let ch = src[i..].chars().next().unwrap_or('?');
            return Err(map.error(i, format!("unexpected character {ch:?}")));
        };
        toks.push(Token { tok, start, end });
        i = end;
    }
    let eof_at = toks.last().map_or(0, |t| t.end);
    toks.push(Token {
        tok: Tok::Eof,
        start: eof_at,
        end: eof_at,
    });
    Ok(toks)
}

fn scan(src: &str, from: usize, keep: impl Fn(char) -> bool) -> usize {
    src[from..]
        .char_indices()
        .find(|&(_, c)| !keep(c))
        .map_or(src.len(), |(k, _)| from + k)
}

/// `digits ('.' digits)? ([eE] [+-]? digits)?`; a fraction or exponent makes it a float.
fn lex_number(src: &str, start: usize) -> (Tok, usize) {
    let b = src.as_bytes();
    let digits_from = |k: usize| scan(src, k, |c| c.is_ascii_digit());
    let mut end = digits_from(start);
    let mut is_float = false;
    if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(|c| c.is_ascii_digit()) {
        end = digits_from(end + 1);
        is_float = true;
    }
    if matches!(b.get(end), Some(b'e' | b'E')) {
        let mut k = end + 1;
        if matches!(b.get(k), Some(b'+' | b'-')) {
            k += 1;
        }
        if b.get(k).is_some_and(|c| c.is_ascii_digit()) {
            end = digits_from(k);
            is_float = true;
        }
    }
    let text = src[start..end].to_string();
    if is_float {
        (Tok::Float(text), end)
    } else {
        (Tok::Int(text), end)
    }
}

/// A `"..."` string starting at `start`; the inverse of [`crate::diag::quote`].
pub(crate) fn lex_string(map: &SourceMap, start: usize) -> Result<(String, usize), Diagnostic> {
    let src = map.src;
    let mut out = String::new();
    let mut chars = src[start + 1..].char_indices();
    while let Some((k, c)) = chars.next() {
        let at = start + 1 + k;
        match c {
            '"' => return Ok((out, at + 1)),
            '\n' => break,
            '\\' => {
                let Some((_, e)) = chars.next() else { break };
                match e {
                    '"' => out.push('"'),
                    '\\' => out.push('\\'),
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'u' => {
                        let rest = &src[at + 2..];
                        let hex = rest
                            .strip_prefix('{')
                            .and_then(|r| r.find('}').map(|n| &r[..n]))
                            .filter(|h| !h.is_empty() && h.len() <= 6);
                        let ch = hex
                            .and_then(|h| u32::from_str_radix(h, 16).ok())
                            .and_then(char::from_u32);
                        match (hex, ch) {
                            (Some(h), Some(ch)) => {
                                out.push(ch);
                                // skip `{hex}`
                                for _ in 0..h.len() + 2 {
                                    chars.next();
                                }
                            }
                            _ => return Err(map.error(at, "bad unicode escape: expected \\u{HEX}")),
                        }
                    }
                    other => {
                        return Err(map.error(at, format!("unknown escape '\\{other}' in string")))
                    }
                }
            }
            c => out.push(c),
        }
    }
    Err(map.error(start, "unterminated string: missing closing '\"'"))
}

/// A `%name` / `@name` token: a bare name or a quoted string after the sigil.
fn lex_name(map: &SourceMap, start: usize) -> Result<(String, usize), Diagnostic> {
    let src = map.src;
    let sigil = &src[start..start + 1];
    if src.as_bytes().get(start + 1) == Some(&b'"') {
        return lex_string(map, start + 1);
    }
    let end = scan(src, start + 1, is_bare_name_char);
    if end == start + 1 {
        return Err(map.error(
            start,
            format!(
                "expected a name after '{sigil}' (letters, digits, _ . $ - or a quoted string)"
            ),
        ));
    }
    Ok((src[start + 1..end].to_string(), end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Tok> {
        let map = SourceMap::new(src, "t.tir");
        lex(&map).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn shapes_split_into_int_and_ident() {
        assert_eq!(
            kinds("tensor<1x64xf32>"),
            vec![
                Tok::Ident("tensor".into()),
                Tok::Lt,
                Tok::Int("1".into()),
                Tok::Ident("x64xf32".into()),
                Tok::Gt,
                Tok::Eof
            ]
        );
    }

    #[test]
    fn numbers_names_strings_and_comments() {
        assert_eq!(
            kinds("-1.0e-5 2e3 7 %a.b-c @\"x y\" \"q\\\"\\u{41}\" -> // gone\n="),
            vec![
                Tok::Minus,
                Tok::Float("1.0e-5".into()),
                Tok::Float("2e3".into()),
                Tok::Int("7".into()),
                Tok::Value("a.b-c".into()),
                Tok::Global("x y".into()),
                Tok::Str("q\"A".into()),
                Tok::Arrow,
                Tok::Eq,
                Tok::Eof
            ]
        );
    }

    #[test]
    fn quoting_round_trips() {
        let s = "a\"b\\c\nd\te\u{1}";
        let q = crate::diag::quote(s);
        assert_eq!(kinds(&q)[0], Tok::Str(s.into()));
    }

    #[test]
    fn errors_have_positions() {
        let map = SourceMap::new("func\n  \"abc", "t.tir");
        let e = lex(&map).unwrap_err();
        assert_eq!(e.location, Location::file("t.tir", 2, 3));
        let map = SourceMap::new("a ~", "t.tir");
        assert!(lex(&map).unwrap_err().message.contains('~'));
    }
}
