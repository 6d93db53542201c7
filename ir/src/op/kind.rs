//! The op table: the families' rows (one per op kind: mnemonic, arity, role, attribute
//! payload, text schema, element-type, shape and flops rules) and variants, chained into
//! one `op_table!` that generates [`Op`], [`OpKind`], the mnemonic lookup, the arity and
//! role queries, the split of an [`Op`] into kind and payload (and back), the type
//! rule's and flops' dispatch, and the text form's attribute schema. The e-graph
//! language (smelt-passes) uses these kinds and payloads as they are, so it mirrors
//! nothing by hand.
//!
//! Unary and binary elementwise ops get one kind per operator (`relu`, `add`, ...);
//! `const` is not a kind (weights are leaves of every graph form). The two forms of a
//! row are written with the same bindings, so each serves as pattern and as
//! constructor: `(Op::Unary(UnaryOp::Clip { min, max })) <=> (Attrs::Clip { min, max })`.
//! Adding an op is adding its variant and row to its family's file; the compiler then
//! lists every other site, since nothing matches ops with `_ =>`.

#[allow(unused_imports)]
use super::conv::*;
use super::dim::{Dim, Shape};
use super::elementwise::*;
use super::fused::*;
use super::grid_sample::*;
use super::linalg::*;
use super::logic::*;
use super::movement::*;
use super::norm::*;
use super::pool::*;
use super::reduce::*;
use super::resize::*;
use super::rules::*;
use super::weight_prep::*;
use super::{
    Arity, BinaryOp, Comparison, Conv2dAttrs, ConvTranspose2dAttrs, FusedOp, GeluApproximation,
    GemmAttrs, LogicOp, PadAttrs, Pool2dAttrs, ReduceAttrs, Reduction, ResizeAttrs, SliceAttrs,
    UnaryOp,
};
use crate::text::{
    DEFAULT_EPSILON, DEFAULT_FLATTEN_AXIS, DEFAULT_HARD_SIGMOID_ALPHA, DEFAULT_HARD_SIGMOID_BETA,
    DEFAULT_LEAKY_ALPHA,
};
use crate::types::{DType, Layout, TensorType, F32};
use crate::weights::WeightId;

/// What an op is for, beyond computing its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An ordinary op.
    Plain,
    /// An elementwise op ([`UnaryOp`], [`BinaryOp`]): it may be a post-op of a fused op.
    Elementwise,
    /// It may anchor a [`FusedOp`] (a conv, GEMM, norm or pool with an epilogue).
    Anchor,
    /// It only prepares weights: always evaluated at compile time by const folding.
    WeightPrep,
}

/// An op's attribute payload, keyed by attribute structure rather than by op, so ops
/// with the same attributes share it (a rule can pass a `batch_norm`'s epsilon straight
/// to `bn_fold_weight`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attrs {
    /// Ops without attributes.
    None,
    /// `batch_norm` and the BN weight-prep ops (`bn_fold_weight`, `bn_scale`, ...).
    Epsilon(F32),
    /// `conv2d`.
    Conv2d(Conv2dAttrs),
    /// `conv_transpose2d`.
    ConvTranspose2d(ConvTranspose2dAttrs),
    /// `clip`.
    Clip {
        /// Lower bound.
        min: F32,
        /// Upper bound.
        max: F32,
    },
    /// `leaky_relu` slope.
    Alpha(F32),
    /// `gelu`'s formula.
    Gelu(GeluApproximation),
    /// `hard_sigmoid`.
    HardSigmoid {
        /// Slope.
        alpha: F32,
        /// Offset.
        beta: F32,
    },
    /// `layer_norm`.
    LayerNorm {
        /// First normalized axis.
        axis: usize,
        /// Added to the variance.
        epsilon: F32,
    },
    /// `max_pool2d`.
    Pool(Pool2dAttrs),
    /// `avg_pool2d`.
    AvgPool {
        /// Window geometry.
        pool: Pool2dAttrs,
        /// Divisor includes padding.
        count_include_pad: bool,
    },
    /// `flatten`, `concat`, `softmax`, `gather`.
    Axis(usize),
    /// A boolean flag: `mod`'s `fmod`.
    Flag(bool),
    /// `cast` target element type.
    DType(DType),
    /// The reductions' axes.
    Reduce(ReduceAttrs),
    /// `resize`.
    Resize(ResizeAttrs),
    /// `grid_sample`.
    GridSample(GridSampleAttrs),
    /// `reshape` and `expand` target shape, `transpose` permutation or `tile` repeats.
    Dims(Vec<usize>),
    /// `gemm`.
    Gemm(GemmAttrs),
    /// `slice` window.
    Slice(SliceAttrs),
    /// `pad` pads and mode.
    Pad(PadAttrs),
    /// `reorder` target layout.
    Layout(Layout),
    /// `fused`: the anchor op (with its attributes) and the post-op list.
    Fused(FusedOp),
}

