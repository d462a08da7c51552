//! The scheduler extender over HTTP, with kube-rs against the test API
//! server: filter/prioritize/bind as the scheduler calls them, 64
//! concurrent binds, rollback of a failed Binding, terminating pods, a
//! restart, metrics.

use cgpu_cluster::extender::Extender;
use cgpu_cluster::signing::DecisionKey;
use cgpu_cluster_core::decision::{Decision, NodeGpu};
use cgpu_cluster_core::names::*;
use cgpu_cluster_core::placement::Policy;
use cgpu_cluster_testkit::apiserver::ApiServer;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &[u8] = b"test decision key, 32 bytes long";

async fn client_for(api: &ApiServer) -> kube::Client {
    let cfg = kube::Config::new(api.url().parse().unwrap());
    kube::Client::try_from(cfg).unwrap()
}

struct Running {
    ext: Arc<Extender>,
    url: String,
    server: tokio::task::JoinHandle<()>,
}

async fn start_extender(api: &ApiServer, policy: Policy) -> Running {
    let ext = Extender::new(
        client_for(api).await,
        DecisionKey::from_bytes(KEY).unwrap(),
        policy,
    );
    ext.spawn_watches();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("{}", listener.local_addr().unwrap());
    let router = ext.router();
    let server = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    let r = Running { ext, url, server };
    // Ready once both watches listed everything.
    for _ in 0..6000 {
        if http(&r.url, "GET", "/readyz", "").await.0 == 200 {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("extender never became ready");
}

/// A minimal HTTP/1.1 exchange: (status, body).
async fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code: u16 = text[9..12].parse().unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = rest;
        loop {
            let (len, tail) = rest.split_once("\r\n").unwrap();
            let len = usize::from_str_radix(len.trim(), 16).unwrap();
            if len == 0 {
                break;
            }
            out.push_str(&tail[..len]);
            rest = &tail[len + 2..];
        }
        out
    } else {
        rest.to_string()
    };
    (code, body)
}

