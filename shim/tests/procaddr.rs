//! The cuGetProcAddress table: every entry agrees with the real
//! cudaTypedefs.h, and the library's own cuGetProcAddress_v2 returns, for
//! each (name, version, flags), the same pointer as dlsym of the variant.

use cgpu_sim::cuda::procaddr::{all_entries, Flavour};
use std::ffi::{c_void, CString};

type GetProc = unsafe extern "C" fn(*const i8, *mut *mut c_void, i32, u64, *mut u32) -> u32;

#[test]
fn table_matches_the_real_headers() {
    let deps = cgpu_testkit::test_deps();
    // The union of CUDA 12.9's and 13.x's typedef headers.
    let dirs = [
        deps.cuda_include.clone(),
        deps.venv.join("cuda13/nvidia/cu13/include"),
    ];
    let src: String = dirs
        .iter()
        .flat_map(|d| {
            [
                "cudaTypedefs.h",
                "cudaGLTypedefs.h",
                "cudaEGLTypedefs.h",
                "cudaVDPAUTypedefs.h",
                "cudaProfilerTypedefs.h",
            ]
            .map(|h| d.join(h))
        })
        .map(|p| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    // Variants in no header: the 12.0 rename.
    let extras = cgpu_sim::cuda::procaddr::EXTRA;
    for (name, ver) in extras {
        assert!(*name == "cuGraphInstantiate", "{name}@{ver}");
        assert!(
            !src.contains(&format!("PFN_{name}_v{ver})(")),
            "{name}@{ver} is in the headers"
        );
    }
    let entries = all_entries();
    assert!(entries.len() > 250, "{}", entries.len());
    for e in &entries {
        if extras.contains(&(e.name, e.version)) {
            continue;
        }
        let found = match e.flavour {
            Flavour::Default => {
                src.contains(&format!("PFN_{}_v{})(", e.name, e.version))
                    || src.contains(&format!(
                        "#define PFN_{} PFN_{}_v{}\n",
                        e.name, e.name, e.version
                    ))
            }
            Flavour::PerThread => {
                src.contains(&format!("PFN_{}_v{}_ptds)(", e.name, e.version))
                    || src.contains(&format!("PFN_{}_v{}_ptsz)(", e.name, e.version))
            }
        };
        assert!(found, "{e:?} has no PFN typedef in the headers");
        // The symbol follows the driver's naming: base[_vN][_ptds|_ptsz].
        let base = e.symbol.trim_end_matches("_ptds").trim_end_matches("_ptsz");
        let ok = base == e.name
            || base
                .strip_prefix(e.name)
                .and_then(|r| r.strip_prefix("_v"))
                .is_some_and(|n| n.parse::<u32>().is_ok());
        assert!(ok, "{e:?}");
        assert_eq!(e.flavour == Flavour::PerThread, e.symbol != base, "{e:?}");
    }
}

#[test]
fn get_proc_address_returns_the_variant_itself() {
    let a = cgpu_testkit::artifacts();
    let path = CString::new(a.libsim.to_str().unwrap()).unwrap();
    // SAFETY: loading our own library; symbols are looked up on its handle.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    let sym = |s: &str| {
        let c = CString::new(s).unwrap();
        // SAFETY: h is a valid handle, c a NUL-terminated name.
        unsafe { libc::dlsym(h, c.as_ptr()) }
    };
    let gp = sym("cuGetProcAddress_v2");
    assert!(!gp.is_null());
    // SAFETY: cuGetProcAddress_v2 has this signature.
    let gp: GetProc = unsafe { std::mem::transmute::<*mut c_void, GetProc>(gp) };
    let query = |name: &str, ver: i32, flags: u64| {
        let c = CString::new(name).unwrap();
        let mut p = std::ptr::null_mut();
        let mut st = 99u32;
        // SAFETY: valid name, out pointers.
        let r = unsafe { gp(c.as_ptr(), &mut p, ver, flags, &mut st) };
        (r, p, st)
    };
    let entries = all_entries();
    for e in &entries {
        let direct = sym(e.symbol);
        assert!(!direct.is_null(), "{} is not exported", e.symbol);
        let flags = if e.flavour == Flavour::PerThread {
            2
        } else {
            0
        };
        // Asked exactly at its version, a variant is returned unless a newer
        // entry has the same version (an alias).
        let same_ver = entries
            .iter()
            .filter(|x| x.name == e.name && x.version == e.version && x.flavour == e.flavour)
            .count();
        let (r, p, st) = query(e.name, e.version as i32, flags);
        if e.version as i32 > cgpu_sim::driver::driver_version() {
            // Newer than the simulated driver: that driver has no such name
            // (CUDA_ERROR_NOT_FOUND, SYMBOL_NOT_FOUND), whatever is asked.
            let oldest = entries
                .iter()
                .filter(|x| x.name == e.name)
                .map(|x| x.version)
                .min();
            if oldest > Some(cgpu_sim::driver::driver_version() as u32) {
                assert_eq!((r, st), (500, 1), "{e:?}");
            }
            continue;
        }
        assert_eq!((r, st), (0, 0), "{e:?}");
        if same_ver == 1 {
            assert_eq!(p, direct, "{e:?}");
        }
        let min = entries
            .iter()
            .filter(|x| x.name == e.name)
            .map(|x| x.version)
            .min()
            .unwrap();
        if min > 1000 {
            let (r, p, st) = query(e.name, min as i32 - 1, 0);
            assert_eq!((r, st), (500, 2), "{} below {min}", e.name);
            assert!(p.is_null());
        }
    }
    let (r, p, st) = query("cuDefinitelyNotAFunction", 13000, 0);
    assert_eq!((r, st), (500, 1));
    assert!(p.is_null());
    // Without the flag: the legacy default-stream variants.
    assert_eq!(query("cuMemcpyHtoD", 13000, 0).1, sym("cuMemcpyHtoD_v2"));
    assert_eq!(
        query("cuMemcpyHtoD", 13000, 2).1,
        sym("cuMemcpyHtoD_v2_ptds")
    );
    assert_eq!(query("cuMemcpyHtoD", 13000, 1).1, sym("cuMemcpyHtoD_v2"));
    assert_eq!(
        query("cuEventRecord", 12000, 2).1,
        sym("cuEventRecord_ptsz")
    );
    assert_eq!(query("cuCtxCreate", 12050, 0).1, sym("cuCtxCreate_v4"));
    assert_eq!(query("cuCtxCreate", 12040, 0).1, sym("cuCtxCreate_v3"));
    assert_eq!(query("cuCtxCreate", 11030, 0).1, sym("cuCtxCreate_v2"));
    assert_eq!(query("cuMemAlloc", 3020, 0).1, sym("cuMemAlloc_v2"));
    assert_eq!(query("cuMemAlloc", 3010, 0).1, sym("cuMemAlloc"));
    assert_eq!(
        query("cuGraphInstantiate", 12000, 0).1,
        sym("cuGraphInstantiateWithFlags")
    );
    assert_eq!(
        query("cuGraphInstantiate", 11000, 0).1,
        sym("cuGraphInstantiate_v2")
    );
}

