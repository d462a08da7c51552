//! Every way a client reaches the driver is caught: a C client
//! compiled three ways against the real headers (linked `-lcuda`, `dlsym` on
//! its own handle, `cuGetProcAddress_v2`), unmodified cuda-bindings and
//! nvidia-ml-py; `cuGetProcAddress` hands back our hook for exactly the
//! variant the driver returns; `libcgpu.so` does not link the driver.

mod interpose_common;

use cgpu_testkit::{field, LinkMode};
use interpose_common::*;
use std::path::PathBuf;
use std::process::Command;

/// The worked examples of docs/memory.md: (physical MiB, DEV, CONTAINER, expected MiB).
const SEEDS: &[(u64, &str, &str, u64)] = &[
    (15109, "15", "6", 6043),
    (16160, "15", "4", 4309),
    (23028, "23", "3", 3003),
    (23028, "23", "4", 4004),
    (23028, "23", "5", 5006),
    (23028, "23", "6", 6007),
];

/// The scriptable C client (`tests/c/cuclient.c`) built for one entry path.
fn client(path: &str) -> PathBuf {
    cgpu_testkit::cuclient(match path {
        "linked" => LinkMode::Link,
        "dlsym" => LinkMode::Dlsym,
        _ => LinkMode::ProcAddr,
    })
}

/// A numeric `key=value` of `cmd`'s line (the `n`th such line, from 0).
fn val(out: &str, cmd: &str, n: usize, key: &str) -> u64 {
    let l = out
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(cmd))
        .nth(n)
        .unwrap_or_else(|| panic!("no {cmd} line #{n} in:\n{out}"));
    field(l, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {key} in `{l}`"))
}

/// The result of `cmd`'s `n`th line: 0 for `ok`, else its `err=`.
fn rc(out: &str, cmd: &str, n: usize) -> u64 {
    let l = out
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(cmd))
        .nth(n)
        .unwrap_or_else(|| panic!("no {cmd} line #{n} in:\n{out}"));
    if l.split_whitespace().nth(1) == Some("ok") {
        0
    } else {
        field(l, "err").and_then(|v| v.parse().ok()).unwrap()
    }
}

