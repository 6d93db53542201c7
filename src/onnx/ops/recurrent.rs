//! RNN, GRU and LSTM unrolled over their static sequence length into IR ops: each
//! gate's input projection `X·Wᵀ + bias` as one `matmul` over the whole sequence, then
//! per step the recurrent `H·Rᵀ` and the gate equations of the ONNX operators, forward,
//! reverse or both. `sequence_lens` known at import: a batch entry's steps past its length
//! keep its state and give zeros (a `where` over a constant mask per step, so the state
//! is kept exactly), which also makes a reverse direction start at each entry's own last
//! step, as ONNX defines it. The default activations only (RNN tanh, GRU sigmoid/tanh,
//! LSTM sigmoid/tanh/tanh), no `clip` and no LSTM `input_forget`; anything else is refused
//! by name.

use smelt_ir::op::{BinaryOp, Op, UnaryOp};
use smelt_ir::{Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "GRU"                 [1, 3, 7, 14, 22],              from 7  => recurrent;
    "LSTM"                [1, 7, 14, 22],                 from 7  => recurrent;
    "RNN"                 [1, 7, 14, 22],                 from 7  => recurrent;
};

/// Which recurrent operator.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cell {
    Rnn,
    Gru { linear_before_reset: bool },
    Lstm,
}

