//! Fuzz target `load_rules`. The rule-file loader: loaded rules run in the fusion pass without panics or cycles.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(violation) = smelt_fuzz::checks::check_rules(data) {
        panic!("load_rules: {violation}");
    }
});
