//! `include/cgpu.h` describes exactly the Rust layout: a C program compiled
//! with gcc prints sizeof/offsetof of every field and the constants; we
//! compare with `offset_of!`/`size_of` here.

use cgpu::ledger::*;
use std::mem::{offset_of, size_of};

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! layout {
    ($( $cname:literal $rty:ty { $($f:ident),* $(,)? } )*) => {{
        let mut rust = Vec::new();
        let mut c = String::new();
        $(
            rust.push(format!("{} size {} align {}", $cname, size_of::<$rty>(), std::mem::align_of::<$rty>()));
            c.push_str(&format!(
                "printf(\"%s size %zu align %zu\\n\", \"{0}\", sizeof(struct {0}), _Alignof(struct {0}));\n",
                $cname
            ));
            $(
                rust.push(format!("{}.{} {} {}", $cname, stringify!($f),
                    offset_of!($rty, $f), field_size(|s: &$rty| &s.$f)));
                c.push_str(&format!(
                    "printf(\"%s.%s %zu %zu\\n\", \"{0}\", \"{1}\", offsetof(struct {0}, {1}), sizeof(((struct {0} *)0)->{1}));\n",
                    $cname, stringify!($f)
                ));
            )*
        )*
        (rust, c)
    }};
}

/// Compiles `prog` against the `cgpu.h` in `include` and returns its lines.
fn compile_and_run(prog: &str, include: &str, name: &str) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ledger_header");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&src, prog).unwrap();
    let out = std::process::Command::new("gcc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-I",
            include,
        ])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("gcc must be installed to check include/cgpu.h");
    assert!(
        out.status.success(),
        "gcc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::process::Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Nothing moves: every field of the previous release's header
/// (`tests/c/cgpu-previous/cgpu.h`, format version 3 before its
/// additions) keeps its offset and size, and the structs their sizes, so a
/// process built from it shares the books with this one.
#[test]
fn the_previous_header_still_describes_this_layout() {
    let (rust, fields) = layout! {
        "cgpu_header" LedgerHeader {
            magic, version, header_size, file_size, ready, gpu_index, uuid, physical_total,
            created_ns, policy, policy_explicit, max_inst, prio_ratio, default_memsize,
            knob_generation, sched, last_reap_ns,
        }
        "cgpu_container" ContainerSlot {
            state, highprio, id, quota, used, peak, weight, nprocs, oom_count, created_ns,
            enforce_off, ops, sched, suspect, recounts,
        }
        "cgpu_process" ProcessSlot {
            state, container, pid, _pad, pidns, start_time, used, pending, gpu_time_ns,
            launches, sched_beat_ns, sched_in_sync,
        }
        "cgpu_shared" SharedSlot {
            state, container, exporter, holder, exporter_pid, holder_pid, bytes,
        }
        "cgpu_ledger" LedgerFile { header, containers, processes, shared }
    };
    let prog = format!(
        "#include <stdio.h>\n#include \"cgpu.h\"\nint main(void) {{\n{fields}return 0;\n}}\n"
    );
    let include = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/cgpu-previous");
    let c = compile_and_run(&prog, include, "previous");
    assert_eq!(c, rust, "a field of the previous format moved");
    let consts = compile_and_run(
        "#include <stdio.h>\n#include \"cgpu.h\"\nint main(void) { printf(\"%u\\n\", CGPU_FORMAT_VERSION); return 0; }\n",
        include,
        "previous_version",
    );
    assert_eq!(
        consts,
        vec![FORMAT_VERSION.to_string()],
        "the breaking number"
    );
}

#[test]
fn c_header_matches_rust_layout() {
    let (mut rust, fields) = layout! {
        "cgpu_header" LedgerHeader {
            magic, version, header_size, file_size, ready, gpu_index, uuid, physical_total,
            created_ns, policy, policy_explicit, max_inst, prio_ratio, default_memsize,
            knob_generation, sched, last_reap_ns, additions, required, reserved,
        }
        "cgpu_container" ContainerSlot {
            state, highprio, id, quota, used, peak, weight, nprocs, oom_count, created_ns,
            enforce_off, ops, sched, suspect, recounts, key, key_created, id_sum, reserved,
        }
        "cgpu_process" ProcessSlot {
            state, container, pid, _pad, pidns, start_time, used, pending, gpu_time_ns,
            launches, sched_beat_ns, sched_in_sync, host_pid, reserved,
        }
        "cgpu_shared" SharedSlot {
            state, container, exporter, holder, exporter_pid, holder_pid, bytes,
        }
        "cgpu_ledger" LedgerFile { header, containers, processes, shared }
    };
    let consts: &[(&str, u64)] = &[
        ("CGPU_LEDGER_MAGIC", LEDGER_MAGIC),
        ("CGPU_FORMAT_VERSION", FORMAT_VERSION as u64),
        ("CGPU_MAX_CONTAINERS", MAX_CONTAINERS as u64),
        ("CGPU_MAX_PROCESSES", MAX_PROCESSES as u64),
        ("CGPU_ID_LEN", ID_LEN as u64),
        ("CGPU_UUID_LEN", UUID_LEN as u64),
        ("CGPU_SCHED_GPU_WORDS", SCHED_GPU_WORDS as u64),
        ("CGPU_SCHED_CONTAINER_WORDS", SCHED_CONTAINER_WORDS as u64),
        ("CGPU_MAX_SHARED", MAX_SHARED as u64),
        ("CGPU_SHARED_BORNE", SHARED_BORNE),
        ("CGPU_SHARED_RELEASED", SHARED_RELEASED),
        ("CGPU_SHARED_BYTES", SHARED_BYTES),
        ("CGPU_ADD_CONTAINER_KEY", ADD_CONTAINER_KEY),
        ("CGPU_ADD_HOST_PID", ADD_HOST_PID),
        ("CGPU_ADD_ID_SUM", ADD_ID_SUM),
        ("CGPU_SLOT_FREE", SLOT_FREE as u64),
        ("CGPU_SLOT_CLAIMING", SLOT_CLAIMING as u64),
        ("CGPU_SLOT_LIVE", SLOT_LIVE as u64),
        ("CGPU_DEFAULT_POLICY", DEFAULT_POLICY as u64),
        ("CGPU_DEFAULT_MAX_INST", DEFAULT_MAX_INST as u64),
        ("CGPU_DEFAULT_PRIO_RATIO", DEFAULT_PRIO_RATIO as u64),
        ("CGPU_POLICY_MAX", POLICY_MAX as u64),
        ("CGPU_MAX_INST_MIN", *MAX_INST_RANGE.start() as u64),
        ("CGPU_MAX_INST_MAX", *MAX_INST_RANGE.end() as u64),
        ("CGPU_PRIO_RATIO_MIN", *PRIO_RATIO_RANGE.start() as u64),
        ("CGPU_PRIO_RATIO_MAX", *PRIO_RATIO_RANGE.end() as u64),
        ("CGPU_PROCESS_LOCK_START(3)", process_slot_offset(3)),
        ("CGPU_PROCESS_LOCK_LEN", size_of::<ProcessSlot>() as u64),
    ];
    let mut prog = String::from("#include <stdio.h>\n#include \"cgpu.h\"\nint main(void) {\n");
    prog.push_str(&fields);
    for (name, v) in consts {
        prog.push_str(&format!(
            "printf(\"%s %llu\\n\", \"{name}\", (unsigned long long)({name}));\n"
        ));
        rust.push(format!("{name} {v}"));
    }
    prog.push_str("return 0;\n}\n");

    let c = compile_and_run(
        &prog,
        concat!(env!("CARGO_MANIFEST_DIR"), "/include"),
        "layout",
    );
    assert_eq!(c.len(), rust.len());
    for (c, r) in c.iter().zip(&rust) {
        assert_eq!(c, r, "cgpu.h (left) disagrees with the Rust layout (right)");
    }
    // And the numbers are the ones docs/ledger.md states.
    assert_eq!(size_of::<LedgerHeader>(), 560);
    assert_eq!(size_of::<ContainerSlot>(), 576);
    assert_eq!(size_of::<ProcessSlot>(), 96);
    assert_eq!(size_of::<SharedSlot>(), 32);
    assert_eq!(size_of::<LedgerFile>(), 205_360);
}