impl Cell {
    /// Gates in W, R and B, in ONNX's order (RNN: i; GRU: z, r, h; LSTM: i, o, f, c).
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm => 4,
        }
    }

    /// The default `activations` of one direction.
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru { .. } => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// RNN, GRU and LSTM (one handler; the op type picks the cell).
pub fn recurrent(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let mut known = vec![
        "activation_alpha",
        "activation_beta",
        "activations",
        "clip",
        "direction",
        "hidden_size",
        "layout",
    ];
    let cell = match cx.node.op_type() {
        "GRU" => {
            known.push("linear_before_reset");
            Cell::Gru {
                linear_before_reset: false,
            }
        }
        "LSTM" => {
            known.push("input_forget");
            Cell::Lstm
        }
        _ => Cell::Rnn,
    };
    cx.check_attrs(&known)?;
    let cell = match cell {
        Cell::Gru { .. } => Cell::Gru {
            linear_before_reset: cx.attr_bool("linear_before_reset", false)?,
        },
        c => c,
    };
    cx.check_max_inputs(if cell == Cell::Lstm { 8 } else { 6 })?;
    for unsupported in ["clip", "activation_alpha", "activation_beta"] {
        if cx.node.attribute.iter().any(|a| a.name() == unsupported) {
            return Err(cx.err(
                "onnx-unsupported-attribute",
                format!("attribute '{unsupported}' is not supported (smelt runs the default activations unclipped)"),
            ));
        }
    }
    if cx.attr_bool("input_forget", false)? {
        return Err(cx.err(
            "onnx-unsupported-attribute",
            "input_forget = 1 (coupled input and forget gates) is not supported",
        ));
    }
    let directions: &[bool] = match cx.attr_string("direction")?.as_deref() {
        None | Some("forward") => &[false],
        Some("reverse") => &[true],
        Some("bidirectional") => &[false, true],
        Some(other) => {
            return Err(cx.bad_attr(
                "direction",
                format!("'{other}' is not forward, reverse or bidirectional"),
            ))
        }
    };
    if let Some(given) = cx.attr_strings("activations")? {
        let want: Vec<&str> = directions
            .iter()
            .flat_map(|_| cell.default_activations().iter().copied())
            .collect();
        let same = given.len() == want.len()
            && given
                .iter()
                .zip(&want)
                .all(|(g, w)| g.eq_ignore_ascii_case(w));
        if !same {
            return Err(cx.err(
                "onnx-unsupported-attribute",
                format!("activations {given:?}: smelt computes the default ones, {want:?}"),
            ));
        }
    }
    let layout = cx.attr_int_or("layout", 0)?;
    if !(0..=1).contains(&layout) {
        return Err(cx.bad_attr("layout", format!("{layout} is not 0 or 1")));
    }
    let batch_first = layout == 1;
    let hidden = match cx.attr_int("hidden_size")? {
        Some(h) if h > 0 => h as usize,
        _ => return Err(cx.bad_attr("hidden_size", "is required and must be positive")),
    };

    let x_dims = cx.dims(0)?;
    if x_dims.len() != 3 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("X of shape {x_dims:?} must be 3-D"),
        ));
    }
    let (seq, batch, input) = if batch_first {
        (x_dims[1], x_dims[0], x_dims[2])
    } else {
        (x_dims[0], x_dims[1], x_dims[2])
    };
    let dirs = directions.len();
    let gates = cell.gates();
    let want = |rows: usize, cols: usize| vec![dirs, rows, cols];
    for (i, name, dims) in [
        (1, "W", want(gates * hidden, input)),
        (2, "R", want(gates * hidden, hidden)),
    ] {
        if cx.dims(i)? != dims {
            return Err(cx.err(
                "onnx-bad-model",
                format!("{name} of shape {:?} must be {dims:?}", cx.dims(i)?),
            ));
        }
    }
    // per batch entry, its length when some entry is shorter than the sequence
    let lengths = match cx.input_name(4) {
        None => None,
        Some(_) => {
            let lengths = cx.const_ints(4, "sequence_lens")?;
            if lengths.len() != batch || lengths.iter().any(|&l| !(0..=seq as i64).contains(&l)) {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!(
                        "sequence_lens {lengths:?} must hold {batch} lengths (one per batch \
                         entry) of at most the sequence's {seq}"
                    ),
                ));
            }
            let lengths: Vec<usize> = lengths.iter().map(|&l| l as usize).collect();
            lengths.iter().any(|&l| l < seq).then_some(lengths)
        }
    };

    let x = cx.value(0)?;
    let x = if batch_first {
        transpose(cx, x, vec![1, 0, 2])?
    } else {
        x
    };
    let w = cx.value(1)?;
    let r = cx.value(2)?;
    let b = cx.opt_value(3)?;
    let state_input =
        |cx: &mut NodeCtx, i: usize, what: &str| -> Result<Option<Value>, Diagnostic> {
            let Some(v) = cx.opt_value(i)? else {
                return Ok(None);
            };
            let v = if batch_first {
                transpose(cx, v, vec![1, 0, 2])?
            } else {
                v
            };
            let dims = cx.type_of(v).dims.clone();
            if dims != [dirs, batch, hidden] {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!("{what} of shape {dims:?} does not fit [{dirs}, {batch}, {hidden}]"),
                ));
            }
            Ok(Some(v))
        };
    let initial_h = state_input(cx, 5, "initial_h")?;
    let (initial_c, peepholes) = match cell {
        Cell::Lstm => (state_input(cx, 6, "initial_c")?, cx.opt_value(7)?),
        _ => (None, None),
    };

    let mut ys = Vec::new();
    let mut hs = Vec::new();
    let mut cs = Vec::new();
    for (d, &reverse) in directions.iter().enumerate() {
        let dir = Direction {
            cell,
            d,
            seq,
            batch,
            hidden,
            input,
            reverse,
            lengths: lengths.clone(),
        };
        let (y, h, c) = dir.run(cx, [x, w, r], b, [initial_h, initial_c], peepholes)?;
        ys.push(y);
        hs.push(h);
        if let Some(c) = c {
            cs.push(c);
        }
    }
    let cat = |cx: &mut NodeCtx, parts: Vec<Value>, axis: usize| match parts.as_slice() {
        [one] => Ok(*one),
        _ => cx.emit(Op::Concat { axis }, &parts),
    };
    // Y [seq, dirs, batch, hidden], Y_h and Y_c [dirs, batch, hidden]
    let y = cat(cx, ys, 1)?;
    let h = cat(cx, hs, 0)?;
    let c = match cs.is_empty() {
        true => None,
        false => Some(cat(cx, cs, 0)?),
    };
    let (y, h, c) = if batch_first {
        let y = transpose(cx, y, vec![2, 0, 1, 3])?;
        let h = transpose(cx, h, vec![1, 0, 2])?;
        let c = match c {
            Some(c) => Some(transpose(cx, c, vec![1, 0, 2])?),
            None => None,
        };
        (y, h, c)
    } else {
        (y, h, c)
    };
    let mut out = vec![Entry::Value(y), Entry::Value(h)];
    if let Some(c) = c {
        out.push(Entry::Value(c));
    }
    Ok(out)
}

