//! The comparison and logic operators (`equal`, `less`, ..., `and`, `or`, `xor`): their
//! exact semantics on every element type.

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
