//! A small ONNX model builder over the generated protobuf types, shared by the ONNX
//! import tests (each test binary uses part of it).
#![allow(dead_code)]

use std::path::Path;

use prost::Message;
use smelt::ir::{interp, Module, Op, Tensor};
use smelt::onnx::proto::attribute_proto::AttributeType;
use smelt::onnx::proto::tensor_shape_proto::{dimension, Dimension};
use smelt::onnx::proto::{
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use smelt::onnx::{import, ImportOptions};
use smelt::Error;

/// One declared dimension of a graph input.
#[derive(Clone, Copy, Debug)]
pub enum Dim {
    /// `dim_value`.
    Fixed(i64),
    /// `dim_param` (named, `?` or empty).
    Param(&'static str),
    /// Neither set.
    Unset,
}

/// A tensor value info of element type `elem_type` (1 is float32), with `dims`, or with
/// no shape at all when `None`.
pub fn value_info(name: &str, elem_type: i32, dims: Option<&[Dim]>) -> ValueInfoProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| Dimension {
                value: match d {
                    Dim::Fixed(v) => Some(dimension::Value::DimValue(*v)),
                    Dim::Param(p) => Some(dimension::Value::DimParam(p.to_string())),
                    Dim::Unset => None,
                },
                ..Default::default()
            })
            .collect(),
    });
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem_type),
                shape,
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Static dims.
pub fn fixed(dims: &[i64]) -> Vec<Dim> {
    dims.iter().map(|&d| Dim::Fixed(d)).collect()
}

fn attr(name: &str, kind: AttributeType, fill: impl FnOnce(&mut AttributeProto)) -> AttributeProto {
    let mut a = AttributeProto {
        name: Some(name.into()),
        r#type: Some(kind as i32),
        ..Default::default()
    };
    fill(&mut a);
    a
}

/// An INT attribute.
pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    attr(name, AttributeType::Int, |a| a.i = Some(v))
}

/// An INTS attribute.
pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    attr(name, AttributeType::Ints, |a| a.ints = v.to_vec())
}

/// A FLOAT attribute.
pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    attr(name, AttributeType::Float, |a| a.f = Some(v))
}

/// A FLOATS attribute.
pub fn attr_floats(name: &str, v: &[f32]) -> AttributeProto {
    attr(name, AttributeType::Floats, |a| a.floats = v.to_vec())
}

/// A STRING attribute.
pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    attr(name, AttributeType::String, |a| {
        a.s = Some(v.as_bytes().to_vec())
    })
}

/// A TENSOR attribute.
pub fn attr_tensor(name: &str, t: TensorProto) -> AttributeProto {
    attr(name, AttributeType::Tensor, |a| a.t = Some(t))
}

/// Little-endian bytes of `values`.
pub fn f32_le(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A float32 tensor in `raw_data`.
pub fn f32_raw(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        raw_data: Some(f32_le(values).into()),
        ..Default::default()
    }
}

/// A float32 tensor in `float_data`.
pub fn f32_typed(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: values.to_vec(),
        ..Default::default()
    }
}

/// An int64 vector in `int64_data`.
pub fn i64_typed(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: vec![values.len() as i64],
        data_type: Some(7),
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

/// A tensor whose data is at `offset` in `location` (no `length` when `None`).
pub fn external(
    name: &str,
    data_type: i32,
    dims: &[i64],
    location: &str,
    offset: u64,
    length: Option<u64>,
) -> TensorProto {
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v),
    };
    let mut external_data = vec![
        entry("location", location.into()),
        entry("offset", offset.to_string()),
    ];
    if let Some(l) = length {
        external_data.push(entry("length", l.to_string()));
    }
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(data_type),
        data_location: Some(1),
        external_data,
        ..Default::default()
    }
}

/// A model under construction: one graph of the default domain at `opset`.
#[derive(Clone)]
pub struct Model {
    /// The default domain's opset.
    pub opset: i64,
    /// The graph.
    pub graph: GraphProto,
}

impl Model {
    /// An empty graph at `opset`.
    pub fn new(opset: i64) -> Model {
        Model {
            opset,
            graph: GraphProto {
                name: Some("test".into()),
                ..Default::default()
            },
        }
    }

    /// A float32 input of static `dims`.
    pub fn input(self, name: &str, dims: &[i64]) -> Model {
        self.input_dims(name, 1, &fixed(dims))
    }

    /// An input of element type `elem_type` with `dims` as declared.
    pub fn input_dims(mut self, name: &str, elem_type: i32, dims: &[Dim]) -> Model {
        self.graph
            .input
            .push(value_info(name, elem_type, Some(dims)));
        self
    }

    /// A float32 input with no shape.
    pub fn input_no_shape(mut self, name: &str) -> Model {
        self.graph.input.push(value_info(name, 1, None));
        self
    }

    /// A graph output.
    pub fn output(mut self, name: &str) -> Model {
        self.graph.output.push(ValueInfoProto {
            name: Some(name.into()),
            ..Default::default()
        });
        self
    }

    /// An initializer.
    pub fn init(mut self, t: TensorProto) -> Model {
        self.graph.initializer.push(t);
        self
    }

    /// A node of the default domain.
    pub fn node(
        mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> Model {
        self.graph.node.push(NodeProto {
            op_type: Some(op.into()),
            name: Some(name.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        });
        self
    }

    /// The serialized model.
    pub fn bytes(&self) -> Vec<u8> {
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(self.opset),
            }],
            graph: Some(self.graph.clone()),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// The model imported with the default options.
    pub fn import(&self) -> Result<Module, Error> {
        import(&self.bytes(), &ImportOptions::default())
    }

    /// Writes the serialized model to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.bytes()).expect("writable");
    }
}

/// The error's text; asserts that it is an ONNX error carrying diagnostic code `code`.
pub fn error_text(result: Result<Module, Error>, code: &str) -> String {
    let err = result.expect_err("import must fail");
    match &err {
        Error::Onnx(d) => assert_eq!(d.0[0].code, code, "{err}"),
        other => panic!("expected an ONNX error, got {other}"),
    }
    err.to_string()
}

/// The interpreter's outputs of the module's first function.
pub fn run(module: &Module, inputs: &[Tensor]) -> Vec<Tensor> {
    interp::run(module, &module.funcs[0], inputs).expect("interpreter")
}

/// The ops of the module's first function, in order.
pub fn ops(m: &Module) -> Vec<&Op> {
    m.funcs[0].insts.iter().map(|i| &i.op).collect()
}
