//! Import state shared by the op handlers: what each ONNX tensor name stands for, and a
//! per-node context with typed attribute and input accessors that produce clear errors.

use std::collections::HashMap;
use std::rc::Rc;

use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::Op;
use smelt_ir::{DType, Diagnostic, Location, TensorType, Value, WeightOrigin};

use super::proto::{attribute_proto::AttributeType, AttributeProto, GraphProto, NodeProto};
use super::tensor::ConstTensor;

/// What an ONNX tensor name stands for during import.
#[derive(Clone, Debug)]
pub enum Entry {
    /// A value computed at run time (of any IR element type).
    Value(Value),
    /// A value known at import time; it becomes a module weight when an op needs it.
    Const(Rc<ConstTensor>),
    /// An extra output smelt does not compute (MaxPool indices, Dropout mask, ...);
    /// using it is an error naming the producer.
    Dropped {
        /// `OpType node 'name'` of the producer, for messages.
        producer: String,
        /// What the output is.
        what: &'static str,
    },
}

impl Entry {
    /// A constant entry.
    pub fn constant(c: ConstTensor) -> Entry {
        Entry::Const(Rc::new(c))
    }
}

/// What names meant before a body scoped them out: per name, its entry, its
/// materialized constant and the name of its f32 widening.
pub type ScopedNames = Vec<(Option<Entry>, Option<Value>, Option<String>)>;

/// The state of one import: the function being built and the meaning of every name.
pub struct Importer<'m> {
    /// The function under construction.
    pub builder: FuncBuilder<'m>,
    /// Every tensor name defined so far.
    pub entries: HashMap<String, Entry>,
    /// Constants already turned into `const` ops, by tensor name.
    materialized: HashMap<String, Value>,
    /// Bytes of the constants nodes folded so far (held until import ends), counted
    /// against the memory budget with the weights.
    folded_bytes: u64,
    /// The model's `ai.onnx` opset, which every node of every subgraph shares.
    pub opset: i64,
    /// How many control-flow bodies enclose the node being imported.
    pub subgraph_depth: usize,
    /// Nodes imported so far by unrolling Loop and Scan bodies (bounded, so a huge trip
    /// count is an error rather than an endless import).
    pub unrolled_nodes: usize,
    /// The name under which each float16 / bfloat16 tensor's f32 widening is entered,
    /// by the tensor's name (see `narrow.rs`).
    pub widened: HashMap<String, String>,
}

