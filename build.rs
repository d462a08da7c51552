//! The hooks (`dlsym`, `cu*`, `nvml*`) are exported by `libcgpu.so` only. The
//! tools (`cgpu-smi`, `cgpuctl`) link the same crate as an rlib; without this
//! flag the linker would export the rlib's `dlsym` from the executables, and
//! every library they load would resolve `dlsym` to our hook.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--exclude-libs,ALL");
}