/// meminfo, device total, one allocation that fits and one of the whole
/// visible total, meminfo again, then NVML's count and both memory infos.
fn info_script(total: u64) -> Vec<String> {
    let total = total.to_string();
    [
        "meminfo",
        "totalmem",
        "alloc",
        "67108864",
        "alloc",
        &total,
        "meminfo",
        "freeall",
        "nvml_count",
        "nvml_meminfo",
        "nvml_meminfo_v2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn gpus(mib: u64) -> String {
    format!("{mib}:Seed GPU")
}

#[test]
fn seed_vectors_over_the_three_c_entry_paths() {
    for &(phys, dev, cont, want) in SEEDS {
        let m = Machine::new("seed-c", &gpus(phys));
        for path in ["linked", "dlsym", "procaddr"] {
            let exe = client(path);
            let vars = [
                ("ALIYUN_COM_GPU_MEM_CONTAINER", cont),
                ("ALIYUN_COM_GPU_MEM_DEV", dev),
            ];
            let quota = phys * MIB * cont.parse::<u64>().unwrap() / dev.parse::<u64>().unwrap();
            let out = run_ok(m.preloaded(&exe, &vars).args(info_script(quota)));
            let total = val(&out, "meminfo", 0, "total");
            assert_eq!(
                total / MIB,
                want,
                "{path}: {phys} MiB, DEV {dev}, CONTAINER {cont}: {out}"
            );
            assert_eq!(total, quota);
            assert_eq!(val(&out, "totalmem", 0, "bytes"), total, "{path}");
            // free = quota - (context reservation) and never above the quota
            let free = val(&out, "meminfo", 0, "free");
            assert!(free < total, "{path}: {out}");
            assert_eq!(rc(&out, "alloc", 0), 0, "{path}: {out}");
            assert_eq!(
                rc(&out, "alloc", 1),
                2,
                "{path}: allocating the whole quota must fail with OOM: {out}"
            );
            assert_eq!(
                val(&out, "meminfo", 1, "free"),
                free - 64 * MIB,
                "{path}: {out}"
            );
            assert_eq!(val(&out, "nvml_count", 0, "n"), 1);
            assert_eq!(
                val(&out, "nvml_meminfo", 0, "total"),
                total,
                "{path}: {out}"
            );
            assert_eq!(
                val(&out, "nvml_meminfo_v2", 0, "total"),
                total,
                "{path}: {out}"
            );
            assert_eq!(val(&out, "nvml_meminfo_v2", 0, "version"), 0x0200_0028);
            // The container's used: its context reservation (64 MiB freed again).
            assert_eq!(
                val(&out, "nvml_meminfo", 0, "used"),
                total - free,
                "{path}: {out}"
            );
            assert_eq!(val(&out, "nvml_meminfo", 0, "free"), free, "{path}: {out}");
        }
    }
}

#[test]
fn cgpu_disable_shows_the_physical_view_over_every_path() {
    let m = Machine::new("disable", &gpus(16130));
    for path in ["linked", "dlsym", "procaddr"] {
        let exe = client(path);
        let vars = [
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "3"),
            ("CGPU_DISABLE", "true"),
        ];
        let out = run_ok(m.preloaded(&exe, &vars).args(info_script(16130 * MIB)));
        assert_eq!(
            val(&out, "meminfo", 0, "total") / MIB,
            16130,
            "{path}: {out}"
        );
        assert_eq!(
            val(&out, "nvml_meminfo", 0, "total") / MIB,
            16130,
            "{path}: {out}"
        );
        // Not enforced: the 16130 MiB allocation fails only on the physical memory.
        assert_eq!(rc(&out, "alloc", 0), 0);
    }
}

#[test]
fn get_proc_address_returns_our_hook_for_exactly_the_drivers_variant() {
    let m = Machine::new("variants", &gpus(15109));
    let exe = client("procaddr");
    let bare = run_ok(m.bare(&exe).arg("variants"));
    let pre = run_ok(
        m.preloaded(&exe, &[("ALIYUN_COM_GPU_MEM_CONTAINER", "4")])
            .arg("variants"),
    );
    let variant_lines = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("variant "))
            .map(str::to_owned)
            .collect()
    };
    let (b, p) = (variant_lines(&bare), variant_lines(&pre));
    assert_eq!(b.len(), p.len());
    assert!(b.len() >= 15);
    let f = |l: &str, k: &str| {
        field(l, k)
            .unwrap_or_else(|| panic!("no {k} in {l}"))
            .to_owned()
    };
    for (b, p) in b.iter().zip(&p) {
        assert_eq!(f(b, "sym"), f(p, "sym"));
        assert_eq!(f(b, "rc"), f(p, "rc"), "return code unchanged: {b} / {p}");
        assert_eq!(
            f(b, "status"),
            f(p, "status"),
            "status unchanged: {b} / {p}"
        );
        assert_eq!(f(b, "null"), f(p, "null"));
        let aliases = f(b, "aliases");
        if aliases == "-" {
            // Not a function we hook: the driver's own pointer, untouched.
            assert_eq!(f(p, "hook"), "driver", "{p}");
        } else {
            // Ours, for a name under which the driver exports that very address.
            let hook = f(p, "hook");
            assert!(
                aliases.split(',').any(|a| a == hook),
                "{p}: hook {hook}, driver gave {aliases}"
            );
        }
    }
    let hook = |sym: &str, ver: u64| {
        p.iter()
            .find(|l| f(l, "sym") == sym && f(l, "ver") == ver.to_string())
            .map(|l| f(l, "hook"))
            .unwrap()
    };
    // Distinct ABIs: these cannot be aliases of each other.
    assert!(
        hook("cuCtxCreate", 3020).ends_with("cuCtxCreate_v2")
            || hook("cuCtxCreate", 3020) == "cuCtxCreate"
    );
    assert_eq!(hook("cuCtxCreate", 11040), "cuCtxCreate_v3");
    assert_eq!(hook("cuCtxCreate", 12050), "cuCtxCreate_v4");
    assert_eq!(hook("cuMemAlloc", 3020), "cuMemAlloc_v2");
    assert_eq!(hook("cuGetProcAddress", 12000), "cuGetProcAddress_v2");
    assert_eq!(hook("cuGetProcAddress", 11030), "cuGetProcAddress");
    assert_eq!(hook("cuGetExportTable", 3000), "driver");
    assert_eq!(hook("cuCtxGetDevice", 2000), "driver");
}

