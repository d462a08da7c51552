//! The manifests in `deploy/` agree with the code: the scheduler
//! configuration uses the current API, names the extender's Service and port
//! and the verbs it serves, for the resource the components use.

use cgpu_cluster_core::names::RESOURCE_GPU_MEM;

fn read(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The value of the first `key: value` line (indentation and `- ` ignored).
fn value<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .map(|l| l.trim_start().trim_start_matches("- "))
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key}: in\n{text}"))
        .trim()
}

#[test]
fn scheduler_configuration_names_the_extender() {
    let cfg = read("scheduler-config.yaml");
    assert_eq!(value(&cfg, "apiVersion"), "kubescheduler.config.k8s.io/v1");
    assert_eq!(value(&cfg, "kind"), "KubeSchedulerConfiguration");
    assert_eq!(
        value(&cfg, "urlPrefix"),
        "http://cgpu-scheduler-extender.kube-system.svc:32766"
    );
    assert_eq!(value(&cfg, "filterVerb"), "filter");
    assert_eq!(value(&cfg, "prioritizeVerb"), "prioritize");
    assert_eq!(value(&cfg, "bindVerb"), "bind");
    assert_eq!(value(&cfg, "nodeCacheCapable"), "true");
    assert_eq!(value(&cfg, "name"), RESOURCE_GPU_MEM);
    assert_eq!(value(&cfg, "ignorable"), "false");
    let ext = read("scheduler-extender.yaml");
    assert!(ext.contains("ports: [{name: http, port: 32766, targetPort: 32766}]"));
    assert!(ext.contains("\"0.0.0.0:32766\""));
    assert!(ext.contains("path: /readyz") && ext.contains("path: /healthz"));
}

#[test]
fn device_plugin_mounts_what_it_uses() {
    let ds = read("device-plugin.yaml");
    for path in [
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
        "/run/cgpu",
        "/run/cgpu-alloc",
        "/var/run/cdi",
        "/etc/cgpu/containers",
    ] {
        assert!(
            ds.contains(&format!("mountPath: {path}")),
            "{path} not mounted"
        );
    }
    let std = cgpu_cluster::device_plugin::PluginConfig::standard("n");
    assert_eq!(std.alloc_dir.to_str(), Some("/run/cgpu-alloc"));
    assert_eq!(std.cdi_dir.to_str(), Some("/var/run/cdi"));
    assert_eq!(std.library_on_host.to_str(), Some("/opt/cgpu/libcgpu.so"));
    assert!(ds.contains("/host/opt/cgpu/libcgpu.so"));
    assert_eq!(
        cgpu_cluster::signing::DEFAULT_KEY_FILE,
        "/etc/cgpu/decision-key/key"
    );
    // The plugins verify with the public key: no signing key on any node.
    assert!(!ds.contains("secretName: cgpu-decision-key"), "{ds}");
    assert!(!ds.contains("mountPath: /etc/cgpu/decision-key"), "{ds}");
    let ext = read("scheduler-extender.yaml");
    assert!(ext.contains("mountPath: /etc/cgpu/decision-key"));
    assert!(ext.contains("secretName: cgpu-decision-key"));
}

/// Every container runs with the runtime's seccomp profile, no privilege
/// escalation, no capabilities (the agent: only the four it needs) and a
/// read-only root filesystem; the extender (which needs no root) as a
/// non-root user.
#[test]
fn manifests_are_hardened() {
    for f in ["device-plugin.yaml", "scheduler-extender.yaml"] {
        let text = read(f);
        let containers = text.matches("image: ").count();
        for needle in [
            "allowPrivilegeEscalation: false",
            "readOnlyRootFilesystem: true",
            "capabilities: {drop: [ALL]",
        ] {
            assert_eq!(text.matches(needle).count(), containers, "{f}: {needle}");
        }
        let added: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("capabilities:") && l.contains("add:"))
            .map(str::trim)
            .collect();
        let expect: &[&str] = if f == "device-plugin.yaml" {
            &["capabilities: {drop: [ALL], add: [SYS_PTRACE, KILL, CHOWN, FOWNER]}"]
        } else {
            &[]
        };
        assert_eq!(added, expect, "{f}");
        assert_eq!(value(&text, "seccompProfile"), "{type: RuntimeDefault}");
    }
    let ext = read("scheduler-extender.yaml");
    assert_eq!(value(&ext, "runAsNonRoot"), "true");
    assert_eq!(value(&ext, "runAsUser"), "65532");
}