fn transpose(cx: &mut NodeCtx, v: Value, perm: Vec<usize>) -> Result<Value, Diagnostic> {
    cx.emit(Op::Transpose { perm }, &[v])
}

/// `v[.., lo..hi, ..]` along `axis`.
fn slice(
    cx: &mut NodeCtx,
    v: Value,
    axis: usize,
    lo: usize,
    hi: usize,
) -> Result<Value, Diagnostic> {
    cx.slice_along(v, axis, lo, hi)
}

/// One direction of a recurrent node.
struct Direction {
    cell: Cell,
    /// Its index in W, R, B and the states.
    d: usize,
    seq: usize,
    batch: usize,
    hidden: usize,
    input: usize,
    reverse: bool,
    /// Each batch entry's length, when some entry is shorter than `seq`.
    lengths: Option<Vec<usize>>,
}

impl Direction {
    /// The `[batch, 1]` mask of the entries still running at step `t`, when some is not.
    fn running(&self, cx: &mut NodeCtx, t: usize) -> Result<Option<Value>, Diagnostic> {
        let Some(lengths) = &self.lengths else {
            return Ok(None);
        };
        if lengths.iter().all(|&l| t < l) {
            return Ok(None);
        }
        let mask = ConstTensor::bool(
            vec![self.batch, 1],
            lengths.iter().map(|&l| t < l).collect(),
        );
        let name = cx.derived_name(&format!("running_{t}"));
        cx.materialize(&mask, &name).map(Some)
    }

    /// Gate `g` of direction `self.d` in a `[dirs, gates·hidden, cols]` weight, transposed
    /// to `[cols, hidden]`.
    fn gate_weight(
        &self,
        cx: &mut NodeCtx,
        w: Value,
        g: usize,
        cols: usize,
    ) -> Result<Value, Diagnostic> {
        let h = self.hidden;
        let one = slice(cx, w, 0, self.d, self.d + 1)?;
        let rows = slice(cx, one, 1, g * h, (g + 1) * h)?;
        let rows = cx.reshape(rows, vec![h, cols])?;
        transpose(cx, rows, vec![1, 0])
    }

    /// The `[hidden]` bias `which` (0: W's, 1: R's) of gate `g`, if B is given.
    fn gate_bias(
        &self,
        cx: &mut NodeCtx,
        b: Option<Value>,
        which: usize,
        g: usize,
    ) -> Result<Option<Value>, Diagnostic> {
        let Some(b) = b else {
            return Ok(None);
        };
        let h = self.hidden;
        let start = (which * self.cell.gates() + g) * h;
        let one = slice(cx, b, 0, self.d, self.d + 1)?;
        let part = slice(cx, one, 1, start, start + h)?;
        cx.reshape(part, vec![h]).map(Some)
    }

