#!/usr/bin/env python3
"""Generates shim/src/cuda/procaddr_table.rs: the cuGetProcAddress table.

Usage: gen_procaddr.py INCLUDE_DIR EXPORTED_SYMBOLS_FILE > shim/src/cuda/procaddr_table.rs

INCLUDE_DIR holds the real cudaTypedefs.h and the GL/EGL/VDPAU/profiler
typedef headers (PyPI nvidia-cuda-runtime-cu12);
EXPORTED_SYMBOLS_FILE lists the cu* functions the sim implements by hand, one
per line (e.g. `nm -D --defined-only libcgpu_sim.so | awk '{print $3}'`).

Rules (the real driver's, as cudaTypedefs.h encodes them): every
`PFN_<name>_v<ver>[_ptds|_ptsz]` typedef is a variant of API <name> introduced
at CUDA version <ver>. Default variants sorted by version are `name`,
`name_v2`, `name_v3`, ...; a per-thread variant is the default variant in
force at its version plus `_ptds`/`_ptsz`. Variants of an API we implement but
whose symbol we do not are emitted as legacy stubs (NOT_SUPPORTED).
EXTRA adds variants newer than the headers (CUDA 13).

It also lists the stubs (STUBS): every name given to `stub_fns!` or
`stub_hit!("...")` in shim/src, and the legacy stubs it emits.
"""
import re, sys, collections

EXTRA = [
    # (api, version, flavour, symbol): CUDA 13.0 additions, not in 12.x headers.
    ("cuCtxGetDevice", 13000, "", "cuCtxGetDevice_v2"),
    ("cuCtxSynchronize", 13000, "", "cuCtxSynchronize_v2"),
] + [
    # CUDA 13.x functions, at the version cuda-bindings 13.5 asks for them.
    (api, ver, "", api) for api, ver in [
        ("cuGraphGetId", 13010), ("cuGraphExecGetId", 13010),
        ("cuGraphNodeGetContainingGraph", 13010), ("cuGraphNodeGetLocalId", 13010),
        ("cuGraphNodeGetToolsId", 13010), ("cuGraphNodeGetParams", 13020),
        ("cuMemGetDefaultMemPool", 13000), ("cuMemGetMemPool", 13000),
        ("cuMemSetMemPool", 13000), ("cuFuncGetParamCount", 13020),
        ("cuKernelGetParamCount", 13020), ("cuCheckpointOperationComplete", 13041),
        ("cuCoredumpRegisterStartCallback", 13020), ("cuCoredumpRegisterCompleteCallback", 13020),
        ("cuCoredumpDeregisterStartCallback", 13020), ("cuCoredumpDeregisterCompleteCallback", 13020),
        ("cuDeviceGetCliqueCount", 13041), ("cuDeviceGetCliqueInfo", 13041),
        ("cuDeviceGetFabricClusterUuid", 13041), ("cuDeviceGetHostAtomicCapabilities", 13000),
        ("cuDeviceGetP2PAtomicCapabilities", 13000), ("cuFabricCpyBatchAsync", 13050),
        ("cuMemDiscardAndPrefetchBatchAsync", 13000), ("cuMemDiscardBatchAsync", 13000),
        ("cuMemPrefetchBatchAsync", 13000), ("cuMemGetLocationInfo", 13041),
        ("cuMemcpy3DWithAttributesAsync", 13020), ("cuMemcpyWithAttributesAsync", 13020),
        ("cuStreamBeginCaptureToCig", 13020), ("cuStreamEndCaptureToCig", 13020),
    ] + [("cuLogicalEndpoint" + x, 13030) for x in (
        "AddDevice", "BindAddr", "BindMem", "Create", "Destroy", "Export", "GetLimits",
        "IdRelease", "IdReserve", "Import", "Query", "Unbind")]
]
# An API renamed in 12.0: cuGraphInstantiate resolves to cuGraphInstantiateWithFlags.
ALIASES = [("cuGraphInstantiate", 12000, "", "cuGraphInstantiateWithFlags")]

inc, exported_file = sys.argv[1], sys.argv[2]
import glob, os
src = "".join(open(f"{inc}/{h}").read() for h in (
    "cudaTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h",
    "cudaProfilerTypedefs.h"))
