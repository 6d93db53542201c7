//! The text form's attribute schema: the value types an attribute can have
//! ([`AttrType`]: how each is read from a dictionary and printed), the attribute structs'
//! own schemas ([`AttrSchema`], implemented beside each struct in its op family), the
//! defaults ONNX gives, and the entry points the parser, the printer and the rule
//! language call. Which keys an op takes, their defaults and their print order are its
//! row's `attrs { ... }` in the op table (`crate::op`), which generates
//! [`Op::from_attributes`] and [`Op::attributes`] from them.

use std::fmt;

use super::attr_dict::{AttrDict, AttrError};
use crate::op::{GeluApproximation, Op, OpKind, PadMode, UnaryOp};
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

/// A value type of attributes: read by key from a dictionary, printed as an
/// [`AttrValue`] (`rank` is the rank of the op's result, which spells layouts).
pub(crate) trait AttrType: Sized + PartialEq + Default {
    /// The value under `key`, if written.
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError>;
    /// The value as printed.
    fn value(&self, rank: usize) -> AttrValue;
}

impl AttrType for usize {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.usize(key)
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Int(*self)
    }
}

impl AttrType for F32 {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.f32(key)
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Float(*self)
    }
}

impl AttrType for bool {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.bool(key)
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Bool(*self)
    }
}

impl AttrType for Vec<usize> {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        if crate::text::attr_dict::SIZE_KEYS.contains(&key) {
            d.sizes(key)
        } else {
            d.usizes(key)
        }
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Ints(self.clone())
    }
}

impl AttrType for Vec<i64> {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.i64s(key)
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::SignedInts(self.clone())
    }
}

impl AttrType for Vec<F32> {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.f32s(key)
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Floats(self.clone())
    }
}

/// Fixed-length integer lists (`strides = [2, 2]`).
impl<const N: usize> AttrType for [usize; N]
where
    [usize; N]: Default,
{
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.array(key, "")
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Ints(self.to_vec())
    }
}

impl AttrType for DType {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.dtype(key)
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::DType(*self)
    }
}

impl AttrType for Layout {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.layout(key)
    }
    fn value(&self, rank: usize) -> AttrValue {
        AttrValue::Layout(*self, rank)
    }
}

impl AttrType for PadMode {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.pad_mode(key)
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Word(self.name())
    }
}

impl AttrType for GeluApproximation {
    fn read(d: &mut AttrDict, key: &'static str) -> Result<Option<Self>, AttrError> {
        d.choice(
            key,
            "a GELU approximation",
            &GeluApproximation::ALL.map(|a| (a, a.name())),
        )
    }
    fn value(&self, _: usize) -> AttrValue {
        AttrValue::Word(self.name())
    }
}

/// An attribute struct's own schema (`conv2d`'s, a pool window, `slice`'s, ...): the keys
/// it reads and prints, written once beside the struct in its op family, and used by
/// every op whose row names it (`attrs { ..p }`).
pub(crate) trait AttrSchema: Sized {
    /// Reads the struct's keys (a missing required one is recorded in `d`).
    fn read(d: &mut AttrDict) -> Result<Self, AttrError>;
    /// Prints the keys that differ from their defaults, in order.
    fn print(&self, rank: usize, out: &mut Printed);
}

/// An op's printed attributes: `(key, value)` pairs, those equal to their default left out.
#[derive(Default)]
pub(crate) struct Printed(pub Vec<(&'static str, AttrValue)>);

impl Printed {
    /// Prints `key = v`.
    pub(crate) fn always<T: AttrType>(&mut self, key: &'static str, v: &T, rank: usize) {
        self.0.push((key, v.value(rank)));
    }

    /// Prints `key = v` unless `v` is the default.
    pub(crate) fn unless<T: AttrType>(
        &mut self,
        key: &'static str,
        v: &T,
        default: &T,
        rank: usize,
    ) {
        if v != default {
            self.always(key, v, rank);
        }
    }

    /// Prints `key = word` (a named choice).
    pub(crate) fn word(&mut self, key: &'static str, word: &'static str) {
        self.0.push((key, AttrValue::Word(word)));
    }
}

/// Builds the op named `name` from its attributes by its row's schema; `Ok(None)` when
/// no op has that name. `const` and `fused` have their own syntax.
pub(crate) fn build_op(name: &str, d: &mut AttrDict) -> Result<Option<Op>, AttrError> {
    Op::from_attributes(name, d)
}

/// The attributes of `op` that differ from their defaults, in print order (its row's).
/// `rank` is the rank of the op's result (it picks the spelling of layouts). A fused
/// op's anchor attributes are those of its anchor; `const` and fused ops themselves
/// have none.
pub(crate) fn op_attrs(op: &Op, rank: usize) -> Vec<(&'static str, AttrValue)> {
    op.attributes(rank).0
}

/// The attributes of a unary op that differ from their defaults, in print order.
pub(crate) fn unary_attrs(u: UnaryOp) -> Vec<(&'static str, AttrValue)> {
    op_attrs(&Op::Unary(u), 0)
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
    /// A word naming a choice (`linear`, `half_pixel`, `reflect`).
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
                for (i, &n) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    // a size attribute may hold a symbolic size (`AttrDict::sizes`)
                    let d = crate::op::Dim::from_stored(n);
                    if d.is_simple() {
                        write!(f, "{d}")?;
                    } else {
                        write!(f, "({d})")?;
                    }
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
    use super::super::attr_dict::{Attr, AttrLit};
    use super::*;
    use crate::op::{Conv2dAttrs, GemmAttrs};

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

    #[test]
    fn every_op_rebuilds_from_its_printed_attributes() {
        // the samples cover every kind of the op table but `fused` (its own syntax)
        let covered: std::collections::BTreeSet<OpKind> =
            crate::op::samples().iter().filter_map(Op::kind).collect();
        let missing: Vec<&str> = OpKind::ALL
            .iter()
            .filter(|k| **k != OpKind::Fused && !covered.contains(k))
            .map(|k| k.name())
            .collect();
        assert!(missing.is_empty(), "no sample of {missing:?}");
        for op in crate::op::samples() {
            let entries = op_attrs(op, 4)
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