impl<'m> Importer<'m> {
    /// An importer appending to `builder`, for a model of `opset`.
    pub fn new(builder: FuncBuilder<'m>, opset: i64) -> Importer<'m> {
        Importer {
            builder,
            opset,
            subgraph_depth: 0,
            unrolled_nodes: 0,
            widened: HashMap::new(),
            entries: HashMap::new(),
            materialized: HashMap::new(),
            folded_bytes: 0,
        }
    }

    /// Takes `names` out of scope: their entries, materialized constants and f32
    /// widenings, returned to give back to [`Importer::scope_in`].
    pub fn scope_out(&mut self, names: &[String]) -> ScopedNames {
        names
            .iter()
            .map(|n| {
                (
                    self.entries.remove(n),
                    self.materialized.remove(n),
                    self.widened.remove(n),
                )
            })
            .collect()
    }

    /// Puts back what [`Importer::scope_out`] took for `names`, dropping what they were
    /// bound to since.
    pub fn scope_in(&mut self, names: &[String], saved: ScopedNames) {
        for (n, (entry, value, wide)) in names.iter().zip(saved) {
            self.entries.remove(n);
            self.materialized.remove(n);
            self.widened.remove(n);
            if let Some(e) = entry {
                self.entries.insert(n.clone(), e);
            }
            if let Some(v) = value {
                self.materialized.insert(n.clone(), v);
            }
            if let Some(w) = wide {
                self.widened.insert(n.clone(), w);
            }
        }
    }

    /// Reserves `bytes` for a constant a node is about to fold, checked against the
    /// memory budget (with the weights and earlier folds) before it is allocated.
    pub fn reserve(&mut self, what: &str, bytes: u64) -> Result<(), Diagnostic> {
        let weights = &self.builder.module().weights;
        smelt_ir::budget::check(
            what,
            bytes,
            weights.bytes().saturating_add(self.folded_bytes),
            weights.memory_budget(),
        )
        .map_err(|m| plain_error("memory-budget", m))?;
        self.folded_bytes = self.folded_bytes.saturating_add(bytes);
        Ok(())
    }

    /// The run-time value for tensor `name`, turning a constant into a weight and a
    /// `const` op (once per name). Errors describe the problem without location.
    pub fn value_of(&mut self, name: &str) -> Result<Value, Diagnostic> {
        match self.entries.get(name).cloned() {
            Some(Entry::Value(v)) => Ok(v),
            Some(Entry::Const(c)) => {
                if let Some(v) = self.materialized.get(name) {
                    return Ok(*v);
                }
                let v = self.materialize(&c, name)?;
                self.materialized.insert(name.to_string(), v);
                Ok(v)
            }
            Some(Entry::Dropped { producer, what }) => Err(plain_error(
                "onnx-unsupported-output",
                format!(
                    "tensor '{name}' is the {what} of {producer}, which smelt does not compute"
                ),
            )),
            None => Err(plain_error(
                "onnx-missing-input",
                format!("tensor '{name}' is not defined"),
            )),
        }
    }

    /// Adds `c` as a weight named after `name` and returns a `const` op reading it:
    /// float32, float16, bfloat16, int64, int32, int16, uint16, int8, uint8 and bool
    /// constants (other types are only folded).
    pub fn materialize(&mut self, c: &ConstTensor, name: &str) -> Result<Value, Diagnostic> {
        let (ty, buf) = c.to_weight().ok_or_else(|| {
            plain_error(
                "onnx-unsupported-dtype",
                format!(
                    "tensor '{name}' has element type {}; smelt's run-time tensors are \
                     float32, float16, bfloat16, int64, int32, int16, uint16, int8, uint8 \
                     and bool (other types are folded at import only)",
                    c.type_name()
                ),
            )
        })?;
        let weights = &self.builder.module().weights;
        weights
            .check_room(&format!("constant '{name}' ({ty})"), buf.len_bytes() as u64)
            .map_err(|m| plain_error("memory-budget", m))?;
        let id = self
            .builder
            .add_weight(name, ty, buf, WeightOrigin::Computed)?;
        self.builder.op(Op::Const(id), &[])
    }
}

/// A diagnostic without location; `import_node` adds the node's location and context.
pub fn plain_error(code: &'static str, message: impl Into<String>) -> Diagnostic {
    Diagnostic::error(code, message, Location::Unknown)
}

/// The context of one node being imported: the node, its resolved operator version and
/// accessors that report errors in the node's terms.
pub struct NodeCtx<'a, 'm> {
    /// The importer state.
    pub imp: &'a mut Importer<'m>,
    /// The node.
    pub node: &'a NodeProto,
    /// The operator version in force (the newest `since_version` <= the model's opset).
    pub version: i64,
}

impl<'a, 'm> NodeCtx<'a, 'm> {
    /// An error about this node (location and node context are added by the caller).
    pub fn err(&self, code: &'static str, message: impl Into<String>) -> Diagnostic {
        plain_error(code, message)
    }

