//! Fuzz target `parse_tir`. The text parser and verifier: accepted text verifies and print/parse is the identity.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = smelt_fuzz::checks::check_tir(data) {
        panic!("parse_tir: {violation}");
    }
});
