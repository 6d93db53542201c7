//! Reading and writing NumPy `.npy` files (little-endian, C order) for CLI tensors, in
//! each tensor's own element type: `<f4`, `<i8`, `<i4`, `<i2`, `<u2`, `|i1`, `|u1`,
//! `|b1` (bool), `<f2` (float16)
//! and `<V2` for bfloat16 — what numpy writes for an `ml_dtypes.bfloat16` array, which
//! has no type code of its own (read it back with `.view(ml_dtypes.bfloat16)`).

use smelt_ir::{DType, Tensor, TensorData};

const MAGIC: &[u8] = b"\x93NUMPY";

/// The `.npy` type descriptor of an element type.
fn descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::Bool => "|b1",
        DType::F16 => "<f2",
        DType::BF16 => "<V2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::I16 => "<i2",
        DType::U16 => "<u2",
    }
}

/// Encodes a tensor's logical elements as a version 1.0 `.npy` file of its element type
/// (C order).
pub fn encode(t: &Tensor) -> Vec<u8> {
    let shape = match t.dims() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype())
    );
    // Pad so the data starts at a multiple of 64 bytes, ending the header with '\n'.
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let data = t.to_row_major().to_le_bytes();
    let mut out = Vec::with_capacity(64 + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    out
}

/// Decodes a `.npy` file in C order into a tensor of its element type: `<f4` (and `<f8`,
/// narrowed to f32, an error where a finite value overflows it), `<i8`, `<i4`, `<i2`,
/// `<u2`, `|i1`, `|u1`, `|b1`,
/// `<f2` (float16) and 2-byte void (`<V2`, `|V2`), the bfloat16 of `ml_dtypes`.
/// Integers are never converted to floats or back: a tensor of the wrong type is the
/// caller's error to report. Errors say what is wrong with the file.
pub fn decode(bytes: &[u8]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (missing the \\x93NUMPY magic)".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes
        .get(start..start + header_len)
        .ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text")?;
    let descr = dict_value(header, "descr").ok_or("the .npy header has no 'descr'")?;
    let fortran =
        dict_value(header, "fortran_order").ok_or("the .npy header has no 'fortran_order'")?;
    let shape = dict_value(header, "shape").ok_or("the .npy header has no 'shape'")?;
    if fortran.trim() != "False" {
        return Err("Fortran-order .npy arrays are not supported; save with C order".into());
    }
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    let dims = parse_shape(shape)?;
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("the .npy shape overflows")?;
    let data = &bytes[start + header_len..];
    let (dtype, width) = match descr {
        "<f4" => (DType::F32, 4),
        "<f8" => (DType::F32, 8),
        "<i8" => (DType::I64, 8),
        "<i4" => (DType::I32, 4),
        "|b1" => (DType::Bool, 1),
        "<f2" => (DType::F16, 2),
        // numpy has no code for ml_dtypes' bfloat16 and saves it as 2-byte void
        "<V2" | "|V2" => (DType::BF16, 2),
        "|i1" => (DType::I8, 1),
        "|u1" => (DType::U8, 1),
        "<i2" => (DType::I16, 2),
        "<u2" => (DType::U16, 2),
        other => {
            return Err(format!(
                "unsupported .npy dtype '{other}' (smelt reads float32, float64, float16, \
                 bfloat16 (saved by ml_dtypes as '<V2'), int64, int32, int16, uint16, int8, \
                 uint8 and bool)"
            ))
        }
    };
    if Some(data.len()) != count.checked_mul(width) {
        return Err(format!(
            "the .npy data has {} bytes, shape {dims:?} of '{descr}' needs {}",
            data.len(),
            count.saturating_mul(width)
        ));
    }
    let values = if descr == "<f8" {
        let mut narrowed = Vec::with_capacity(count);
        for (k, c) in data.chunks_exact(8).enumerate() {
            let v = f64::from_le_bytes(c.try_into().expect("chunks of 8"));
            let f = v as f32;
            if v.is_finite() && !f.is_finite() {
                return Err(format!(
                    "element {k} of the float64 .npy ({v:e}) overflows float32"
                ));
            }
            narrowed.push(f);
        }
        TensorData::F32(narrowed)
    } else {
        TensorData::from_le_bytes(dtype, data).ok_or("a bool .npy element is neither 0 nor 1")?
    };
    Tensor::typed(dims, values)
}

/// The text after `'key':` in a Python dict literal, up to the next top-level comma.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[at + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    None
}

fn parse_shape(s: &str) -> Result<Vec<usize>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("bad .npy shape '{s}'"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format!("bad .npy dimension '{p}'"))
        })
        .collect()
}

/// A file name for a result called `name`: every byte outside `[A-Za-z0-9._-]` is
/// percent-encoded, so names like `/layer1/Relu_output_0` cannot leave the output folder
/// (`.` and `..` alone are encoded too).
pub fn file_name_for(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() || out.bytes().all(|b| b == b'.') {
        out = out.replace('.', "%2E");
    }
    format!("{out}.npy")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_shape_and_values() {
        let t = Tensor::new([2, 3], vec![1.0, -2.5, 3.0, 0.0, 1e-7, f32::MAX]).unwrap();
        let bytes = encode(&t);
        assert_eq!((bytes.len() - t.data.len() * 4) % 64, 0);
        assert_eq!(decode(&bytes).unwrap(), t);
        let s = Tensor::new([], vec![4.0]).unwrap();
        assert_eq!(decode(&encode(&s)).unwrap(), s);
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(decode(b"hello").is_err());
        let mut bytes = encode(&Tensor::new([4], vec![0.0; 4]).unwrap());
        bytes.truncate(bytes.len() - 1);
        assert!(decode(&bytes).unwrap_err().contains("needs"));
    }

    #[test]
    fn result_names_cannot_escape_the_folder() {
        assert_eq!(
            file_name_for("/layer1/Relu_output_0"),
            "%2Flayer1%2FRelu_output_0.npy"
        );
        assert_eq!(file_name_for(".."), "%2E%2E.npy");
        assert_eq!(file_name_for("y"), "y.npy");
        assert!(!file_name_for("../../etc/passwd").contains('/'));
    }
}
