//! Tensor types: `tensor<D0xD1x...xDTYPE, LAYOUT>`, their dimensions and layouts.

use super::{PResult, Parser};
use crate::text::lexer::Tok;
use crate::types::{DType, Layout, TensorType};

impl<'a> Parser<'a> {
    pub(super) fn parse_layout(&mut self) -> PResult<Layout> {
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
            Ok(n) => usize::try_from(n)
                .map_err(|_| self.diag("too-large", format!("dimension {text} is too large"), at)),
            Err(_) => Err(self.diag("too-large", format!("dimension {text} is too large"), at)),
        }
    }

    /// `tensor<D0xD1x...xDTYPE[, LAYOUT]>`; `tensor<f32>` is a scalar.
    pub(super) fn parse_type(&mut self) -> PResult<(TensorType, usize)> {
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
                                    format!("bad dimension '{piece}': expected a non-negative integer"),
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
                    "unknown element type '{}' (expected f32, i64, i32, i1, f16, bf16, i8, ui8, i16 or ui16)",
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
}
