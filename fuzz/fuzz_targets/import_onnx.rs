//! Fuzz target `import_onnx`. The ONNX importer: imported modules verify, print and parse back, and optimize.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = smelt_fuzz::checks::check_onnx(data) {
        panic!("import_onnx: {violation}");
    }
});
