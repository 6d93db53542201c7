//! The comparison and logic operators (`equal`, `less`, ..., `and`, `or`, `xor`), with
//! their exact semantics on every element type, and the reductions (`reduce_sum`, ...).

/// An elementwise comparison; the result is `i1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Comparison {
    /// `a == b` (NaN equals nothing).
    Equal,
    /// `a < b`.
    Less,
    /// `a <= b`.
    LessOrEqual,
    /// `a > b`.
    Greater,
    /// `a >= b`.
    GreaterOrEqual,
}

impl Comparison {
    /// Whether `a cmp b` holds (IEEE semantics for floats: every comparison with NaN is
    /// false).
    pub fn holds<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            Comparison::Equal => a == b,
            Comparison::Less => a < b,
            Comparison::LessOrEqual => a <= b,
            Comparison::Greater => a > b,
            Comparison::GreaterOrEqual => a >= b,
        }
    }

    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Compare(self).name()
    }
}

/// What a reduction computes over its axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reduction {
    /// The sum.
    Sum,
    /// The mean (the sum divided by the number of reduced elements).
    Mean,
    /// The largest element (NaN if any is NaN, as numpy's `max`).
    Max,
    /// The smallest element (NaN if any is NaN).
    Min,
}

impl Reduction {
    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Reduce(self, super::ReduceAttrs::default()).name()
    }

    /// The reduction of `values` (NaN propagates through max and min; an empty
    /// reduction is 0 for sum, NaN for mean, -inf for max and +inf for min).
    pub fn eval(self, values: impl Iterator<Item = f64>) -> f64 {
        let mut n = 0usize;
        let mut acc = match self {
            Reduction::Sum | Reduction::Mean => 0.0,
            Reduction::Max => f64::NEG_INFINITY,
            Reduction::Min => f64::INFINITY,
        };
        for v in values {
            n += 1;
            acc = match self {
                Reduction::Sum | Reduction::Mean => acc + v,
                Reduction::Max if v.is_nan() || acc.is_nan() => f64::NAN,
                Reduction::Min if v.is_nan() || acc.is_nan() => f64::NAN,
                Reduction::Max => acc.max(v),
                Reduction::Min => acc.min(v),
            };
        }
        match self {
            Reduction::Mean => acc / n as f64,
            _ => acc,
        }
    }
}

/// An elementwise logic operator on `i1` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogicOp {
    /// `a && b`.
    And,
    /// `a || b`.
    Or,
    /// `a != b`.
    Xor,
}

impl LogicOp {
    /// `a op b`.
    pub fn eval(self, a: bool, b: bool) -> bool {
        match self {
            LogicOp::And => a && b,
            LogicOp::Or => a || b,
            LogicOp::Xor => a != b,
        }
    }

    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Logic(self).name()
    }
}
