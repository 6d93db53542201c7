//! Fuzz target `differential`. Random valid graphs: fusion and the JIT agree with the interpreter within 1e-4.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = smelt_fuzz::checks::check_differential(data) {
        panic!("differential: {violation}");
    }
});
