//! Lowering: each op of a function to a kernel in the loop-nest IR.