    /// Y `[seq, 1, batch, hidden]`, the last H `[1, batch, hidden]` and, for LSTM, the
    /// last C.
    fn run(
        &self,
        cx: &mut NodeCtx,
        [x, w, r]: [Value; 3],
        b: Option<Value>,
        [initial_h, initial_c]: [Option<Value>; 2],
        peepholes: Option<Value>,
    ) -> Result<(Value, Value, Option<Value>), Diagnostic> {
        let (seq, batch, hidden) = (self.seq, self.batch, self.hidden);
        if let Some(b) = b {
            let dims = cx.type_of(b).dims.clone();
            let want = [cx.type_of(w).dims[0], 2 * self.cell.gates() * hidden];
            if dims != want {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!("B of shape {dims:?} must be {want:?}"),
                ));
            }
        }
        let add =
            |cx: &mut NodeCtx, a: Value, b: Value| cx.emit(Op::Binary(BinaryOp::Add), &[a, b]);
        let mul =
            |cx: &mut NodeCtx, a: Value, b: Value| cx.emit(Op::Binary(BinaryOp::Mul), &[a, b]);
        let linear_before_reset = matches!(
            self.cell,
            Cell::Gru {
                linear_before_reset: true
            }
        );
        // per gate: the input projection of the whole sequence and the recurrent weight
        let mut projected = Vec::new();
        let mut recurrent = Vec::new();
        let mut recurrent_bias = Vec::new();
        for g in 0..self.cell.gates() {
            let wt = self.gate_weight(cx, w, g, self.input)?;
            let mut p = cx.emit(Op::MatMul, &[x, wt])?;
            let wb = self.gate_bias(cx, b, 0, g)?;
            let rb = self.gate_bias(cx, b, 1, g)?;
            // GRU with linear_before_reset keeps R's bias of h inside the reset product
            let inside = linear_before_reset && g == 2;
            let bias = match (wb, rb, inside) {
                (Some(wb), Some(rb), false) => Some(add(cx, wb, rb)?),
                (wb, _, _) => wb,
            };
            if let Some(bias) = bias {
                p = add(cx, p, bias)?;
            }
            projected.push(p);
            recurrent.push(self.gate_weight(cx, r, g, hidden)?);
            recurrent_bias.push(if inside { rb } else { None });
        }
        let state = |cx: &mut NodeCtx, given: Option<Value>| -> Result<Value, Diagnostic> {
            match given {
                Some(v) => {
                    let one = slice(cx, v, 0, self.d, self.d + 1)?;
                    cx.reshape(one, vec![batch, hidden])
                }
                None => {
                    let zeros = ConstTensor::f32(vec![batch, hidden], vec![0.0; batch * hidden]);
                    let name = cx.derived_name("zero_state");
                    cx.materialize(&zeros, &name)
                }
            }
        };
        let mut h = state(cx, initial_h)?;
        let mut c = match self.cell {
            Cell::Lstm => Some(state(cx, initial_c)?),
            _ => None,
        };
        let peephole = |cx: &mut NodeCtx, k: usize| -> Result<Option<Value>, Diagnostic> {
            let Some(p) = peepholes else {
                return Ok(None);
            };
            let one = slice(cx, p, 0, self.d, self.d + 1)?;
            let part = slice(cx, one, 1, k * hidden, (k + 1) * hidden)?;
            cx.reshape(part, vec![hidden]).map(Some)
        };
        let peeps = [peephole(cx, 0)?, peephole(cx, 1)?, peephole(cx, 2)?];
        let mut outputs: Vec<Option<Value>> = vec![None; seq];
        for step in 0..seq {
            let t = if self.reverse { seq - 1 - step } else { step };
            let (h_prev, c_prev_step) = (h, c);
            // gate g's pre-activation: its projected input at t plus H·Rᵀ
            let pre = |cx: &mut NodeCtx, g: usize, hv: Value| -> Result<Value, Diagnostic> {
                let xt = slice(cx, projected[g], 0, t, t + 1)?;
                let xt = cx.reshape(xt, vec![batch, hidden])?;
                let hr = cx.emit(Op::MatMul, &[hv, recurrent[g]])?;
                add(cx, xt, hr)
            };
            let sigmoid = |cx: &mut NodeCtx, v: Value| cx.emit(Op::Unary(UnaryOp::Sigmoid), &[v]);
            let tanh = |cx: &mut NodeCtx, v: Value| cx.emit(Op::Unary(UnaryOp::Tanh), &[v]);
            h = match self.cell {
                Cell::Rnn => {
                    let a = pre(cx, 0, h)?;
                    tanh(cx, a)?
                }
                Cell::Gru {
                    linear_before_reset,
                } => {
                    let z = pre(cx, 0, h)?;
                    let z = sigmoid(cx, z)?;
                    let rg = pre(cx, 1, h)?;
                    let rg = sigmoid(cx, rg)?;
                    let candidate = if linear_before_reset {
                        let xt = slice(cx, projected[2], 0, t, t + 1)?;
                        let xt = cx.reshape(xt, vec![batch, hidden])?;
                        let mut hr = cx.emit(Op::MatMul, &[h, recurrent[2]])?;
                        if let Some(rb) = recurrent_bias[2] {
                            hr = add(cx, hr, rb)?;
                        }
                        let gated = mul(cx, rg, hr)?;
                        add(cx, xt, gated)?
                    } else {
                        let reset = mul(cx, rg, h)?;
                        pre(cx, 2, reset)?
                    };
                    let candidate = tanh(cx, candidate)?;
                    // (1 − z)·h̃ + z·H
                    let one = cx.scalar(1.0)?;
                    let keep = cx.emit(Op::Binary(BinaryOp::Sub), &[one, z])?;
                    let fresh = mul(cx, keep, candidate)?;
                    let old = mul(cx, z, h)?;
                    add(cx, fresh, old)?
                }
                Cell::Lstm => {
                    let Some(c_prev) = c else {
                        return Err(
                            cx.err("onnx-bad-model", "internal: an LSTM without a cell state")
                        );
                    };
                    let with_peephole =
                        |cx: &mut NodeCtx, a: Value, k: usize, cv: Value| match peeps[k] {
                            Some(p) => {
                                let pc = mul(cx, p, cv)?;
                                add(cx, a, pc)
                            }
                            None => Ok(a),
                        };
                    let i = pre(cx, 0, h)?;
                    let i = with_peephole(cx, i, 0, c_prev)?;
                    let i = sigmoid(cx, i)?;
                    let f = pre(cx, 2, h)?;
                    let f = with_peephole(cx, f, 2, c_prev)?;
                    let f = sigmoid(cx, f)?;
                    let cand = pre(cx, 3, h)?;
                    let cand = tanh(cx, cand)?;
                    let kept = mul(cx, f, c_prev)?;
                    let added = mul(cx, i, cand)?;
                    let c_new = add(cx, kept, added)?;
                    let o = pre(cx, 1, h)?;
                    let o = with_peephole(cx, o, 1, c_new)?;
                    let o = sigmoid(cx, o)?;
                    c = Some(c_new);
                    let squashed = tanh(cx, c_new)?;
                    mul(cx, o, squashed)?
                }
            };
            let y = match self.running(cx, t)? {
                None => h,
                Some(running) => {
                    // past its length an entry keeps its state and gives zeros
                    let zeros = ConstTensor::f32(vec![1], vec![0.0]);
                    let name = cx.derived_name("zero");
                    let zero = cx.materialize(&zeros, &name)?;
                    let y = cx.emit(Op::Where, &[running, h, zero])?;
                    h = cx.emit(Op::Where, &[running, h, h_prev])?;
                    if let (Some(c_new), Some(c_old)) = (c, c_prev_step) {
                        c = Some(cx.emit(Op::Where, &[running, c_new, c_old])?);
                    }
                    y
                }
            };
            outputs[t] = Some(cx.reshape(y, vec![1, 1, batch, hidden])?);
        }
        let outputs: Vec<Value> = outputs.into_iter().flatten().collect();
        let y = match outputs.as_slice() {
            [one] => *one,
            _ => cx.emit(Op::Concat { axis: 0 }, &outputs)?,
        };
        let last_h = cx.reshape(h, vec![1, batch, hidden])?;
        let last_c = match c {
            Some(c) => Some(cx.reshape(c, vec![1, batch, hidden])?),
            None => None,
        };
        Ok((y, last_h, last_c))
    }
}
