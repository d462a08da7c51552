//! NVIDIA's own CUDA runtime runs on the sim, unmodified: a C program built
//! against the real `cuda_runtime_api.h` and linked with NVIDIA's
//! `libcudart.so.12` and, as a second row, `libcudart.so.13` (versions
//! pinned in `scripts/test-deps.sh`) — devices, memory, copies, symbols,
//! streams, events, a kernel registered the way nvcc output registers it and
//! launched directly and from a captured graph. The device time the sim
//! records is exactly what the kernels asked for.

use cgpu_sim::stat::snapshot;
use cgpu_testkit::{compile_cudart_client, cudart_rows, num, workspace_root, SimEnv};

const MIB: u64 = 1 << 20;
const CTX: u64 = 300 * MIB;
const T4_BYTES: u64 = 15109 * MIB;

fn value<'a>(out: &'a str, cmd: &str, key: &str) -> &'a str {
    let l = cgpu_testkit::line(out, cmd);
    cgpu_testkit::field(l, key).unwrap_or_else(|| panic!("no {key} in `{l}`"))
}

#[test]
fn cudart_12_and_13_run_unmodified() {
    let src = workspace_root().join("tests/c/cudart_client.c");
    for row in cudart_rows() {
        let client = compile_cudart_client(&src, &row);
        let env = SimEnv::new().ctx_mib(300);
        let o = env.run(
            &client,
            &[
                "info",
                "meminfo",
                "roundtrip",
                "3000001",
                "malloc",
                "1048576",
                "malloc",
                "100000000000",
                "symbol",
                "launch",
                "2000000",
                "3",
                "graph",
                "1000000",
                "2",
                "2",
                "tables",
            ],
        );
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let err = String::from_utf8_lossy(&o.stderr);
        let m = row.major;
        assert!(o.status.success(), "CUDA {m}: {:?}\n{out}\n{err}", o.status);
        assert_eq!(num(&out, "info", "runtime") / 1000, m as u64, "{out}");
        assert_eq!(num(&out, "info", "devices"), 1);
        assert_eq!(num(&out, "info", "total"), T4_BYTES);
        assert_eq!(value(&out, "info", "cc"), "7.5");
        // cudaMemGetInfo: the device less the context's reservation (and
        // the 512 B charged for the image's 8-byte global when the runtime
        // resolves it at context start, as 12.x does).
        let (free, total) = (num(&out, "meminfo", "free"), num(&out, "meminfo", "total"));
        assert_eq!(total, T4_BYTES, "CUDA {m}");
        assert!(
            (T4_BYTES - CTX - 512..=T4_BYTES - CTX).contains(&free),
            "CUDA {m}: free {free}"
        );
        assert_eq!(
            num(&out, "roundtrip", "same"),
            1,
            "CUDA {m}: bytes round-trip"
        );
        assert_eq!(num(&out, "malloc", "rc"), 0);
        let rcs: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("malloc "))
            .map(|l| cgpu_testkit::field(l, "rc").unwrap())
            .collect();
        assert_eq!(
            rcs,
            ["0", "2"],
            "CUDA {m}: 100 GB is cudaErrorMemoryAllocation"
        );
        // __device__ u64: a zeroed buffer of its size, written and read back.
        assert_eq!(num(&out, "symbol", "size"), 8);
        assert_eq!(num(&out, "symbol", "initial"), 0);
        assert_eq!(num(&out, "symbol", "same"), 1);
        // Events around a 2 ms kernel measure at least its device time.
        let ms: f64 = value(&out, "launch", "ms").parse().unwrap();
        assert!(ms >= 2.0, "CUDA {m}: {ms} ms");
        // The captured graph: 2 kernels, a memset and a copy; the copy ran
        // at replay, not at capture.
        assert_eq!(num(&out, "graph", "nodes"), 4);
        assert_eq!(num(&out, "graph", "before"), 0);
        assert_eq!(num(&out, "graph", "after"), 0x5a);
        // The private tables are the sim's; unknown ids are refused.
        assert_eq!(value(&out, "tables", "rc"), "0,0");
        assert_eq!(num(&out, "tables", "unknown_rc"), 1);
        assert_eq!(num(&out, "tables", "unknown_null"), 1);

        // Device time: exactly what the kernels asked for (3 × 2 ms + two
        // replays of 2 × 1 ms), kernel by kernel.
        let pid = num(&out, "info", "pid") as u32;
        let st = env.stats();
        let p = st.process(pid, 0).expect("the client's record");
        assert_eq!(
            p.device_time_ns,
            3 * 2_000_000 + 2 * 2 * 1_000_000,
            "CUDA {m}"
        );
        assert_eq!(p.kernels, 3 + 2 * 2, "CUDA {m}");
        assert_eq!(p.mem_bytes, 0, "everything returned at exit");

        // Stubs: none. (The runtime calls its tool-callback hook slots only
        // when the bytes past the hook buffers it was handed say a tool is
        // attached; they are zero, as with no tool on a real driver.)
        let s = snapshot(&env.state_dir).unwrap();
        assert!(s.stubs.is_empty(), "CUDA {m}: {:?}", s.stubs);
    }
}

/// Two GPUs (the integrity check covers every device), and
/// `cudaMemGetInfo` as the very first runtime call (the runtime creates its
/// context for it).
#[test]
fn cudart_on_two_gpus_meminfo_first() {
    let src = workspace_root().join("tests/c/cudart_client.c");
    for row in cudart_rows() {
        let client = compile_cudart_client(&src, &row);
        let env = SimEnv::new().gpus("23028:NVIDIA A10,15109:Tesla T4");
        let o = env.run(&client, &["meminfo", "info"]);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(num(&out, "meminfo", "total"), 23028 * MIB);
        assert_eq!(num(&out, "info", "devices"), 2);
    }
}
