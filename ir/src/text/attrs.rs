//! The op ↔ attribute-dictionary mapping: which attributes each mnemonic takes, their
//! defaults, and how an [`Op`] prints its non-default attributes in a fixed order.

use std::fmt;

use crate::op::{
    Attrs, Conv2dAttrs, ConvTranspose2dAttrs, CoordinateMode, GemmAttrs, NearestMode, Op, OpKind,
    PadAttrs, PadMode, Pool2dAttrs, ReduceAttrs, Reduction, ResizeAttrs, ResizeMode, SliceAttrs,
    UnaryOp,
};
use crate::types::{DType, Layout, F32};

/// Default `epsilon` of batch_norm, layer_norm, bn_fold_weight and bn_fold_bias (ONNX's).
pub const DEFAULT_EPSILON: F32 = F32(1e-5);
/// Default slope of `leaky_relu` (ONNX's).
pub const DEFAULT_LEAKY_ALPHA: F32 = F32(0.01);
/// Default slope of `hard_sigmoid` (ONNX's).
pub const DEFAULT_HARD_SIGMOID_ALPHA: F32 = F32(0.2);
/// Default offset of `hard_sigmoid` (ONNX's).
pub const DEFAULT_HARD_SIGMOID_BETA: F32 = F32(0.5);
/// Default `axis` of `flatten` (ONNX's).
pub const DEFAULT_FLATTEN_AXIS: usize = 1;
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
    fn required<T: Default>(&mut self, key: &'static str, v: Option<T>) -> T {
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
    fn need<T: Default>(
        &mut self,
        key: &'static str,
        read: fn(&mut Self, &'static str) -> Result<Option<T>, AttrError>,
    ) -> Result<T, AttrError> {
        let v = read(self, key)?;
        Ok(self.required(key, v))
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

fn pool_attrs(d: &mut AttrDict) -> Result<Pool2dAttrs, AttrError> {
    let kernel = d.array::<2>("kernel", "[kh, kw]")?;
    let kernel = d.required("kernel", kernel);
    Ok(Pool2dAttrs {
        kernel,
        strides: d.array("strides", "[sh, sw]")?.unwrap_or([1, 1]),
        pads: d
            .array("pads", "[top, left, bottom, right]")?
            .unwrap_or([0; 4]),
        dilations: d.array("dilations", "[dh, dw]")?.unwrap_or([1, 1]),
        ceil_mode: d.bool("ceil_mode")?.unwrap_or(false),
        layout: d.layout("layout")?.unwrap_or(Layout::RowMajor),
    })
}

fn unary(u: UnaryOp) -> Option<Op> {
    Some(Op::Unary(u))
}

/// Builds the op named `name` from its attributes; `Ok(None)` when no op has that name.
/// `const` and `fused` have their own syntax and are not handled here. Ops without
/// attributes come straight from the op table; the others read their keys here.
pub(crate) fn build_op(name: &str, d: &mut AttrDict) -> Result<Option<Op>, AttrError> {
    if let Some(op) = OpKind::from_name(name).and_then(|k| k.join(&Attrs::None)) {
        return Ok(Some(op));
    }
    let eps = |d: &mut AttrDict| -> Result<F32, AttrError> {
        Ok(d.f32("epsilon")?.unwrap_or(DEFAULT_EPSILON))
    };
    let op = match name {
        "conv2d" => {
            let def = Conv2dAttrs::default();
            Some(Op::Conv2d(Conv2dAttrs {
                strides: d.array("strides", "[sh, sw]")?.unwrap_or(def.strides),
                pads: d
                    .array("pads", "[top, left, bottom, right]")?
                    .unwrap_or(def.pads),
                dilations: d.array("dilations", "[dh, dw]")?.unwrap_or(def.dilations),
                groups: d.usize("groups")?.unwrap_or(def.groups),
                layout: d.layout("layout")?.unwrap_or(def.layout),
            }))
        }
        "conv_transpose2d" => {
            let def = ConvTranspose2dAttrs::default();
            Some(Op::ConvTranspose2d(ConvTranspose2dAttrs {
                strides: d.array("strides", "[sh, sw]")?.unwrap_or(def.strides),
                pads: d
                    .array("pads", "[top, left, bottom, right]")?
                    .unwrap_or(def.pads),
                dilations: d.array("dilations", "[dh, dw]")?.unwrap_or(def.dilations),
                groups: d.usize("groups")?.unwrap_or(def.groups),
                output_padding: d
                    .array("output_padding", "[bottom, right]")?
                    .unwrap_or(def.output_padding),
            }))
        }
        "batch_norm" => Some(Op::BatchNorm { epsilon: eps(d)? }),
        "clip" => unary(UnaryOp::Clip {
            min: d.need("min", AttrDict::f32)?,
            max: d.need("max", AttrDict::f32)?,
        }),
        "leaky_relu" => unary(UnaryOp::LeakyRelu {
            alpha: d.f32("alpha")?.unwrap_or(DEFAULT_LEAKY_ALPHA),
        }),
        "hard_sigmoid" => unary(UnaryOp::HardSigmoid {
            alpha: d.f32("alpha")?.unwrap_or(DEFAULT_HARD_SIGMOID_ALPHA),
            beta: d.f32("beta")?.unwrap_or(DEFAULT_HARD_SIGMOID_BETA),
        }),
        "layer_norm" => Some(Op::LayerNorm {
            axis: d.need("axis", AttrDict::usize)?,
            epsilon: eps(d)?,
        }),
        "max_pool2d" => Some(Op::MaxPool2d(pool_attrs(d)?)),
        "avg_pool2d" => Some(Op::AvgPool2d {
            pool: pool_attrs(d)?,
            count_include_pad: d.bool("count_include_pad")?.unwrap_or(false),
        }),
        "flatten" => Some(Op::Flatten {
            axis: d.usize("axis")?.unwrap_or(DEFAULT_FLATTEN_AXIS),
        }),
        "reshape" => Some(Op::Reshape {
            shape: d.need("shape", AttrDict::usizes)?,
        }),
        "expand" => Some(Op::Expand {
            shape: d.need("shape", AttrDict::usizes)?,
        }),
        "tile" => Some(Op::Tile {
            repeats: d.need("repeats", AttrDict::usizes)?,
        }),
        "transpose" => Some(Op::Transpose {
            perm: d.need("perm", AttrDict::usizes)?,
        }),
        "gemm" => {
            let def = GemmAttrs::default();
            Some(Op::Gemm(GemmAttrs {
                alpha: d.f32("alpha")?.unwrap_or(def.alpha),
                beta: d.f32("beta")?.unwrap_or(def.beta),
                trans_a: d.bool("trans_a")?.unwrap_or(def.trans_a),
                trans_b: d.bool("trans_b")?.unwrap_or(def.trans_b),
            }))
        }
        "slice" => {
            let starts = d.need("starts", AttrDict::i64s)?;
            let ends = d.need("ends", AttrDict::i64s)?;
            let steps = d.i64s("steps")?.unwrap_or_else(|| vec![1; starts.len()]);
            Some(Op::Slice(SliceAttrs {
                starts,
                ends,
                steps,
            }))
        }
        "pad" => Some(Op::Pad(PadAttrs {
            pads: d.need("pads", AttrDict::i64s)?,
            mode: d.pad_mode("mode")?.unwrap_or(PadMode::Constant),
        })),
        "concat" => Some(Op::Concat {
            axis: d.need("axis", AttrDict::usize)?,
        }),
        "cast" => Some(Op::Cast {
            to: d.need("to", AttrDict::dtype)?,
        }),
        "gather" => Some(Op::Gather {
            axis: d.usize("axis")?.unwrap_or(0),
        }),
        "reduce_sum" | "reduce_mean" | "reduce_max" | "reduce_min" => {
            let r = match name {
                "reduce_sum" => Reduction::Sum,
                "reduce_mean" => Reduction::Mean,
                "reduce_max" => Reduction::Max,
                _ => Reduction::Min,
            };
            Some(Op::Reduce(
                r,
                ReduceAttrs {
                    axes: d.need("axes", AttrDict::usizes)?,
                    keep_dims: d.bool("keep_dims")?.unwrap_or(false),
                },
            ))
        }
        "resize" => {
            let nearest = d.choice("nearest", "a rounding mode", &NearestMode::NAMES)?;
            let mode = match d.choice(
                "mode",
                "a resize mode",
                &[(false, "nearest"), (true, "linear")],
            )? {
                Some(true) => ResizeMode::Linear,
                _ => ResizeMode::Nearest(nearest.unwrap_or_default()),
            };
            Some(Op::Resize(ResizeAttrs {
                sizes: d.need("sizes", AttrDict::usizes)?,
                scales: d.need("scales", AttrDict::f32s)?,
                mode,
                coordinate: d
                    .choice(
                        "coordinate",
                        "a coordinate transform",
                        &CoordinateMode::NAMES,
                    )?
                    .unwrap_or_default(),
            }))
        }
        "softmax" => Some(Op::Softmax {
            axis: d.need("axis", AttrDict::usize)?,
        }),
        "reorder" => Some(Op::Reorder {
            layout: d.need("layout", AttrDict::layout)?,
        }),
        "bn_fold_weight" => Some(Op::BnFoldWeight { epsilon: eps(d)? }),
        "bn_fold_bias" => Some(Op::BnFoldBias { epsilon: eps(d)? }),
        "bn_scale" => Some(Op::BnScale { epsilon: eps(d)? }),
        "bn_shift" => Some(Op::BnShift { epsilon: eps(d)? }),
        _ => None,
    };
    Ok(op)
}

/// Every mnemonic of the text form — `const` and the op table's kinds — for "did you
/// mean" hints.
pub(crate) fn mnemonics() -> impl Iterator<Item = &'static str> {
    std::iter::once("const").chain(OpKind::ALL.iter().map(|k| k.name()))
}

/// The known mnemonic closest to `name` (edit distance ≤ 2), for "did you mean" notes.
pub(crate) fn suggest(name: &str) -> Option<&'static str> {
    mnemonics()
        .map(|m| (edit_distance(name, m), m))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, m)| m)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// An attribute value as printed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AttrValue {
    Int(usize),
    Float(F32),
    Bool(bool),
    Ints(Vec<usize>),
    /// A list of signed integers.
    SignedInts(Vec<i64>),
    /// A layout and the rank of the tensor it applies to (which picks its spelling).
    Layout(Layout, usize),
    /// An element type.
    DType(DType),
    /// A list of floats.
    Floats(Vec<F32>),
    /// A word naming a choice (`linear`, `half_pixel`).
    Word(&'static str),
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttrValue::Int(n) => write!(f, "{n}"),
            AttrValue::Float(v) => write!(f, "{v}"),
            AttrValue::Bool(b) => write!(f, "{b}"),
            AttrValue::Ints(v) => {
                f.write_str("[")?;
                for (i, n) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{n}")?;
                }
                f.write_str("]")
            }
            AttrValue::SignedInts(v) => {
                f.write_str("[")?;
                for (i, n) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{n}")?;
                }
                f.write_str("]")
            }
            AttrValue::DType(d) => write!(f, "{d}"),
            AttrValue::Word(w) => f.write_str(w),
            AttrValue::Floats(v) => {
                f.write_str("[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
            AttrValue::Layout(l, rank) => match l.name(*rank) {
                Some(n) => f.write_str(&n),
                None => f.write_str("row_major"),
            },
        }
    }
}

