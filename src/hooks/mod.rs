//! Everything the interposer exports: the hooks translate C calls into the
//! layer below them (`crate::process`, `crate::memory`, `crate::scheduler`).
//!
//! The declaration list (`src/api.rs`) generates, for every hooked driver
//! function:
//! - the exported `extern "C"` symbol (programs linked with `-lcuda`/`-lnvidia-ml`);
//! - its entry in the table our `dlsym` override consults ([`hook_by_name`]);
//! - its entry in the table `cuGetProcAddress(_v2)` uses to map the real
//!   pointer the driver returned back to the variant it is ([`hook_by_real`]).
//!
//! The real functions (`real::<name>`) and their signatures (`sig::<name>`)
//! are the layer's (`crate::process::table`), re-exported here for the hook
//! bodies.

pub mod context;
pub mod device;
pub mod dlsym;
pub mod graph;
pub mod launch;
pub mod memory;
pub mod module;
pub mod nvml;
pub mod procaddr;
pub mod stream;
pub mod types;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use types::*;

pub use crate::process::table::{real, sig, SIGNATURES};

/// Run a hook body; a panic becomes `CUDA_ERROR_UNKNOWN` / `NVML_ERROR_UNKNOWN`
/// (both 999) instead of unwinding into C.
#[inline(always)]
pub fn guard(f: impl FnOnce() -> u32) -> u32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

pub(crate) use crate::process::call_real;

macro_rules! declare_hooks {
    (
        hooks { $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $hook:path ; )* }
        real { $( fn $rname:ident ( $($rarg:ident : $rty:ty),* $(,)? ) -> $rret:ty ; )* }
    ) => {
        /// The exported hooks.
        pub mod exports {
            #[allow(unused_imports)]
            use super::types::*;
            #[allow(unused_imports)]
            use super::{context, device, graph, launch, memory, module, nvml, procaddr, stream};
            use crate::process::table::real;
            $(
                /// Exported hook (see the declaration list in `src/api.rs`).
                ///
                /// # Safety
                /// The C contract of the driver function of the same name.
                #[unsafe(no_mangle)]
                #[allow(non_snake_case, clippy::too_many_arguments)]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                    // SAFETY: forwarded with the caller's arguments; the hook
                    // upholds the same contract as the driver function.
                    super::guard(|| unsafe { $hook(&real::$name, $($arg),*) })
                }
            )*
        }

        /// Names of all hooked functions (tests, docs).
        pub const HOOKED: &[&str] = &[ $( stringify!($name) ),* ];

        /// Our hook for a hooked function `name`, with its real symbol.
        pub fn hook_by_name(name: &[u8]) -> Option<(*mut c_void, &'static crate::process::driver::RealSym)> {
            $(
                if name == stringify!($name).as_bytes() {
                    return Some((exports::$name as *const () as *mut c_void, crate::process::table::real::$name.sym()));
                }
            )*
            None
        }

        /// Our hook for the variant whose real address is `p` (what the driver's
        /// `cuGetProcAddress` returned), identified by address, never by version.
        pub fn hook_by_real(p: usize) -> Option<(*mut c_void, &'static str)> {
            if p == 0 {
                return None;
            }
            $(
                if crate::process::table::real::$name.sym().lib() == crate::process::driver::Lib::Cuda && crate::process::table::real::$name.sym().addr() == p {
                    return Some((exports::$name as *const () as *mut c_void, stringify!($name)));
                }
            )*
            None
        }
    };
}

crate::api::for_each_api!(declare_hooks);
