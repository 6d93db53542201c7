//! ONNX external data: tensors whose bytes live in a side file (`data_location =
//! EXTERNAL`, with `location`, `offset` and `length` entries in `external_data`), read
//! before import into their own aligned buffers, which then become the weights as they
//! are (one read, no copy).
//!
//! A model is untrusted input, so every read is confined and bounded:
//!
//! - the location resolves (after `..` and symlinks) inside the model's folder, or inside
//!   the allowed root the caller named ([`super::ImportOptions::allowed_root`]); an
//!   absolute path, a `..` that climbs out or a symlink that leads out is refused before
//!   anything outside is examined ([`smelt_ir::files::Confinement`], shared with the text
//!   form's sidecars), so the error never tells whether a file outside exists;
//! - the file is a regular file (checked on the opened handle, which was opened without
//!   blocking and without following a symlink swapped in after the check, so a FIFO or a
//!   device such as `/dev/zero` is refused, never read: [`smelt_ir::files::open_regular`]);
//! - `offset + length` lies inside the file, `length` (when given) is exactly the
//!   tensor's size from its dims and data type, and exactly that many bytes are read.
//!
//! A model given as bytes has no folder: its external tensors are refused with an error
//! that says to import the file instead.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use smelt_ir::files::{open_regular, Confinement};
use smelt_ir::types::MAX_TENSOR_BYTES;
use smelt_ir::{AlignedBuf, Diagnostic};

use super::context::{node_display_name, plain_error};
use super::proto::{ModelProto, TensorProto};
use super::tensor::dtype;
use crate::Interface;

/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;

/// Whether the tensor's data is stored outside the model.
pub fn is_external(t: &TensorProto) -> bool {
    t.data_location == Some(EXTERNAL) || !t.external_data.is_empty()
}

/// Reads the data of every external tensor the importer uses — initializers and the
/// tensor attributes of the graph's nodes (`Constant`'s `value`...) — into `raw_data`.
/// `folder` is the folder of the model file (`None` for a model given as bytes, whose
/// external tensors are errors); `allowed_root` is one more folder the caller allows. The data of a float32 initializer is also stored in
/// `windows` under its index, so it becomes the module weight without a copy.
pub fn resolve(
    model: &mut ModelProto,
    folder: Option<&Path>,
    windows: &mut HashMap<usize, AlignedBuf>,
    interface: Interface,
    allowed_root: Option<&Path>,
) -> Result<(), Diagnostic> {
    let Some(graph) = model.graph.as_mut() else {
        return Ok(());
    };
    let any = graph.initializer.iter().any(is_external)
        || graph
            .node
            .iter()
            .flat_map(|n| &n.attribute)
            .flat_map(|a| a.t.iter().chain(&a.tensors))
            .any(is_external);
    if !any {
        return Ok(());
    }
    let mut reader = match folder {
        Some(folder) => Reader::new(folder, allowed_root)?,
        None => {
            let (what, t) = graph
                .initializer
                .iter()
                .filter(|t| is_external(t))
                .map(|t| (format!("initializer '{}'", t.name()), t))
                .chain(graph.node.iter().flat_map(|n| {
                    n.attribute.iter().flat_map(move |a| {
                        a.t.iter()
                            .chain(&a.tensors)
                            .filter(|t| is_external(t))
                            .map(move |t| (attribute_what(n, a.name()), t))
                    })
                }))
                .next()
                .ok_or_else(|| plain_error("onnx-external-data", "no external tensor"))?;
            let instead = match interface {
                Interface::Rust => {
                    "import the file with smelt::onnx::import_file or smelt::load_model"
                }
                Interface::C => "compile the file with smelt_executable_from_file",
                Interface::Cli => "give the model's file",
            };
            return Err(plain_error(
                "onnx-external-data",
                format!(
                    "{what} stores its data in the external file '{}', but the model was given \
                     as bytes, with no folder to find that file in; {instead}",
                    location_of(t).unwrap_or("?")
                ),
            ));
        }
    };
    let little_endian = cfg!(target_endian = "little");
    for (i, t) in graph.initializer.iter_mut().enumerate() {
        if is_external(t) {
            let what = format!("initializer '{}'", t.name());
            let buf = reader.read(t, &what)?;
            if little_endian && t.data_type() == dtype::FLOAT {
                windows.insert(i, buf);
            }
        }
    }
    for n in &mut graph.node {
        let (op, node) = (n.op_type().to_string(), node_display_name(n));
        for a in &mut n.attribute {
            let what = format!("attribute '{}' of {op} node '{node}'", a.name());
            for t in a.t.iter_mut().chain(&mut a.tensors) {
                if is_external(t) {
                    reader.read(t, &what)?;
                }
            }
        }
    }
    Ok(())
}

fn attribute_what(node: &super::proto::NodeProto, attr: &str) -> String {
    format!(
        "attribute '{attr}' of {} node '{}'",
        node.op_type(),
        node_display_name(node)
    )
}

/// The `location` entry of a tensor's `external_data`, if any.
fn location_of(t: &TensorProto) -> Option<&str> {
    t.external_data
        .iter()
        .find(|e| e.key() == "location")
        .map(|e| e.value())
}

/// Reads external data from files inside one folder (or an allowed root).
struct Reader {
    /// Where locations may resolve.
    confinement: Confinement,
    /// Files opened so far, by canonical path, with their length.
    files: HashMap<PathBuf, (File, u64)>,
}

/// Where a tensor's bytes are, from its `external_data` entries.
struct Entries<'t> {
    location: &'t str,
    offset: u64,
    length: Option<u64>,
}