    /// Rejects attributes the handler does not know, so nothing is silently ignored.
    pub fn check_attrs(&self, known: &[&str]) -> Result<(), Diagnostic> {
        for a in &self.node.attribute {
            if !known.contains(&a.name()) {
                return Err(self.err(
                    "onnx-unsupported-attribute",
                    format!(
                        "attribute '{}' is not supported (supported: {})",
                        a.name(),
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    fn attr(
        &self,
        name: &str,
        want: AttributeType,
    ) -> Result<Option<&'a AttributeProto>, Diagnostic> {
        let Some(a) = self.node.attribute.iter().find(|a| a.name() == name) else {
            return Ok(None);
        };
        if !a.ref_attr_name().is_empty() {
            return Err(self.err(
                "onnx-bad-attribute",
                format!("attribute '{name}' refers to a function attribute; only plain graphs are supported"),
            ));
        }
        // Old exporters leave `type` unset; accept that when the right field is filled.
        let ty = a.r#type();
        if ty != want && ty != AttributeType::Undefined {
            return Err(self.err(
                "onnx-bad-attribute",
                format!(
                    "attribute '{name}' must be {}, got {}",
                    want.as_str_name(),
                    ty.as_str_name()
                ),
            ));
        }
        Ok(Some(a))
    }

    /// An integer attribute.
    pub fn attr_int(&self, name: &str) -> Result<Option<i64>, Diagnostic> {
        Ok(self.attr(name, AttributeType::Int)?.and_then(|a| a.i))
    }

    /// An integer attribute with a default.
    pub fn attr_int_or(&self, name: &str, default: i64) -> Result<i64, Diagnostic> {
        Ok(self.attr_int(name)?.unwrap_or(default))
    }

    /// A float attribute, `None` when absent.
    pub fn attr_float(&self, name: &str) -> Result<Option<f32>, Diagnostic> {
        Ok(self.attr(name, AttributeType::Float)?.and_then(|a| a.f))
    }

    /// A float attribute with a default.
    pub fn attr_float_or(&self, name: &str, default: f32) -> Result<f32, Diagnostic> {
        Ok(self
            .attr(name, AttributeType::Float)?
            .and_then(|a| a.f)
            .unwrap_or(default))
    }

    /// An integer-list attribute.
    pub fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>, Diagnostic> {
        Ok(self
            .attr(name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    /// A float-list attribute.
    pub fn attr_floats(&self, name: &str) -> Result<Option<Vec<f32>>, Diagnostic> {
        Ok(self
            .attr(name, AttributeType::Floats)?
            .map(|a| a.floats.clone()))
    }

    /// A string attribute.
    pub fn attr_string(&self, name: &str) -> Result<Option<String>, Diagnostic> {
        Ok(self
            .attr(name, AttributeType::String)?
            .map(|a| String::from_utf8_lossy(a.s()).into_owned()))
    }

    /// A string-list attribute.
    pub fn attr_strings(&self, name: &str) -> Result<Option<Vec<String>>, Diagnostic> {
        Ok(self.attr(name, AttributeType::Strings)?.map(|a| {
            a.strings
                .iter()
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        }))
    }

    /// A tensor attribute, decoded.
    pub fn attr_tensor(&self, name: &str) -> Result<Option<ConstTensor>, Diagnostic> {
        match self
            .attr(name, AttributeType::Tensor)?
            .and_then(|a| a.t.as_ref())
        {
            Some(t) => ConstTensor::from_proto(t)
                .map(Some)
                .map_err(|m| self.err("onnx-bad-attribute", format!("attribute '{name}': {m}"))),
            None => Ok(None),
        }
    }

    /// A graph attribute (a control-flow body).
    pub fn attr_graph(&self, name: &str) -> Result<Option<&'a GraphProto>, Diagnostic> {
        Ok(self
            .attr(name, AttributeType::Graph)?
            .and_then(|a| a.g.as_ref()))
    }

    /// A boolean (0/1) integer attribute.
    pub fn attr_bool(&self, name: &str, default: bool) -> Result<bool, Diagnostic> {
        match self.attr_int(name)? {
            None => Ok(default),
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(v) => Err(self.err(
                "onnx-bad-attribute",
                format!("attribute '{name}' must be 0 or 1, got {v}"),
            )),
        }
    }

    /// A bad attribute value.
    pub fn bad_attr(&self, name: &str, message: impl std::fmt::Display) -> Diagnostic {
        self.err(
            "onnx-bad-attribute",
            format!("attribute '{name}': {message}"),
        )
    }

    /// The name of input `i`, or `None` when it is absent (missing or empty: optional).
    pub fn input_name(&self, i: usize) -> Option<&'a str> {
        self.node
            .input
            .get(i)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    /// Number of inputs given (trailing empty names count).
    pub fn num_inputs(&self) -> usize {
        self.node.input.len()
    }

    /// Rejects a node given more inputs than its operator takes (optional ones
    /// included): an extra input would be silently ignored, and onnxruntime refuses
    /// such a model.
    pub fn check_max_inputs(&self, max: usize) -> Result<(), Diagnostic> {
        let n = self.node.input.len();
        if n <= max {
            return Ok(());
        }
        let takes = if max == 1 {
            "1 input".to_string()
        } else {
            format!("at most {max} inputs")
        };
        Err(self.err(
            "onnx-bad-model",
            format!("{n} inputs given; '{}' takes {takes}", self.node.op_type()),
        ))
    }

    fn required_name(&self, i: usize) -> Result<&'a str, Diagnostic> {
        self.input_name(i).ok_or_else(|| {
            self.err(
                "onnx-missing-input",
                format!("required input {i} is missing"),
            )
        })
    }

    /// Input `i` as a run-time value (a constant becomes a weight); it must be present.
    pub fn value(&mut self, i: usize) -> Result<Value, Diagnostic> {
        let name = self.required_name(i)?;
        self.imp.value_of(name).map_err(|d| self.input_error(i, d))
    }

    /// Input `i` as a run-time value, or `None` when the optional input is absent.
    pub fn opt_value(&mut self, i: usize) -> Result<Option<Value>, Diagnostic> {
        match self.input_name(i) {
            Some(_) => self.value(i).map(Some),
            None => Ok(None),
        }
    }

    fn input_error(&self, i: usize, d: Diagnostic) -> Diagnostic {
        Diagnostic {
            message: format!("input {i}: {}", d.message),
            ..d
        }
    }

    /// The `axes` of an op whose axes were an attribute until version `input_from` and
    /// input 1 from it (Squeeze and Unsqueeze at 13, ReduceSum at 13, the other
    /// reductions at 18): the form the node's version takes, `None` when absent. The
    /// other version's form is an error saying which opset has which.
    pub fn versioned_axes(&self, input_from: i64) -> Result<Option<Vec<i64>>, Diagnostic> {
        let op = self.node.op_type();
        if self.version < input_from {
            if self.num_inputs() > 1 {
                return Err(self.err(
                    "onnx-bad-model",
                    format!(
                        "{op}-{} takes its axes as an attribute; the axes input exists from \
                         opset {input_from} (this model imports an older opset)",
                        self.version
                    ),
                ));
            }
            return self.attr_ints("axes");
        }
        if self.node.attribute.iter().any(|a| a.name() == "axes") {
            return Err(self.bad_attr(
                "axes",
                format!(
                    "is input 1 of {op} from opset {input_from} (this node is version {}); \
                     the attribute form is older versions'",
                    self.version
                ),
            ));
        }
        match self.input_name(1) {
            Some(_) => self.const_ints(1, "axes").map(Some),
            None => Ok(None),
        }
    }

    /// The entry of input `i` (must be present).
    pub fn entry(&self, i: usize) -> Result<Entry, Diagnostic> {
        let name = self.required_name(i)?;
        self.imp.entries.get(name).cloned().ok_or_else(|| {
            self.err(
                "onnx-missing-input",
                format!("input {i} ('{name}') is not defined"),
            )
        })
    }

    /// Input `i` if it is known at import time, `None` if it is computed at run time.
    pub fn const_input(&self, i: usize) -> Result<Option<Rc<ConstTensor>>, Diagnostic> {
        match self.entry(i)? {
            Entry::Const(c) => Ok(Some(c)),
            Entry::Value(_) => Ok(None),
            Entry::Dropped { producer, what } => Err(self.err(
                "onnx-unsupported-output",
                format!("input {i} is the {what} of {producer}, which smelt does not compute"),
            )),
        }
    }

    /// Input `i`, which must be known at import time (`what` says what it is for).
    pub fn require_const(&self, i: usize, what: &str) -> Result<Rc<ConstTensor>, Diagnostic> {
        self.const_input(i)?.ok_or_else(|| {
            self.err(
                "onnx-dynamic-shape",
                format!(
                    "input {i} ('{}', the {what}) is computed at run time; smelt needs it \
                     constant (an initializer, a Constant node or foldable shape arithmetic)",
                    self.input_name(i).unwrap_or("")
                ),
            )
        })
    }

    /// Input `i` as a constant list of integers (shape, axes, pads...).
    pub fn const_ints(&self, i: usize, what: &str) -> Result<Vec<i64>, Diagnostic> {
        let c = self.require_const(i, what)?;
        c.i64s().map(<[i64]>::to_vec).ok_or_else(|| {
            self.err(
                "onnx-unsupported-dtype",
                format!(
                    "input {i} (the {what}) must be an integer tensor, got {}",
                    c.type_name()
                ),
            )
        })
    }

    /// Input `i` as one constant integer (TopK's k, CumSum's axis...): a tensor of one
    /// element, of any rank.
    pub fn const_int(&self, i: usize, what: &str) -> Result<i64, Diagnostic> {
        match self.const_ints(i, what)?.as_slice() {
            [v] => Ok(*v),
            other => Err(self.err(
                "onnx-bad-model",
                format!("input {i} (the {what}) must be one integer, got {other:?}"),
            )),
        }
    }

    /// Dimensions of input `i`, whether constant or computed.
    pub fn dims(&self, i: usize) -> Result<Vec<usize>, Diagnostic> {
        Ok(match self.entry(i)? {
            Entry::Const(c) => c.dims.clone(),
            Entry::Value(v) => self.imp.builder.type_of(v).dims.clone(),
            Entry::Dropped { producer, what } => {
                return Err(self.err(
                    "onnx-unsupported-output",
                    format!("input {i} is the {what} of {producer}, which smelt does not compute"),
                ))
            }
        })
    }

    /// The type of a value built so far.
    pub fn type_of(&self, v: Value) -> &TensorType {
        self.imp.builder.type_of(v)
    }

    /// Appends an op (type-checked; a type error is reported against this node).
    pub fn emit(&mut self, op: Op, operands: &[Value]) -> Result<Value, Diagnostic> {
        self.imp.builder.op(op, operands)
    }

    /// A float32 scalar constant.
    pub fn scalar(&mut self, v: f32) -> Result<Value, Diagnostic> {
        self.imp
            .builder
            .constant("scalar", TensorType::f32([]), &[v])
    }

    /// An int64 scalar constant (an index bound, a class, a stride).
    pub fn int_scalar(&mut self, v: i64) -> Result<Value, Diagnostic> {
        let name = self.derived_name("int_scalar");
        self.materialize(&ConstTensor::i64(vec![], vec![v]), &name)
    }

    /// `v` as int64 indices: int64 as it is, int32 cast; `what` names it in the error
    /// for any other type.
    pub fn int64_indices(&mut self, v: Value, what: &str) -> Result<Value, Diagnostic> {
        match self.type_of(v).dtype {
            DType::I64 => Ok(v),
            DType::I32 => self.emit(Op::Cast { to: DType::I64 }, &[v]),
            other => Err(self.err(
                "onnx-unsupported-dtype",
                format!("{what} must be int64 or int32, got {other}"),
            )),
        }
    }

    /// Turns a derived constant into a weight and a `const` op.
    pub fn materialize(&mut self, c: &ConstTensor, hint: &str) -> Result<Value, Diagnostic> {
        self.imp.materialize(c, hint)
    }

    /// A name for derived weights: the node's first output with a suffix.
    pub fn derived_name(&self, suffix: &str) -> String {
        let base = self.node.output.first().map(String::as_str).unwrap_or("t");
        format!("{base}_{suffix}")
    }

    /// Input `i` reshaped to `dims`: folded for constants, a `reshape` op otherwise.
    pub fn reshaped_input(&mut self, i: usize, dims: Vec<usize>) -> Result<Value, Diagnostic> {
        match self.const_input(i)? {
            Some(c) if c.dims != dims => {
                let name = self.derived_name(&format!("in{i}"));
                self.materialize(&c.reshaped(dims), &name)
            }
            _ => {
                let v = self.value(i)?;
                self.reshape(v, dims)
            }
        }
    }

    /// `v[.., start..end, ..]` along `axis` (a `slice` of every other axis whole).
    pub fn slice_along(
        &mut self,
        v: Value,
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<Value, Diagnostic> {
        let dims = self.type_of(v).dims.clone();
        let mut starts = vec![0i64; dims.len()];
        let mut ends: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        starts[axis] = start as i64;
        ends[axis] = end as i64;
        let steps = vec![1; dims.len()];
        self.emit(
            Op::Slice(smelt_ir::op::SliceAttrs {
                starts,
                ends,
                steps,
            }),
            &[v],
        )
    }

    /// `v` reshaped to `dims` (no op when the shape is already right).
    pub fn reshape(&mut self, v: Value, dims: Vec<usize>) -> Result<Value, Diagnostic> {
        if self.type_of(v).dims == dims {
            return Ok(v);
        }
        self.emit(Op::Reshape { shape: dims }, &[v])
    }

    /// Normalizes a possibly negative axis against `rank` (valid range `0..rank`).
    pub fn axis(&self, attr: &str, axis: i64, rank: usize) -> Result<usize, Diagnostic> {
        normalize_axis(axis, rank).ok_or_else(|| {
            self.bad_attr(attr, format!("axis {axis} is out of range for rank {rank}"))
        })
    }

    /// `producer` text for [`Entry::Dropped`].
    pub fn describe(&self) -> String {
        format!(
            "{} node '{}'",
            self.node.op_type(),
            node_display_name(self.node)
        )
    }

    /// An entry for an extra output that smelt does not compute.
    pub fn dropped(&self, what: &'static str) -> Entry {
        Entry::Dropped {
            producer: self.describe(),
            what,
        }
    }
}

/// `axis` in `-rank..rank` mapped to `0..rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// The node's name, or its first output's name when it has none (many exporters and
/// ONNX's own tests leave names empty).
pub fn node_display_name(node: &NodeProto) -> String {
    if !node.name().is_empty() {
        node.name().to_string()
    } else {
        node.output
            .first()
            .map(|o| format!("<output {o}>"))
            .unwrap_or_else(|| "<unnamed>".to_string())
    }
}
