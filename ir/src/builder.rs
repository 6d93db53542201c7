//! A builder API for embedders and importers: construct functions op by op with type checking.

use crate::diag::{Diagnostic, Location};
use crate::graph::{Func, FuncResult, Inst, Module, Param, Value};
use crate::op::Op;
use crate::types::TensorType;
use crate::weights::{AlignedBuf, WeightId, WeightOrigin};

/// Builds one function of a module, inferring and checking each instruction's type.
///
/// ```
/// use smelt_ir::{builder::FuncBuilder, op::{Op, UnaryOp}, types::TensorType, Module};
/// let mut module = Module::default();
/// let mut b = FuncBuilder::new(&mut module, "f");
/// let x = b.param("x", TensorType::f32([2, 3]));
/// let y = b.op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
/// b.finish(&[("y", y)]);
/// assert_eq!(module.funcs[0].insts.len(), 1);
/// ```
pub struct FuncBuilder<'m> {
    module: &'m mut Module,
    func: Func,
    loc: Location,
}

impl<'m> FuncBuilder<'m> {
    /// Starts a function named `name` in `module`.
    pub fn new(module: &'m mut Module, name: &str) -> FuncBuilder<'m> {
        FuncBuilder {
            module,
            func: Func {
                name: name.to_string(),
                params: Vec::new(),
                insts: Vec::new(),
                results: Vec::new(),
                loc: Location::Unknown,
            },
            loc: Location::Unknown,
        }
    }

    /// Adds a parameter. Parameters must come before instructions.
    pub fn param(&mut self, name: &str, ty: TensorType) -> Value {
        assert!(
            self.func.insts.is_empty(),
            "parameters come before instructions"
        );
        self.func.params.push(Param {
            name: name.to_string(),
            ty,
        });
        Value(self.func.params.len() as u32 - 1)
    }

    /// Sets the location given to the following instructions.
    pub fn set_loc(&mut self, loc: Location) {
        self.loc = loc;
    }

    /// Appends `op` applied to `operands`; returns its value or a diagnostic naming the
    /// current location when the type rule rejects it.
    pub fn op(&mut self, op: Op, operands: &[Value]) -> Result<Value, Diagnostic> {
        let mut types = Vec::with_capacity(operands.len());
        for v in operands {
            if v.index() >= self.func.num_values() {
                return Err(Diagnostic::error(
                    "undefined-value",
                    format!("operand {} of '{}' is not defined", v.0, op.name()),
                    self.loc.clone(),
                ));
            }
            types.push(self.func.type_of(*v));
        }
        let weights = &self.module.weights;
        let ty = op
            .infer_type(&types, &|id| weights.type_of(id))
            .map_err(|m| Diagnostic::error("type-mismatch", m, self.loc.clone()))?;
        self.func.insts.push(Inst {
            op,
            operands: operands.to_vec(),
            ty,
            loc: self.loc.clone(),
        });
        Ok(self.func.inst_value(self.func.insts.len() - 1))
    }

    /// Adds an f32 weight to the module and a `const` op reading it.
    pub fn constant(
        &mut self,
        name: &str,
        ty: TensorType,
        values: &[f32],
    ) -> Result<Value, Diagnostic> {
        let id = self.add_weight(
            name,
            ty,
            AlignedBuf::from_f32(values),
            WeightOrigin::Computed,
        )?;
        self.op(Op::Const(id), &[])
    }

    /// Adds a weight to the module.
    pub fn add_weight(
        &mut self,
        name: &str,
        ty: TensorType,
        data: AlignedBuf,
        origin: WeightOrigin,
    ) -> Result<WeightId, Diagnostic> {
        let name = self.module.weights.fresh_name(name);
        self.module
            .weights
            .add(name, ty, data, origin)
            .map_err(|m| Diagnostic::error("bad-weight", m, self.loc.clone()))
    }

    /// Read access to the module's weights (e.g. to look up types while building).
    pub fn module(&self) -> &Module {
        self.module
    }

    /// Type of a value built so far.
    pub fn type_of(&self, v: Value) -> &TensorType {
        self.func.type_of(v)
    }

    /// Sets the results and appends the function to the module.
    pub fn finish(mut self, results: &[(&str, Value)]) {
        self.func.results = results
            .iter()
            .map(|(n, v)| FuncResult {
                name: n.to_string(),
                value: *v,
            })
            .collect();
        self.module.funcs.push(self.func);
    }
}
