//! Reading an attribute dictionary: the literals of one `{key = value, ...}` as the
//! lexer saw them ([`AttrLit`]), and [`AttrDict`], which hands out typed values by key
//! (integers bounded by [`MAX_ATTR_INT`], floats, booleans, lists, element types,
//! layouts, named choices), remembers which keys were asked for and which required ones
//! were missing, and reports leftovers as unknown attributes.

use crate::op::PadMode;
use crate::types::{DType, Layout, F32};

/// The integer-list attributes that are sizes of a result, so may hold symbolic sizes
/// (issue #23): a reshape's and an expand's `shape` (a resize's `sizes` reads them too).
pub const SIZE_KEYS: &[&str] = &["shape"];

/// Largest integer accepted in an attribute: big enough for any real model, small enough
/// that the type rules' sums and products of attributes cannot overflow.
pub const MAX_ATTR_INT: u64 = i32::MAX as u64;

/// A literal on the right of `key = ` as written, before it is checked against the key.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AttrLit {
    /// An integer or float literal with its sign, as text.
    Num {
        negative: bool,
        text: String,
        is_float: bool,
    },
    /// `inf` or `nan` (with the sign in `negative`).
    NonFinite { negative: bool, nan: bool },
    /// `true` / `false`.
    Bool(bool),
    /// A layout name (`nchw8c`, `oihw8o`, `blocked<a,b>`, `row_major`).
    Layout(Layout),
    /// Any other identifier.
    Word(String),
    /// A symbolic size written `?1`, `"name"` or `(expression)`, as a dim stores it
    /// (only the attributes that are sizes take one: [`AttrDict::sizes`]).
    Size(usize),
    /// `[a, b, ...]`, each element with its byte offset.
    List(Vec<(AttrLit, usize)>),
}

impl AttrLit {
    fn describe(&self) -> &'static str {
        match self {
            AttrLit::Num { is_float: true, .. } | AttrLit::NonFinite { .. } => "a float",
            AttrLit::Num { .. } => "an integer",
            AttrLit::Bool(_) => "a boolean",
            AttrLit::Layout(_) => "a layout",
            AttrLit::Word(_) => "a name",
            AttrLit::Size(_) => "a symbolic size",
            AttrLit::List(_) => "a list",
        }
    }
}

/// One `key = value` entry with byte offsets of the key and the value.
#[derive(Clone, Debug)]
pub(crate) struct Attr {
    pub key: String,
    pub key_at: usize,
    pub value: AttrLit,
    pub value_at: usize,
}

/// An attribute problem at a byte offset; the parser turns it into a `bad-attribute`
/// diagnostic with a file position.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AttrError {
    pub at: usize,
    pub message: String,
}

fn err<T>(at: usize, message: impl Into<String>) -> Result<T, AttrError> {
    Err(AttrError {
        at,
        message: message.into(),
    })
}

/// The entries of one `{...}` (or `random<...>`) in source order. Builders take the keys
/// they know; what is left over is unknown.
#[derive(Clone, Debug)]
pub(crate) struct AttrDict {
    entries: Vec<Attr>,
    /// Where to point when a required attribute is missing (the op name).
    pub owner_at: usize,
    /// What the dictionary belongs to, for messages (`'conv2d'`).
    owner: String,
    asked: Vec<&'static str>,
    missing: Option<AttrError>,
}

impl AttrDict {
    /// A dictionary of `entries` belonging to `owner` (mentioned in messages).
    pub(crate) fn new(owner: &str, owner_at: usize, entries: Vec<Attr>) -> AttrDict {
        AttrDict {
            entries,
            owner_at,
            owner: owner.to_string(),
            asked: Vec::new(),
            missing: None,
        }
    }

    fn take(&mut self, key: &'static str) -> Option<Attr> {
        self.asked.push(key);
        let i = self.entries.iter().position(|a| a.key == key)?;
        Some(self.entries.remove(i))
    }

    /// Records that a required attribute is missing; reported by [`AttrDict::finish`]
    /// unless an unknown attribute (likely a misspelling of it) is reported first.
    pub(crate) fn required<T: Default>(&mut self, key: &'static str, v: Option<T>) -> T {
        match v {
            Some(v) => v,
            None => {
                if self.missing.is_none() {
                    self.missing = Some(AttrError {
                        at: self.owner_at,
                        message: format!("{} needs the attribute '{key}'", self.owner),
                    });
                }
                T::default()
            }
        }
    }

