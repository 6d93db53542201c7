//! The cost model: a roofline per kernel, max(flops / peak, bytes / bandwidth) plus a
//! fixed per-kernel overhead. Bytes internal to a fused op never appear (they are not
//! operands or results); constant-only subgraphs cost nothing (computed at compile time).

use egg::Id;
use smelt_ir::op::Op;
use smelt_ir::types::TensorType;

use super::analysis::FusionGraph;
use super::lang::TensorNode;

/// Machine parameters of the roofline. Defaults: one core of this machine (AMD Zen 3,
/// f32x4 FMA peak 50 GFLOP/s, DRAM triad ≈17 GB/s), see FACTS.md.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Peak floating-point rate, FLOP/s.
    pub peak_flops: f64,
    /// Memory bandwidth, bytes/s.
    pub bandwidth: f64,
    /// Fixed cost of launching one kernel, seconds.
    pub kernel_overhead: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            peak_flops: 50e9,
            bandwidth: 17e9,
            kernel_overhead: 1e-6,
        }
    }
}

/// The size every symbol takes in the cost of a symbolic type.
pub const SYMBOL_COST_SIZE: usize = 64;

fn bytes(t: &TensorType) -> f64 {
    (t.storage_len() * t.dtype.size_bytes()) as f64
}

impl CostModel {
    /// Seconds one kernel of `op` takes on operands and a result of these types. Symbolic
    /// sizes are costed at [`SYMBOL_COST_SIZE`]: the choice among equivalent graphs is
    /// made once, for every value of the symbols.
    pub fn kernel_cost(&self, op: &Op, operands: &[&TensorType], result: &TensorType) -> f64 {
        if result.is_symbolic() || operands.iter().any(|t| t.is_symbolic()) {
            let at = |t: &TensorType| smelt_ir::symbolic::representative(t, SYMBOL_COST_SIZE);
            let operands: Vec<TensorType> = operands.iter().map(|t| at(t)).collect();
            let refs: Vec<&TensorType> = operands.iter().collect();
            return self.kernel_cost(op, &refs, &at(result));
        }
        let flops = op.flops(operands, result) as f64;
        let traffic: f64 = operands.iter().map(|t| bytes(t)).sum::<f64>() + bytes(result);
        (flops / self.peak_flops).max(traffic / self.bandwidth) + self.kernel_overhead
    }

    /// The cost of computing `node` once, given its children are available; `None` when
    /// the node cannot be used (ill-typed, or attributes that do not fit its kind).
    pub fn node_cost(&self, egraph: &FusionGraph, class: Id, node: &TensorNode) -> Option<f64> {
        match node {
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => Some(0.0),
            TensorNode::Op(..) => {
                let op = egraph.analysis.op_of(egraph, node)?;
                let result = egraph[class].data.ty.as_ref()?;
                let mut types = Vec::with_capacity(node.operands().len());
                let mut all_const = true;
                for c in node.operands() {
                    types.push(egraph[*c].data.ty.as_ref()?);
                    all_const &= egraph[*c].data.is_const;
                }
                // The node must type-check on its own: a class's type may come from
                // another node.
                let weights = &egraph.analysis.weight_types;
                let own = op
                    .infer_type(&types, &|w| weights.get(w.0 as usize).cloned())
                    .ok()?;
                if own.dims != result.dims || own.layout != result.layout {
                    return None;
                }
                if all_const {
                    return Some(0.0);
                }
                Some(self.kernel_cost(&op, &types, result))
            }
        }
    }
}
