//! The real driver's function table: for every function of the declaration
//! list (`src/api.rs`), its C signature (`sig::<name>`) and the real function
//! (`real::<name>`), resolved lazily on the real driver's handle (never on
//! `RTLD_DEFAULT`, which would find our own export). The hooks and the
//! scheduler call the driver through it.

macro_rules! declare_table {
    (
        hooks { $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $hook:path ; )* }
        real { $( fn $rname:ident ( $($rarg:ident : $rty:ty),* $(,)? ) -> $rret:ty ; )* }
    ) => {
        /// C signatures of the declared functions.
        #[allow(non_camel_case_types)]
        pub mod sig {
            use crate::process::types::*;
            $( pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*
            $( pub type $rname = unsafe extern "C" fn($($rty),*) -> $rret; )*
        }

        /// The real driver functions, resolved on the driver's handle.
        #[allow(non_upper_case_globals)]
        pub mod real {
            use crate::process::driver::RealFn;
            // SAFETY (each `RealFn::new`): the type is the C signature the
            // declaration list gives for this name, which
            // `tests/entry_paths.rs` (`the_declaration_list_matches_cuda_h`)
            // compiles against the real cuda.h/nvml.h.
            $( pub static $name: RealFn<super::sig::$name> = unsafe { RealFn::new(
                match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!(),
                }) }; )*
            $( pub static $rname: RealFn<super::sig::$rname> = unsafe { RealFn::new(
                match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($rname), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!(),
                }) }; )*
        }


        /// Every declared function as written in the list: name, return type
        /// and argument types (Rust spelling). `tests/entry_paths.rs` turns
        /// them into C declarations and compiles them against the real
        /// headers, so a signature that differs from `cuda.h`/`nvml.h` fails.
        pub const SIGNATURES: &[(&str, &str, &[&str])] = &[
            $( (stringify!($name), stringify!($ret), &[ $( stringify!($ty) ),* ]), )*
            $( (stringify!($rname), stringify!($rret), &[ $( stringify!($rty) ),* ]), )*
        ];

    };
}

crate::api::for_each_api!(declare_table);