#[test]
fn unmodified_cuda_bindings_and_pynvml_see_the_quota() {
    if venv().is_none() {
        panic!("test deps missing: run scripts/test-deps.sh (needs PyPI)");
    }
    for &(phys, dev, cont, want) in SEEDS.iter().take(3) {
        let m = Machine::new("py", &gpus(phys));
        let vars = [
            ("ALIYUN_COM_GPU_MEM_CONTAINER", cont),
            ("ALIYUN_COM_GPU_MEM_DEV", dev),
        ];
        let mut c = m.preloaded(python(), &vars);
        c.arg(repo().join("tests/py/bindings_meminfo.py"));
        let out = run_ok(&mut c);
        let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(j["total"].as_u64().unwrap() / MIB, want, "{out}");
        assert_eq!(j["devtotal"], j["total"], "{out}");
        assert_eq!(j["alloc_rc"], 0, "{out}");
        assert_eq!(j["over_rc"], 2, "{out}");
        assert_eq!(
            j["free"].as_u64().unwrap() - j["free_after_alloc"].as_u64().unwrap(),
            MIB,
            "{out}"
        );
        // cuCtxCreate (v4 through cuGetProcAddress): +300 MiB, then given back.
        let free = j["free"].as_u64().unwrap();
        assert_eq!(
            free - j["free_with_ctx2"].as_u64().unwrap(),
            300 * MIB,
            "{out}"
        );
        assert_eq!(j["free_after_ctx2"].as_u64().unwrap(), free, "{out}");

        let mut c = m.preloaded(python(), &vars);
        c.arg(repo().join("tests/py/pynvml_meminfo.py"));
        let out = run_ok(&mut c);
        let j: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(j["count"], 1);
        assert_eq!(j["v1"]["total"].as_u64().unwrap() / MIB, want, "{out}");
        assert_eq!(j["v2"]["total"].as_u64().unwrap() / MIB, want, "{out}");
    }
}

#[test]
fn libcgpu_does_not_link_the_driver() {
    let (cgpu, _) = artifacts();
    let o = Command::new("readelf")
        .arg("-d")
        .arg(&cgpu)
        .output()
        .expect("readelf (binutils)");
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("NEEDED"), "{s}");
    for bad in ["libcuda", "libnvidia-ml"] {
        assert!(
            !s.lines().any(|l| l.contains("NEEDED") && l.contains(bad)),
            "{bad} is NEEDED:\n{s}"
        );
    }
    // The exports: a dlsym override and the hooked names, nothing else of the driver.
    let o = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&cgpu)
        .output()
        .expect("nm");
    let syms = String::from_utf8_lossy(&o.stdout);
    for name in cgpu::hooks::HOOKED.iter().chain(["dlsym"].iter()) {
        assert!(
            syms.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "{name} not exported"
        );
    }
    assert!(
        !syms.lines().any(|l| l.ends_with(" cuGetExportTable")),
        "cuGetExportTable must pass through"
    );
}

