//! JIT code memory: the executable pages of compiled kernels, their entry points as
//! [`KernelFn`]s, and their release.
//!
//! The invariant that makes it sound: an entry point handed out is the finalized
//! address of a function declared here ([`declare_kernel`], the only way to get a
//! [`KernelId`]) with `kernel_signature` — a pointer and two `i64` arguments, no result,
//! the platform's C calling convention — and defined with code compiled from a function
//! of that signature (`build_function` makes no other); so it is a [`KernelFn`]. The
//! pages — the code, and the read-only call records it passes to the routines — stay
//! mapped while the [`CompiledKernels`] that owns the module lives, and the entry points
//! live in it too: dropping it frees the pages (`free_memory`, without
//! which a dropped `JITModule` leaks them) only when no entry point can be used again.

#![allow(unsafe_code)]

use cranelift_codegen::isa::TargetIsa;
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Linkage, Module as _};

use super::{kernel_signature, KernelFn};
use crate::Error;

/// A kernel function declared with `kernel_signature` in a JIT module.
pub(super) struct KernelId(FuncId);

impl KernelId {
    /// The module's id of the function, for defining its code.
    pub(super) fn func_id(&self) -> FuncId {
        self.0
    }
}

/// Declares a local function `name` with the kernel signature.
pub(super) fn declare_kernel(
    module: &mut JITModule,
    name: &str,
    isa: &dyn TargetIsa,
) -> Result<KernelId, String> {
    module
        .declare_function(name, Linkage::Local, &kernel_signature(isa))
        .map(KernelId)
        .map_err(|e| e.to_string())
}

/// Native code of a set of kernels. Dropping it frees the code pages.
pub struct CompiledKernels {
    /// Kept only to free its memory on drop; never used after compilation. The mutex
    /// makes the owner `Sync` honestly (a `JITModule` is `Send` but not `Sync`).
    module: std::sync::Mutex<Option<JITModule>>,
    fns: Vec<KernelFn>,
}

impl CompiledKernels {
    /// The entry point of kernel `i`.
    pub fn get(&self, i: usize) -> Option<KernelFn> {
        self.fns.get(i).copied()
    }

    /// Number of kernels.
    pub fn len(&self) -> usize {
        self.fns.len()
    }

    /// Whether there are no kernels.
    pub fn is_empty(&self) -> bool {
        self.fns.is_empty()
    }
}

impl Drop for CompiledKernels {
    fn drop(&mut self) {
        let module = match self.module.get_mut() {
            Ok(m) => m.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(m) = module {
            // SAFETY: the function pointers into this module's code live in `self.fns`,
            // which is dropped together with `self`; nothing else holds them (the
            // Executable owning `self` hands out no copies that outlive it).
            unsafe { m.free_memory() };
        }
    }
}

impl std::fmt::Debug for CompiledKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompiledKernels({} functions)", self.fns.len())
    }
}

impl CompiledKernels {
    /// Finalizes `module`, whose kernels `ids` have all been defined, and takes
    /// ownership of its code.
    pub(super) fn finalize(
        mut module: JITModule,
        ids: &[KernelId],
    ) -> Result<CompiledKernels, Error> {
        module
            .finalize_definitions()
            .map_err(|e| Error::Unsupported(format!("finalizing JIT code: {e}")))?;
        let fns = ids
            .iter()
            .map(|id| {
                let p = module.get_finalized_function(id.0);
                // SAFETY: `p` is the entry of a function declared with `kernel_signature`
                // by `declare_kernel` and defined with code of that signature (the module
                // doc), which is `KernelFn`.
                unsafe { std::mem::transmute::<*const u8, KernelFn>(p) }
            })
            .collect();
        Ok(CompiledKernels {
            module: std::sync::Mutex::new(Some(module)),
            fns,
        })
    }

    /// Every entry point, in kernel order.
    pub(super) fn entries(&self) -> &[KernelFn] {
        &self.fns
    }
}
