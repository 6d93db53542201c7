//! Code generation: loop-nest IR to Cranelift IR to native code.
