//! ONNX import: protobuf decoding and mapping of ONNX operators to smelt ops.
