//! Control flow whose course is known at import: an `If` whose condition is a constant
//! once the input shapes are (exporters test a shape before a squeeze: torch writes one
//! around every LocalResponseNorm), imported as the branch it takes.

use smelt_ir::Diagnostic;

use super::super::context::{Entry, NodeCtx};
use super::OpRule;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "If"                  [1, 11, 13, 16, 19, 21, 23, 24, 25], from 1 => if_;
};

/// If (every version): the taken branch's nodes, imported in place; its outputs are the
/// node's. A condition computed at run time is a clear error.
pub fn if_(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["then_branch", "else_branch"])?;
    let Some(cond) = cx.const_input(0)? else {
        return Err(cx.err(
            "onnx-dynamic-shape",
            "the condition (input 0) is computed at run time; smelt imports an If only when \
             its condition is known once the input shapes are (a test on shapes), and then \
             imports the branch it takes",
        ));
    };
    let taken = match (cond.is_bool(), cond.i64s()) {
        (true, Some([flag])) => *flag != 0,
        _ => {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "the condition must be one bool, got {} of shape {:?}",
                    cond.type_name(),
                    cond.dims
                ),
            ))
        }
    };
    let name = if taken { "then_branch" } else { "else_branch" };
    let graph = cx
        .attr_graph(name)?
        .ok_or_else(|| cx.bad_attr(name, "is required"))?;
    let outputs = super::super::import_subgraph(cx.imp, graph).map_err(|d| Diagnostic {
        message: format!("in its {name}: {}", d.message),
        ..d
    })?;
    if outputs.len() != cx.node.output.len() {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "its {name} has {} outputs but the node has {}",
                outputs.len(),
                cx.node.output.len()
            ),
        ));
    }
    Ok(outputs)
}