#[test]
fn dlsym_keeps_rtld_next_semantics_and_other_names_untouched() {
    let m = Machine::new("rtldnext", &gpus(15109));
    let src = m.root.join("next.c");
    std::fs::write(
        &src,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
static const char *lib(void *p) { Dl_info d; return p && dladdr(p, &d) && d.dli_fname ? d.dli_fname : "null"; }
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("{\"op\":\"next_printf\",\"same\":%d}\n", dlsym(RTLD_NEXT, "printf") == (void *)printf);
    printf("{\"op\":\"default_strlen\",\"same\":%d}\n", dlsym(RTLD_DEFAULT, "strlen") == (void *)strlen);
    printf("{\"op\":\"next_cu\",\"lib\":\"%s\"}\n", lib(dlsym(RTLD_NEXT, "cuMemAlloc_v2")));
    printf("{\"op\":\"handle_cu\",\"lib\":\"%s\"}\n", lib(dlsym(h, "cuMemAlloc_v2")));
    printf("{\"op\":\"handle_pass\",\"lib\":\"%s\"}\n", lib(dlsym(h, "cuCtxGetDevice")));
    printf("{\"op\":\"handle_missing\",\"null\":%d}\n", dlsym(h, "cuNoSuchFunction") == NULL);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = cc(&src, "rtld_next", &[], false);
    let out = run_ok(&mut m.preloaded(&exe, &[("ALIYUN_COM_GPU_MEM_CONTAINER", "2")]));
    assert_eq!(op(&out, "next_printf")["same"], 1, "{out}");
    assert_eq!(op(&out, "default_strlen")["same"], 1, "{out}");
    // From the executable, "next" is libcgpu (preloaded right after it).
    assert!(
        op(&out, "next_cu")["lib"]
            .as_str()
            .unwrap()
            .contains("libcgpu"),
        "{out}"
    );
    assert!(
        op(&out, "handle_cu")["lib"]
            .as_str()
            .unwrap()
            .contains("libcgpu"),
        "{out}"
    );
    // A function we do not hook: the driver's own.
    assert!(
        op(&out, "handle_pass")["lib"]
            .as_str()
            .unwrap()
            .ends_with("libcuda.so.1"),
        "{out}"
    );
    assert_eq!(op(&out, "handle_missing")["null"], 1, "{out}");
}

/// The C spelling of a type as the declaration list writes it in Rust.
fn c_type(rust: &str) -> String {
    let t: String = rust.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some(inner) = t.strip_prefix("*mut ").or_else(|| t.strip_prefix("* mut ")) {
        return format!("{} *", c_type(inner));
    }
    if let Some(inner) = t
        .strip_prefix("*const ")
        .or_else(|| t.strip_prefix("* const "))
    {
        return format!("const {} *", c_type(inner));
    }
    match t.as_str() {
        "u32" => "unsigned int".into(),
        "i32" => "int".into(),
        "f32" => "float".into(),
        "u64" => "unsigned long long".into(),
        "usize" => "size_t".into(),
        "c_void" => "void".into(),
        "c_char" => "char".into(),
        "CStrP" => "const char *".into(),
        "Ptr" => "void *".into(),
        // Every other name is a typedef of the headers, spelled alike.
        other => other.into(),
    }
}

/// The declaration list (`src/api.rs`) against the real headers: every
/// function it declares is redeclared in C from the list, after including
/// cuda.h and nvml.h with every legacy and per-thread variant declared; the
/// compiler rejects a declaration whose types differ from the header's.
#[test]
fn the_declaration_list_matches_cuda_h() {
    let mut c = String::from(
        "/* generated by tests/entry_paths.rs from cgpu::hooks::SIGNATURES */\n\
         #define __CUDA_API_VERSION_INTERNAL 1\n\
         #define NVML_NO_UNVERSIONED_FUNC_DEFS 1\n\
         #include <cuda.h>\n#include <nvml.h>\n",
    );
    for (name, ret, args) in cgpu::hooks::SIGNATURES {
        let args: Vec<String> = args.iter().map(|a| c_type(a)).collect();
        let args = if args.is_empty() {
            "void".to_string()
        } else {
            args.join(", ")
        };
        c += &format!("#undef {name}\n{} {name}({args});\n", c_type(ret));
    }
    let dir = std::env::temp_dir().join(format!("cgpu-decls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("decls.c");
    std::fs::write(&src, &c).unwrap();
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-fsyntax-only", "-Werror"]);
    for d in cuda_include_dirs() {
        cmd.arg("-I").arg(d);
    }
    let o = cmd.arg(&src).output().expect("run cc");
    assert!(
        o.status.success(),
        "the declaration list differs from the real headers:\n{}\n{c}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(cgpu::hooks::SIGNATURES.len() >= cgpu::hooks::HOOKED.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The legacy `_v1` array descriptors (`cuArrayCreate`, `cuArray3DCreate`)
/// against the real cuda.h, which declares them in its internal section:
/// a program compiled against it prints their layout, which must be ours.
#[test]
fn v1_descriptors_match_cuda_h() {
    use cgpu_ffi::{CUDA_ARRAY3D_DESCRIPTOR_v1, CUDA_ARRAY_DESCRIPTOR_v1};
    use std::mem::{offset_of, size_of};
    let checks: &[(&str, usize)] = &[
        (
            "sizeof(CUDA_ARRAY_DESCRIPTOR_v1)",
            size_of::<CUDA_ARRAY_DESCRIPTOR_v1>(),
        ),
        (
            "offsetof(CUDA_ARRAY_DESCRIPTOR_v1, Height)",
            offset_of!(CUDA_ARRAY_DESCRIPTOR_v1, Height),
        ),
        (
            "offsetof(CUDA_ARRAY_DESCRIPTOR_v1, Format)",
            offset_of!(CUDA_ARRAY_DESCRIPTOR_v1, Format),
        ),
        (
            "offsetof(CUDA_ARRAY_DESCRIPTOR_v1, NumChannels)",
            offset_of!(CUDA_ARRAY_DESCRIPTOR_v1, NumChannels),
        ),
        (
            "sizeof(CUDA_ARRAY3D_DESCRIPTOR_v1)",
            size_of::<CUDA_ARRAY3D_DESCRIPTOR_v1>(),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR_v1, Height)",
            offset_of!(CUDA_ARRAY3D_DESCRIPTOR_v1, Height),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR_v1, Depth)",
            offset_of!(CUDA_ARRAY3D_DESCRIPTOR_v1, Depth),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR_v1, Format)",
            offset_of!(CUDA_ARRAY3D_DESCRIPTOR_v1, Format),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR_v1, NumChannels)",
            offset_of!(CUDA_ARRAY3D_DESCRIPTOR_v1, NumChannels),
        ),
        (
            "offsetof(CUDA_ARRAY3D_DESCRIPTOR_v1, Flags)",
            offset_of!(CUDA_ARRAY3D_DESCRIPTOR_v1, Flags),
        ),
    ];
    let mut c = String::from(
        "#define __CUDA_API_VERSION_INTERNAL 1\n#include <cuda.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n",
    );
    for (expr, _) in checks {
        c += &format!("  printf(\"%zu\\n\", (size_t)({expr}));\n");
    }
    c += "  return 0;\n}\n";
    let dir = std::env::temp_dir().join(format!("cgpu-v1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("v1.c"), dir.join("v1"));
    std::fs::write(&src, &c).unwrap();
    let mut cmd = Command::new("cc");
    for d in cuda_include_dirs() {
        cmd.arg("-I").arg(d);
    }
    let o = cmd.arg(&src).arg("-o").arg(&exe).output().expect("run cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = Command::new(&exe).output().unwrap();
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    for ((expr, ours), header) in checks.iter().zip(&got) {
        assert_eq!(ours, header, "{expr}: ours {ours}, cuda.h {header}");
    }
    assert_eq!(got.len(), checks.len());
    let _ = std::fs::remove_dir_all(&dir);
}