# Stubs named in the sources (shim/src next to this script's directory).
srcdir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
named_stubs = set()
for path in glob.glob(f"{srcdir}/**/*.rs", recursive=True):
    text = open(path).read()
    named_stubs.update(re.findall(r'stub_hit!\("([A-Za-z0-9_]+)"', text))
    # unsupported! { name(args); ... } (cuda/unsupported.rs): every entry a stub
    for block in re.findall(r"\nunsupported!\s*\{(.*?)\n\}", text, re.S):
        named_stubs.update(re.findall(r"^\s*(cu\w+)\(", block, re.M))
    for block in re.findall(r"stub_fns!\s*\{(.*?)\n\}", text, re.S):
        for part in re.findall(r"=>(.*?);", block, re.S):
            part = re.sub(r"//[^\n]*", "", part)
            named_stubs.update(x.strip() for x in part.split(",") if x.strip())
exported = {l.strip() for l in open(exported_file) if l.strip().startswith("cu")}

variants = collections.defaultdict(set)  # api -> {(ver, flavour)}
for m in re.finditer(r"PFN_(\w+)_v(\d+)(_ptds|_ptsz)?\)\s*\(", src):
    variants[m.group(1)].add((int(m.group(2)), m.group(3) or ""))
# A few typedefs lack their version suffix (header bug); their #define has it.
for m in re.finditer(r"#define PFN_(\w+)\s+PFN_(\w+)_v(\d+)\s*$", src, re.M):
    if m.group(1) == m.group(2) and not variants.get(m.group(1)):
        variants[m.group(1)].add((int(m.group(3)), ""))

rows = collections.defaultdict(list)  # api -> [(ver, flavour, symbol)]
for api, vs in variants.items():
    default = sorted(v for v, f in vs if not f)
    sym_of = {v: (api if i == 0 else f"{api}_v{i + 1}") for i, v in enumerate(default)}
    for v, f in sorted(vs):
        if not f:
            rows[api].append((v, "", sym_of[v]))
        else:
            base = [d for d in default if d <= v]
            sym = (sym_of[base[-1]] if base else api) + f
            rows[api].append((v, "ptds", sym))
for api, v, f, sym in EXTRA + ALIASES:
    rows[api].append((v, f, sym))

implemented = {api for api, rs in rows.items() if any(s in exported for _, _, s in rs)}
stubs = sorted({s for api in implemented for _, f, s in rows[api] if s not in exported and not f})
out = ["// @generated by shim/tools/gen_procaddr.py from cudaTypedefs.h (CUDA 12.9) + CUDA 13 extras.",
       "// Regenerate after adding API functions; tests/procaddr.rs checks it. Do not edit by hand.",
       "use super::procaddr::{legacy_stubs, proc_table};",
       "#[allow(unused_imports)]",
       "use super::*;", "",
       "legacy_stubs! {"]
out += [f"    {s}," for s in stubs]
out += ["}", "", "proc_table! {"]
for api in sorted(implemented):
    ents = []
    for v, f, s in sorted(rows[api]):
        if f and s not in exported:
            continue  # per-thread variant we do not implement: fall back to default
        ents.append(f"{v}{' ptds' if f else ''} => {s}")
    out.append(f"    {api}: " + ", ".join(ents) + ";")
out.append("}")
out += ["", "/// Variants not in the 12.9 typedef headers (CUDA 13 additions, the 12.0 rename, the profiler).",
        "pub const EXTRA: &[(&str, u32)] = &["]
out += [f'    ("{api}", {v}),' for api, v, f, sym in EXTRA + ALIASES]
out += ["];"]
all_stubs = sorted(set(stubs) | (named_stubs & exported))
out += ["", "/// Every symbol that is only a counted stub (legacy variants included).",
        "pub const STUBS: &[&str] = &["]
out += [f'    "{s}",' for s in all_stubs]
out += ["];"]
missing = sorted(s for s in exported if not any(s == x for api in rows for _, _, x in rows[api]))
if missing:
    print("// exported but not in any PFN typedef: " + " ".join(missing), file=sys.stderr)
print("\n".join(out))
