fn main() {
    // Bind the library's references to its own symbols at link time, as the
    // real libcuda does: our internal calls and the pointers cuGetProcAddress
    // hands out can then not be interposed by an LD_PRELOADed library.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    // Never unloaded (executor threads run its code), like the real driver.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