impl Reader {
    fn new(folder: &Path, allowed_root: Option<&Path>) -> Result<Reader, Diagnostic> {
        let confinement = Confinement::new(folder, allowed_root).map_err(|m| {
            plain_error(
                "onnx-external-data",
                format!("external data cannot be read: {m}"),
            )
        })?;
        Ok(Reader {
            confinement,
            files: HashMap::new(),
        })
    }

    /// Reads tensor `t`'s external bytes into a new aligned buffer, stores them as its
    /// `raw_data` (clearing the external fields) and returns the buffer. `what` names
    /// the tensor in errors.
    fn read(&mut self, t: &mut TensorProto, what: &str) -> Result<AlignedBuf, Diagnostic> {
        let fail = |m: String| plain_error("onnx-external-data", format!("{what}: {m}"));
        let entries = entries(t).map_err(fail)?;
        let size = tensor_bytes(t).map_err(fail)?;
        if t.raw_data.as_ref().is_some_and(|r| !r.is_empty()) {
            return Err(fail(
                "has both raw_data and external data; a tensor stores its data in one place".into(),
            ));
        }
        let shown = entries.location;
        let path = self
            .confinement
            .resolve(entries.location)
            .map_err(|m| fail(format!("external data location {m}")))?;
        if let Some(length) = entries.length {
            if length != size {
                return Err(fail(format!(
                    "external data in '{shown}' has length {length}, but the tensor's dims and \
                     type make {size} bytes"
                )));
            }
        }
        if !self.files.contains_key(&path) {
            let opened = open_regular(&path, false)
                .map_err(|m| fail(format!("external data file '{shown}' {m}")))?;
            self.files.insert(path.clone(), opened);
        }
        let (file, file_len) = self
            .files
            .get_mut(&path)
            .ok_or_else(|| fail(format!("external data file '{shown}' was not opened")))?;
        let end = entries.offset.checked_add(size);
        if end.is_none_or(|end| end > *file_len) {
            return Err(fail(format!(
                "external data at offset {} with length {size} runs past the end of '{shown}' \
                 ({file_len} bytes)",
                entries.offset
            )));
        }
        let len = usize::try_from(size).map_err(|_| fail(format!("{size} bytes is too large")))?;
        let mut buf = AlignedBuf::zeroed(len);
        if let Some(dst) = buf.as_bytes_mut() {
            file.seek(SeekFrom::Start(entries.offset))
                .and_then(|_| file.read_exact(dst))
                .map_err(|e| fail(format!("reading external data from '{shown}': {e}")))?;
        }
        t.raw_data = Some(Bytes::from_owner(buf.clone()));
        t.data_location = None;
        t.external_data.clear();
        Ok(buf)
    }
}

/// The `location`, `offset` and `length` entries (`checksum` is accepted unchecked;
/// other keys and repeated keys are errors, so nothing is ignored silently).
fn entries(t: &TensorProto) -> Result<Entries<'_>, String> {
    let (mut location, mut offset, mut length) = (None, None, None);
    for e in &t.external_data {
        let number = |v: &str| {
            v.trim().parse::<u64>().map_err(|_| {
                format!(
                    "external data {} '{v}' is not a non-negative integer",
                    e.key()
                )
            })
        };
        let repeated = match e.key() {
            "location" => location.replace(e.value()).is_some(),
            "offset" => offset.replace(number(e.value())?).is_some(),
            "length" => length.replace(number(e.value())?).is_some(),
            "checksum" => false,
            other => return Err(format!("external data has an unknown key '{other}'")),
        };
        if repeated {
            return Err(format!("external data gives '{}' twice", e.key()));
        }
    }
    let location = location.ok_or("is stored as external data but gives no location")?;
    Ok(Entries {
        location,
        offset: offset.unwrap_or(0),
        length,
    })
}

/// The tensor's size in bytes from its dims and data type (at most the tensor limit).
fn tensor_bytes(t: &TensorProto) -> Result<u64, String> {
    let elem = element_bytes(t.data_type()).ok_or_else(|| {
        format!(
            "external data of element type {} is not supported",
            dtype::name(t.data_type())
        )
    })?;
    let mut n = elem;
    for &d in &t.dims {
        let d = u64::try_from(d).map_err(|_| format!("dimension {d} is negative"))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| format!("shape {:?} is too large", t.dims))?;
    }
    if n > MAX_TENSOR_BYTES {
        return Err(format!(
            "shape {:?} needs {n} bytes, more than smelt's tensor limit of {MAX_TENSOR_BYTES}",
            t.dims
        ));
    }
    Ok(n)
}

/// Bytes per element of the ONNX data types stored a whole number of bytes each.
fn element_bytes(code: i32) -> Option<u64> {
    Some(match code {
        2 | 3 | 9 | 17..=20 => 1, // uint8, int8, bool, float8 variants
        4 | 5 | 10 | 16 => 2,     // uint16, int16, float16, bfloat16
        1 | 6 | 12 => 4,          // float32, int32, uint32
        7 | 11 | 13 | 14 => 8,    // int64, float64, uint64, complex64
        15 => 16,                 // complex128
        _ => return None,         // undefined, string, 4-bit types
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_come_from_dims_and_type() {
        let t = TensorProto {
            dims: vec![2, 3],
            data_type: Some(dtype::INT64),
            ..TensorProto::default()
        };
        assert_eq!(tensor_bytes(&t), Ok(48));
        let huge = TensorProto {
            dims: vec![1 << 40, 1 << 40],
            data_type: Some(dtype::FLOAT),
            ..TensorProto::default()
        };
        assert!(tensor_bytes(&huge).is_err());
        let string = TensorProto {
            dims: vec![1],
            data_type: Some(8),
            ..TensorProto::default()
        };
        assert!(tensor_bytes(&string).is_err());
    }
}
