//! Build script: compiles `proto/onnx.proto` into Rust types (prost) with protox, so no
//! `protoc` binary is needed. Only with the `onnx` feature.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "onnx")]
    compile_onnx_proto();
}

/// Generates `onnx.rs` in `OUT_DIR`; `TensorProto.raw_data` becomes `bytes::Bytes`, so
/// decoding from a `Bytes` buffer slices weights instead of copying them.
#[cfg(feature = "onnx")]
fn compile_onnx_proto() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let descriptors = match protox::compile(["onnx.proto"], ["proto"]) {
        Ok(d) => d,
        Err(e) => panic!("proto/onnx.proto does not compile: {e}"),
    };
    let mut config = prost_build::Config::new();
    config.bytes([".onnx.TensorProto.raw_data"]);
    if let Err(e) = config.compile_fds(descriptors) {
        panic!("prost-build failed on proto/onnx.proto: {e}");
    }
}
