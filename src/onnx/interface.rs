//! A model's declared graph inputs and outputs, read without reading its weights: a walk
//! over the protobuf fields of the file that seeks past everything else.
//!
//! A `DynamicExecutable` learns its inputs before compiling anything; decoding the whole
//! `ModelProto` for that read (and faulted in) every byte of the weights: 220 ms for
//! ResNet-50's 100 MB, more than a bucket's compile. This walk reads the few kilobytes of
//! the `ModelProto.graph` fields it needs — each initializer's `name`, each `input` and
//! `output` `ValueInfoProto` — and seeks over the rest, whatever their order in the file.

use std::fs::File;
use std::io::{BufReader, Read};

use prost::Message;

use super::proto::ValueInfoProto;

/// Field numbers (onnx.proto3).
const MODEL_GRAPH: u32 = 7;
const GRAPH_INITIALIZER: u32 = 5;
const GRAPH_INPUT: u32 = 11;
const GRAPH_OUTPUT: u32 = 12;
const TENSOR_NAME: u32 = 8;

/// The largest `ValueInfoProto` or name read: far above any real one (a few hundred
/// bytes), low enough that a corrupt length cannot make the walk allocate much.
const MAX_FIELD_BYTES: u64 = 1 << 20;

/// What the graph declares, in file order.
pub struct GraphInterface {
    /// Every initializer's name (old exporters list initializers as inputs too).
    pub initializer_names: Vec<String>,
    /// The graph inputs.
    pub inputs: Vec<ValueInfoProto>,
    /// The graph outputs.
    pub outputs: Vec<ValueInfoProto>,
}

/// How a protobuf field is encoded.
enum Wire {
    Varint,
    Fixed64,
    Len(u64),
    Fixed32,
}

/// A reader over one file with the file's length, so every length is checked against
/// what is left before it is followed.
struct Walker {
    r: BufReader<File>,
    pos: u64,
}

impl Walker {
    fn byte(&mut self) -> Result<u8, String> {
        let mut b = [0u8];
        self.r
            .read_exact(&mut b)
            .map_err(|e| format!("truncated at byte {}: {e}", self.pos))?;
        self.pos += 1;
        Ok(b[0])
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!(
            "a varint longer than 10 bytes at byte {}",
            self.pos
        ))
    }

    /// The next field's number and encoding, or `None` at `end`.
    fn field(&mut self, end: u64) -> Result<Option<(u32, Wire)>, String> {
        if self.pos >= end {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| "a field number overflows")?;
        let wire = match key & 7 {
            0 => Wire::Varint,
            1 => Wire::Fixed64,
            2 => {
                let len = self.varint()?;
                if len > end.saturating_sub(self.pos) {
                    return Err(format!(
                        "field {number} at byte {} claims {len} bytes past its message",
                        self.pos
                    ));
                }
                Wire::Len(len)
            }
            5 => Wire::Fixed32,
            w => return Err(format!("wire type {w} at byte {}", self.pos)),
        };
        Ok(Some((number, wire)))
    }

    fn skip(&mut self, wire: Wire) -> Result<(), String> {
        match wire {
            Wire::Varint => self.varint().map(drop),
            Wire::Fixed64 => self.seek_by(8),
            Wire::Fixed32 => self.seek_by(4),
            Wire::Len(n) => self.seek_by(n),
        }
    }

    fn seek_by(&mut self, n: u64) -> Result<(), String> {
        let by = i64::try_from(n).map_err(|_| "a field too long to skip")?;
        // within the buffer this moves in it; past it, one seek of the file
        self.r
            .seek_relative(by)
            .map_err(|e| format!("cannot seek past byte {}: {e}", self.pos))?;
        self.pos += n;
        Ok(())
    }

    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, String> {
        if n > MAX_FIELD_BYTES {
            return Err(format!(
                "a {n}-byte field at byte {} where a name or value info is expected",
                self.pos
            ));
        }
        let mut buf = vec![0u8; n as usize];
        self.r
            .read_exact(&mut buf)
            .map_err(|e| format!("truncated at byte {}: {e}", self.pos))?;
        self.pos += n;
        Ok(buf)
    }
}