/// Every exported variant has an address of its own (identical bodies are
/// never folded), as in the real driver: interposers map pointers to variants.
#[test]
fn every_variant_has_its_own_address() {
    let a = cgpu_testkit::artifacts();
    let path = CString::new(a.libsim.to_str().unwrap()).unwrap();
    // SAFETY: loading our own library.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    let mut seen = std::collections::HashMap::new();
    for e in all_entries() {
        let c = CString::new(e.symbol).unwrap();
        // SAFETY: valid handle and name.
        let p = unsafe { libc::dlsym(h, c.as_ptr()) } as usize;
        if let Some(other) = seen.insert(p, e.symbol) {
            assert_eq!(other, e.symbol, "{other} and {} share an address", e.symbol);
        }
    }
}

/// A function newer than the simulated driver is still exported (a shared
/// library cannot hide a symbol at run time), but a client that finds it
/// with dlsym and calls it gets `CUDA_ERROR_NOT_SUPPORTED`, as from a
/// driver that lacks it, and nothing happens; cuGetProcAddress does not
/// find it. With a driver as new as the function, the call runs.
#[test]
fn functions_newer_than_the_driver_answer_not_supported_through_dlsym() {
    let script = r#"
import ctypes, json
cu = ctypes.CDLL("libcuda.so.1")  # dlopen + dlsym, as old clients do
assert cu.cuInit(0) == 0
dev = ctypes.c_int()
ctx = ctypes.c_void_p()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
out = {}
# 13.1: a device resource of a stream (the NULL stream); 12.1: context flags.
res = ctypes.create_string_buffer(144)
out["stream_resource"] = cu.cuStreamGetDevResource(None, res, 1)
out["sms"] = int.from_bytes(res.raw[96:100], "little")
out["set_flags"] = cu.cuCtxSetFlags(0)
# 13.0: the context's device.
d = ctypes.c_int(-1)
out["get_device_v2"] = cu.cuCtxGetDevice_v2(ctypes.byref(d), None)
out["device"] = d.value
fn = ctypes.c_void_p()
st = ctypes.c_int(-1)
out["procaddr"] = [cu.cuGetProcAddress_v2(b"cuStreamGetDevResource", ctypes.byref(fn), 13050, 0, ctypes.byref(st)), st.value]
print(json.dumps(out))
"#;
    let run = |ver: &str| -> serde_json::Value {
        let env = cgpu_testkit::SimEnv::new()
            .gpus("23028:NVIDIA A10")
            .env("CGPU_SIM_DRIVER_VERSION", ver);
        let o = env.run(&cgpu_testkit::test_deps().python, &["-c", script]);
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_str(stdout.trim()).unwrap()
    };
    const NOT_SUPPORTED: u32 = 801;
    const NOT_FOUND: u32 = 500;
    let old = run("12000");
    assert_eq!(old["stream_resource"], NOT_SUPPORTED, "{old}");
    assert_eq!(old["sms"], 0); // nothing written
    assert_eq!(old["set_flags"], NOT_SUPPORTED);
    assert_eq!(old["get_device_v2"], NOT_SUPPORTED);
    assert_eq!(old["device"], -1);
    assert_eq!(old["procaddr"], serde_json::json!([NOT_FOUND, 1])); // SYMBOL_NOT_FOUND
    let new = run("13050");
    assert_eq!(new["stream_resource"], 0, "{new}");
    assert_eq!(new["sms"], 72);
    assert_eq!(new["set_flags"], 0);
    assert_eq!(new["get_device_v2"], 0);
    assert_eq!(new["device"], 0);
    assert_eq!(new["procaddr"], serde_json::json!([0, 0]));
}