/// Collects `(key, value)` pairs, skipping those equal to their default.
struct Printed(Vec<(&'static str, AttrValue)>);

impl Printed {
    fn always(&mut self, key: &'static str, v: AttrValue) {
        self.0.push((key, v));
    }
    fn unless<T: PartialEq>(&mut self, key: &'static str, v: T, default: T, f: fn(T) -> AttrValue) {
        if v != default {
            self.0.push((key, f(v)));
        }
    }
}

fn pool_printed(p: &Pool2dAttrs, rank: usize, out: &mut Printed) {
    out.always("kernel", AttrValue::Ints(p.kernel.to_vec()));
    out.unless("strides", p.strides, [1, 1], |v| {
        AttrValue::Ints(v.to_vec())
    });
    out.unless("pads", p.pads, [0; 4], |v| AttrValue::Ints(v.to_vec()));
    out.unless("dilations", p.dilations, [1, 1], |v| {
        AttrValue::Ints(v.to_vec())
    });
    out.unless("ceil_mode", p.ceil_mode, false, AttrValue::Bool);
    if p.layout != Layout::RowMajor {
        out.always("layout", AttrValue::Layout(p.layout, rank));
    }
}

/// The attributes of a unary op that differ from their defaults, in print order.
pub(crate) fn unary_attrs(u: UnaryOp) -> Vec<(&'static str, AttrValue)> {
    op_attrs(&Op::Unary(u), 0)
}

/// The attributes of `op` that differ from their defaults, in print order, read from its
/// payload (ops sharing a payload share its keys). `rank` is the rank of the op's result
/// (it picks the spelling of layouts). A fused op's anchor attributes are those of its
/// anchor; `const` and fused ops themselves have none.
pub(crate) fn op_attrs(op: &Op, rank: usize) -> Vec<(&'static str, AttrValue)> {
    let mut out = Printed(Vec::new());
    let ints = |v: Vec<usize>| AttrValue::Ints(v);
    let Some((kind, attrs)) = op.split() else {
        return out.0;
    };
    match attrs {
        Attrs::None | Attrs::Fused(_) => {}
        Attrs::Conv2d(a) => {
            let def = Conv2dAttrs::default();
            out.unless("strides", a.strides.to_vec(), def.strides.to_vec(), ints);
            out.unless("pads", a.pads.to_vec(), def.pads.to_vec(), ints);
            out.unless(
                "dilations",
                a.dilations.to_vec(),
                def.dilations.to_vec(),
                ints,
            );
            out.unless("groups", a.groups, def.groups, AttrValue::Int);
            if a.layout != def.layout {
                out.always("layout", AttrValue::Layout(a.layout, rank));
            }
        }
        Attrs::ConvTranspose2d(a) => {
            let def = ConvTranspose2dAttrs::default();
            out.unless("strides", a.strides.to_vec(), def.strides.to_vec(), ints);
            out.unless("pads", a.pads.to_vec(), def.pads.to_vec(), ints);
            out.unless(
                "dilations",
                a.dilations.to_vec(),
                def.dilations.to_vec(),
                ints,
            );
            out.unless("groups", a.groups, def.groups, AttrValue::Int);
            out.unless(
                "output_padding",
                a.output_padding.to_vec(),
                def.output_padding.to_vec(),
                ints,
            );
        }
        Attrs::Epsilon(epsilon) => {
            out.unless("epsilon", epsilon, DEFAULT_EPSILON, AttrValue::Float);
        }
        Attrs::Clip { min, max } => {
            out.always("min", AttrValue::Float(min));
            out.always("max", AttrValue::Float(max));
        }
        Attrs::Alpha(alpha) => {
            out.unless("alpha", alpha, DEFAULT_LEAKY_ALPHA, AttrValue::Float);
        }
        Attrs::HardSigmoid { alpha, beta } => {
            out.unless("alpha", alpha, DEFAULT_HARD_SIGMOID_ALPHA, AttrValue::Float);
            out.unless("beta", beta, DEFAULT_HARD_SIGMOID_BETA, AttrValue::Float);
        }
        Attrs::LayerNorm { axis, epsilon } => {
            out.always("axis", AttrValue::Int(axis));
            out.unless("epsilon", epsilon, DEFAULT_EPSILON, AttrValue::Float);
        }
        Attrs::Pool(p) => pool_printed(&p, rank, &mut out),
        Attrs::AvgPool {
            pool,
            count_include_pad,
        } => {
            pool_printed(&pool, rank, &mut out);
            out.unless(
                "count_include_pad",
                count_include_pad,
                false,
                AttrValue::Bool,
            );
        }
        // flatten's axis has a default; concat's and softmax's must be written
        Attrs::Axis(axis) if kind == OpKind::Flatten => {
            out.unless("axis", axis, DEFAULT_FLATTEN_AXIS, AttrValue::Int);
        }
        Attrs::Axis(axis) if kind == OpKind::Gather => out.unless("axis", axis, 0, AttrValue::Int),
        Attrs::Axis(axis) => out.always("axis", AttrValue::Int(axis)),
        Attrs::DType(to) => out.always("to", AttrValue::DType(to)),
        Attrs::Resize(r) => {
            out.always("sizes", AttrValue::Ints(r.sizes));
            out.always("scales", AttrValue::Floats(r.scales));
            match r.mode {
                ResizeMode::Linear => out.always("mode", AttrValue::Word("linear")),
                ResizeMode::Nearest(n) => {
                    out.always("mode", AttrValue::Word("nearest"));
                    out.unless("nearest", n, NearestMode::default(), |n| {
                        AttrValue::Word(n.name())
                    });
                }
            }
            out.unless("coordinate", r.coordinate, CoordinateMode::default(), |c| {
                AttrValue::Word(c.name())
            });
        }
        Attrs::Reduce(r) => {
            out.always("axes", AttrValue::Ints(r.axes));
            out.unless("keep_dims", r.keep_dims, false, AttrValue::Bool);
        }
        // the same payload, named for what it is: reshape's shape, transpose's permutation
        Attrs::Dims(dims) if kind == OpKind::Transpose => out.always("perm", AttrValue::Ints(dims)),
        Attrs::Dims(dims) if kind == OpKind::Tile => out.always("repeats", AttrValue::Ints(dims)),
        Attrs::Dims(dims) => out.always("shape", AttrValue::Ints(dims)),
        Attrs::Gemm(g) => {
            let def = GemmAttrs::default();
            out.unless("alpha", g.alpha, def.alpha, AttrValue::Float);
            out.unless("beta", g.beta, def.beta, AttrValue::Float);
            out.unless("trans_a", g.trans_a, def.trans_a, AttrValue::Bool);
            out.unless("trans_b", g.trans_b, def.trans_b, AttrValue::Bool);
        }
        Attrs::Slice(SliceAttrs {
            starts,
            ends,
            steps,
        }) => {
            let unit = vec![1; starts.len()];
            out.always("starts", AttrValue::SignedInts(starts));
            out.always("ends", AttrValue::SignedInts(ends));
            out.unless("steps", steps, unit, AttrValue::SignedInts);
        }
        Attrs::Pad(PadAttrs { pads, mode }) => {
            out.always("pads", AttrValue::SignedInts(pads));
            out.unless("mode", mode, PadMode::Constant, |m| {
                AttrValue::Word(m.name())
            });
        }
        Attrs::Layout(layout) => out.always("layout", AttrValue::Layout(layout, rank)),
    }
    out.0
}

/// Prints ` {k = v, ...}`, or nothing for an empty list.
pub(crate) fn print_dict(attrs: &[(&'static str, AttrValue)]) -> String {
    if attrs.is_empty() {
        return String::new();
    }
    let body: Vec<String> = attrs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    format!(" {{{}}}", body.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::BinaryOp;
    use crate::weights::WeightId;

    /// Turns printed attributes back into literals, as the parser would see them.
    fn to_lit(v: &AttrValue) -> AttrLit {
        match v {
            AttrValue::Int(n) => AttrLit::Num {
                negative: false,
                text: n.to_string(),
                is_float: false,
            },
            AttrValue::Float(f) => {
                let s = f.to_string();
                match s.strip_prefix('-') {
                    Some(rest) => AttrLit::Num {
                        negative: true,
                        text: rest.into(),
                        is_float: true,
                    },
                    None => AttrLit::Num {
                        negative: false,
                        text: s,
                        is_float: true,
                    },
                }
            }
            AttrValue::Bool(b) => AttrLit::Bool(*b),
            AttrValue::DType(d) => AttrLit::Word(d.name().into()),
            AttrValue::Word(w) => AttrLit::Word(w.to_string()),
            AttrValue::Floats(v) => AttrLit::List(
                v.iter()
                    .map(|x| (to_lit(&AttrValue::Float(*x)), 0))
                    .collect(),
            ),
            AttrValue::Ints(v) => {
                AttrLit::List(v.iter().map(|n| (to_lit(&AttrValue::Int(*n)), 0)).collect())
            }
            AttrValue::SignedInts(v) => AttrLit::List(
                v.iter()
                    .map(|n| {
                        let lit = AttrLit::Num {
                            negative: *n < 0,
                            text: n.unsigned_abs().to_string(),
                            is_float: false,
                        };
                        (lit, 0)
                    })
                    .collect(),
            ),
            AttrValue::Layout(l, _) => AttrLit::Layout(*l),
        }
    }

    /// One op of every kind, with attributes away from their defaults. The match makes
    /// the compiler list every op here when one is added.
    fn samples() -> Vec<Op> {
        let pool = Pool2dAttrs {
            kernel: [3, 2],
            strides: [2, 1],
            pads: [1, 0, 1, 0],
            dilations: [1, 2],
            ceil_mode: true,
            layout: Layout::RowMajor,
        };
        let all = vec![
            Op::Const(WeightId(0)),
            Op::Conv2d(Conv2dAttrs {
                strides: [2, 2],
                pads: [1, 0, 2, 1],
                dilations: [2, 1],
                groups: 4,
                layout: Layout::RowMajor,
            }),
            Op::Conv2d(Conv2dAttrs {
                layout: Layout::Blocked { axis: 1, block: 16 },
                ..Conv2dAttrs::default()
            }),
            Op::BatchNorm { epsilon: F32(1e-3) },
            Op::Unary(UnaryOp::Relu),
            Op::Unary(UnaryOp::Clip {
                min: F32(0.0),
                max: F32(6.0),
            }),
            Op::Unary(UnaryOp::LeakyRelu { alpha: F32(0.2) }),
            Op::Unary(UnaryOp::Sigmoid),
            Op::Unary(UnaryOp::Tanh),
            Op::Unary(UnaryOp::Erf),
            Op::Unary(UnaryOp::Gelu),
            Op::Unary(UnaryOp::HardSigmoid {
                alpha: F32(0.25),
                beta: F32(0.4),
            }),
            Op::Unary(UnaryOp::HardSwish),
            Op::Unary(UnaryOp::Silu),
            Op::Unary(UnaryOp::Neg),
            Op::Unary(UnaryOp::Abs),
            Op::Unary(UnaryOp::Sqrt),
            Op::Unary(UnaryOp::Exp),
            Op::Unary(UnaryOp::Log),
            Op::Unary(UnaryOp::Reciprocal),
            Op::Binary(BinaryOp::Add),
            Op::Binary(BinaryOp::Sub),
            Op::Binary(BinaryOp::Mul),
            Op::Binary(BinaryOp::Div),
            Op::Binary(BinaryOp::Min),
            Op::Binary(BinaryOp::Max),
            Op::LayerNorm {
                axis: 2,
                epsilon: F32(1e-6),
            },
            Op::MaxPool2d(pool.clone()),
            Op::AvgPool2d {
                pool,
                count_include_pad: true,
            },
            Op::GlobalAvgPool,
            Op::Flatten { axis: 2 },
            Op::Reshape { shape: vec![2, 8] },
            Op::Transpose {
                perm: vec![1, 0, 2],
            },
            Op::MatMul,
            Op::Gemm(GemmAttrs {
                alpha: F32(0.5),
                beta: F32(2.0),
                trans_a: true,
                trans_b: true,
            }),
            Op::Slice(SliceAttrs {
                starts: vec![0, 4, 1],
                ends: vec![2, -1, 5],
                steps: vec![1, -2, 3],
            }),
            Op::Pad(PadAttrs {
                pads: vec![0, 2, -1, 1, 0, 3],
                mode: PadMode::Reflect,
            }),
            Op::Pad(PadAttrs {
                pads: vec![1, 0],
                mode: PadMode::Constant,
            }),
            Op::Expand {
                shape: vec![2, 3, 4],
            },
            Op::Tile {
                repeats: vec![1, 3],
            },
            Op::Concat { axis: 1 },
            Op::Softmax { axis: 3 },
            Op::Reorder {
                layout: Layout::Blocked { axis: 1, block: 8 },
            },
            Op::BnFoldWeight { epsilon: F32(1e-4) },
            Op::BnFoldBias { epsilon: F32(2e-5) },
            Op::BnScale { epsilon: F32(3e-5) },
            Op::BnShift { epsilon: F32(4e-5) },
            Op::ChannelScale,
            Op::ChannelVector,
            Op::ConvShiftBias,
            Op::Cast { to: DType::I64 },
            Op::Cast { to: DType::Bool },
            Op::Compare(crate::op::Comparison::Equal),
            Op::Compare(crate::op::Comparison::Less),
            Op::Compare(crate::op::Comparison::LessOrEqual),
            Op::Compare(crate::op::Comparison::Greater),
            Op::Compare(crate::op::Comparison::GreaterOrEqual),
            Op::Logic(crate::op::LogicOp::And),
            Op::Logic(crate::op::LogicOp::Or),
            Op::Logic(crate::op::LogicOp::Xor),
            Op::Not,
            Op::Where,
            Op::Gather { axis: 2 },
            Op::Reduce(
                Reduction::Sum,
                ReduceAttrs {
                    axes: vec![1, 2],
                    keep_dims: true,
                },
            ),
            Op::Reduce(
                Reduction::Mean,
                ReduceAttrs {
                    axes: vec![0],
                    keep_dims: false,
                },
            ),
            Op::Reduce(Reduction::Max, ReduceAttrs::default()),
            Op::Reduce(Reduction::Min, ReduceAttrs::default()),
            Op::Resize(ResizeAttrs {
                sizes: vec![1, 2, 8, 6],
                scales: vec![F32(1.0), F32(1.0), F32(2.0), F32(1.5)],
                mode: ResizeMode::Linear,
                coordinate: CoordinateMode::AlignCorners,
            }),
            Op::Resize(ResizeAttrs {
                sizes: vec![3, 4],
                scales: vec![F32(1.0), F32(0.5)],
                mode: ResizeMode::Nearest(NearestMode::Floor),
                coordinate: CoordinateMode::Asymmetric,
            }),
            Op::ConvTranspose2d(ConvTranspose2dAttrs {
                strides: [2, 3],
                pads: [1, 0, 2, 1],
                dilations: [2, 1],
                groups: 2,
                output_padding: [1, 0],
            }),
        ];
        for op in &all {
            match op {
                Op::Const(_)
                | Op::Conv2d(_)
                | Op::BatchNorm { .. }
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::LayerNorm { .. }
                | Op::MaxPool2d(_)
                | Op::AvgPool2d { .. }
                | Op::GlobalAvgPool
                | Op::Flatten { .. }
                | Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::MatMul
                | Op::Gemm(_)
                | Op::Slice(_)
                | Op::Pad(_)
                | Op::Expand { .. }
                | Op::Tile { .. }
                | Op::Concat { .. }
                | Op::Softmax { .. }
                | Op::Reorder { .. }
                | Op::BnFoldWeight { .. }
                | Op::BnFoldBias { .. }
                | Op::BnScale { .. }
                | Op::BnShift { .. }
                | Op::ChannelScale
                | Op::ChannelVector
                | Op::ConvShiftBias
                | Op::Cast { .. }
                | Op::Compare(_)
                | Op::Logic(_)
                | Op::Not
                | Op::Where
                | Op::Gather { .. }
                | Op::Reduce(..)
                | Op::Resize(_)
                | Op::Fused(_)
                | Op::ConvTranspose2d(_) => {}
            }
        }
        all
    }

    #[test]
    fn every_op_rebuilds_from_its_printed_attributes() {
        // the samples cover every kind of the op table but `fused` (its own syntax)
        let covered: std::collections::BTreeSet<OpKind> =
            samples().iter().filter_map(Op::kind).collect();
        let missing: Vec<&str> = OpKind::ALL
            .iter()
            .filter(|k| **k != OpKind::Fused && !covered.contains(k))
            .map(|k| k.name())
            .collect();
        assert!(missing.is_empty(), "no sample of {missing:?}");
        for op in samples() {
            if matches!(op, Op::Const(_)) {
                continue;
            }
            let entries = op_attrs(&op, 4)
                .iter()
                .map(|(k, v)| Attr {
                    key: k.to_string(),
                    key_at: 0,
                    value: to_lit(v),
                    value_at: 0,
                })
                .collect();
            let mut d = AttrDict::new(op.name(), 0, entries);
            let rebuilt = build_op(op.name(), &mut d).unwrap();
            d.finish().unwrap();
            assert_eq!(rebuilt, Some(op.clone()), "{}", op.name());
            assert!(mnemonics().any(|m| m == op.name()));
            // every kind but `fused` (its own syntax) is built from its mnemonic
            assert_eq!(op.kind().map(OpKind::name), Some(op.name()));
        }
    }

    #[test]
    fn defaults_are_not_printed() {
        let conv = Op::Conv2d(Conv2dAttrs::default());
        assert!(op_attrs(&conv, 4).is_empty());
        let gemm = Op::Gemm(GemmAttrs::default());
        assert!(op_attrs(&gemm, 2).is_empty());
        let bn = Op::BatchNorm {
            epsilon: DEFAULT_EPSILON,
        };
        assert_eq!(print_dict(&op_attrs(&bn, 4)), "");
        let clip = Op::Unary(UnaryOp::Clip {
            min: F32(0.0),
            max: F32(6.0),
        });
        assert_eq!(print_dict(&op_attrs(&clip, 4)), " {min = 0.0, max = 6.0}");
    }

    #[test]
    fn unknown_and_missing_attributes_name_the_key() {
        let lit = AttrLit::List(vec![]);
        let mut d = AttrDict::new(
            "'max_pool2d'",
            3,
            vec![Attr {
                key: "kernal".into(),
                key_at: 7,
                value: lit,
                value_at: 9,
            }],
        );
        build_op("max_pool2d", &mut d).unwrap();
        let e = d.finish().unwrap_err();
        assert_eq!(e.at, 7);
        assert!(e.message.contains("'kernal'"), "{}", e.message);
        let mut d = AttrDict::new("'max_pool2d'", 3, vec![]);
        build_op("max_pool2d", &mut d).unwrap();
        let e = d.finish().unwrap_err();
        assert!(e.message.contains("'kernel'"), "{}", e.message);
    }

    #[test]
    fn suggestions_find_near_misses() {
        assert_eq!(suggest("conv2"), Some("conv2d"));
        assert_eq!(suggest("batchnorm"), Some("batch_norm"));
        assert_eq!(suggest("frobnicate"), None);
    }
}
