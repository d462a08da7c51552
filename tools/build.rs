//! The hooks (`dlsym`, `cu*`, `nvml*`) are exported by `libcgpu.so` only. The
//! tools link the interposer crate as an rlib (for its ledger and scheduler
//! code); without this flag the linker would export the rlib's `dlsym` from
//! the executables, and every library they load would resolve `dlsym` to our
//! hook.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--exclude-libs,ALL");
}
