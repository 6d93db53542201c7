//! The reference interpreter: plain loops, f64 accumulation, every op and layout — the oracle.
