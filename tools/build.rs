//! The hooks (`dlsym`, `cu*`, `nvml*`) are exported by `libcgpu.so` only. The
//! tools link the interposer crate as an rlib (for its ledger and scheduler
//! code); unless the linker is told otherwise it would export the rlib's
//! `dlsym` from the executables, and every library they load would resolve
//! `dlsym` to our hook.
//!
//! A plain build asks the system linker to hide every symbol that comes from
//! an archive (`--exclude-libs ALL`). `scripts/build-dist.sh` links the tools
//! with zig's linker (for glibc 2.17), which does not take that flag; it
//! builds with `--cfg cgpu_embedded` instead, under which the interposer
//! crate defines no `dlsym` at all.
fn main() {
    if std::env::var_os("CARGO_CFG_CGPU_EMBEDDED").is_none() {
        println!("cargo:rustc-link-arg-bins=-Wl,--exclude-libs,ALL");
    }
}
