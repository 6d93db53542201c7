//! Tensor types: `tensor<D0xD1x...xDTYPE, LAYOUT>` and their layouts (the dims: `dims`).

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

    /// `tensor<D0xD1x...xDTYPE[, LAYOUT]>`; `tensor<f32>` is a scalar.
    pub(super) fn parse_type(&mut self) -> PResult<(TensorType, usize)> {
        let at = self.at();
        if !self.is_ident("tensor") {
            return Err(self.unexpected("a tensor type like tensor<1x3xf32>"));
        }
        self.bump();
        self.expect(Tok::Lt, "'<' after 'tensor'")?;
        let (dims, dtype_word) = self.parse_dims()?;
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