    /// A required attribute read by `read` (e.g. [`AttrDict::usizes`]): a missing one is
    /// recorded like [`AttrDict::required`] does, and reported by [`AttrDict::finish`].
    pub(crate) fn need<T: Default>(
        &mut self,
        key: &'static str,
        read: fn(&mut Self, &'static str) -> Result<Option<T>, AttrError>,
    ) -> Result<T, AttrError> {
        let v = read(self, key)?;
        Ok(self.required(key, v))
    }

    /// An error about the dictionary's owner as a whole, pointing at it.
    pub(crate) fn error_at_owner(&self, message: &str) -> AttrError {
        AttrError {
            at: self.owner_at,
            message: format!("{}: {message}", self.owner),
        }
    }

    /// Fails on entries no builder asked for, then on missing required ones.
    pub(crate) fn finish(self) -> Result<(), AttrError> {
        if let Some(a) = self.entries.first() {
            let known = if self.asked.is_empty() {
                "it takes no attributes".to_string()
            } else {
                format!("known: {}", self.asked.join(", "))
            };
            return err(
                a.key_at,
                format!("unknown attribute '{}' for {} ({known})", a.key, self.owner),
            );
        }
        match self.missing {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A non-negative integer no larger than [`MAX_ATTR_INT`].
    pub(crate) fn usize(&mut self, key: &'static str) -> Result<Option<usize>, AttrError> {
        match self.take(key) {
            None => Ok(None),
            Some(a) => to_usize(&a.key, &a.value, a.value_at).map(Some),
        }
    }

    /// Any unsigned 64-bit integer (seeds).
    pub(crate) fn u64(&mut self, key: &'static str) -> Result<Option<u64>, AttrError> {
        match self.take(key) {
            None => Ok(None),
            Some(a) => to_int(&a.key, &a.value, a.value_at, u64::MAX).map(Some),
        }
    }

    /// A float (integer literals are accepted).
    pub(crate) fn f32(&mut self, key: &'static str) -> Result<Option<F32>, AttrError> {
        match self.take(key) {
            None => Ok(None),
            Some(a) => to_f32(&a.key, &a.value, a.value_at).map(|v| Some(F32(v))),
        }
    }

    /// `true` or `false`.
    pub(crate) fn bool(&mut self, key: &'static str) -> Result<Option<bool>, AttrError> {
        match self.take(key) {
            None => Ok(None),
            Some(Attr {
                value: AttrLit::Bool(b),
                ..
            }) => Ok(Some(b)),
            Some(a) => err(
                a.value_at,
                format!(
                    "attribute '{}' must be true or false, got {}",
                    a.key,
                    a.value.describe()
                ),
            ),
        }
    }

    /// A list of integers of any length.
    pub(crate) fn usizes(&mut self, key: &'static str) -> Result<Option<Vec<usize>>, AttrError> {
        self.list(key, "[1, 2]", to_usize)
    }

    /// A list of sizes, each a non-negative integer of at most [`MAX_ATTR_INT`] or a
    /// symbolic size — a symbol's name, `?1`, `"name"` or `(expression)` — in its stored
    /// form: the attributes that are a result's sizes (a reshape's or expand's `shape`, a
    /// resize's `sizes`, [`SIZE_KEYS`]).
    pub(crate) fn sizes(&mut self, key: &'static str) -> Result<Option<Vec<usize>>, AttrError> {
        self.list(key, "[N, 2]", |k, v, at| match v {
            AttrLit::Word(name) => Ok(crate::op::Dim::symbol(name).stored()),
            AttrLit::Size(stored) => Ok(*stored),
            other => to_usize(k, other, at),
        })
    }

    /// A list of signed integers of any length, each of magnitude at most [`MAX_ATTR_INT`].
    pub(crate) fn i64s(&mut self, key: &'static str) -> Result<Option<Vec<i64>>, AttrError> {
        self.list(key, "[1, -2]", to_i64)
    }

    /// A list of floats of any length.
    pub(crate) fn f32s(&mut self, key: &'static str) -> Result<Option<Vec<F32>>, AttrError> {
        self.list(key, "[1.0, 2.5]", |k, v, at| to_f32(k, v, at).map(F32))
    }

    /// One of the words `choices` names (the value it stands for); `what` says what the
    /// words are in the message when the value is none of them.
    pub(crate) fn choice<T: Copy>(
        &mut self,
        key: &'static str,
        what: &str,
        choices: &[(T, &'static str)],
    ) -> Result<Option<T>, AttrError> {
        let names = || {
            choices
                .iter()
                .map(|(_, n)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self.take(key) {
            None => Ok(None),
            Some(Attr {
                value: AttrLit::Word(w),
                value_at,
                ..
            }) => match choices.iter().find(|(_, n)| *n == w) {
                Some((v, _)) => Ok(Some(*v)),
                None => err(
                    value_at,
                    format!("attribute '{key}' must be {what} ({}), got '{w}'", names()),
                ),
            },
            Some(a) => err(
                a.value_at,
                format!(
                    "attribute '{}' must be {what} ({}), got {}",
                    a.key,
                    names(),
                    a.value.describe()
                ),
            ),
        }
    }

    /// A list of any length, each element read by `element`; `example` shows the form
    /// in the message when the value is not a list.
    fn list<T>(
        &mut self,
        key: &'static str,
        example: &str,
        element: fn(&str, &AttrLit, usize) -> Result<T, AttrError>,
    ) -> Result<Option<Vec<T>>, AttrError> {
        match self.take(key) {
            None => Ok(None),
            Some(Attr {
                value: AttrLit::List(items),
                ..
            }) => items
                .iter()
                .map(|(v, at)| element(key, v, *at))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(a) => err(
                a.value_at,
                format!(
                    "attribute '{}' must be a list of integers like {example}, got {}",
                    a.key,
                    a.value.describe()
                ),
            ),
        }
    }

    /// A list of exactly `N` integers.
    pub(crate) fn array<const N: usize>(
        &mut self,
        key: &'static str,
        meaning: &str,
    ) -> Result<Option<[usize; N]>, AttrError> {
        let at = self
            .entries
            .iter()
            .find(|a| a.key == key)
            .map_or(0, |a| a.value_at);
        match self.usizes(key)? {
            None => Ok(None),
            Some(v) => match <[usize; N]>::try_from(v.as_slice()) {
                Ok(a) => Ok(Some(a)),
                Err(_) => err(
                    at,
                    format!(
                        "attribute '{key}' takes {N} integers {meaning}, got {}",
                        v.len()
                    ),
                ),
            },
        }
    }

    /// An element type name (`f32`, `i64`, `i32`, `i1`).
    pub(crate) fn dtype(&mut self, key: &'static str) -> Result<Option<DType>, AttrError> {
        self.choice(key, "an element type", &DType::ALL.map(|d| (d, d.name())))
    }

    /// A pad mode name (`constant`, `reflect`, `edge`, `wrap`).
    pub(crate) fn pad_mode(&mut self, key: &'static str) -> Result<Option<PadMode>, AttrError> {
        self.choice(key, "a pad mode", &PadMode::ALL.map(|m| (m, m.name())))
    }

    /// A layout name.
    pub(crate) fn layout(&mut self, key: &'static str) -> Result<Option<Layout>, AttrError> {
        match self.take(key) {
            None => Ok(None),
            Some(Attr {
                value: AttrLit::Layout(l),
                ..
            }) => Ok(Some(l)),
            Some(a) => err(
                a.value_at,
                format!(
                    "attribute '{}' must be a layout (row_major, nchw8c, oihw8o, blocked<axis,block>), got {}",
                    a.key,
                    match &a.value {
                        AttrLit::Word(w) => format!("'{w}'"),
                        other => other.describe().to_string(),
                    }
                ),
            ),
        }
    }
}

fn to_int(key: &str, v: &AttrLit, at: usize, max: u64) -> Result<u64, AttrError> {
    match v {
        AttrLit::Num {
            negative,
            text,
            is_float: false,
        } => {
            if *negative && text.bytes().any(|b| b != b'0') {
                return err(
                    at,
                    format!("attribute '{key}' must be non-negative, got -{text}"),
                );
            }
            match text.parse::<u64>() {
                Ok(n) if n <= max => Ok(n),
                _ => err(
                    at,
                    format!("integer {text} is too large for attribute '{key}' (at most {max})"),
                ),
            }
        }
        other => err(
            at,
            format!(
                "attribute '{key}' must be an integer, got {}",
                other.describe()
            ),
        ),
    }
}

/// A signed integer of magnitude at most [`MAX_ATTR_INT`].
fn to_i64(key: &str, v: &AttrLit, at: usize) -> Result<i64, AttrError> {
    match v {
        AttrLit::Num {
            negative: true,
            text,
            is_float: false,
        } => {
            let magnitude = AttrLit::Num {
                negative: false,
                text: text.clone(),
                is_float: false,
            };
            to_int(key, &magnitude, at, MAX_ATTR_INT).map(|n| -(n as i64))
        }
        other => to_int(key, other, at, MAX_ATTR_INT).map(|n| n as i64),
    }
}

fn to_usize(key: &str, v: &AttrLit, at: usize) -> Result<usize, AttrError> {
    to_int(key, v, at, MAX_ATTR_INT).map(|n| n as usize)
}

/// Converts a numeric literal to the nearest f32; literals beyond f32's range are errors
/// (write `inf` for infinity).
pub(crate) fn to_f32(key: &str, v: &AttrLit, at: usize) -> Result<f32, AttrError> {
    match v {
        AttrLit::Num { negative, text, .. } => {
            let signed = if *negative {
                format!("-{text}")
            } else {
                text.clone()
            };
            match signed.parse::<f32>() {
                Ok(f) if f.is_finite() => Ok(f),
                _ => err(
                    at,
                    format!("number {signed} is out of range for an f32 (write inf for infinity)"),
                ),
            }
        }
        AttrLit::NonFinite { negative, nan } => {
            let v = if *nan { f32::NAN } else { f32::INFINITY };
            Ok(if *negative { -v } else { v })
        }
        other => err(
            at,
            format!("'{key}' must be a number, got {}", other.describe()),
        ),
    }
}