/// Reads the graph interface of the ONNX model in `file` (`len` bytes).
pub fn read(file: File, len: u64) -> Result<GraphInterface, String> {
    let mut w = Walker {
        r: BufReader::with_capacity(64 * 1024, file),
        pos: 0,
    };
    let mut graph = None;
    while let Some((number, wire)) = w.field(len)? {
        match (number, wire) {
            (MODEL_GRAPH, Wire::Len(n)) => {
                let end = w.pos + n;
                graph = Some(read_graph(&mut w, end)?);
            }
            (_, wire) => w.skip(wire)?,
        }
    }
    graph.ok_or_else(|| "the model has no graph".to_string())
}

fn read_graph(w: &mut Walker, end: u64) -> Result<GraphInterface, String> {
    let mut g = GraphInterface {
        initializer_names: Vec::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
    };
    while let Some((number, wire)) = w.field(end)? {
        match (number, wire) {
            (GRAPH_INITIALIZER, Wire::Len(n)) => {
                let tensor_end = w.pos + n;
                let mut name = String::new();
                while let Some((field, wire)) = w.field(tensor_end)? {
                    match (field, wire) {
                        (TENSOR_NAME, Wire::Len(k)) => {
                            name = String::from_utf8(w.bytes(k)?)
                                .map_err(|_| "an initializer name is not UTF-8")?;
                        }
                        (_, wire) => w.skip(wire)?,
                    }
                }
                g.initializer_names.push(name);
            }
            (GRAPH_INPUT | GRAPH_OUTPUT, Wire::Len(n)) => {
                let info = ValueInfoProto::decode(&w.bytes(n)?[..])
                    .map_err(|e| format!("a graph input or output: {e}"))?;
                match number {
                    GRAPH_INPUT => g.inputs.push(info),
                    _ => g.outputs.push(info),
                }
            }
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::proto::{
        tensor_shape_proto::{dimension, Dimension},
        type_proto, GraphProto, ModelProto, TensorProto, TensorShapeProto, TypeProto,
    };

    fn info(name: &str) -> ValueInfoProto {
        let dim = |v| Dimension {
            value: Some(v),
            ..Default::default()
        };
        ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(1),
                    shape: Some(TensorShapeProto {
                        dim: vec![
                            dim(dimension::Value::DimParam("N".into())),
                            dim(dimension::Value::DimValue(3)),
                        ],
                    }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A model whose weight `w` (4 KiB of data) is listed as an input too, as old
    /// exporters write.
    fn model_bytes() -> Vec<u8> {
        ModelProto {
            ir_version: Some(8),
            graph: Some(GraphProto {
                initializer: vec![TensorProto {
                    name: Some("w".into()),
                    dims: vec![1024],
                    data_type: Some(1),
                    raw_data: Some(vec![7u8; 4096].into()),
                    ..Default::default()
                }],
                input: vec![info("w"), info("x")],
                output: vec![info("y")],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn read_bytes(bytes: &[u8]) -> Result<GraphInterface, String> {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        std::io::Seek::rewind(&mut f).unwrap();
        read(f, bytes.len() as u64)
    }

    #[test]
    fn reads_names_inputs_and_outputs_past_the_weights() {
        let g = read_bytes(&model_bytes()).unwrap();
        assert_eq!(g.initializer_names, ["w"]);
        let names: Vec<&str> = g.inputs.iter().map(|i| i.name()).collect();
        assert_eq!(names, ["w", "x"]);
        assert_eq!(g.outputs.len(), 1);
        assert_eq!(g.inputs[1], info("x"));
    }

    #[test]
    fn truncated_or_corrupt_files_are_errors_not_panics() {
        let bytes = model_bytes();
        for cut in 0..bytes.len() {
            // a cut inside a field is an error; at a field boundary fewer fields are read
            let _ = read_bytes(&bytes[..cut]);
        }
        assert!(read_bytes(&bytes[..bytes.len() - 3]).is_err());
        // field 7 (the graph) claiming a terabyte
        let mut huge = vec![(7 << 3) | 2];
        huge.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x20]);
        let err = read_bytes(&huge).err().unwrap();
        assert!(err.contains("claims"), "{err}");
        assert_eq!(
            read_bytes(&[0x08, 0x08]).err().as_deref(),
            Some("the model has no graph")
        );
    }
}