async fn post(addr: &str, path: &str, body: &Value) -> Value {
    let (code, text) = http(addr, "POST", path, &body.to_string()).await;
    assert_eq!(code, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

fn gpu_node(api: &ApiServer, name: &str, gpus: u32, mib: u64) {
    let list: Vec<NodeGpu> = (0..gpus)
        .map(|i| NodeGpu {
            index: i,
            uuid: format!("GPU-{name}-{i}"),
            memory_mib: mib,
            gib: mib / 1024,
            model: "Tesla V100-SXM2-16GB".into(),
            unhealthy: false,
            mib: false,
        })
        .collect();
    api.put(
        "nodes",
        json!({"metadata": {"name": name, "annotations": {ANN_NODE_GPUS: serde_json::to_string(&list).unwrap()}},
               "status": {"capacity": {RESOURCE_GPU_COUNT: gpus.to_string(),
                                       RESOURCE_GPU_MEM: (u64::from(gpus) * (mib / 1024)).to_string()}}}),
    );
}

fn gpu_pod(api: &ApiServer, name: &str, mem: u64, count: u32) -> Value {
    api.put(
        "pods",
        json!({"metadata": {"name": name, "namespace": "default", "labels": {LABEL_GPU_COUNT: count.to_string()}},
               "spec": {"containers": [{"name": "main", "resources": {"limits": {RESOURCE_GPU_MEM: mem.to_string()}}}]}}),
    )
}

fn bind_args(pod: &Value, node: &str) -> Value {
    json!({"PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": node})
}

fn decision(api: &ApiServer, name: &str) -> Option<Decision> {
    Decision::from_pod(&api.get("pods", "default", name)?)
}

/// Waits until the extender's watch has seen `n` pods holding GPU memory.
async fn settled(r: &Running, pods: i64) {
    for _ in 0..6000 {
        if r.ext.metrics.pods.get() == pods && r.ext.metrics.reserved.get() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "view never settled at {pods} pods (has {}, {} reserved)",
        r.ext.metrics.pods.get(),
        r.ext.metrics.reserved.get()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_prioritize_bind_as_the_scheduler_calls_them() {
    let api = ApiServer::start().await;
    gpu_node(&api, "two-v100", 2, 16160);
    gpu_node(&api, "one-v100", 1, 16160);
    api.put("nodes", json!({"metadata": {"name": "cpu"}}));
    let pod = gpu_pod(&api, "tf-multi", 8, 2);
    let r = start_extender(&api, Policy::Binpack).await;

    let args = json!({"Pod": pod, "NodeNames": ["two-v100", "one-v100", "cpu", "ghost"]});
    let f = post(&r.url, "/filter", &args).await;
    assert_eq!(f["NodeNames"], json!(["two-v100"]));
    assert_eq!(f["FailedNodes"], json!({}));
    let unres = f["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert!(
        unres["one-v100"]
            .as_str()
            .unwrap()
            .contains("asks for 2 GPUs"),
        "{unres:?}"
    );
    assert!(unres["cpu"].as_str().unwrap().contains("no shared GPUs"));
    assert!(unres["ghost"].as_str().unwrap().contains("unknown"));
    assert_eq!(f["Error"], "");

    let p = post(
        &r.url,
        "/prioritize",
        &json!({"Pod": pod, "NodeNames": ["two-v100", "one-v100"]}),
    )
    .await;
    // Binpack: 22 of 30 GiB left free after placing -> 10 - 22*10/30 = 3.
    assert_eq!(
        p,
        json!([{"Host": "two-v100", "Score": 3}, {"Host": "one-v100", "Score": 0}])
    );

    let b = post(&r.url, "/bind", &bind_args(&pod, "two-v100")).await;
    assert_eq!(b, json!({"Error": ""}));
    let bound = api.get("pods", "default", "tf-multi").unwrap();
    assert_eq!(bound["spec"]["nodeName"], "two-v100");
    let d = Decision::from_pod(&bound).unwrap();
    assert_eq!(d.node, "two-v100");
    assert_eq!(d.pod_uid, pod["metadata"]["uid"].as_str().unwrap());
    assert_eq!(
        d.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(),
        ["GPU-two-v100-0", "GPU-two-v100-1"]
    );
    assert_eq!((d.per_gpu, d.gpu_gib), (4, 15));
    assert!(DecisionKey::from_bytes(KEY).unwrap().verify(&d));
    let ann = &bound["metadata"]["annotations"];
    assert_eq!(ann[ANN_ACK_ALLOCATION], r#"{"0":{"0":4,"1":4}}"#);
    assert_eq!(ann[ANN_GPUSHARE_POD], "8");
    // The annotation was written before the Binding was created.
    let reqs = api.requests();
    let patch = reqs
        .iter()
        .position(|r| r.starts_with("PATCH /api/v1/namespaces/default/pods/tf-multi"))
        .unwrap();
    let binding = reqs
        .iter()
        .position(|r| r.starts_with("POST /api/v1/namespaces/default/pods/tf-multi/binding"))
        .unwrap();
    assert!(patch < binding, "{reqs:?}");

    // 7 over 2 is refused everywhere, for good.
    let bad = gpu_pod(&api, "odd", 7, 2);
    let f = post(
        &r.url,
        "/filter",
        &json!({"Pod": bad, "NodeNames": ["two-v100"]}),
    )
    .await;
    assert_eq!(f["NodeNames"], json!([]));
    assert!(f["FailedAndUnresolvableNodes"]["two-v100"]
        .as_str()
        .unwrap()
        .contains("not divisible"));

    // The 8/2 pod took 4 of each GPU: a 12 GiB single-GPU pod no longer fits,
    // which preemption could fix.
    settled(&r, 1).await;
    let big = gpu_pod(&api, "big", 12, 1);
    let f = post(
        &r.url,
        "/filter",
        &json!({"Pod": big, "NodeNames": ["two-v100"]}),
    )
    .await;
    assert!(
        f["FailedNodes"]["two-v100"]
            .as_str()
            .unwrap()
            .contains("not enough free GPU memory"),
        "{f}"
    );
    let b = post(&r.url, "/bind", &bind_args(&big, "two-v100")).await;
    assert!(
        b["Error"]
            .as_str()
            .unwrap()
            .contains("not enough free GPU memory"),
        "{b}"
    );
    assert!(api.get("pods", "default", "big").unwrap()["spec"]["nodeName"].is_null());
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_binds_never_over_commit() {
    let api = ApiServer::start().await;
    gpu_node(&api, "n1", 2, 16160); // 2 x 15 GiB
    let pods: Vec<Value> = (0..64)
        .map(|i| gpu_pod(&api, &format!("p{i:02}"), 2, 1))
        .collect();
    let r = start_extender(&api, Policy::Spread).await;
    let mut tasks = Vec::new();
    for pod in &pods {
        let url = r.url.clone();
        let args = bind_args(pod, "n1");
        tasks.push(tokio::spawn(
            async move { post(&url, "/bind", &args).await },
        ));
    }
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap()["Error"] == "" {
            ok += 1;
        }
    }
    // 7 pods of 2 GiB per 15 GiB GPU.
    assert_eq!(ok, 14);
    let mut per_gpu = [0u64; 2];
    let mut bound = 0;
    for pod in api.list("pods") {
        let d = Decision::from_pod(&pod);
        assert_eq!(
            d.is_some(),
            !pod["spec"]["nodeName"].is_null(),
            "a decision without a binding, or the reverse: {pod}"
        );
        if let Some(d) = d {
            bound += 1;
            for g in d.gpus {
                per_gpu[g.index as usize] += d.per_gpu;
            }
        }
    }
    assert_eq!(bound, 14);
    assert_eq!(per_gpu, [14, 14]);
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_binding_rolls_back() {
    let api = ApiServer::start().await;
    gpu_node(&api, "n1", 1, 16160);
    let a = gpu_pod(&api, "a", 15, 1);
    let b = gpu_pod(&api, "b", 15, 1);
    let r = start_extender(&api, Policy::Binpack).await;
    api.fail_next(axum::http::Method::POST, "/pods/a/binding", 500);
    let res = post(&r.url, "/bind", &bind_args(&a, "n1")).await;
    assert!(
        res["Error"]
            .as_str()
            .unwrap()
            .contains("binding default/a to n1 failed"),
        "{res}"
    );
    let pod_a = api.get("pods", "default", "a").unwrap();
    assert!(pod_a["spec"]["nodeName"].is_null());
    assert!(
        decision(&api, "a").is_none(),
        "decision left behind: {pod_a}"
    );
    assert!(pod_a["metadata"]["annotations"][ANN_GPUSHARE_POD].is_null());
    // The whole GPU is free again: b gets it.
    assert_eq!(
        post(&r.url, "/bind", &bind_args(&b, "n1")).await,
        json!({"Error": ""})
    );
    let d = decision(&api, "b").unwrap();
    assert_eq!(d.per_gpu, 15);
    // A retried bind of a bound pod changes nothing (and never rolls back
    // its decision); to another node it is refused.
    assert_eq!(
        post(&r.url, "/bind", &bind_args(&b, "n1")).await,
        json!({"Error": ""})
    );
    let res = post(&r.url, "/bind", &bind_args(&b, "n2")).await;
    assert!(
        res["Error"]
            .as_str()
            .unwrap()
            .contains("already bound to n1"),
        "{res}"
    );
    assert_eq!(decision(&api, "b").unwrap(), d);
    assert_eq!(
        api.get("pods", "default", "b").unwrap()["spec"]["nodeName"],
        "n1"
    );
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_pods_hold_memory_until_gone_and_a_restart_loses_nothing() {
    let api = ApiServer::start().await;
    gpu_node(&api, "n1", 1, 16160);
    let a = gpu_pod(&api, "a", 10, 1);
    let b = gpu_pod(&api, "b", 10, 1);
    let r = start_extender(&api, Policy::Binpack).await;
    assert_eq!(
        post(&r.url, "/bind", &bind_args(&a, "n1")).await,
        json!({"Error": ""})
    );
    settled(&r, 1).await;

    // The extender restarts: the new one rebuilds the same view.
    r.server.abort();
    let r = start_extender(&api, Policy::Binpack).await;
    settled(&r, 1).await;
    let f = post(&r.url, "/filter", &json!({"Pod": b, "NodeNames": ["n1"]})).await;
    assert_eq!(f["NodeNames"], json!([]), "{f}");

    // a is deleted: while it terminates, its memory is still held.
    let client = client_for(&api).await;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, "default");
    pods.delete("a", &Default::default()).await.unwrap();
    assert!(!api.get("pods", "default", "a").unwrap()["metadata"]["deletionTimestamp"].is_null());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let f = post(&r.url, "/filter", &json!({"Pod": b, "NodeNames": ["n1"]})).await;
    assert_eq!(
        f["NodeNames"],
        json!([]),
        "terminating pod counted free: {f}"
    );
    // Gone: now b fits.
    api.finalize("pods", "default", "a");
    settled(&r, 0).await;
    let f = post(&r.url, "/filter", &json!({"Pod": b, "NodeNames": ["n1"]})).await;
    assert_eq!(f["NodeNames"], json!(["n1"]), "{f}");
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics() {
    let api = ApiServer::start().await;
    gpu_node(&api, "n1", 2, 16160);
    let pod = gpu_pod(&api, "a", 4, 2);
    let r = start_extender(&api, Policy::Binpack).await;
    assert_eq!(
        http(&r.url, "GET", "/healthz", "").await,
        (200, "ok".to_string())
    );
    post(&r.url, "/filter", &json!({"Pod": pod, "NodeNames": ["n1"]})).await;
    post(&r.url, "/bind", &bind_args(&pod, "n1")).await;
    settled(&r, 1).await;
    let (code, text) = http(&r.url, "GET", "/metrics", "").await;
    assert_eq!(code, 200);
    assert!(
        text.contains("cgpu_extender_requests_total{verb=\"filter\",result=\"fit\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("cgpu_extender_requests_total{verb=\"bind\",result=\"ok\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("cgpu_extender_nodes 1\n"), "{text}");
    assert!(text.contains("cgpu_extender_pods 1\n"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    // The reference OpenMetrics parser (Python prometheus_client) reads it.
    let parsed = openmetrics_parse(&text);
    assert!(
        parsed.contains("cgpu_extender_requests filter fit 1.0\n"),
        "{parsed}"
    );
    assert!(parsed.contains("cgpu_extender_pods  1.0\n"), "{parsed}");
    // The 4 GiB pod over 2 GPUs: 2 on each of n1's two 15 GiB GPUs.
    assert!(
        parsed.contains("cgpu_extender_gpu_allocated_gib n1 0 2.0\n"),
        "{parsed}"
    );
    assert!(
        parsed.contains("cgpu_extender_gpu_allocated_gib n1 1 2.0\n"),
        "{parsed}"
    );
    assert!(
        parsed.contains("cgpu_extender_gpu_total_gib n1 1 15.0\n"),
        "{parsed}"
    );
    assert!(
        parsed.contains("cgpu_extender_gpu_pods n1 0 1.0\n"),
        "{parsed}"
    );
    assert!(
        parsed.contains("cgpu_extender_gpu_healthy n1 1 1.0\n"),
        "{parsed}"
    );
    // Per namespace: a holds 4 GiB; a second pod asks 6 more, not placed.
    gpu_pod(&api, "waiting", 6, 1);
    let mut text = String::new();
    for _ in 0..6000 {
        text = http(&r.url, "GET", "/metrics", "").await.1;
        if text.contains("requested_gib{namespace=\"default\"} 10\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let parsed = openmetrics_parse(&text);
    assert!(
        parsed.contains("cgpu_extender_namespace_gpu_memory_allocated_gib default 4.0\n"),
        "{parsed}"
    );
    assert!(
        parsed.contains("cgpu_extender_namespace_gpu_memory_requested_gib default 10.0\n"),
        "{parsed}"
    );
    r.server.abort();
}

/// Parses OpenMetrics text with `prometheus_client.openmetrics.parser`;
/// one line per sample: family, label values, value.
fn openmetrics_parse(text: &str) -> String {
    use std::io::Write;
    let deps = cgpu_testkit::test_deps();
    let script = "import sys\n\
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\n\
        for f in parse(sys.stdin.read()):\n\
        \x20   for s in f.samples:\n\
        \x20       print(f.name, ' '.join(s.labels[k] for k in sorted(s.labels, reverse=True)), float(s.value))\n";
    let mut child = std::process::Command::new(&deps.python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser rejected the metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Node objects as the scheduler holds them.
fn nodes(api: &ApiServer, names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|n| api.get("nodes", "", n).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_gets_its_answer_in_the_mode_it_asked() {
    use cgpu_cluster_testkit::scheduler::Scheduler;
    let api = ApiServer::start().await;
    gpu_node(&api, "two-v100", 2, 16160);
    gpu_node(&api, "one-v100", 1, 16160);
    api.put("nodes", json!({"metadata": {"name": "cpu"}}));
    let r = start_extender(&api, Policy::Binpack).await;
    let all = nodes(&api, &["two-v100", "one-v100", "cpu"]);
    // Both modes, and gpushare's paths in front of the same handlers.
    for (i, s) in [
        Scheduler::new(&r.url, true),
        Scheduler::new(&r.url, false),
        Scheduler::new(&r.url, false).with_prefix("/gpushare-scheduler"),
    ]
    .into_iter()
    .enumerate()
    {
        let pod = gpu_pod(&api, &format!("multi-{i}"), 8, 2);
        let f = s.filter(&pod, &all).await.unwrap();
        assert_eq!(f.nodes, ["two-v100"], "{s:?}");
        assert!(f.unresolvable["one-v100"].contains("asks for 2 GPUs"));
        assert!(f.unresolvable["cpu"].contains("no shared GPUs"));
        if s.prefix.is_empty() {
            let p = s.prioritize(&pod, &all[..2]).await.unwrap();
            assert_eq!(p[0].0, "two-v100");
            assert!(p[0].1 > p[1].1, "{p:?}");
        }
        s.bind(&pod, "two-v100").await.unwrap();
        let d = decision(&api, &format!("multi-{i}")).unwrap();
        assert_eq!((d.node.as_str(), d.per_gpu), ("two-v100", 4));
        // A pod that asks for no GPU memory passes every node.
        let plain = api.put(
            "pods",
            json!({"metadata": {"name": format!("plain-{i}"), "namespace": "default"},
                   "spec": {"containers": [{"name": "c"}]}}),
        );
        assert_eq!(
            s.filter(&plain, &all).await.unwrap().nodes,
            ["two-v100", "one-v100", "cpu"]
        );
    }
    // 3 pods of 4+4: 12 GiB of each 15 GiB GPU; a 4 GiB pod fits no more.
    settled(&r, 3).await;
    let s = Scheduler::new(&r.url, false);
    let late = gpu_pod(&api, "late", 4, 1);
    let f = s.filter(&late, &all[..1]).await.unwrap();
    assert!(f.nodes.is_empty(), "{f:?}");
    assert!(f.failed["two-v100"].contains("not enough free GPU memory"));
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_get_200_and_the_reason() {
    let api = ApiServer::start().await;
    let r = start_extender(&api, Policy::Binpack).await;
    for path in ["/filter", "/gpushare-scheduler/filter"] {
        let (code, body) = http(&r.url, "POST", path, "{\"Pod\": [not json").await;
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["Error"]
                .as_str()
                .unwrap()
                .contains("cannot decode the filter request"),
            "{v}"
        );
    }
    let (code, body) = http(&r.url, "POST", "/bind", "{\"PodName\": 7}").await;
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["Error"]
            .as_str()
            .unwrap()
            .contains("cannot decode the bind request"),
        "{v}"
    );
    let (code, body) = http(&r.url, "POST", "/prioritize", "nonsense").await;
    assert_eq!((code, body.as_str()), (200, "[]"));
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpushare_version_inspect_labels_and_annotations() {
    let api = ApiServer::start().await;
    gpu_node(&api, "n1", 2, 16160);
    // ACK's placement label chooses spread though the default is binpack.
    api.patch(
        "nodes",
        "",
        "n1",
        &json!({"metadata": {"labels": {LABEL_NODE_PLACEMENT_ACK: "spread"}}}),
    );
    let r = start_extender(&api, Policy::Binpack).await;
    assert_eq!(
        http(&r.url, "GET", "/version", "").await,
        (200, env!("CARGO_PKG_VERSION").to_string())
    );
    let a = gpu_pod(&api, "a", 2, 1);
    let b = gpu_pod(&api, "b", 3, 1);
    for p in [&a, &b] {
        let res = post(&r.url, "/gpushare-scheduler/bind", &bind_args(p, "n1")).await;
        assert_eq!(res, json!({"Error": ""}));
    }
    let (da, db) = (decision(&api, "a").unwrap(), decision(&api, "b").unwrap());
    assert_eq!((da.gpus[0].index, db.gpus[0].index), (0, 1), "spread");
    let ann = &api.get("pods", "default", "b").unwrap()["metadata"]["annotations"];
    assert_eq!(ann[ANN_GPUSHARE_IDX], "1");
    assert_eq!(ann[ANN_GPUSHARE_POD], "3");
    assert_eq!(ann[ANN_GPUSHARE_DEV], "15");
    assert_eq!(ann[ANN_GPUSHARE_ASSIGNED], "false");
    settled(&r, 2).await;
    let (code, body) = http(&r.url, "GET", "/gpushare-scheduler/inspect", "").await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        json!({"nodes": [{"name": "n1", "totalGPU": 30, "usedGPU": 5, "devs": [
            {"id": 0, "totalGPU": 15, "usedGPU": 2, "pods": [{"name": "a", "namespace": "default", "usedGPU": 2}]},
            {"id": 1, "totalGPU": 15, "usedGPU": 3, "pods": [{"name": "b", "namespace": "default", "usedGPU": 3}]}]}]})
    );
    let (_, one) = http(&r.url, "GET", "/gpushare-scheduler/inspect/n1", "").await;
    assert_eq!(serde_json::from_str::<Value>(&one).unwrap(), v);
    let (_, none) = http(&r.url, "GET", "/gpushare-scheduler/inspect/ghost", "").await;
    let none: Value = serde_json::from_str(&none).unwrap();
    assert_eq!(none["nodes"], json!([]));
    assert!(none["error"].as_str().unwrap().contains("ghost"));
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copied_and_forged_decisions_count_for_nothing() {
    let api = ApiServer::start().await;
    gpu_node(&api, "n1", 1, 16160); // 15 GiB
    let a = gpu_pod(&api, "a", 10, 1);
    let r = start_extender(&api, Policy::Binpack).await;
    assert_eq!(
        post(&r.url, "/bind", &bind_args(&a, "n1")).await,
        json!({"Error": ""})
    );
    settled(&r, 1).await;
    // A pod bound by spec.nodeName carrying a's annotations, all of them.
    let ann = api.get("pods", "default", "a").unwrap()["metadata"]["annotations"].clone();
    api.put(
        "pods",
        json!({"metadata": {"name": "copycat", "namespace": "default", "annotations": ann},
               "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": {RESOURCE_GPU_MEM: "10"}}}]},
               "status": {"phase": "Running"}}),
    );
    // A pod with a decision for itself, signed by another key.
    let forger = api.put(
        "pods",
        json!({"metadata": {"name": "forger", "namespace": "default"},
               "spec": {"nodeName": "n1", "containers": [{"name": "main", "resources": {"limits": {RESOURCE_GPU_MEM: "5"}}}]},
               "status": {"phase": "Running"}}),
    );
    let mut forged = decision(&api, "a").unwrap();
    forged.pod_uid = forger["metadata"]["uid"].as_str().unwrap().into();
    forged.per_gpu = 5;
    forged.containers.insert("main".into(), 5);
    DecisionKey::from_bytes(b"the forger's own key, 16+ bytes")
        .unwrap()
        .sign(&mut forged);
    api.patch(
        "pods",
        "default",
        "forger",
        &json!({"metadata": {"annotations": {ANN_ALLOCATION: serde_json::to_string(&forged).unwrap()}}}),
    );
    // The watch delivers changes in order: once it shows a pod bound after
    // them, the view has seen the copy and the forgery.
    let marker = gpu_pod(&api, "marker", 1, 1);
    assert_eq!(
        post(&r.url, "/bind", &bind_args(&marker, "n1")).await,
        json!({"Error": ""})
    );
    settled(&r, 2).await;
    // 4 GiB are still free for the rightful pods.
    let b = gpu_pod(&api, "b", 4, 1);
    let f = post(&r.url, "/filter", &json!({"Pod": b, "NodeNames": ["n1"]})).await;
    assert_eq!(f["NodeNames"], json!(["n1"]), "{f}");
    assert_eq!(
        post(&r.url, "/bind", &bind_args(&b, "n1")).await,
        json!({"Error": ""})
    );
    let (_, text) = http(&r.url, "GET", "/metrics", "").await;
    assert!(
        text.contains("cgpu_extender_gpu_allocated_gib{node=\"n1\",gpu=\"0\"} 15\n"),
        "{text}"
    );
    r.server.abort();
}

/// A node still served by gpushare's device plugin with `--memory-unit=MiB`
/// advertises `aliyun.com/gpu-mem` in MiB and its pods ask in MiB: the
/// extender counts in the node's own unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpushare_nodes_in_mib_are_counted_in_mib() {
    let api = ApiServer::start().await;
    api.put(
        "nodes",
        json!({"metadata": {"name": "mib"},
               "status": {"capacity": {RESOURCE_GPU_COUNT: "2", RESOURCE_GPU_MEM: "32320"}}}),
    );
    // Running under gpushare: 10000 MiB on GPU0.
    api.put(
        "pods",
        json!({"metadata": {"name": "old", "namespace": "default",
                            "annotations": {ANN_GPUSHARE_IDX: "0", ANN_GPUSHARE_POD: "10000"}},
               "spec": {"nodeName": "mib", "containers": [{"name": "main", "resources": {"limits": {RESOURCE_GPU_MEM: "10000"}}}]},
               "status": {"phase": "Running"}}),
    );
    let r = start_extender(&api, Policy::Binpack).await;
    settled(&r, 1).await;
    let a = gpu_pod(&api, "a", 6000, 1);
    assert_eq!(
        post(&r.url, "/gpushare-scheduler/bind", &bind_args(&a, "mib")).await,
        json!({"Error": ""})
    );
    let d = decision(&api, "a").unwrap();
    // 16160 - 10000 = 6160 MiB left on GPU0: binpack puts it there.
    assert_eq!((d.gpus[0].index, d.per_gpu, d.gpu_gib), (0, 6000, 16160));
    settled(&r, 2).await;
    let b = gpu_pod(&api, "b", 200, 1);
    let f = post(&r.url, "/filter", &json!({"Pod": b, "NodeNames": ["mib"]})).await;
    assert_eq!(f["NodeNames"], json!(["mib"]));
    let big = gpu_pod(&api, "big", 16161, 1);
    let f = post(
        &r.url,
        "/filter",
        &json!({"Pod": big, "NodeNames": ["mib"]}),
    )
    .await;
    assert!(f["FailedAndUnresolvableNodes"]["mib"].is_string(), "{f}");
    r.server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_choose_gpus_by_model_and_uuid() {
    let api = ApiServer::start().await;
    let list = vec![
        NodeGpu {
            index: 0,
            uuid: "GPU-t4".into(),
            memory_mib: 15360,
            gib: 15,
            model: "Tesla T4".into(),
            unhealthy: false,
            mib: false,
        },
        NodeGpu {
            index: 1,
            uuid: "GPU-a10".into(),
            memory_mib: 23028,
            gib: 22,
            model: "NVIDIA A10".into(),
            unhealthy: false,
            mib: false,
        },
    ];
    api.put(
        "nodes",
        json!({"metadata": {"name": "n1", "annotations": {ANN_NODE_GPUS: serde_json::to_string(&list).unwrap()}}}),
    );
    let r = start_extender(&api, Policy::Binpack).await;
    let cases = [
        ("use-a10", json!({ANN_USE_GPUTYPE: "a10"}), Some(1)),
        ("avoid-a10", json!({ANN_NOUSE_GPUTYPE: "A10,H100"}), Some(0)),
        ("by-uuid", json!({ANN_USE_GPUUUID: "GPU-a10"}), Some(1)),
        ("not-t4-uuid", json!({ANN_NOUSE_GPUUUID: "GPU-t4"}), Some(1)),
        ("h100", json!({ANN_USE_GPUTYPE: "H100"}), None),
    ];
    for (name, ann, want) in cases {
        let pod = api.put(
            "pods",
            json!({"metadata": {"name": name, "namespace": "default", "annotations": ann},
                   "spec": {"containers": [{"name": "main", "resources": {"limits": {RESOURCE_GPU_MEM: "2"}}}]}}),
        );
        let f = post(&r.url, "/filter", &json!({"Pod": pod, "NodeNames": ["n1"]})).await;
        let b = post(&r.url, "/bind", &bind_args(&pod, "n1")).await;
        match want {
            Some(idx) => {
                assert_eq!(f["NodeNames"], json!(["n1"]), "{name}: {f}");
                assert_eq!(b, json!({"Error": ""}), "{name}");
                assert_eq!(decision(&api, name).unwrap().gpus[0].index, idx, "{name}");
            }
            None => {
                assert!(
                    f["FailedAndUnresolvableNodes"]["n1"]
                        .as_str()
                        .unwrap()
                        .contains(
                        "no healthy GPU of the node matches the pod's nvidia.com/use-gputype=H100"
                    ),
                    "{f}"
                );
                assert!(b["Error"].as_str().unwrap() != "", "{b}");
            }
        }
    }
    r.server.abort();
}