/// Generates, from every family's variants and rows, [`Op`], [`OpKind`] and everything
/// that reads a row: names, arities, roles, the split into kind and payload (and back),
/// the type rule's dispatch, flops, and the text form's attribute schema (read and
/// printed). A row reads
///
/// ```text
/// Kind "mnemonic" arity, role: (Op form) <=> (payload form)
///     attrs { key = default, key, ..payload },
///     dtype: element-type rule, shape: shape rule, flops: flops rule;
/// ```
///
/// `attrs` lists the text-form keys, each named as its binding in the two forms: `key =
/// default` is optional, a bare `key` is required, `..p` is an attribute struct read and
/// printed by its own [`AttrSchema`](crate::text::AttrSchema). Keys print in this order,
/// and only when they differ from their defaults. The three rules are closures (or
/// functions) over the operands' types; they see the row's bindings by reference.
macro_rules! op_table {
    // the attribute schema, read from a dictionary `$d`
    (@read $d:ident;) => {};
    (@read $d:ident; .. $p:ident $(, $($rest:tt)*)?) => {
        let $p = $crate::text::AttrSchema::read($d)?;
        op_table!(@read $d; $($($rest)*)?);
    };
    (@read $d:ident; $key:ident = $default:expr $(, $($rest:tt)*)?) => {
        let $key = $crate::text::AttrType::read($d, stringify!($key))?.unwrap_or($default);
        op_table!(@read $d; $($($rest)*)?);
    };
    (@read $d:ident; $key:ident $(, $($rest:tt)*)?) => {
        let $key = $crate::text::AttrType::read($d, stringify!($key))?;
        let $key = $d.required(stringify!($key), $key);
        op_table!(@read $d; $($($rest)*)?);
    };
    // the attribute schema, printed into `$out` for a result of rank `$rank`
    (@print $out:ident $rank:ident;) => {};
    (@print $out:ident $rank:ident; .. $p:ident $(, $($rest:tt)*)?) => {
        $crate::text::AttrSchema::print($p, $rank, &mut $out);
        op_table!(@print $out $rank; $($($rest)*)?);
    };
    (@print $out:ident $rank:ident; $key:ident = $default:expr $(, $($rest:tt)*)?) => {
        $out.unless(stringify!($key), $key, &$default, $rank);
        op_table!(@print $out $rank; $($($rest)*)?);
    };
    (@print $out:ident $rank:ident; $key:ident $(, $($rest:tt)*)?) => {
        $out.always(stringify!($key), $key, $rank);
        op_table!(@print $out $rank; $($($rest)*)?);
    };
    (
        [$($variants:tt)*]
        [$(
            $(#[$doc:meta])*
            $kind:ident $name:literal $arity:expr, $role:ident: ($($op:tt)+) <=> ($($attrs:tt)+)
                attrs { $($schema:tt)* },
                dtype: $dtype:expr,
                shape: $shape:expr,
                flops: $flops:expr;
        )*]
    ) => {
        /// Every tensor op. Each op has exactly one result. The variants are declared
        /// with their rows, one file per op family (see [`OpKind`] for the kinds).
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Op {
            /// A module weight (`const @name`); no operands.
            Const(WeightId),
            $($variants)*
        }

        /// The kind of an op: one per row of the op table (unary and binary ops are one
        /// kind per operator; `const` is not a kind).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $(
                #[doc = concat!("`", $name, "` (see [`Op`] for its operands and semantics).")]
                $(#[$doc])*
                $kind,
            )*
        }

        impl OpKind {
            /// Every kind, in table order.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$kind),*];

            /// The mnemonic of the text form (`conv2d`, `relu`, `add`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(OpKind::$kind => $name,)*
                }
            }

            /// Operands accepted; `None` for `fused`, whose count depends on its post-ops.
            pub fn arity(self) -> Option<Arity> {
                #[allow(unused_imports)]
                use Arity::{AtLeast, Exact, Range};
                match self {
                    $(OpKind::$kind => $arity,)*
                }
            }

            /// What the op is for.
            pub fn role(self) -> Role {
                match self {
                    $(OpKind::$kind => Role::$role,)*
                }
            }

            /// Rebuilds the op from its payload; `None` when the payload does not fit the
            /// kind (a user rule that wired a `conv2d`'s attributes into a `clip`, say).
            pub fn join(self, attrs: &Attrs) -> Option<Op> {
                match self {
                    $(OpKind::$kind => match attrs.clone() {
                        $($attrs)+ => Some($($op)+),
                        // a payload of another structure
                        _ => None,
                    },)*
                }
            }
        }

        impl Op {
            /// The op's kind; `None` for `const`.
            #[allow(unused_variables)]
            pub fn kind(&self) -> Option<OpKind> {
                match self {
                    Op::Const(_) => None,
                    $($($op)+ => Some(OpKind::$kind),)*
                }
            }

            /// The op's kind and attribute payload; `None` for `const` (a leaf).
            pub fn split(&self) -> Option<(OpKind, Attrs)> {
                match self.clone() {
                    Op::Const(_) => None,
                    $($($op)+ => Some((OpKind::$kind, $($attrs)+)),)*
                }
            }

            /// The row's element-type and shape rules for these operands (checked against
            /// the arity already); a weight's type for `const`.
            #[allow(unused_variables)]
            pub(super) fn row_rules(&self, o: &OperandTypes<'_>) -> Result<TensorType, String> {
                match self {
                    Op::Const(id) => o.weight(*id).ok_or_else(|| format!("unknown weight {}", id.0)),
                    $($($op)+ => {
                        let dtype = dtype_rule($dtype)(o)?;
                        let shape = shape_rule($shape)(o)?;
                        Ok(TensorType::new(dtype, Dim::stored_all(&shape.dims)).with_layout(shape.layout))
                    })*
                }
            }

            /// Floating-point operations (multiply and add count one each) to compute the
            /// result from operands of these types; the cost model's compute term.
            #[allow(unused_variables)]
            pub fn flops(&self, operands: &[&TensorType], result: &TensorType) -> u64 {
                match self {
                    Op::Const(_) => 0,
                    $($($op)+ => flops_rule($flops)(operands, result),)*
                }
            }

            /// Builds the op named `name` from the attribute dictionary `d` by its row's
            /// schema; `Ok(None)` when no row has that name.
            #[allow(unused_variables)]
            pub(crate) fn from_attributes(
                name: &str,
                d: &mut $crate::text::AttrDict,
            ) -> Result<Option<Op>, $crate::text::AttrError> {
                $(
                    if name == $name {
                        op_table!(@read d; $($schema)*);
                        return Ok(Some($($op)+));
                    }
                )*
                Ok(None)
            }

            /// The op's attributes that differ from their defaults, in its row's order;
            /// `rank` is the result's rank (it picks the spelling of layouts).
            #[allow(unused_variables, unused_mut)]
            pub(crate) fn attributes(&self, rank: usize) -> $crate::text::Printed {
                let mut out = $crate::text::Printed::default();
                match self {
                    Op::Const(_) => {}
                    $($($op)+ => { op_table!(@print out rank; $($schema)*); })*
                }
                out
            }
        }
    };
}

