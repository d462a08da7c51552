//! End to end on the simulated driver: the test API server, the scheduler
//! extender (called as kube-scheduler calls it), the real
//! `cgpu-device-plugin` binary reading the simulated GPUs through NVML, the
//! kubelet double, and container processes under `libcgpu.so`.

mod support;

use cgpu_cluster::extender::Extender;
use cgpu_cluster::signing::DecisionKey;
use cgpu_cluster_core::decision::Decision;
use cgpu_cluster_core::placement::Policy;
use cgpu_cluster_testkit::apiserver::ApiServer;
use cgpu_testkit::secure::{self as rig, AgentClient, Cgroups, SecureAgent};
use cgpu_testkit::{artifacts, cuclient, field, line, LinkMode, SimEnv};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;
use support::kubelet::{Kubelet, Started};

const KEY: &[u8] = b"e2e decision key: 32 bytes long!";
const NODE: &str = "gpu-node-1";
const V100: &str = "16160:Tesla V100-SXM2-16GB";

struct Cluster {
    api: ApiServer,
    dir: PathBuf,
    sim: SimEnv,
    kubelet: Kubelet,
    plugin: Option<Child>,
    extender: Arc<Extender>,
    ext_url: String,
    /// Environment the plugin is started with, besides the layout's.
    plugin_env: Vec<(String, String)>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut p) = self.plugin.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cgpu-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Cluster {
    async fn new(name: &str, gpus: &[&str], labels: Value) -> Cluster {
        Cluster::with_kubelet(name, gpus, labels, false).await
    }

    /// `old_kubelet`: the kubelet dials plugins with the socket path as
    /// `:authority` (kubelets before 1.26).
    async fn with_kubelet(name: &str, gpus: &[&str], labels: Value, old_kubelet: bool) -> Cluster {
        Cluster::build(name, gpus, labels, old_kubelet, &[]).await
    }

    async fn build(
        name: &str,
        gpus: &[&str],
        labels: Value,
        old_kubelet: bool,
        plugin_env: &[(&str, &str)],
    ) -> Cluster {
        let dir = scratch(name);
        let api = ApiServer::start().await;
        api.write_kubeconfig(&dir.join("kubeconfig"));
        std::fs::write(dir.join("key"), KEY).unwrap();
        api.put("nodes", json!({"metadata": {"name": NODE, "labels": labels},
                                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.11"}]}}));
        let sim = SimEnv::new().gpus(&gpus.join(","));
        let kubelet = if old_kubelet {
            Kubelet::start_old(&dir.join("device-plugins")).await
        } else {
            Kubelet::start(&dir.join("device-plugins")).await
        };
        let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
        let extender = Extender::new(
            client,
            DecisionKey::from_bytes(KEY).unwrap(),
            Policy::Binpack,
        );
        // The plugin holds no signing key: it verifies with the public key
        // the extender publishes.
        extender.publish_public_key("kube-system").await.unwrap();
        extender.spawn_watches();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ext_url = listener.local_addr().unwrap().to_string();
        let router = extender.router();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        let mut c = Cluster {
            api,
            dir,
            sim,
            kubelet,
            plugin: None,
            extender,
            ext_url,
            plugin_env: plugin_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        c.start_plugin();
        c
    }

    fn start_plugin(&mut self) {
        let a = artifacts();
        let child = self
            .sim
            .command(a.bin("cgpu-device-plugin"))
            .env("NODE_NAME", NODE)
            .env("KUBECONFIG", self.dir.join("kubeconfig"))
            .env("CGPU_KUBELET_DIR", &self.kubelet.dir)
            .env("CGPU_POD_RESOURCES_SOCKET", &self.kubelet.pod_resources)
            .env("CGPU_LIBRARY", &a.libcgpu)
            .env("CGPU_LEDGER_DIR", self.dir.join("ledger"))
            .env("CGPU_ALLOC_DIR", self.dir.join("alloc"))
            .env("CGPU_CDI_DIR", &self.kubelet.cdi_dir)
            .env("CGPU_LOG", "warn")
            .envs(self.plugin_env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cgpu-device-plugin");
        std::fs::create_dir_all(self.dir.join("ledger")).unwrap();
        self.plugin = Some(child);
    }

    fn kill_plugin(&mut self) {
        if let Some(mut p) = self.plugin.take() {
            p.kill().unwrap();
            p.wait().unwrap();
        }
    }

    /// Waits for the plugin's devices and the extender's view of the node.
    async fn ready(&self, gib: usize) {
        let devs = self
            .kubelet
            .devices("aliyun.com/gpu-mem", Duration::from_secs(60))
            .await;
        assert_eq!(devs.len(), gib);
        for _ in 0..6000 {
            if self.extender.ready() && self.extender.metrics.nodes.get() == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the extender never saw the node's GPUs");
    }

    fn pod(&self, name: &str, containers: Value, gpu_count: u32) -> Value {
        self.api.put(
            "pods",
            json!({"metadata": {"name": name, "namespace": "default", "labels": {"aliyun.com/gpu-count": gpu_count.to_string()}},
                   "spec": {"containers": containers}}),
        )
    }

    /// kube-scheduler's part: filter, then bind through the extender.
    async fn schedule(&self, pod: &Value) -> Result<(), String> {
        let f = post(
            &self.ext_url,
            "/filter",
            &json!({"Pod": pod, "NodeNames": [NODE]}),
        )
        .await;
        if f["NodeNames"] != json!([NODE]) {
            return Err(format!("filtered out: {f}"));
        }
        let b = post(
            &self.ext_url,
            "/bind",
            &json!({"PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": NODE}),
        )
        .await;
        match b["Error"].as_str() {
            Some("") => Ok(()),
            other => Err(format!("bind: {other:?}")),
        }
    }

    fn get(&self, name: &str) -> Value {
        self.api.get("pods", "default", name).unwrap()
    }

    /// The kubelet's part for one single-container pod: admit, start.
    async fn run_pod(&self, name: &str, container: &str) -> Result<Started, String> {
        let pod = self.get(name);
        let alloc = self.kubelet.admit(&pod).await?;
        self.kubelet
            .start_container(&pod, container, &alloc[container])
            .await
    }

    /// A process in the container: cuclient with the container's environment.
    fn exec(&self, started: &Started, args: &[&str]) -> String {
        let mut cmd = self.sim.command(cuclient(LinkMode::Link));
        for (k, v) in started.env_on_host() {
            cmd.env(k, v);
        }
        let out = cmd.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "cuclient {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

async fn post(addr: &str, path: &str, body: &Value) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf);
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn mib(bytes: &str) -> u64 {
    bytes.parse::<u64>().unwrap() >> 20
}

fn gpu_container(name: &str, gib: u64) -> Value {
    json!({"name": name, "resources": {"limits": {"aliyun.com/gpu-mem": gib.to_string()}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_000_two_v100s_give_two_gpus_of_4309_mib() {
    let c = Cluster::new("seed000", &[V100, V100], json!({})).await;
    c.ready(30).await;
    let pod = c.pod(
        "tensorflow-mnist-multigpu",
        json!([gpu_container("tf", 8)]),
        2,
    );
    c.schedule(&pod).await.unwrap();
    let started = c.run_pod("tensorflow-mnist-multigpu", "tf").await.unwrap();
    assert_eq!(
        c.kubelet
            .calls()
            .iter()
            .filter(|s| !s.starts_with("Register") && !s.starts_with("ListAndWatch"))
            .cloned()
            .collect::<Vec<_>>(),
        [
            "Allocate default/tensorflow-mnist-multigpu/tf",
            "PreStartContainer default/tensorflow-mnist-multigpu/tf"
        ]
    );
    let file =
        std::fs::read_to_string(started.host_path(&started.envs["CGPU_ALLOC_FILE"])).unwrap();
    assert!(file.starts_with("CGPU_CONTAINER_ID=default/tensorflow-mnist-multigpu/tf\nALIYUN_COM_GPU_MEM_CONTAINER=4,4\nALIYUN_COM_GPU_MEM_DEV=15\n"), "{file}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(started.host_path(&started.envs["CGPU_ALLOC_FILE"]))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o222, 0, "the allocation file is writable");
    assert!(started
        .mounts
        .iter()
        .any(|m| m.container_path == started.envs["CGPU_ALLOC_FILE"] && m.read_only));
    // The plugin labelled the node with its GPUs' model and memory.
    let node = c.api.get("nodes", "", NODE).unwrap();
    assert_eq!(
        node["metadata"]["labels"]["cgpu.io/gpu-model"],
        "Tesla-V100-SXM2-16GB"
    );
    assert_eq!(
        node["metadata"]["labels"]["cgpu.io/gpu-memory-mib"],
        "16160"
    );
    // The runtime is told the pod's two GPUs, not all of the node's.
    let d = Decision::from_pod(&c.get("tensorflow-mnist-multigpu")).unwrap();
    let uuids: Vec<&str> = d.gpus.iter().map(|g| g.uuid.as_str()).collect();
    assert_eq!(uuids.len(), 2);
    assert_eq!(started.envs["NVIDIA_VISIBLE_DEVICES"], uuids.join(","));
    // /etc/ld.so.preload names the library as the container sees it, so a
    // program that clears LD_PRELOAD still loads it.
    assert!(started
        .mounts
        .iter()
        .any(|m| m.container_path == "/etc/ld.so.preload" && m.read_only));
    assert_eq!(
        std::fs::read_to_string(started.host_path("/etc/ld.so.preload")).unwrap(),
        format!("{}\n", started.envs["LD_PRELOAD"])
    );

    // The container's process sees two GPUs of 4309 MiB.
    let out = c.exec(&started, &["devcount", "meminfo"]);
    assert_eq!(field(line(&out, "devcount"), "n"), Some("2"), "{out}");
    assert_eq!(
        mib(field(line(&out, "meminfo"), "total").unwrap()),
        4309,
        "{out}"
    );
    let out = c.exec(&started, &["-d", "1", "meminfo", "nvml_count"]);
    assert_eq!(
        mib(field(line(&out, "meminfo"), "total").unwrap()),
        4309,
        "{out}"
    );
    assert_eq!(field(line(&out, "nvml_count"), "n"), Some("2"), "{out}");
    // ... and gets CUDA_ERROR_OUT_OF_MEMORY (2) past it.
    let out = c.exec(&started, &["alloc_until_oom", "67108864"]);
    let l = line(&out, "alloc_until_oom");
    assert_eq!(field(l, "err"), Some("2"), "{out}");
    assert!(mib(field(l, "bytes").unwrap()) <= 4309, "{out}");

    // cgpu-smi shows it under its pod's id while it holds memory.
    let mut cmd = c.sim.command(cuclient(LinkMode::Link));
    for (k, v) in started.env_on_host() {
        cmd.env(k, v);
    }
    let mut holder = cmd
        .args(["alloc", "1073741824", "ready", "hold"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = cgpu_testkit::read_until(&mut holder, "ready", Duration::from_secs(60));
    assert!(seen.iter().any(|l| l.starts_with("alloc ok")), "{seen:?}");
    let smi = c
        .sim
        .command(artifacts().bin("cgpu-smi"))
        .env("CGPU_LEDGER_DIR", c.dir.join("ledger"))
        .args(["--json", "--instant"])
        .output()
        .unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    let doc: Value = serde_json::from_slice(&smi.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&smi.stdout)));
    let rows: Vec<(String, u64)> = doc["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            g["gpu"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|ct| {
            (
                ct["id"].as_str().unwrap().to_string(),
                ct["quota_bytes"].as_u64().unwrap() >> 20,
            )
        })
        .collect();
    assert!(
        rows.contains(&("default/tensorflow-mnist-multigpu/tf".to_string(), 4309)),
        "{rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_extender_or_with_a_forged_decision_no_gpu_memory() {
    let c = Cluster::new("forged", &[V100, V100], json!({})).await;
    c.ready(30).await;
    // Bound straight to the node (spec.nodeName), no extender.
    c.api.put(
        "pods",
        json!({"metadata": {"name": "direct", "namespace": "default"},
               "spec": {"nodeName": NODE, "containers": [gpu_container("main", 4)]}, "status": {"phase": "Pending"}}),
    );
    let err = c.run_pod("direct", "main").await.unwrap_err();
    assert!(
        err.contains("holds no decision from cgpu-scheduler-extender"),
        "{err}"
    );
    // ... and a Warning event on the pod says so.
    let events = c.api.list("events");
    let ev = events
        .iter()
        .find(|e| e["involvedObject"]["name"] == "direct")
        .unwrap_or_else(|| panic!("no event for the pod: {events:?}"));
    assert_eq!(ev["reason"], "CgpuAllocationRefused");
    assert_eq!(ev["type"], "Warning");
    // Timestamps, so `kubectl describe` shows the event's age.
    for t in ["firstTimestamp", "lastTimestamp"] {
        let v = ev[t].as_str().unwrap_or_else(|| panic!("no {t}: {ev}"));
        assert!(v.starts_with("20") && v.ends_with('Z'), "{t}={v}");
    }
    assert!(
        ev["eventTime"].as_str().is_some_and(|v| v.contains('.')),
        "{ev}"
    );
    assert!(
        ev["message"]
            .as_str()
            .unwrap()
            .contains("gets no GPU memory"),
        "{ev}"
    );

    // A decision written by hand: right shape, wrong signature.
    let honest = c.pod("honest", json!([gpu_container("main", 2)]), 1);
    c.schedule(&honest).await.unwrap();
    let mut forged: Decision = Decision::from_pod(&c.get("honest")).unwrap();
    let p = c.api.put(
        "pods",
        json!({"metadata": {"name": "forger", "namespace": "default"},
               "spec": {"nodeName": NODE, "containers": [gpu_container("main", 15)]}, "status": {"phase": "Pending"}}),
    );
    forged.pod_uid = p["metadata"]["uid"].as_str().unwrap().into();
    forged.containers.insert("main".into(), 15);
    forged.per_gpu = 15;
    DecisionKey::from_bytes(b"the attacker's own key, 16+ bytes")
        .unwrap()
        .sign(&mut forged);
    c.api.patch("pods", "default", "forger", &json!({"metadata": {"annotations": {"cgpu.io/allocation": serde_json::to_string(&forged).unwrap()}}}));
    let err = c.run_pod("forger", "main").await.unwrap_err();
    assert!(
        err.contains("not signed by cgpu-scheduler-extender"),
        "{err}"
    );

    // Another pod's genuine decision copied over.
    c.api.put(
        "pods",
        json!({"metadata": {"name": "copycat", "namespace": "default",
                            "annotations": {"cgpu.io/allocation": c.get("honest")["metadata"]["annotations"]["cgpu.io/allocation"]}},
               "spec": {"nodeName": NODE, "containers": [gpu_container("main", 2)]}, "status": {"phase": "Pending"}}),
    );
    let err = c.run_pod("copycat", "main").await.unwrap_err();
    assert!(err.contains("was made for pod uid"), "{err}");

    // Had a runtime started such a container anyway (its Allocate
    // environment, no allocation file), its processes see no GPU.
    let never = Started {
        envs: c
            .kubelet
            .admit(
                &json!({"metadata": {"name": "ghost", "namespace": "default"},
                                        "spec": {"containers": [gpu_container("main", 1)]}}),
            )
            .await
            .unwrap()["main"]
            .envs
            .clone()
            .into_iter()
            .collect(),
        mounts: Vec::new(),
    };
    // ... and the runtime no GPU device (no CDI spec: not even created).
    assert_eq!(never.envs["NVIDIA_VISIBLE_DEVICES"], "none");
    let mut cmd = c.sim.command(cuclient(LinkMode::Link));
    for (k, v) in never.env_on_host() {
        cmd.env(k, v);
    }
    let out = cmd.args(["devcount"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().any(|l| l == "devcount ok n=0"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no GPU is visible"));

    // The honest pod runs.
    let started = c.run_pod("honest", "main").await.unwrap();
    let out = c.exec(&started, &["devcount", "meminfo"]);
    assert_eq!(field(line(&out, "devcount"), "n"), Some("1"), "{out}");
    assert_eq!(
        mib(field(line(&out, "meminfo"), "total").unwrap()),
        2154,
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_pods_admitted_in_random_order_each_get_their_own() {
    let gpus = [V100; 8];
    let c = Cluster::new("hundred", &gpus, json!({})).await;
    c.ready(120).await;
    let mut names: Vec<String> = (0..100).map(|i| format!("p{i:03}")).collect();
    for n in &names {
        let pod = c.pod(n, json!([gpu_container("main", 1)]), 1);
        c.schedule(&pod).await.unwrap();
    }
    // Admission and starts in an order unrelated to scheduling.
    let mut seed = 12345u64;
    let mut shuffle = |v: &mut Vec<String>| {
        for i in (1..v.len()).rev() {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            v.swap(i, (seed >> 33) as usize % (i + 1));
        }
    };
    shuffle(&mut names);
    let mut allocs = Vec::new();
    for n in &names {
        let pod = c.get(n);
        allocs.push((n.clone(), c.kubelet.admit(&pod).await.unwrap()));
    }
    shuffle(&mut names);
    let mut per_gpu: std::collections::BTreeMap<String, u64> = Default::default();
    for n in &names {
        let pod = c.get(n);
        let a = &allocs.iter().find(|(m, _)| m == n).unwrap().1["main"];
        let s = c.kubelet.start_container(&pod, "main", a).await.unwrap();
        let file = std::fs::read_to_string(s.host_path(&s.envs["CGPU_ALLOC_FILE"])).unwrap();
        let d = Decision::from_pod(&pod).unwrap();
        let uuid = d.gpus[0].uuid.clone();
        assert_eq!(
            file,
            format!("CGPU_CONTAINER_ID=default/{n}/main\nALIYUN_COM_GPU_MEM_CONTAINER=1\nALIYUN_COM_GPU_MEM_DEV=15\nALIYUN_COM_GPU_VISIBLE_DEVICES={uuid}\n")
        );
        assert_eq!(s.envs["NVIDIA_VISIBLE_DEVICES"], uuid);
        *per_gpu.entry(uuid).or_default() += 1;
    }
    // Binpack filled GPUs one after another: 15 + 15 + ... + 10.
    let mut counts: Vec<u64> = per_gpu.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, [10, 15, 15, 15, 15, 15, 15]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_and_kubelet_restarts_lose_nothing() {
    let mut c = Cluster::new(
        "restarts",
        &[V100, V100],
        json!({"ack.node.gpu.schedule": "share"}),
    )
    .await;
    c.ready(30).await;
    let a = c.pod("a", json!([gpu_container("main", 3)]), 1);
    c.schedule(&a).await.unwrap();
    let pod_a = c.get("a");
    let alloc_a = c.kubelet.admit(&pod_a).await.unwrap();
    let first = c
        .kubelet
        .start_container(&pod_a, "main", &alloc_a["main"])
        .await
        .unwrap();
    let file =
        |s: &Started| std::fs::read_to_string(s.host_path(&s.envs["CGPU_ALLOC_FILE"])).unwrap();
    let before = file(&first);
    // Nodes labelled for sharing without isolation: CGPU_DISABLE=true.
    assert!(before.ends_with("CGPU_DISABLE=true\n"), "{before}");

    // The plugin restarts: it registers again and the container's next
    // start gets the same allocation. A file left by a pod that went away
    // meanwhile is removed.
    c.kill_plugin();
    let stale = c.dir.join("alloc/0123456789abcdef01234567.env");
    std::fs::write(&stale, "CGPU_CONTAINER_ID=gone\n").unwrap();
    c.start_plugin();
    let registers = |c: &Cluster| {
        c.kubelet
            .calls()
            .iter()
            .filter(|s| *s == "Register aliyun.com/gpu-mem")
            .count()
    };
    for _ in 0..3000 {
        if registers(&c) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(registers(&c), 2);
    c.ready(30).await;
    let again = c
        .kubelet
        .start_container(&pod_a, "main", &alloc_a["main"])
        .await
        .unwrap();
    assert_eq!(file(&again), before);
    assert!(!stale.exists(), "stale allocation file left");

    // The kubelet restarts (removing the plugin's sockets): the plugin
    // registers a third time; old allocations still resolve, new pods run.
    c.kubelet.restart().await;
    let devs = c
        .kubelet
        .devices("aliyun.com/gpu-mem", Duration::from_secs(60))
        .await;
    assert_eq!(devs.len(), 30);
    assert_eq!(registers(&c), 3);
    let again = c
        .kubelet
        .start_container(&pod_a, "main", &alloc_a["main"])
        .await
        .unwrap();
    assert_eq!(file(&again), before);
    let b = c.pod("b", json!([gpu_container("main", 12)]), 1);
    c.schedule(&b).await.unwrap();
    let started = c.run_pod("b", "main").await.unwrap();
    let d_a = Decision::from_pod(&c.get("a")).unwrap();
    let d_b = Decision::from_pod(&c.get("b")).unwrap();
    assert_eq!(
        d_a.gpus[0].index, d_b.gpus[0].index,
        "binpack: 3 + 12 on one GPU"
    );
    assert!(file(&started).contains("ALIYUN_COM_GPU_MEM_CONTAINER=12\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_container_of_a_pod_gets_its_own_share_of_the_same_gpus() {
    let c = Cluster::new(
        "multi",
        &[V100, V100, V100],
        json!({"cgpu.io/gpu-mem-dev": "16"}),
    )
    .await;
    c.ready(48).await;
    let pod = c.pod(
        "two-containers",
        json!([gpu_container("trainer", 6), {"name": "sidecar"}, gpu_container("eval", 2)]),
        2,
    );
    c.schedule(&pod).await.unwrap();
    let pod = c.get("two-containers");
    let d = Decision::from_pod(&pod).unwrap();
    assert_eq!(d.per_gpu, 4);
    let uuids: Vec<String> = d.gpus.iter().map(|g| g.uuid.clone()).collect();
    let alloc = c.kubelet.admit(&pod).await.unwrap();
    // No Allocate for a container that asks for no GPU memory.
    assert_eq!(alloc.keys().collect::<Vec<_>>(), ["eval", "trainer"]);
    for (container, share) in [("eval", 1), ("trainer", 3)] {
        let s = c
            .kubelet
            .start_container(&pod, container, &alloc[container])
            .await
            .unwrap();
        let file = std::fs::read_to_string(s.host_path(&s.envs["CGPU_ALLOC_FILE"])).unwrap();
        assert_eq!(
            file,
            format!(
                "CGPU_CONTAINER_ID=default/two-containers/{container}\nALIYUN_COM_GPU_MEM_CONTAINER={share},{share}\n\
                 ALIYUN_COM_GPU_MEM_DEV=16\nALIYUN_COM_GPU_VISIBLE_DEVICES={}\n",
                uuids.join(",")
            )
        );
        // 16160 MiB counted as 16 GiB: a 3 GiB share shows 3030 MiB.
        let out = c.exec(&s, &["devcount", "meminfo"]);
        assert_eq!(field(line(&out, "devcount"), "n"), Some("2"), "{out}");
        assert_eq!(
            mib(field(line(&out, "meminfo"), "total").unwrap()),
            16160 * share / 16,
            "{out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_uuids_that_changed_since_scheduling_still_resolve() {
    let c = Cluster::new("uuids", &[V100, V100], json!({})).await;
    c.ready(30).await;
    let pod = c.pod("old-uuids", json!([gpu_container("main", 8)]), 2);
    c.schedule(&pod).await.unwrap();
    // As if the node had other UUIDs when the extender decided (a cloud
    // instance stopped and started): same indices and sizes.
    let mut d = Decision::from_pod(&c.get("old-uuids")).unwrap();
    let now: Vec<String> = d.gpus.iter().map(|g| g.uuid.clone()).collect();
    for g in &mut d.gpus {
        g.uuid = format!("GPU-00000000-0000-0000-0000-00000000000{}", g.index);
    }
    DecisionKey::from_bytes(KEY).unwrap().sign(&mut d);
    c.api.patch(
        "pods",
        "default",
        "old-uuids",
        &json!({"metadata": {"annotations": {"cgpu.io/allocation": serde_json::to_string(&d).unwrap()}}}),
    );
    let s = c.run_pod("old-uuids", "main").await.unwrap();
    let file = std::fs::read_to_string(s.host_path(&s.envs["CGPU_ALLOC_FILE"])).unwrap();
    assert!(
        file.contains(&format!(
            "ALIYUN_COM_GPU_VISIBLE_DEVICES={}\n",
            now.join(",")
        )),
        "{file}"
    );
    let out = c.exec(&s, &["devcount"]);
    assert_eq!(field(line(&out, "devcount"), "n"), Some("2"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_container_gets_its_own_share_though_podresources_does_not_list_it() {
    let c = Cluster::new("init", &[V100], json!({})).await;
    c.ready(15).await;
    c.api.put(
        "pods",
        json!({"metadata": {"name": "with-init", "namespace": "default"},
               "spec": {"initContainers": [gpu_container("setup", 4)],
                        "containers": [gpu_container("main", 2)]}}),
    );
    let pod = c.get("with-init");
    c.schedule(&pod).await.unwrap();
    let pod = c.get("with-init");
    // The pod needs the larger of its init container and its app containers.
    assert_eq!(Decision::from_pod(&pod).unwrap().per_gpu, 4);
    let alloc = c.kubelet.admit(&pod).await.unwrap();
    for (container, share) in [("setup", 4), ("main", 2)] {
        let s = c
            .kubelet
            .start_container(&pod, container, &alloc[container])
            .await
            .unwrap();
        let file = std::fs::read_to_string(s.host_path(&s.envs["CGPU_ALLOC_FILE"])).unwrap();
        assert!(
            file.starts_with(&format!(
                "CGPU_CONTAINER_ID=default/with-init/{container}\nALIYUN_COM_GPU_MEM_CONTAINER={share}\n"
            )),
            "{file}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_decision_never_refuses_the_rightful_pods() {
    let c = Cluster::new("copied", &[V100], json!({})).await;
    c.ready(15).await;
    let big = c.pod("big", json!([gpu_container("main", 12)]), 1);
    c.api.patch(
        "pods",
        "default",
        "big",
        &json!({"metadata": {"annotations": {"cgpu.io/high-priority": "true"}}}),
    );
    c.schedule(&big).await.unwrap();
    // Bound by spec.nodeName with every annotation of big: the GPU would
    // hold 24 of 15 GiB if the copied decision counted, and big would be
    // refused as over-committed.
    let ann = c.get("big")["metadata"]["annotations"].clone();
    c.api.put(
        "pods",
        json!({"metadata": {"name": "copycat", "namespace": "default", "annotations": ann},
               "spec": {"nodeName": NODE, "containers": [gpu_container("main", 2)]},
               "status": {"phase": "Running"}}),
    );
    let started = c.run_pod("big", "main").await.unwrap();
    // Its annotation asked for high priority: the runtime sets it.
    assert_eq!(started.envs["ALIYUN_COM_GPU_HIGH_PRIO"], "1");
    // ... and its allocation file (the library takes the file's keys alone).
    let file =
        std::fs::read_to_string(started.host_path(&started.envs["CGPU_ALLOC_FILE"])).unwrap();
    assert!(file.contains("\nALIYUN_COM_GPU_HIGH_PRIO=1\n"), "{file}");
    let out = c.exec(&started, &["meminfo"]);
    assert_eq!(
        mib(field(line(&out, "meminfo"), "total").unwrap()),
        16160 * 12 / 15,
        "{out}"
    );
    let err = c.run_pod("copycat", "main").await.unwrap_err();
    assert!(err.contains("was made for pod uid"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_kubelet_that_sends_the_socket_path_as_authority() {
    let c = Cluster::with_kubelet("old-kubelet", &[V100, V100], json!({}), true).await;
    c.ready(30).await;
    let pod = c.pod("old", json!([gpu_container("main", 4)]), 2);
    c.schedule(&pod).await.unwrap();
    let started = c.run_pod("old", "main").await.unwrap();
    let out = c.exec(&started, &["devcount", "meminfo"]);
    assert_eq!(field(line(&out, "devcount"), "n"), Some("2"), "{out}");
    assert_eq!(
        mib(field(line(&out, "meminfo"), "total").unwrap()),
        16160 * 2 / 15,
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpushare_cluster_moves_over_without_touching_pods_or_scheduler_config() {
    use cgpu_cluster_testkit::scheduler::Scheduler;
    // gpushare's node label for sharing without isolation.
    let c = Cluster::new(
        "gpushare",
        &[V100, V100],
        json!({"cgpu.disable.isolation": "true"}),
    )
    .await;
    // Pods placed by gpushare's extender and ACK's scheduler, running.
    c.api.put(
        "pods",
        json!({"metadata": {"name": "old-gpushare", "namespace": "default",
                            "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "10",
                                            "ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}},
               "spec": {"nodeName": NODE, "containers": [gpu_container("main", 10)]},
               "status": {"phase": "Running"}}),
    );
    c.api.put(
        "pods",
        json!({"metadata": {"name": "old-ack", "namespace": "default",
                            "annotations": {"scheduler.framework.gpushare.allocation": "{\"0\":{\"1\":3}}"}},
               "spec": {"nodeName": NODE, "containers": [gpu_container("main", 3)]},
               "status": {"phase": "Running"}}),
    );
    c.ready(30).await;
    // kube-scheduler still configured for gpushare's extender paths.
    let s = Scheduler::new(&c.ext_url, true).with_prefix("/gpushare-scheduler");
    let node = c.api.get("nodes", "", NODE).unwrap();
    let pod = c.pod("new", json!([gpu_container("main", 10)]), 1);
    // The extender's view has the two running pods.
    for _ in 0..60000 {
        if c.extender.metrics.pods.get() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(c.extender.metrics.pods.get(), 2);
    let f = s.filter(&pod, std::slice::from_ref(&node)).await.unwrap();
    assert_eq!(f.nodes, [NODE], "{f:?}");
    s.bind(&pod, NODE).await.unwrap();
    // GPU0 has 5 GiB left, GPU1 12: the new pod goes to GPU1.
    let d = Decision::from_pod(&c.get("new")).unwrap();
    assert_eq!(d.gpus[0].index, 1);
    let ann = &c.get("new")["metadata"]["annotations"];
    assert_eq!(ann["ALIYUN_COM_GPU_MEM_IDX"], "1");
    assert_eq!(ann["ALIYUN_COM_GPU_MEM_DEV"], "15");
    let started = c.run_pod("new", "main").await.unwrap();
    // The environment gpushare's plugin gives, and only GPU1 for the runtime.
    for (k, v) in [
        ("ALIYUN_COM_GPU_MEM_IDX", "1"),
        ("ALIYUN_COM_GPU_MEM_POD", "10"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "10"),
        ("ALIYUN_COM_GPU_MEM_DEV", "15"),
        ("NVIDIA_VISIBLE_DEVICES", d.gpus[0].uuid.as_str()),
    ] {
        assert_eq!(started.envs[k], v, "{k}");
    }
    let file =
        std::fs::read_to_string(started.host_path(&started.envs["CGPU_ALLOC_FILE"])).unwrap();
    assert!(file.ends_with("CGPU_DISABLE=true\n"), "{file}");
    // A further 6 GiB pod fits neither GPU (5 and 2 GiB left).
    let late = c.pod("late", json!([gpu_container("main", 6)]), 1);
    let f = s.filter(&late, std::slice::from_ref(&node)).await.unwrap();
    assert!(f.nodes.is_empty(), "{f:?}");
}

impl Cluster {
    /// Waits until the kubelet lists `n` healthy devices of `resource`.
    async fn healthy_devices(&self, resource: &str, n: usize) {
        for _ in 0..12000 {
            if self
                .kubelet
                .devices(resource, Duration::from_secs(60))
                .await
                .len()
                == n
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the kubelet never saw {n} healthy {resource} devices");
    }

    /// Whether the extender lets the pod onto the node.
    async fn passes_filter(&self, pod: &Value) -> bool {
        let f = post(
            &self.ext_url,
            "/filter",
            &json!({"Pod": pod, "NodeNames": [NODE]}),
        )
        .await;
        f["NodeNames"] == json!([NODE])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_fails_takes_no_new_pod() {
    let c = Cluster::new("unhealthy", &[V100, V100, V100], json!({})).await;
    c.ready(45).await;
    let before = c.pod("before", json!([gpu_container("main", 10)]), 1);
    c.schedule(&before).await.unwrap();
    assert_eq!(
        Decision::from_pod(&c.get("before")).unwrap().gpus[0].index,
        0
    );
    c.run_pod("before", "main").await.unwrap();
    let big = c.pod("big", json!([gpu_container("main", 6)]), 1);
    assert!(c.passes_filter(&big).await);

    // The simulated driver reports an application's XID 13 on GPU0 (the
    // GPU stays healthy), then a double-bit ECC error (XID 48) on GPU1;
    // GPU2 falls off the bus. The plugin sees them in this order.
    let state = &c.sim.state_dir;
    std::fs::write(state.join("gpu0.xid"), "13\n").unwrap();
    std::fs::write(state.join("gpu1.xid"), "48\n").unwrap();
    c.healthy_devices("aliyun.com/gpu-count", 2).await;
    std::fs::write(state.join("gpu2.lost"), "").unwrap();
    c.healthy_devices("aliyun.com/gpu-count", 1).await;
    assert_eq!(
        c.kubelet
            .devices("aliyun.com/gpu-count", Duration::from_secs(60))
            .await,
        ["cgpu-gpu-0"]
    );
    // GPU0's 15 GiB devices stay healthy, the others' are not offered.
    c.healthy_devices("aliyun.com/gpu-mem", 15).await;
    let mem = c
        .kubelet
        .devices("aliyun.com/gpu-mem", Duration::from_secs(60))
        .await;
    assert_eq!(
        mem,
        (0..15).map(|i| format!("cgpu-mem-{i}")).collect::<Vec<_>>()
    );

    // The node says which GPUs failed; the extender then places nothing on
    // them: 6 GiB fit on no healthy GPU, 4 GiB go to GPU0.
    let mut published = false;
    for _ in 0..12000 {
        let gpus: Vec<Value> = serde_json::from_str(
            c.api.get("nodes", "", NODE).unwrap()["metadata"]["annotations"]["cgpu.io/gpus"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        if gpus[1]["unhealthy"] == json!(true) && gpus[2]["unhealthy"] == json!(true) {
            assert_eq!(gpus[0].get("unhealthy"), None);
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(published, "the plugin never published the failed GPUs");
    let mut refused = false;
    for _ in 0..12000 {
        if !c.passes_filter(&big).await {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "the extender still places 6 GiB on the node");
    let small = c.pod("small", json!([gpu_container("main", 4)]), 1);
    c.schedule(&small).await.unwrap();
    assert_eq!(
        Decision::from_pod(&c.get("small")).unwrap().gpus[0].index,
        0
    );
    c.run_pod("small", "main").await.unwrap();

    // kubectl inspect cgpu (the real kubectl) shows them.
    let bin = c.dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-inspect-cgpu"),
        bin.join("kubectl-inspect-cgpu"),
    )
    .unwrap();
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new("kubectl")
            .args(args)
            .env(
                "PATH",
                format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
            )
            .env("KUBECONFIG", c.dir.join("kubeconfig"))
            .env("HOME", &c.dir)
            .output()
            .expect("kubectl is installed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = kubectl(&["inspect", "cgpu"]);
    assert!(
        out.contains(
            "gpu-node-1  10.0.0.11  14/15                  0/15(Unhealthy)        0/15(Unhealthy)        14/45\n"
        ),
        "{out}"
    );
    let out = kubectl(&["inspect", "cgpu", "-d"]);
    assert!(out.contains("Unhealthy: GPU1 (GPU-"), "{out}");
    assert!(out.contains("Unhealthy: GPU2 (GPU-"), "{out}");
    assert!(!out.contains("Unhealthy: GPU0"), "{out}");
}

/// The events the plugin recorded on the node: (reason, message, eventTime).
fn node_events(c: &Cluster) -> Vec<(String, String, String)> {
    c.api
        .list("events")
        .into_iter()
        .filter(|e| e["involvedObject"]["kind"] == "Node" && e["involvedObject"]["name"] == NODE)
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
            (s("reason"), s("message"), s("eventTime"))
        })
        .collect()
}

/// Waits for an event on the node with this reason whose message starts
/// with `prefix`; returns its eventTime.
async fn node_event(c: &Cluster, reason: &str, prefix: &str) -> String {
    for _ in 0..12000 {
        if let Some(e) = node_events(c)
            .into_iter()
            .find(|(r, m, _)| r == reason && m.starts_with(prefix))
        {
            return e.2;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no {reason} event {prefix:?} on the node: {:?}",
        node_events(c)
    );
}

async fn get_text(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

/// Waits until the extender's metrics hold `line`.
async fn metric_line(c: &Cluster, line: &str) {
    let mut text = String::new();
    for _ in 0..12000 {
        text = get_text(&c.ext_url, "/metrics").await;
        if text.contains(line) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the metrics never showed {line:?}:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_is_healthy_again_takes_pods_again() {
    // A GPU failed by a critical XID error is trusted again 3 s after its
    // last one; a lost GPU as soon as it answers.
    let hold = Duration::from_secs(3);
    let c = Cluster::build(
        "recovers",
        &[V100, V100],
        json!({}),
        false,
        &[("CGPU_XID_HOLD", "3s")],
    )
    .await;
    c.ready(30).await;
    // a (4 GiB) goes to GPU0; b (12 GiB) fits only on GPU1.
    let a = c.pod("a", json!([gpu_container("main", 4)]), 1);
    c.schedule(&a).await.unwrap();
    assert_eq!(Decision::from_pod(&c.get("a")).unwrap().gpus[0].index, 0);
    c.run_pod("a", "main").await.unwrap();
    let b = c.pod("b", json!([gpu_container("main", 12)]), 1);
    c.schedule(&b).await.unwrap();
    assert_eq!(Decision::from_pod(&c.get("b")).unwrap().gpus[0].index, 1);
    let b = c.get("b");
    let alloc = c.kubelet.admit(&b).await.unwrap();
    let started = c
        .kubelet
        .start_container(&b, "main", &alloc["main"])
        .await
        .unwrap();
    let quota = mib(field(line(&c.exec(&started, &["meminfo"]), "meminfo"), "total").unwrap());
    assert!(quota > 12 * 1000, "{quota} MiB");
    metric_line(
        &c,
        "cgpu_extender_gpu_healthy{node=\"gpu-node-1\",gpu=\"1\"} 1\n",
    )
    .await;

    // GPU1 falls off the bus: unhealthy, an event on the node, a metric.
    let state = &c.sim.state_dir;
    std::fs::write(state.join("gpu1.lost"), "").unwrap();
    c.healthy_devices("aliyun.com/gpu-count", 1).await;
    c.healthy_devices("aliyun.com/gpu-mem", 15).await;
    node_event(&c, "CgpuGpuUnhealthy", "GPU1 (GPU-").await;
    let msgs: Vec<String> = node_events(&c).into_iter().map(|e| e.1).collect();
    assert!(
        msgs.iter().any(|m| m.starts_with("GPU1 ")
            && m.ends_with("failed: the GPU fell off the bus (lost); no new pod is placed on it")),
        "{msgs:?}"
    );
    metric_line(
        &c,
        "cgpu_extender_gpu_healthy{node=\"gpu-node-1\",gpu=\"1\"} 0\n",
    )
    .await;
    metric_line(
        &c,
        "cgpu_extender_gpu_healthy{node=\"gpu-node-1\",gpu=\"0\"} 1\n",
    )
    .await;

    // b's container starts again (a restart) while GPU1 is unhealthy: the
    // plugin refuses it, saying why.
    let refused = c
        .kubelet
        .start_container(&b, "main", &alloc["main"])
        .await
        .unwrap_err();
    assert!(
        refused.contains(
            "default/b container main: the decision places it on GPU1, which is unhealthy now \
             (the GPU fell off the bus (lost)); the container is not started"
        ),
        "{refused}"
    );

    // GPU1 answers again: healthy without a plugin restart, and b starts
    // with its quota.
    std::fs::remove_file(state.join("gpu1.lost")).unwrap();
    c.healthy_devices("aliyun.com/gpu-count", 2).await;
    c.healthy_devices("aliyun.com/gpu-mem", 30).await;
    node_event(&c, "CgpuGpuHealthy", "GPU1 (GPU-").await;
    metric_line(
        &c,
        "cgpu_extender_gpu_healthy{node=\"gpu-node-1\",gpu=\"1\"} 1\n",
    )
    .await;
    let started = c
        .kubelet
        .start_container(&b, "main", &alloc["main"])
        .await
        .unwrap();
    assert_eq!(
        mib(field(line(&c.exec(&started, &["meminfo"]), "meminfo"), "total").unwrap()),
        quota
    );

    // A double-bit ECC error (XID 48) on GPU0: unhealthy, then trusted
    // again once the hold has passed without another.
    let before_xid = k8s_openapi::jiff::Timestamp::now();
    std::fs::write(state.join("gpu0.xid"), "48\n").unwrap();
    node_event(&c, "CgpuGpuUnhealthy", "GPU0 (GPU-").await;
    let msgs: Vec<String> = node_events(&c).into_iter().map(|e| e.1).collect();
    assert!(
        msgs.iter().any(|m| m.starts_with("GPU0 ")
            && m.ends_with("failed: critical XID error 48; no new pod is placed on it")),
        "{msgs:?}"
    );
    let back: k8s_openapi::jiff::Timestamp = node_event(&c, "CgpuGpuHealthy", "GPU0 (GPU-")
        .await
        .parse()
        .unwrap();
    let waited = back.duration_since(before_xid);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::try_from(hold).unwrap(),
        "GPU0 was trusted again {waited:?} after its XID error"
    );
    c.healthy_devices("aliyun.com/gpu-count", 2).await;
    metric_line(
        &c,
        "cgpu_extender_gpu_healthy{node=\"gpu-node-1\",gpu=\"0\"} 1\n",
    )
    .await;
    let d = c.pod("d", json!([gpu_container("main", 8)]), 1);
    c.schedule(&d).await.unwrap();
    assert_eq!(Decision::from_pod(&c.get("d")).unwrap().gpus[0].index, 0);
    c.run_pod("d", "main").await.unwrap();
}

/// A node labelled `cgpu.io/gpu-mem-unit=MiB`: the plugin offers one device
/// per MiB, the extender places MiB, and the container's quota is exactly
/// the MiB it asked for, in bytes, enforced by the library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_a_mib_node_gets_its_quota_in_exact_bytes() {
    const T4: &str = "15109:Tesla T4";
    let c = Cluster::new("mib", &[T4, T4], json!({"cgpu.io/gpu-mem-unit": "MiB"})).await;
    c.ready(2 * 15109).await;
    let gpus: Vec<Value> = serde_json::from_str(
        c.api.get("nodes", "", NODE).unwrap()["metadata"]["annotations"]["cgpu.io/gpus"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(gpus[0]["gib"], 15109, "{gpus:?}");
    assert_eq!(gpus[0]["mib"], true, "{gpus:?}");
    // 3000 MiB, then 12000 MiB: binpack puts both on GPU0 (15000 of 15109);
    // 200 MiB more do not fit there and go to GPU1.
    let a = c.pod("a", json!([gpu_container("main", 3000)]), 1);
    c.schedule(&a).await.unwrap();
    let d = Decision::from_pod(&c.get("a")).unwrap();
    assert_eq!(
        (d.mib, d.gpu_gib, d.containers["main"]),
        (true, 15109, 3000)
    );
    assert_eq!(d.gpus[0].index, 0);
    let b = c.pod("b", json!([gpu_container("main", 12000)]), 1);
    c.schedule(&b).await.unwrap();
    assert_eq!(Decision::from_pod(&c.get("b")).unwrap().gpus[0].index, 0);
    let e = c.pod("e", json!([gpu_container("main", 200)]), 1);
    c.schedule(&e).await.unwrap();
    assert_eq!(Decision::from_pod(&c.get("e")).unwrap().gpus[0].index, 1);

    let started = c.run_pod("a", "main").await.unwrap();
    let file = std::fs::read_to_string(started.host_path("/etc/cgpu/alloc.env")).unwrap();
    assert!(
        file.contains("\nALIYUN_COM_GPU_MEM_CONTAINER=3\nALIYUN_COM_GPU_MEM_DEV=14\n")
            && file.ends_with("\nCGPU_MEM_CONTAINER_MIB=3000\n"),
        "{file}"
    );
    // The process sees exactly 3000 MiB, and the library refuses past them.
    let out = c.exec(&started, &["meminfo"]);
    let total: u64 = field(line(&out, "meminfo"), "total")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, 3000 << 20, "{out}");
    // What its context leaves free is what it gets, to the MiB.
    let out = c.exec(&started, &["meminfo", "alloc_until_oom", "1048576"]);
    let free: u64 = field(line(&out, "meminfo"), "free")
        .unwrap()
        .parse()
        .unwrap();
    let l = line(&out, "alloc_until_oom");
    assert_eq!(field(l, "err"), Some("2"), "{out}");
    let got: u64 = field(l, "bytes").unwrap().parse().unwrap();
    assert!(got <= free && free - got < 1 << 20, "{out}");
    // A pod's own environment cannot raise it.
    let mut cmd = c.sim.command(cuclient(LinkMode::Link));
    for (k, v) in started.env_on_host() {
        cmd.env(k, v);
    }
    let out = cmd
        .env("CGPU_MEM_CONTAINER_MIB", "15000")
        .env("ALIYUN_COM_GPU_MEM_CONTAINER", "15")
        .arg("meminfo")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let total: u64 = field(line(&text, "meminfo"), "total")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(total, 3000 << 20, "{text}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("CGPU_MEM_CONTAINER_MIB='15000' in the environment is ignored"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compute_shares_never_sum_past_a_whole_gpu() {
    let c = Cluster::new("gpu-core", &[V100], json!({})).await;
    c.ready(15).await;
    let with_core = |name: &str, core: &str| {
        c.pod(name, json!([gpu_container("main", 4)]), 1);
        c.api.patch(
            "pods",
            "default",
            name,
            &json!({"metadata": {"annotations": {"cgpu.io/gpu-core": core}}}),
        );
        c.get(name)
    };
    let a = with_core("a", "60");
    c.schedule(&a).await.unwrap();
    assert_eq!(Decision::from_pod(&c.get("a")).unwrap().compute, 60);
    // 60 + 50 > 100 though the memory fits: refused, resolvable by
    // preemption, with the reason.
    let b = with_core("b", "50");
    let f = post(
        &c.ext_url,
        "/filter",
        &json!({"Pod": b, "NodeNames": [NODE]}),
    )
    .await;
    assert_eq!(f["NodeNames"], json!([]), "{f}");
    assert!(
        f["FailedNodes"][NODE]
            .as_str()
            .unwrap()
            .contains("no GPU of the node has 50% of its compute free"),
        "{f}"
    );
    // Less than one of the GPU's 16 time slices: never placeable.
    let tiny = with_core("tiny", "5");
    let f = post(
        &c.ext_url,
        "/filter",
        &json!({"Pod": tiny, "NodeNames": [NODE]}),
    )
    .await;
    assert!(
        f["FailedAndUnresolvableNodes"][NODE]
            .as_str()
            .unwrap()
            .contains("ask for at least 7"),
        "{f}"
    );
    let d = with_core("d", "40");
    c.schedule(&d).await.unwrap();
    // The shares reach the library as weights of the GPU's 16 slices, in
    // the allocation file it reads.
    for (pod, weight) in [("a", 9), ("d", 6)] {
        let started = c.run_pod(pod, "main").await.unwrap();
        let file =
            std::fs::read_to_string(started.host_path(&started.envs["CGPU_ALLOC_FILE"])).unwrap();
        assert!(
            file.contains(&format!("\nALIYUN_COM_GPU_SCHD_WEIGHT={weight}\n")),
            "{file}"
        );
        // The library accepts the file: the container sees its 4 GiB.
        let out = c.exec(&started, &["meminfo"]);
        assert_eq!(
            mib(field(line(&out, "meminfo"), "total").unwrap()),
            16160 * 4 / 15,
            "{out}"
        );
    }
    // A pod without a share gets no weight key; it still fits (compute is
    // not asked for, memory is free).
    let plain = c.pod("plain", json!([gpu_container("main", 4)]), 1);
    c.schedule(&plain).await.unwrap();
    let started = c.run_pod("plain", "main").await.unwrap();
    let file =
        std::fs::read_to_string(started.host_path(&started.envs["CGPU_ALLOC_FILE"])).unwrap();
    assert!(!file.contains("WEIGHT"), "{file}");
}

/// A process of a Kubernetes container as the node agent sees it: uid
/// 65534, in a mount namespace of its own holding the kubelet's
/// per-container bind (`…/pods/<pod uid>/containers/<name>/<hex>`, bound
/// on a file as the kubelet binds the termination log), in a cgroup named
/// as the kubelet names a pod's (`…/pod<uid>/<container id>`), speaking to the agent with `cgpu-agent client`. `pod`: (pod
/// uid of the bind, container name, pod uid of the cgroup); `None`: a host
/// process (no bind, no cgroup).
struct Tenant(AgentClient);

impl Tenant {
    fn start(
        dir: &std::path::Path,
        sock: &std::path::Path,
        pod: Option<(&str, &str, &str)>,
        cgroups: &Cgroups,
    ) -> Tenant {
        let agent = artifacts().profile_dir.join("cgpu-agent");
        let run = rig::exec_as_nobody(&format!("{} client {}", agent.display(), sock.display()));
        let script = match pod {
            Some((uid, container, _)) => {
                let bind = dir.join(format!("kubelet/pods/{uid}/containers/{container}"));
                std::fs::create_dir_all(&bind).unwrap();
                let src = bind.join("4a7b9c2e");
                let dst = dir.join(format!("termination-log-{uid}-{container}"));
                std::fs::write(&src, "").unwrap();
                std::fs::write(&dst, "").unwrap();
                format!("mount --bind {} {} && {run}", src.display(), dst.display())
            }
            None => run,
        };
        let child = std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare");
        if let Some((_, _, cg_uid)) = pod {
            // The same process execs the client, which connects at its
            // first command: it asks from this cgroup.
            let cg = cgroups.make(format!(
                "kubepods/pod{cg_uid}/{:08x}{}",
                child.id(),
                "c".repeat(56)
            ));
            rig::enter(&cg, child.id());
        }
        Tenant(AgentClient::new(child, Duration::from_secs(120)))
    }

    /// One command, its reply as (status, used, quota).
    fn ask(&mut self, line: &str) -> (String, u64, u64) {
        let r = self.0.ask(line);
        (r.status, r.used, r.quota)
    }
}

/// Secure mode end to end: the device plugin (CGPU_MODE=secure) allocates
/// two pods' containers through the kubelet double and writes each one's
/// settings for the agent; the real `cgpu-agent --secure` reads them; a
/// process of uid 65534 in each container (identified by the kernel: the
/// kubelet's bind in its mount namespace) gets exactly its container's
/// quota through the agent and nothing past it; a host process gets
/// nothing. Containers get the ledger directory read-only. When a pod is
/// gone, its settings file is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_mode_gives_each_container_its_quota_through_the_agent() {
    assert!(
        rig::is_root(),
        "secure mode runs the agent as root and its tenants as uid 65534"
    );
    let settings = std::env::temp_dir()
        .join(format!("cgpu-e2e-secure-{}", std::process::id()))
        .join("settings");
    let settings_s = settings.display().to_string();
    let mut c = Cluster::build(
        "secure",
        &[V100, V100],
        json!({}),
        false,
        &[("CGPU_MODE", "secure"), ("CGPU_SETTINGS_DIR", &settings_s)],
    )
    .await;
    c.ready(30).await;
    let a = c.pod("trainer", json!([gpu_container("cuda", 3)]), 1);
    c.schedule(&a).await.unwrap();
    let b = c.pod("other", json!([gpu_container("cuda", 5)]), 1);
    c.schedule(&b).await.unwrap();
    let sa = c.run_pod("trainer", "cuda").await.unwrap();
    let sb = c.run_pod("other", "cuda").await.unwrap();
    let ledger = c.dir.join("ledger");
    for s in [&sa, &sb] {
        let m = s
            .mounts
            .iter()
            .find(|m| m.host_path == ledger.display().to_string())
            .expect("the ledger directory is mounted");
        assert!(m.read_only, "the ledger directory is mounted writable");
    }
    // Each container's settings, on the host, under the name the agent
    // finds from the container's own bind: the allocation file's.
    let uid = |name: &str| c.get(name)["metadata"]["uid"].as_str().unwrap().to_string();
    let (ua, ub) = (uid("trainer"), uid("other"));
    let host = |u: &str| settings.join(cgpu_cluster::device_plugin::settings_file_name(u, "cuda"));
    for (u, s) in [(&ua, &sa), (&ub, &sb)] {
        let alloc = std::fs::read_to_string(s.host_path(&s.envs["CGPU_ALLOC_FILE"])).unwrap();
        assert_eq!(std::fs::read_to_string(host(u)).unwrap(), alloc);
    }
    let file = std::fs::read_to_string(host(&ua)).unwrap();
    let gpu = file
        .lines()
        .find_map(|l| l.strip_prefix("ALIYUN_COM_GPU_VISIBLE_DEVICES="))
        .unwrap()
        .to_string();

    // The agent, as the DaemonSet runs it; killed when the test ends,
    // whichever way.
    let agent = SecureAgent::start(
        &mut rig::secure_agent_command(
            c.sim.command(artifacts().profile_dir.join("cgpu-agent")),
            &ledger,
            &settings,
            "500ms",
        ),
        Duration::from_secs(120),
    );
    assert!(agent.is_ok(), "the agent did not start: {:?}", agent.err());
    let _agent = agent;
    let sock = ledger.join("agent.sock");
    // The scratch directory must let uid 65534 reach the socket.
    rig::set_mode(&c.dir, 0o755);

    const GIB: u64 = 1 << 30;
    // Declared before the tenants, so dropped after them, even on a panic.
    let cgroups = Cgroups::new(&format!("cgpu-e2e-{}", std::process::id()));
    // What each container's process sees in cooperative mode too: its
    // share of the V100 (16160 MiB) by ALIYUN_COM_GPU_MEM_DEV=15.
    let v100 = 16160u64 << 20;
    let (qa, qb) = (v100 * 3 / 15, v100 * 5 / 15);
    assert_eq!(qa, 3232 << 20);
    let mut ta = Tenant::start(&c.dir, &sock, Some((&ua, "cuda", &ua)), &cgroups);
    let mut tb = Tenant::start(&c.dir, &sock, Some((&ub, "cuda", &ub)), &cgroups);
    // A process of pod a that shows pod b's bind (as one that can mount in
    // a user namespace could, hiding its own): its cgroup is pod a's, so
    // the agent gives it nothing.
    let mut forger = Tenant::start(&c.dir, &sock, Some((&ub, "cuda", &ua)), &cgroups);
    assert_eq!(forger.ask(&format!("hello {gpu}")).0, "Unknown");
    let mut host_proc = Tenant::start(&c.dir, &sock, None, &cgroups);
    assert_eq!(ta.ask(&format!("hello {gpu}")), ("Ok".into(), 0, qa));
    assert_eq!(
        ta.ask(&format!("reserve {gpu} {}", 2 * GIB)),
        ("Ok".into(), 2 * GIB, qa)
    );
    // Past its quota: refused, nothing more charged.
    assert_eq!(
        ta.ask(&format!("reserve {gpu} {}", qa - 2 * GIB + 1)),
        ("OverQuota".into(), 2 * GIB, qa)
    );
    assert_eq!(
        ta.ask(&format!("reserve {gpu} {}", qa - 2 * GIB)),
        ("Ok".into(), qa, qa)
    );
    // The other pod's container: its own quota, its own books.
    assert_eq!(tb.ask(&format!("hello {gpu}")), ("Ok".into(), 0, qb));
    assert_eq!(
        tb.ask(&format!("reserve {gpu} {qb}")),
        ("Ok".into(), qb, qb)
    );
    assert_eq!(tb.ask(&format!("reserve {gpu} 1")).0, "OverQuota");
    // The container's own program under libcgpu.so, as the container
    // starts it (its environment from Allocate, uid 65534, its bind and
    // cgroup): the library finds the agent's socket in the read-only
    // ledger directory and gets its quota from it.
    assert_eq!(ta.ask(&format!("release {gpu} {qa}")), ("Ok".into(), 0, qa));
    // The simulated driver's state stands for the device: every uid uses it.
    rig::share_tree(&c.sim.state_dir);
    let cuda = cgroups.make(format!("kubepods/pod{ua}/{}", "d".repeat(64)));
    let bind = c
        .dir
        .join(format!("kubelet/pods/{ua}/containers/cuda/4a7b9c2e"));
    let dst = c.dir.join("termination-log-lib");
    std::fs::write(&dst, "").unwrap();
    let mut lib = c.sim.command("unshare");
    lib.envs(sa.env_on_host())
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount --bind {} {} && read go && {}",
            bind.display(),
            dst.display(),
            rig::exec_as_nobody(&format!(
                "{} meminfo alloc_until_oom 67108864",
                cuclient(LinkMode::Link).display()
            ))
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut p = lib.spawn().unwrap();
    rig::enter(&cuda, p.id());
    {
        use std::io::Write;
        writeln!(p.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let o = p.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(
        field(line(&out, "meminfo"), "total").map(|t| t.parse::<u64>().unwrap()),
        Some(qa),
        "{out}{err}"
    );
    let l = line(&out, "alloc_until_oom");
    assert_eq!(field(l, "err"), Some("2"), "{out}{err}");
    // Granted up to what its quota leaves (its context is charged too), 64
    // MiB at a time, through the agent: the ledger is not the process's to
    // write.
    let free: u64 = field(line(&out, "meminfo"), "free")
        .unwrap()
        .parse()
        .unwrap();
    let got: u64 = field(l, "bytes").unwrap().parse().unwrap();
    assert!(
        free < qa && got <= free && got + (64 << 20) > free,
        "{out}{err}"
    );
    // A process in no container gets nothing.
    assert_eq!(host_proc.ask(&format!("hello {gpu}")).0, "Unknown");

    // The tenants cannot write the books: the directory is root's 0755,
    // the ledger root's 0644.
    {
        use std::os::unix::fs::MetadataExt;
        let l = cgpu_ledger::Ledger::live_path(&ledger, &gpu);
        let m = std::fs::metadata(&l).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o644), "{}", l.display());
        let d = std::fs::metadata(&ledger).unwrap();
        assert_eq!((d.uid(), d.mode() & 0o7777), (0, 0o755));
    }

    // Pod "other" is gone: its settings go at the plugin's next clean (at
    // start, then every minute); the running pod's stay.
    drop(tb);
    c.api.finalize("pods", "default", "other");
    c.kubelet.remove_pod("default", "other");
    c.kill_plugin();
    c.start_plugin();
    let t0 = std::time::Instant::now();
    while host(&ub).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the gone pod's settings file stays"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        host(&ua).exists(),
        "the running pod's settings file was removed"
    );
    drop(ta);
    drop(host_proc);
    drop(forger);
}