/// The plugin may read only the public key's ConfigMap, and a policy
/// limits its node and pod patches to its own node and annotations.
#[test]
fn the_plugin_reads_the_public_key_and_patches_only_its_node() {
    use cgpu_cluster_core::names::*;
    let rbac = read("rbac.yaml");
    let role = rbac
        .split("\n---\n")
        .find(|d| d.contains("kind: Role\n") && d.contains("name: cgpu-device-plugin\n"))
        .expect("the plugin's Role");
    assert!(role.contains(&format!("resourceNames: [{CONFIGMAP_DECISION_KEY}]")));
    assert!(role.contains("verbs: [get]"));
    let policy = rbac
        .split("\n---\n")
        .find(|d| d.contains("kind: ValidatingAdmissionPolicy\n"))
        .expect("the policy");
    assert!(policy.contains("system:serviceaccount:kube-system:cgpu-device-plugin"));
    assert!(policy.contains(&format!("'{ANN_NODE_GPUS}'")));
    assert!(policy.contains(&format!("'{ANN_GPUSHARE_ASSIGNED}'")));
    assert!(policy.contains("authentication.kubernetes.io/node-name"));
}

/// `libcgpu.so` is injected into every job: none of the cluster crates'
/// dependencies may reach it.
#[test]
fn the_interposer_links_no_cluster_crate() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "-p",
            "cgpu",
            "--prefix",
            "none",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("cgpu v")), "{tree}");
    for c in [
        "kube",
        "k8s-openapi",
        "tonic",
        "prost",
        "tokio",
        "axum",
        "hyper",
        "ring",
        "cgpu-cluster",
    ] {
        assert!(
            !tree
                .lines()
                .any(|l| l.starts_with(&format!("{c} v")) || l.starts_with(&format!("{c}-"))),
            "libcgpu.so depends on {c}:\n{tree}"
        );
    }
}

/// The node agent runs beside the plugin: in the host's PID namespace, on
/// the same ledger directory as the plugin hands to containers, with NVML,
/// its status file on the host, and the flags the agent accepts.
#[test]
fn the_agent_runs_beside_the_plugin() {
    let ds = read("device-plugin.yaml");
    assert_eq!(value(&ds, "hostPID"), "true");
    let agent = ds
        .split("- name: agent\n")
        .nth(1)
        .expect("an agent container")
        .split("\n      volumes:")
        .next()
        .unwrap();
    let command: Vec<&str> = value(agent, "command")
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .collect();
    let ledger = cgpu_cluster::device_plugin::PluginConfig::standard("n").ledger_on_host;
    assert_eq!(
        command,
        [
            "cgpu-agent",
            "--secure",
            "--settings-dir",
            "/etc/cgpu/containers",
            "--ledger-dir",
            ledger.to_str().unwrap(),
            "--interval",
            "500ms",
            "--policy",
            "report",
            "--status-file",
            "/run/cgpu-agent/agent.json"
        ]
    );
    assert!(agent.contains("{name: host-run-cgpu, mountPath: /run/cgpu}"));
    assert!(agent.contains("{name: host-run-cgpu-agent, mountPath: /run/cgpu-agent}"));
    // Secure mode: the settings the plugin writes, read-only for the agent;
    // the plugin told to write them and to give containers the ledger
    // directory read-only; the ledger directory root's 0755.
    assert!(agent.contains(
        "{name: host-etc-cgpu-containers, mountPath: /etc/cgpu/containers, readOnly: true}"
    ));
    let plugin = ds.split("- name: device-plugin\n").nth(1).unwrap();
    let plugin = plugin.split("- name: agent\n").next().unwrap();
    assert!(plugin.contains("{name: CGPU_MODE, value: secure}"));
    assert!(plugin.contains("{name: host-etc-cgpu-containers, mountPath: /etc/cgpu/containers}"));
    assert!(ds.contains("install -d -m 0755 /host/run/cgpu"));
    assert!(!ds.contains("1777"));
    assert_eq!(
        cgpu_cluster::device_plugin::PluginConfig::standard("n")
            .settings_dir
            .to_str(),
        Some("/etc/cgpu/containers")
    );
    assert!(agent.contains("{name: NVIDIA_DRIVER_CAPABILITIES, value: utility}"));
    assert!(ds.contains(
        "{name: host-run-cgpu-agent, hostPath: {path: /run/cgpu-agent, type: DirectoryOrCreate}}"
    ));
    // The node image ships the binary.
    let image = read("docker/node.Dockerfile");
    assert!(image.contains("dist/cgpu-agent"));
}