/// Gives a row's element-type rule its signature (so closures need no annotations).
fn dtype_rule<F: FnOnce(&OperandTypes<'_>) -> Result<DType, String>>(f: F) -> F {
    f
}

/// Gives a row's shape rule its signature.
fn shape_rule<F: FnOnce(&OperandTypes<'_>) -> Result<Shape, String>>(f: F) -> F {
    f
}

/// Gives a row's flops rule its signature.
fn flops_rule<F: FnOnce(&[&TensorType], &TensorType) -> u64>(f: F) -> F {
    f
}

// The families, chained: each appends its variants and rows and hands on to the next;
// the last hands everything to `op_table`. A new family is a file with a `*_ops!` macro
// and a name here.
conv_ops! { [] [] norm_ops, elementwise_ops, pool_ops, movement_ops, linalg_ops, weight_prep_ops, logic_ops, reduce_ops, resize_ops, grid_sample_ops, fused_ops, op_table }

impl OpKind {
    /// The kind whose mnemonic is `name`.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The binary operator of a binary kind.
    pub fn binary(self) -> Option<BinaryOp> {
        if let Some(Op::Binary(b)) = self.join(&Attrs::None) {
            Some(b)
        } else {
            None
        }
    }

    /// Whether the kind takes no attributes (its payload is always [`Attrs::None`]).
    pub fn has_no_attrs(self) -> bool {
        self.join(&Attrs::None).is_some()
    }

    /// The payload patterns use when they omit the attributes: [`Attrs::None`] for
    /// kinds without attributes, `None` (match anything) otherwise.
    pub fn default_attrs(self) -> Option<Attrs> {
        self.has_no_attrs().then_some(Attrs::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_join_round_trip_and_names_are_unique() {
        for &k in OpKind::ALL {
            assert_eq!(OpKind::from_name(k.name()), Some(k));
        }
        let ops = [
            Op::Conv2d(Conv2dAttrs::default()),
            Op::BatchNorm { epsilon: F32(1e-5) },
            Op::Unary(UnaryOp::Clip {
                min: F32(0.0),
                max: F32(6.0),
            }),
            Op::Binary(BinaryOp::Sub),
            Op::Reshape { shape: vec![2, 3] },
            Op::Transpose { perm: vec![1, 0] },
            Op::BnFoldBias { epsilon: F32(1e-3) },
        ];
        for op in ops {
            let (k, a) = op.split().expect("not a const");
            assert_eq!(k.join(&a), Some(op.clone()));
            assert_eq!(op.kind(), Some(k));
        }
        // a payload of another structure does not fit
        assert_eq!(OpKind::Clip.join(&Attrs::Epsilon(F32(1.0))), None);
        assert_eq!(OpKind::Add.binary(), Some(BinaryOp::Add));
        assert!(OpKind::Relu.has_no_attrs() && !OpKind::Clip.has_no_attrs());
    }
}
