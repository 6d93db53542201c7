//! The operator table: each supported ONNX op type, the operator versions ONNX defines
//! for it, the oldest version smelt implements, and the handler. Each family file declares
//! its rows beside its handlers (`ROWS`); this module collects them into one sorted table,
//! built once, that the importer looks op types up in.

/// Rows of the operator table, one per op type: `"OpType" [versions], from min => handler;`.
macro_rules! rules {
    ($($op:literal $versions:expr, from $min:literal => $f:path;)*) => {
        &[$($crate::onnx::ops::OpRule { op_type: $op, versions: &$versions, min_version: $min, import: $f },)*]
    };
}

mod attention;
mod control;
mod conv;
mod einsum;
mod elementwise;
mod grid_sample;
mod indexing;
mod linalg;
pub(super) mod logic;
mod loss;
mod movement;
mod norm;
mod pad_split;
mod pool;
mod quantize;
mod recurrent;
mod reduce;
mod resize;
mod scatter;
mod shape;

use std::sync::LazyLock;

use smelt_ir::Diagnostic;

use super::context::{Entry, NodeCtx};

/// Newest `ai.onnx` opset whose operator versions the table below lists (onnx 1.23.2).
pub const MAX_OPSET: i64 = 28;

/// Imports one node; returns an entry per node output, in order (fewer entries than
/// outputs means the remaining outputs do not exist for this op).
pub type Handler = fn(&mut NodeCtx) -> Result<Vec<Entry>, Diagnostic>;

/// One row of the table.
#[derive(Clone, Copy)]
pub struct OpRule {
    /// ONNX op type.
    pub op_type: &'static str,
    /// Every `since_version` of the op in the `ai.onnx` domain up to [`MAX_OPSET`].
    pub versions: &'static [i64],
    /// Oldest version smelt implements (older ones have semantics it does not model).
    pub min_version: i64,
    /// The handler.
    pub import: Handler,
}

/// Every family's rows, in no particular order (each family's own are sorted by op type).
const FAMILIES: &[&[OpRule]] = &[
    attention::ROWS,
    control::ROWS,
    conv::ROWS,
    einsum::ROWS,
    elementwise::ROWS,
    grid_sample::ROWS,
    indexing::ROWS,
    linalg::ROWS,
    logic::ROWS,
    loss::ROWS,
    movement::ROWS,
    norm::ROWS,
    pad_split::ROWS,
    pool::ROWS,
    quantize::ROWS,
    recurrent::ROWS,
    reduce::ROWS,
    resize::ROWS,
    scatter::ROWS,
    shape::ROWS,
];

/// The table: every family's rows, sorted by op type (collected on first use).
pub fn rules() -> &'static [OpRule] {
    static TABLE: LazyLock<Vec<OpRule>> = LazyLock::new(|| {
        let mut table: Vec<OpRule> = FAMILIES
            .iter()
            .flat_map(|rows| rows.iter().copied())
            .collect();
        table.sort_by_key(|r| r.op_type);
        table
    });
    &TABLE
}

/// The rule for `op_type`, if smelt supports it.
pub fn rule(op_type: &str) -> Option<&'static OpRule> {
    let table = rules();
    table
        .binary_search_by(|r| r.op_type.cmp(op_type))
        .ok()
        .map(|i| &table[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_type_appears_once_and_versions_ascend() {
        let table = rules();
        assert_eq!(
            table.len(),
            FAMILIES.iter().map(|rows| rows.len()).sum::<usize>()
        );
        // sorted strictly: an op type two families (or one twice) declare fails here
        for w in table.windows(2) {
            assert!(
                w[0].op_type < w[1].op_type,
                "{} before {}",
                w[0].op_type,
                w[1].op_type
            );
        }
        for r in table {
            assert!(r.versions.windows(2).all(|v| v[0] < v[1]), "{}", r.op_type);
            assert!(r.versions.contains(&r.min_version), "{}", r.op_type);
            assert!(r.versions.iter().all(|&v| v <= MAX_OPSET), "{}", r.op_type);
        }
        assert!(rule("Conv").is_some());
        assert!(rule("Conv3d").is_none());
    }
}
