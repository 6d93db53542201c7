//! The loop-nest IR: kernels as loops over vector loads, stores, FMAs and epilogues.
