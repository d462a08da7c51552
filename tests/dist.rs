//! Checks of the deployable files in `dist/` (built by `scripts/build-dist.sh`,
//! which runs these with `--ignored` and then the interposer tests with
//! `dist/libcgpu.so` preloaded). Ignored in a plain `cargo test`: `dist/` is
//! built by a cross-linker that the script installs.

use std::path::PathBuf;
use std::process::Command;

/// The newest glibc symbol version the library may require.
const GLIBC_FLOOR: (u32, u32) = (2, 17);
/// The most `dist/libcgpu.so` may weigh: it is mapped into every job.
const MAX_LIBRARY_BYTES: u64 = 2 * 1024 * 1024;

fn dist(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("dist")
        .join(name);
    assert!(
        p.is_file(),
        "{} missing: run scripts/build-dist.sh",
        p.display()
    );
    p
}

fn tool(program: &str, args: &[&str], file: &std::path::Path) -> String {
    let o = Command::new(program)
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{program} (binutils): {e}"));
    assert!(o.status.success(), "{program} {}", file.display());
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every `GLIBC_x.y[.z]` version named in the file's version-needs section
/// (`readelf -V`), as (major, minor).
fn glibc_versions_needed(file: &std::path::Path) -> Vec<(String, (u32, u32))> {
    let text = tool("readelf", &["-V", "--wide"], file);
    let needs = text
        .split("Version needs section")
        .nth(1)
        .unwrap_or_else(|| panic!("{}: no version-needs section", file.display()));
    let mut out: Vec<(String, (u32, u32))> = needs
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        .map(|v| {
            let mut it = v
                .split('.')
                .map(|n| n.parse::<u32>().expect("version number"));
            let major = it.next().unwrap();
            let minor = it.next().unwrap_or(0);
            (format!("GLIBC_{v}"), (major, minor))
        })
        .collect();
    out.sort_by_key(|(_, v)| *v);
    out.dedup();
    out
}

/// The executables and the library `dist/` holds: the Kubernetes components
/// only when `scripts/build-dist.sh --cluster` built them.
fn binaries() -> Vec<String> {
    let mut v: Vec<String> = ["libcgpu.so", "cgpu-smi", "cgpuctl"]
        .map(String::from)
        .to_vec();
    for b in [
        "cgpu-scheduler-extender",
        "cgpu-device-plugin",
        "kubectl-inspect-cgpu",
    ] {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("dist")
            .join(b);
        if p.is_file() {
            v.push(b.to_string());
        }
    }
    v
}

/// The shared libraries a file needs (`DT_NEEDED`).
fn needed(file: &std::path::Path) -> Vec<String> {
    tool("readelf", &["-d", "--wide"], file)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.split(']').next()?.to_string()))
        .collect()
}

#[test]
#[ignore = "needs dist/ from scripts/build-dist.sh (which runs it)"]
fn every_file_needs_nothing_newer_than_glibc_2_17_and_nothing_but_glibc() {
    for name in binaries() {
        let f = dist(&name);
        let needed_versions = glibc_versions_needed(&f);
        assert!(
            !needed_versions.is_empty(),
            "{name}: no GLIBC versions found"
        );
        let too_new: Vec<&String> = needed_versions
            .iter()
            .filter(|(_, v)| *v > GLIBC_FLOOR)
            .map(|(n, _)| n)
            .collect();
        assert!(
            too_new.is_empty(),
            "{name} requires {too_new:?}, newer than GLIBC_{}.{}",
            GLIBC_FLOOR.0,
            GLIBC_FLOOR.1
        );
        // Only glibc's own libraries: never the driver (found at run time),
        // never libgcc_s or anything else a host or an image might lack.
        for n in needed(&f) {
            assert!(
                [
                    "libc.so.6",
                    "ld-linux-x86-64.so.2",
                    "libpthread.so.0",
                    "libdl.so.2",
                    "libm.so.6",
                    "librt.so.1",
                ]
                .contains(&n.as_str()),
                "dist/{name} needs {n}"
            );
        }
        let sections = tool("readelf", &["-S", "--wide"], &f);
        assert!(
            !sections.contains(".debug_info"),
            "dist/{name}: not stripped"
        );
        assert!(
            sections.contains(".gnu_debuglink"),
            "dist/{name}: no .gnu_debuglink"
        );
    }
}

#[test]
#[ignore = "needs dist/ from scripts/build-dist.sh (which runs it)"]
fn the_library_is_small_stripped_and_points_at_its_debug_info() {
    let lib = dist("libcgpu.so");
    let size = std::fs::metadata(&lib).unwrap().len();
    assert!(
        size <= MAX_LIBRARY_BYTES,
        "dist/libcgpu.so is {size} bytes, more than {MAX_LIBRARY_BYTES}"
    );
    let sections = tool("readelf", &["-S", "--wide"], &lib);
    assert!(!sections.contains(".debug_info"), "not stripped");
    assert!(sections.contains(".gnu_debuglink"), "no .gnu_debuglink");
    let debug = dist("debug/libcgpu.so.debug");
    let dsections = tool("readelf", &["-S", "--wide"], &debug);
    assert!(
        dsections.contains(".debug_info"),
        "debug file without DWARF"
    );
    // The hooks are exported by the library, and by nothing else in dist/.
    let dynsym = tool("nm", &["-D", "--defined-only"], &lib);
    for sym in [
        "cuMemAlloc_v2",
        "cuGetProcAddress_v2",
        "dlsym",
        "nvmlDeviceGetMemoryInfo",
    ] {
        assert!(
            dynsym
                .lines()
                .any(|l| l.split_whitespace().last() == Some(sym)),
            "dist/libcgpu.so does not export {sym}"
        );
    }
    for exe in binaries().iter().filter(|b| *b != "libcgpu.so") {
        let syms = tool("nm", &["-D", "--defined-only"], &dist(exe));
        let leaked: Vec<&str> = syms
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .filter(|n| *n == "dlsym" || n.starts_with("cu") || n.starts_with("nvml"))
            .collect();
        assert!(leaked.is_empty(), "dist/{exe} exports {leaked:?}");
    }
}