/// `[a, b, c]` (a YAML flow list of plain words) as its items.
fn flow_list(v: &str) -> Vec<String> {
    v.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `{k1: v1, k2: v2}` (a YAML flow map of plain words) as its pairs.
fn flow_map(v: &str) -> Vec<(String, String)> {
    flow_list(&v.trim().replace(['{', '}'], ""))
        .into_iter()
        .filter_map(|kv| {
            let (k, v) = kv.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The DaemonSet's agent container, started as the container runtime
/// would: the real `cgpu-agent` with exactly the manifest's command and
/// environment, each of its volume mounts a directory of its own (paths
/// under a mount point rewritten to it), on the simulated driver. It keeps
/// running, rewrites its status file where the manifest says, and sees a
/// process under the library that uses the ledger directory the device
/// plugin hands to containers. The manifest runs it in secure mode, which
/// runs as root (as the DaemonSet's container does): so does this test.
#[test]
fn the_agent_starts_with_the_manifests_flags() {
    use cgpu_testkit::{artifacts, cuclient, read_until, LinkMode, SimEnv};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let ds = read("device-plugin.yaml");
    let agent = ds
        .split("- name: agent\n")
        .nth(1)
        .expect("an agent container")
        .split("\n      volumes:")
        .next()
        .unwrap();
    let command = flow_list(value(agent, "command"));
    let env: Vec<(String, String)> = agent
        .split("\n        env:\n")
        .nth(1)
        .map(|rest| {
            rest.lines()
                .take_while(|l| l.starts_with("        - {"))
                .map(|l| {
                    let m = flow_map(l.trim_start().trim_start_matches("- "));
                    let get = |k: &str| m.iter().find(|(x, _)| x == k).unwrap().1.clone();
                    (get("name"), get("value"))
                })
                .collect()
        })
        .unwrap_or_default();
    let mounts: Vec<String> = agent
        .split("\n        volumeMounts:\n")
        .nth(1)
        .expect("the agent's volume mounts")
        .lines()
        .take_while(|l| l.starts_with("        - {"))
        .map(|l| {
            let m = flow_map(l.trim_start().trim_start_matches("- "));
            m.iter().find(|(k, _)| k == "mountPath").unwrap().1.clone()
        })
        .collect();
    let root = std::env::temp_dir().join(format!("cgpu-agent-ds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mapped = |path: &str| -> String {
        let m = mounts
            .iter()
            .filter(|m| path == m.as_str() || path.starts_with(&format!("{m}/")))
            .max_by_key(|m| m.len());
        match m {
            Some(m) => format!(
                "{}{}",
                root.join(m.trim_start_matches('/').replace('/', "_"))
                    .display(),
                &path[m.len()..]
            ),
            None => path.to_string(),
        }
    };
    for m in &mounts {
        std::fs::create_dir_all(mapped(m)).unwrap();
    }
    let args: Vec<String> = command[1..].iter().map(|a| mapped(a)).collect();
    let status_file = args
        .iter()
        .position(|a| a == "--status-file")
        .map(|i| args[i + 1].clone())
        .expect("the agent writes a status file");
    let ledger = mapped(
        cgpu_cluster::device_plugin::PluginConfig::standard("n")
            .ledger_on_host
            .to_str()
            .unwrap(),
    );

    let sim = SimEnv::new().gpus("16160:Tesla V100-SXM2-16GB");
    let a = artifacts();
    let mut agent = sim
        .command(a.profile_dir.join(&command[0]))
        .args(&args)
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the agent");
    // Secure mode: the agent serves its socket before containers use it.
    let secure = args.iter().any(|a| a == "--secure");
    let t0 = Instant::now();
    while secure && !std::path::Path::new(&format!("{ledger}/agent.sock")).exists() {
        if let Ok(Some(st)) = agent.try_wait() {
            let o = agent.wait_with_output().unwrap();
            panic!(
                "the agent exited ({st}) with the manifest's flags {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no agent.sock");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A container's process as the device plugin sets it up: the library,
    // the ledger directory, a 1 GiB quota; it holds 256 MiB. In secure mode
    // the quota is the host's settings for the container (in the agent's
    // --settings-dir), the container the one its cgroup names.
    let cid = format!("{:08x}{}", std::process::id(), "f".repeat(56));
    let cgroup = std::path::PathBuf::from(format!(
        "{}/cgpu-ds-{}",
        cgpu_testkit::cgroup_root(),
        std::process::id()
    ));
    if secure {
        let dir = args
            .iter()
            .position(|a| a == "--settings-dir")
            .map(|i| args[i + 1].clone())
            .expect("secure mode names its settings directory");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            format!("{dir}/{cid}.env"),
            "ALIYUN_COM_GPU_MEM_CONTAINER=1\n",
        )
        .unwrap();
        std::fs::create_dir_all(cgroup.join(&cid)).expect("create a cgroup (root)");
    }
    // Removed when the test ends, whichever way (after the process below).
    struct Rmdir(Vec<std::path::PathBuf>);
    impl Drop for Rmdir {
        fn drop(&mut self) {
            for d in &self.0 {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
    let _cgroups = Rmdir(vec![cgroup.join(&cid), cgroup.clone()]);
    let mut proc = sim
        .command("sh")
        .args(["-c", "read go && exec \"$0\" \"$@\""])
        .arg(cuclient(LinkMode::Link))
        .env("LD_PRELOAD", &a.libcgpu)
        .env("CGPU_LEDGER_DIR", &ledger)
        .env("CGPU_CONTAINER_ID", "default/p/main")
        .env("ALIYUN_COM_GPU_MEM_CONTAINER", "1")
        .env("CUCLIENT_HOLD_MAX_S", "120")
        .args(["alloc", &(256u64 << 20).to_string(), "hold"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    if secure {
        std::fs::write(
            cgroup.join(&cid).join("cgroup.procs"),
            proc.id().to_string(),
        )
        .unwrap();
    }
    {
        use std::io::Write;
        writeln!(proc.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let lines = read_until(&mut proc, "holding", Duration::from_secs(120));
    assert!(lines.iter().any(|l| l.starts_with("alloc ok")), "{lines:?}");
    let pid = u64::from(proc.id());

    let read_status = || -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(&status_file).ok()?).ok()
    };
    let sees = |d: &serde_json::Value| {
        let g = &d["gpus"][0];
        g["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["processes"].as_array().into_iter().flatten())
            .chain(g["outside_containers"].as_array().into_iter().flatten())
            .any(|p| p["pid"] == pid && p["bytes"].as_u64() >= Some(256 << 20))
    };
    let t0 = Instant::now();
    let first = loop {
        if let Some(d) = read_status().filter(|d| sees(d)) {
            break d;
        }
        if let Ok(Some(st)) = agent.try_wait() {
            let o = agent.wait_with_output().unwrap();
            panic!(
                "the agent exited ({st}) with the manifest's flags {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the agent never showed pid {pid} in {status_file}: {:?}",
            read_status()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(first["ledger_dir"], ledger.as_str(), "{first}");
    assert_eq!(
        first["gpus"][0]["ledger"]
            .as_str()
            .map(|l| l.starts_with(&ledger)),
        Some(true),
        "{first}"
    );
    assert!(
        first["gpus"][0]["uuid"]
            .as_str()
            .is_some_and(|u| u.starts_with("GPU-")),
        "{first}"
    );
    assert_eq!(first["over"], 0, "{first}");
    // Secure mode: it serves the socket containers ask it on, in the
    // ledger directory it keeps root's and 0755, its ledger root's 0644.
    {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let sock = std::fs::metadata(format!("{ledger}/agent.sock")).expect("agent.sock");
        assert!(sock.file_type().is_socket());
        let dir = std::fs::metadata(&ledger).unwrap();
        assert_eq!((dir.uid(), dir.mode() & 0o7777), (0, 0o755));
        let l = std::fs::metadata(first["gpus"][0]["ledger"].as_str().unwrap()).unwrap();
        assert_eq!((l.uid(), l.mode() & 0o7777), (0, 0o644));
    }
    // It runs as a service: later passes rewrite the file.
    let t0 = Instant::now();
    while read_status().map(|d| d["time_ns"].clone()) == Some(first["time_ns"].clone()) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the status file is not rewritten"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        agent.try_wait().unwrap().is_none(),
        "the agent keeps running"
    );
    let _ = agent.kill();
    let _ = agent.wait();
    let _ = proc.kill();
    let _ = proc.wait();
    let _ = std::fs::remove_dir_all(&root);
}

/// Cooperative mode stays one documented switch away: the component
/// deploy/cooperative runs the same agent without `--secure` (and its
/// settings directory), the plugin in cooperative mode, and the ledger
/// directory world-writable and sticky; it is named, commented out, in
/// deploy/kustomization.yaml.
#[test]
fn cooperative_mode_is_the_same_deployment_without_secure() {
    let ds = read("device-plugin.yaml");
    let coop = read("cooperative/kustomization.yaml");
    assert!(coop.contains("kind: Component"));
    let agent = ds.split("- name: agent\n").nth(1).unwrap();
    let secure = flow_list(value(agent, "command"));
    let plain: Vec<String> = coop
        .lines()
        .filter(|l| l.trim_start().starts_with("value: [cgpu-agent"))
        .map(|l| flow_list(l.trim_start().trim_start_matches("value:")))
        .next()
        .expect("the cooperative agent's command");
    let mut expect = secure.clone();
    let i = expect.iter().position(|a| a == "--secure").unwrap();
    expect.drain(i..i + 3);
    assert_eq!(
        secure[i + 1..i + 3],
        ["--settings-dir", "/etc/cgpu/containers"]
    );
    assert_eq!(plain, expect);
    // The init container's command, but for the directory's mode.
    let init = |t: &str| -> String {
        let l = t
            .lines()
            .find(|l| l.contains("install -D -m 0755 /opt/cgpu/libcgpu.so"))
            .unwrap();
        l[l.find('[').unwrap()..].to_string()
    };
    assert_eq!(
        init(&coop),
        init(&ds).replace("install -d -m 0755", "install -d -m 1777")
    );
    assert!(coop.contains("value: cooperative"));
    assert!(coop.contains("value: [SYS_PTRACE, KILL]"));
    let k = read("kustomization.yaml");
    assert!(k.contains("#components:\n#- cooperative"), "{k}");
}

/// The `ExecStart` of deploy/cgpu-agent.service: the active one
/// (`commented` false) or the commented one, as its words.
fn exec_start(unit: &str, commented: bool) -> Vec<String> {
    let prefix = if commented {
        "#ExecStart="
    } else {
        "ExecStart="
    };
    let mut lines = unit.lines().skip_while(|l| !l.starts_with(prefix));
    let mut text = String::new();
    for l in lines.by_ref() {
        let l = if commented {
            l.trim_start_matches('#')
        } else {
            l
        };
        let cont = l.trim_end().ends_with('\\');
        text.push_str(l.trim_end().trim_end_matches('\\'));
        text.push(' ');
        if !cont {
            break;
        }
    }
    text.trim_start_matches("ExecStart=")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The host deployment's two files agree, in each mode: the ledger
/// directory the tmpfiles line makes is one the unit's agent runs on. The
/// real agent is started with each `ExecStart` (paths under a scratch
/// root, `${CGPU_AGENT_POLICY}` as the unit's Environment gives it) on a
/// directory made with the matching tmpfiles line's mode: secure (as
/// shipped) on 0755 serves its socket; cooperative (the commented lines)
/// on 1777 writes its status; and the secure agent refuses the cooperative
/// directory, which is why the two lines go together. Runs as root (as
/// the unit does).
#[test]
fn the_host_files_agree_in_each_mode() {
    use std::os::unix::fs::PermissionsExt;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let tmpfiles = read("host/cgpu.tmpfiles.conf");
    let unit = read("cgpu-agent.service");
    let line = |commented: bool| -> (String, u32) {
        let l = tmpfiles
            .lines()
            .find(|l| {
                let l2 = l.strip_prefix('#').unwrap_or(l);
                l.starts_with('#') == commented && l2.starts_with("d /run/cgpu ")
            })
            .unwrap_or_else(|| {
                panic!(
                    "no {} /run/cgpu line",
                    if commented { "commented" } else { "active" }
                )
            });
        let w: Vec<&str> = l.trim_start_matches('#').split_whitespace().collect();
        assert_eq!(&w[3..5], ["root", "root"], "{l}");
        (w[1].to_string(), u32::from_str_radix(w[2], 8).unwrap())
    };
    assert_eq!(line(false), ("/run/cgpu".to_string(), 0o755));
    assert_eq!(line(true), ("/run/cgpu".to_string(), 0o1777));
    assert!(tmpfiles.contains("\nd /etc/cgpu/containers 0755 root root -\n"));
    let secure = exec_start(&unit, false);
    let coop = exec_start(&unit, true);
    assert!(secure.contains(&"--secure".to_string()), "{secure:?}");
    assert!(!coop.contains(&"--secure".to_string()), "{coop:?}");
    let policy = unit
        .lines()
        .find_map(|l| l.strip_prefix("Environment=CGPU_AGENT_POLICY="))
        .expect("the unit's policy")
        .to_string();

    let a = cgpu_testkit::artifacts();
    let run = |args: &[String], mode: u32, tag: &str| -> (bool, String, std::path::PathBuf) {
        let root = std::env::temp_dir().join(format!("cgpu-host-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let map = |p: &str| {
            if p.starts_with('/') && !p.starts_with("/usr/local/bin/") {
                format!("{}{p}", root.display())
            } else {
                p.replace("${CGPU_AGENT_POLICY}", &policy)
            }
        };
        let ledger = root.join("run/cgpu");
        std::fs::create_dir_all(&ledger).unwrap();
        std::fs::create_dir_all(root.join("etc/cgpu/containers")).unwrap();
        std::fs::create_dir_all(root.join("run/cgpu-agent")).unwrap();
        std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(mode)).unwrap();
        let bin = args[0].rsplit('/').next().unwrap();
        let sim = cgpu_testkit::SimEnv::new().gpus("16160:Tesla V100-SXM2-16GB");
        let mut agent = sim
            .command(a.profile_dir.join(bin))
            .args(args[1..].iter().map(|s| map(s)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = root.join("run/cgpu-agent/agent.json");
        let t0 = Instant::now();
        let running = loop {
            if status.exists() {
                break true;
            }
            if agent.try_wait().unwrap().is_some() {
                break false;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "{tag}: no status file, no exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = agent.kill();
        let out = agent.wait_with_output().unwrap();
        (
            running,
            String::from_utf8_lossy(&out.stderr).into_owned(),
            root,
        )
    };
    let (ok, log, root) = run(&secure, 0o755, "secure");
    assert!(ok, "the shipped pair: {log}");
    assert!(root.join("run/cgpu/agent.sock").exists(), "{log}");
    let _ = std::fs::remove_dir_all(&root);
    let (ok, log, root) = run(&coop, 0o1777, "coop");
    assert!(ok, "the cooperative pair: {log}");
    assert!(!root.join("run/cgpu/agent.sock").exists());
    let _ = std::fs::remove_dir_all(&root);
    let (ok, log, root) = run(&secure, 0o1777, "mixed");
    assert!(!ok, "secure mode ran on a directory others can write");
    assert!(log.contains("writable by others"), "{log}");
    let _ = std::fs::remove_dir_all(&root);
}
