//! Modules, functions, instructions and SSA values.

use crate::diag::Location;
use crate::op::Op;
use crate::types::TensorType;
use crate::weights::WeightStore;

/// An SSA value of a function: parameters first (`0..params.len()`), then one value per
/// instruction in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

impl Value {
    /// The raw index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A named function parameter. Names are the embedding API: they are kept verbatim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Name without the `%`.
    pub name: String,
    /// Type.
    pub ty: TensorType,
}

/// A named function result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncResult {
    /// Result name (an ONNX output name, or `result{i}` by default).
    pub name: String,
    /// The returned value.
    pub value: Value,
}

/// One instruction: an op applied to operands, producing one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inst {
    /// The op.
    pub op: Op,
    /// Operand values, all defined earlier.
    pub operands: Vec<Value>,
    /// Type of the result.
    pub ty: TensorType,
    /// Provenance.
    pub loc: Location,
}

/// A function: parameters, a straight-line body in definition order, results.
///
/// Invariant (checked by the verifier): every operand is a parameter or an earlier
/// instruction, so the body is a topological order of the dataflow graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Func {
    /// Name without the `@`.
    pub name: String,
    /// Parameters.
    pub params: Vec<Param>,
    /// Instructions in definition order.
    pub insts: Vec<Inst>,
    /// Results.
    pub results: Vec<FuncResult>,
    /// Provenance of the function itself.
    pub loc: Location,
}

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// The i-th parameter.
    Param(usize),
    /// The i-th instruction.
    Inst(usize),
}

/// A use of a value: as operand `operand` of instruction `inst`, or as result `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Use {
    /// Operand of an instruction.
    Operand {
        /// Instruction index.
        inst: usize,
        /// Operand position.
        operand: usize,
    },
    /// Returned as a function result.
    Result(usize),
}

impl Func {
    /// Number of values (parameters plus instructions).
    pub fn num_values(&self) -> usize {
        self.params.len() + self.insts.len()
    }

    /// The symbols its parameters' sizes read, by name (every symbolic size in the body
    /// is computed from them: weights have known sizes).
    pub fn symbols(&self) -> std::collections::BTreeSet<std::sync::Arc<str>> {
        self.params.iter().flat_map(|p| p.ty.symbols()).collect()
    }

    /// Whether a parameter has a symbolic size ([`crate::symbolic`]).
    pub fn is_symbolic(&self) -> bool {
        self.params.iter().any(|p| p.ty.is_symbolic())
    }

    /// Where `v` is defined, or `None` if it is out of range.
    pub fn def(&self, v: Value) -> Option<ValueDef> {
        let i = v.index();
        if i < self.params.len() {
            Some(ValueDef::Param(i))
        } else if i < self.num_values() {
            Some(ValueDef::Inst(i - self.params.len()))
        } else {
            None
        }
    }

    /// The value defined by instruction `inst`.
    pub fn inst_value(&self, inst: usize) -> Value {
        Value((self.params.len() + inst) as u32)
    }

    /// The instruction defining `v`, if `v` is not a parameter.
    pub fn inst_of(&self, v: Value) -> Option<&Inst> {
        match self.def(v)? {
            ValueDef::Inst(i) => self.insts.get(i),
            ValueDef::Param(_) => None,
        }
    }

    /// Type of a value. Panics on out-of-range values; only call on verified functions.
    pub fn type_of(&self, v: Value) -> &TensorType {
        match self.def(v).expect("value in range") {
            ValueDef::Param(i) => &self.params[i].ty,
            ValueDef::Inst(i) => &self.insts[i].ty,
        }
    }

    /// Floating-point operations of one run as written (each op's count on its operand
    /// and result types), so that fused and unfused forms compare on the same work.
    /// Only call on verified functions.
    pub fn flops(&self) -> u64 {
        self.insts
            .iter()
            .map(|i| {
                let operands: Vec<_> = i.operands.iter().map(|v| self.type_of(*v)).collect();
                i.op.flops(&operands, &i.ty)
            })
            .sum()
    }

    /// The use list of every value, indexed by value, in program order.
    pub fn uses(&self) -> Vec<Vec<Use>> {
        let mut uses = vec![Vec::new(); self.num_values()];
        for (i, inst) in self.insts.iter().enumerate() {
            for (k, v) in inst.operands.iter().enumerate() {
                if let Some(u) = uses.get_mut(v.index()) {
                    u.push(Use::Operand {
                        inst: i,
                        operand: k,
                    });
                }
            }
        }
        for (i, r) in self.results.iter().enumerate() {
            if let Some(u) = uses.get_mut(r.value.index()) {
                u.push(Use::Result(i));
            }
        }
        uses
    }
}

/// A compilation unit: weights shared by its functions.
#[derive(Clone, Debug, Default)]
pub struct Module {
    /// Weights referenced by `const` ops.
    pub weights: WeightStore,
    /// Functions, in source order.
    pub funcs: Vec<Func>,
}

impl Module {
    /// The first function with symbolic sizes, if any.
    pub fn symbolic_func(&self) -> Option<&Func> {
        self.funcs.iter().find(|f| f.is_symbolic())
    }

    /// The function named `name`.
    pub fn func(&self, name: &str) -> Option<&Func> {
        self.funcs.iter().find(|f| f.name == name)
    }

    /// The function to run when none is named: the only one, or the one called `main`.
    pub fn entry(&self) -> Option<&Func> {
        match self.funcs.as_slice() {
            [only] => Some(only),
            _ => self.func("main"),
        }
    }

    /// Why [`Module::entry`] found nothing, for error messages.
    pub fn no_entry_reason(&self) -> String {
        if self.funcs.is_empty() {
            "the module has no function".to_string()
        } else {
            let names: Vec<_> = self.funcs.iter().map(|f| format!("@{}", f.name)).collect();
            format!(
                "the module has several functions ({}) and none is called @main",
                names.join(", ")
            )
        }
    }
}
