//! The scheduler extender: `filter`, `prioritize` and `bind` for pods that
//! ask for `aliyun.com/gpu-mem`.
//!
//! Its view of GPU use is rebuilt from the API server on start (a list of
//! nodes and pods) and kept by watches; a pod holds its share from the
//! moment the extender decides at bind until the pod is gone from the API
//! server (terminating pods still hold it). Filter and prioritize only read
//! the view; the final choice is made at bind, under the node's lock: the
//! GPUs are chosen against the view plus the decisions made but not yet seen
//! through the watch, the decision is signed and written on the pod, and only
//! then is the Binding created. If the Binding fails, the annotation is
//! removed and the reservation dropped.

use crate::kube_io::to_value;
use crate::signing::{DecisionKey, DecisionVerifier};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use cgpu_cluster_core::decision::{
    gpu_allowed, gpu_constraints, node_gpus, node_usage, pod_compute, pod_compute_use, pod_gpu_use,
    pod_request, Decision, NodeGpu,
};
use cgpu_cluster_core::names::*;
use cgpu_cluster_core::placement::{self, Gpu, Policy};
use cgpu_cluster_core::wire::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub verb: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub node: String,
    pub gpu: String,
}

/// The extender's Prometheus metrics.
pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<ResultLabels, Counter>,
    pub nodes: Gauge,
    pub pods: Gauge,
    pub reserved: Gauge,
    pub gpu_allocated: Family<GpuLabels, Gauge>,
    pub gpu_total: Family<GpuLabels, Gauge>,
    pub gpu_pods: Family<GpuLabels, Gauge>,
    pub gpu_healthy: Family<GpuLabels, Gauge>,
    pub ns_allocated: Family<NamespaceLabels, Gauge>,
    pub ns_requested: Family<NamespaceLabels, Gauge>,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("cgpu_extender");
        let requests = Family::<ResultLabels, Counter>::default();
        let nodes = Gauge::default();
        let pods = Gauge::default();
        let reserved = Gauge::default();
        registry.register(
            "requests",
            "Scheduler requests served, by verb (filter/prioritize/bind) and result",
            requests.clone(),
        );
        registry.register(
            "nodes",
            "Nodes with shared GPUs in the extender's view",
            nodes.clone(),
        );
        registry.register(
            "pods",
            "Pods holding GPU memory in the extender's view",
            pods.clone(),
        );
        registry.register(
            "reserved_pods",
            "Decisions made at bind not yet seen back through the watch",
            reserved.clone(),
        );
        let gpu_allocated = Family::<GpuLabels, Gauge>::default();
        let gpu_total = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "gpu_allocated_gib",
            "GiB of a GPU promised to pods (decided, bound, running or terminating)",
            gpu_allocated.clone(),
        );
        registry.register(
            "gpu_total_gib",
            "Size of a GPU in GiB as the cluster counts it",
            gpu_total.clone(),
        );
        let gpu_pods = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "gpu_pods",
            "Pods holding a share of a GPU",
            gpu_pods.clone(),
        );
        let gpu_healthy = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "gpu_healthy",
            "1 while the node's device plugin reports the GPU healthy, 0 while it is unhealthy (lost, or a critical XID error): no new pod is placed on it",
            gpu_healthy.clone(),
        );
        let ns_allocated = Family::<NamespaceLabels, Gauge>::default();
        let ns_requested = Family::<NamespaceLabels, Gauge>::default();
        registry.register(
            "namespace_gpu_memory_allocated_gib",
            "GPU memory (GiB, over all their GPUs) held by a namespace's pods: decided, bound, running or terminating",
            ns_allocated.clone(),
        );
        registry.register(
            "namespace_gpu_memory_requested_gib",
            "GPU memory (GiB) asked for by a namespace's unfinished pods, placed or not",
            ns_requested.clone(),
        );
        Metrics {
            gpu_allocated,
            gpu_total,
            gpu_pods,
            gpu_healthy,
            ns_allocated,
            ns_requested,
            registry,
            requests,
            nodes,
            pods,
            reserved,
        }
    }

    fn count(&self, verb: &str, result: &str) {
        self.requests
            .get_or_create(&ResultLabels {
                verb: verb.into(),
                result: result.into(),
            })
            .inc();
    }
}

struct View {
    /// Checks the signature of every decision the view counts.
    verifier: DecisionVerifier,
    nodes: HashMap<String, Value>,
    /// Pods by uid.
    pods: HashMap<String, Value>,
    /// Decisions made at bind, by pod uid: (node, GPU index → GiB), until the
    /// watch shows the pod bound with its decision (or gone).
    reserved: HashMap<String, Reservation>,
    /// Counts reservations, to tell which were made before a relist began.
    seq: u64,
}

struct Reservation {
    node: String,
    per_gpu: BTreeMap<u32, u64>,
    /// Compute share (percent) on each of its GPUs.
    compute: u32,
    seq: u64,
}

impl View {
    fn new(verifier: DecisionVerifier) -> View {
        View {
            verifier,
            nodes: HashMap::new(),
            pods: HashMap::new(),
            reserved: HashMap::new(),
            seq: 0,
        }
    }

    fn holds(&self, pod: &Value) -> bool {
        !pod_gpu_use(pod, &|d| self.verifier.verify(d)).is_empty()
    }

    /// The node's GPUs the pod may use (healthy, allowed by its model/UUID
    /// annotations, with `compute` percent of their compute free), with
    /// what they hold.
    fn usage_for(&self, node: &str, pod: &Value, compute: u32) -> Option<(Vec<NodeGpu>, Vec<Gpu>)> {
        let (gpus, mut usage) = self.usage(node)?;
        let busy = if compute > 0 {
            self.compute_used(node)
        } else {
            BTreeMap::new()
        };
        usage.retain(|u| {
            gpus.iter()
                .any(|g| g.index == u.index && !g.unhealthy && gpu_allowed(pod, g))
                && busy.get(&u.index).copied().unwrap_or(0) + compute <= 100
        });
        Some((gpus, usage))
    }

    /// The compute shares (percent) held on each GPU of the node.
    fn compute_used(&self, node: &str) -> BTreeMap<u32, u32> {
        let mut out: BTreeMap<u32, u32> = BTreeMap::new();
        for (uid, p) in &self.pods {
            if self.reserved.contains_key(uid) || p["spec"]["nodeName"].as_str() != Some(node) {
                continue;
            }
            for (i, c) in pod_compute_use(p, &|d| self.verifier.verify(d)) {
                *out.entry(i).or_default() += c;
            }
        }
        for r in self.reserved.values().filter(|r| r.node == node) {
            for i in r.per_gpu.keys() {
                *out.entry(*i).or_default() += r.compute;
            }
        }
        out
    }

    fn usage(&self, node: &str) -> Option<(Vec<NodeGpu>, Vec<Gpu>)> {
        let n = self.nodes.get(node)?;
        let gpus = node_gpus(n);
        let on_node = self
            .pods
            .iter()
            .filter(|(uid, p)| {
                !self.reserved.contains_key(*uid) && p["spec"]["nodeName"].as_str() == Some(node)
            })
            .map(|(_, p)| p);
        let mut usage = node_usage(&gpus, on_node, &|d| self.verifier.verify(d));
        for r in self.reserved.values() {
            if r.node != node {
                continue;
            }
            for (idx, gib) in &r.per_gpu {
                if let Some(g) = usage.iter_mut().find(|g| g.index == *idx) {
                    g.used += gib;
                    g.pods += 1;
                }
            }
        }
        Some((gpus, usage))
    }

    /// The node's policy: its `cgpu.io/gpu-policy` label, else ACK's
    /// `ack.node.gpu.placement`, else the extender's default.
    fn policy(&self, node: &str, default: Policy) -> Policy {
        let labels = self.nodes.get(node).map(|n| &n["metadata"]["labels"]);
        [LABEL_NODE_POLICY, LABEL_NODE_PLACEMENT_ACK]
            .iter()
            .find_map(|l| {
                labels
                    .and_then(|ls| ls[*l].as_str())
                    .and_then(Policy::parse)
            })
            .unwrap_or(default)
    }

    /// A reservation ends when the watch shows the pod bound with its
    /// decision (the view then counts it), or the pod deleted.
    fn settle(&mut self) {
        let done: Vec<String> = self
            .reserved
            .keys()
            .filter(|uid| self.pods.get(*uid).is_some_and(|p| self.holds(p)))
            .cloned()
            .collect();
        for uid in done {
            self.reserved.remove(&uid);
        }
    }

    /// After a relist that began at `since`: reservations made before it
    /// whose pod is not listed belong to pods deleted meanwhile.
    fn settle_after_relist(&mut self, since: u64) {
        let pods = &self.pods;
        self.reserved
            .retain(|uid, r| r.seq >= since || pods.contains_key(uid));
        self.settle();
    }
}

/// The extender's state, shared by its HTTP handlers and watches.
pub struct Extender {
    client: Client,
    key: DecisionKey,
    default_policy: Policy,
    view: Mutex<View>,
    node_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pods_synced: AtomicBool,
    nodes_synced: AtomicBool,
    pub metrics: Metrics,
}

fn uid_of(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap_or("").to_string()
}

impl Extender {
    pub fn new(client: Client, key: DecisionKey, default_policy: Policy) -> Arc<Extender> {
        Arc::new(Extender {
            client,
            view: Mutex::new(View::new(key.verifier())),
            key,
            default_policy,
            node_locks: Mutex::new(HashMap::new()),
            pods_synced: AtomicBool::new(false),
            nodes_synced: AtomicBool::new(false),
            metrics: Metrics::new(),
        })
    }

    /// Starts the pod and node watches (each first lists everything, then
    /// follows changes; restarted with backoff when the API server goes away).
    pub fn spawn_watches(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let pods: Api<Pod> = Api::all(me.client.clone());
            let mut buf: HashMap<String, Value> = HashMap::new();
            let mut since = 0;
            let mut s = std::pin::pin!(
                watcher::watcher(pods, watcher::Config::default()).default_backoff()
            );
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(Event::Init) => {
                        buf.clear();
                        since = me.view.lock().seq;
                    }
                    Ok(Event::InitApply(p)) => {
                        let v = to_value(&p);
                        buf.insert(uid_of(&v), v);
                    }
                    Ok(Event::InitDone) => {
                        let mut view = me.view.lock();
                        view.pods = std::mem::take(&mut buf);
                        view.settle_after_relist(since);
                        me.pods_synced.store(true, Ordering::Release);
                        me.update_gauges(&view);
                    }
                    Ok(Event::Apply(p)) => {
                        let v = to_value(&p);
                        let mut view = me.view.lock();
                        view.pods.insert(uid_of(&v), v);
                        view.settle();
                        me.update_gauges(&view);
                    }
                    Ok(Event::Delete(p)) => {
                        let v = to_value(&p);
                        let mut view = me.view.lock();
                        let uid = uid_of(&v);
                        view.pods.remove(&uid);
                        view.reserved.remove(&uid);
                        me.update_gauges(&view);
                    }
                    Err(e) => tracing::warn!("pod watch: {e}; retrying"),
                }
            }
        });
        let me = self.clone();
        tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(me.client.clone());
            let mut buf: HashMap<String, Value> = HashMap::new();
            let mut s = std::pin::pin!(
                watcher::watcher(nodes, watcher::Config::default()).default_backoff()
            );
            while let Some(ev) = s.next().await {
                let name = |v: &Value| v["metadata"]["name"].as_str().unwrap_or("").to_string();
                match ev {
                    Ok(Event::Init) => buf.clear(),
                    Ok(Event::InitApply(n)) => {
                        let v = to_value(&n);
                        buf.insert(name(&v), v);
                    }
                    Ok(Event::InitDone) => {
                        let mut view = me.view.lock();
                        view.nodes = std::mem::take(&mut buf);
                        me.nodes_synced.store(true, Ordering::Release);
                        me.update_gauges(&view);
                    }
                    Ok(Event::Apply(n)) => {
                        let v = to_value(&n);
                        let mut view = me.view.lock();
                        view.nodes.insert(name(&v), v);
                        me.update_gauges(&view);
                    }
                    Ok(Event::Delete(n)) => {
                        let v = to_value(&n);
                        let mut view = me.view.lock();
                        view.nodes.remove(&name(&v));
                        me.update_gauges(&view);
                    }
                    Err(e) => tracing::warn!("node watch: {e}; retrying"),
                }
            }
        });
    }

    fn update_gauges(&self, view: &View) {
        self.metrics.nodes.set(
            view.nodes
                .values()
                .filter(|n| !node_gpus(n).is_empty())
                .count() as i64,
        );
        self.metrics
            .pods
            .set(view.pods.values().filter(|p| view.holds(p)).count() as i64);
        self.metrics.reserved.set(view.reserved.len() as i64);
    }

    /// Both watches have listed everything once.
    pub fn ready(&self) -> bool {
        self.pods_synced.load(Ordering::Acquire) && self.nodes_synced.load(Ordering::Acquire)
    }

    /// Publishes the public key of the decisions (see [`crate::signing`]).
    pub async fn publish_public_key(&self, namespace: &str) -> Result<(), String> {
        self.key.publish(&self.client, namespace).await
    }

    /// The routes: cgpu's, and gpushare's beside them (same handlers), so a
    /// scheduler configured for gpushare's extender needs no change.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/filter", post(filter))
            .route("/prioritize", post(prioritize))
            .route("/bind", post(bind))
            .route("/gpushare-scheduler/filter", post(filter))
            .route("/gpushare-scheduler/prioritize", post(prioritize))
            .route("/gpushare-scheduler/bind", post(bind))
            .route("/gpushare-scheduler/inspect", get(inspect_all))
            .route("/gpushare-scheduler/inspect/{node}", get(inspect_node))
            .route("/version", get(|| async { env!("CARGO_PKG_VERSION") }))
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self.clone())
    }

    /// The filter's answer for one pod over the given nodes.
    /// The filter's answer for one pod over the given nodes, in the form
    /// the scheduler asked in: node names for node names (`nodeCacheCapable:
    /// true`), node objects for node objects.
    pub fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let mut out = self.filter_names(args);
        let pass = out.node_names.take().unwrap_or_default();
        match (&args.node_names, &args.nodes) {
            (None, Some(list)) => {
                out.nodes = Some(NodeList {
                    items: list
                        .items
                        .iter()
                        .filter(|n| {
                            n["metadata"]["name"]
                                .as_str()
                                .is_some_and(|name| pass.iter().any(|p| p == name))
                        })
                        .cloned()
                        .collect(),
                });
            }
            _ => out.node_names = Some(pass),
        }
        out
    }

    fn filter_names(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let names = node_names(args);
        let mut out = ExtenderFilterResult::default();
        let req = match pod_request(&args.pod) {
            Ok(r) => r,
            Err(reason) => {
                for n in names {
                    out.failed_and_unresolvable_nodes.insert(n, reason.clone());
                }
                out.node_names = Some(Vec::new());
                return out;
            }
        };
        let mut pass = Vec::new();
        if !req.wants_gpu_mem() {
            out.node_names = Some(names);
            return out;
        }
        let compute = match pod_compute(&args.pod, &req) {
            Ok((c, _)) => c,
            Err(reason) => {
                for n in names {
                    out.failed_and_unresolvable_nodes.insert(n, reason.clone());
                }
                out.node_names = Some(Vec::new());
                return out;
            }
        };
        let view = self.view.lock();
        for n in names {
            let Some((gpus, usage)) = view.usage_for(&n, &args.pod, compute) else {
                out.failed_and_unresolvable_nodes
                    .insert(n, "the node is unknown to cgpu-scheduler-extender".into());
                continue;
            };
            if usage.is_empty() && !gpus.is_empty() {
                let compute_only = compute > 0
                    && view
                        .usage_for(&n, &args.pod, 0)
                        .is_some_and(|(_, u)| !u.is_empty());
                if compute_only {
                    out.failed_nodes.insert(
                        n,
                        format!(
                            "no GPU of the node has {compute}% of its compute free \
                             ({ANN_GPU_CORE}); evicting pods from this node would make room"
                        ),
                    );
                } else {
                    let constraints = gpu_constraints(&args.pod);
                    out.failed_and_unresolvable_nodes.insert(
                        n,
                        if constraints.is_empty() {
                            "every GPU of the node is unhealthy".to_string()
                        } else {
                            format!("no healthy GPU of the node matches the pod's {constraints}")
                        },
                    );
                }
                continue;
            }
            if usage.is_empty() {
                out.failed_and_unresolvable_nodes.insert(
                    n,
                    "the node has no shared GPUs (no cgpu-device-plugin running, or no GPU)".into(),
                );
                continue;
            }
            match placement::place(&usage, &req, view.policy(&n, self.default_policy)) {
                Ok(_) => pass.push(n),
                Err(r) if r.resolvable_by_preemption => {
                    out.failed_nodes.insert(n, r.reason);
                }
                Err(r) => {
                    out.failed_and_unresolvable_nodes.insert(n, r.reason);
                }
            }
        }
        out.node_names = Some(pass);
        out
    }

    pub fn prioritize(&self, args: &ExtenderArgs) -> Vec<HostPriority> {
        let names = node_names(args);
        let req = pod_request(&args.pod).ok();
        let view = self.view.lock();
        names
            .into_iter()
            .map(|n| {
                let score = req
                    .as_ref()
                    .filter(|r| r.wants_gpu_mem())
                    .and_then(|r| {
                        let compute = pod_compute(&args.pod, r).ok()?.0;
                        let (_, usage) = view.usage_for(&n, &args.pod, compute)?;
                        placement::score(
                            &usage,
                            r,
                            view.policy(&n, self.default_policy),
                            MAX_EXTENDER_PRIORITY,
                        )
                    })
                    .unwrap_or(0);
                HostPriority { host: n, score }
            })
            .collect()
    }

    fn node_lock(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.node_locks
            .lock()
            .entry(node.to_string())
            .or_default()
            .clone()
    }

    /// Chooses the GPUs, records the decision on the pod, then binds it.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> Result<(), String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &args.pod_namespace);
        let lock = self.node_lock(&args.node);
        let _held = lock.lock().await;
        let pod = pods.get(&args.pod_name).await.map_err(|e| {
            format!(
                "cannot read pod {}/{}: {e}",
                args.pod_namespace, args.pod_name
            )
        })?;
        let pod = to_value(&pod);
        let uid = uid_of(&pod);
        if !args.pod_uid.is_empty() && uid != args.pod_uid {
            return Err(format!(
                "pod {}/{} has uid {uid}, not {} (it was recreated)",
                args.pod_namespace, args.pod_name, args.pod_uid
            ));
        }
        // Already bound (a retried bind whose first answer was lost): never
        // touch a bound pod's decision; succeed only if it is this node's.
        if let Some(bound) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            return if bound == args.node {
                Ok(())
            } else {
                Err(format!(
                    "pod {}/{} is already bound to {bound}",
                    args.pod_namespace, args.pod_name
                ))
            };
        }
        let req = pod_request(&pod)?;
        let (compute, _) = pod_compute(&pod, &req)?;
        let mut annotations = serde_json::Map::new();
        let mut reserved = None;
        if req.wants_gpu_mem() {
            let (decision, per) = {
                let mut view = self.view.lock();
                let (gpus, usage) = view.usage_for(&args.node, &pod, compute).ok_or_else(|| {
                    format!("node {} is unknown to cgpu-scheduler-extender", args.node)
                })?;
                let policy = view.policy(&args.node, self.default_policy);
                let p = placement::place(&usage, &req, policy).map_err(|r| r.reason)?;
                let mut d = Decision::new(&args.node, &uid, &p, &gpus);
                d.compute = compute;
                self.key.sign(&mut d);
                let per: BTreeMap<u32, u64> = p.gpus.iter().map(|&i| (i, p.per_gpu)).collect();
                // Reserve before releasing the view: a concurrent bind on
                // this node (it waits on the node lock anyway) or a filter
                // sees the space as taken from now on.
                view.seq += 1;
                let seq = view.seq;
                view.reserved.insert(
                    uid.clone(),
                    Reservation {
                        node: args.node.clone(),
                        per_gpu: per.clone(),
                        compute,
                        seq,
                    },
                );
                self.update_gauges(&view);
                (d, per)
            };
            reserved = Some(uid.clone());
            annotations.insert(
                ANN_ALLOCATION.into(),
                json!(serde_json::to_string(&decision).expect("decision serialises")),
            );
            annotations.insert(
                ANN_ACK_ALLOCATION.into(),
                json!(decision.ack_allocation(&pod)),
            );
            if per.len() == 1 {
                let idx = per.keys().next().expect("one GPU");
                annotations.insert(ANN_GPUSHARE_IDX.into(), json!(idx.to_string()));
            }
            annotations.insert(ANN_GPUSHARE_DEV.into(), json!(decision.gpu_gib.to_string()));
            annotations.insert(
                ANN_GPUSHARE_POD.into(),
                json!(decision
                    .per_gpu
                    .saturating_mul(per.len() as u64)
                    .to_string()),
            );
            annotations.insert(ANN_GPUSHARE_ASSIGNED.into(), json!("false"));
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            annotations.insert(ANN_GPUSHARE_ASSUME_TIME.into(), json!(nanos.to_string()));
            let patch = json!({"metadata": {"annotations": annotations}});
            if let Err(e) = pods
                .patch(
                    &args.pod_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                self.drop_reservation(&uid);
                return Err(format!("cannot record the GPU decision on the pod: {e}"));
            }
        }
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        });
        let bound: Result<Value, _> = pods
            .create_subresource("binding", &args.pod_name, &PostParams::default(), &binding)
            .await;
        if let Err(e) = bound {
            if let Some(uid) = reserved {
                // Roll back: the pod is not on this node, its decision is void.
                let nulls: serde_json::Map<String, Value> = annotations
                    .keys()
                    .map(|k| (k.clone(), Value::Null))
                    .collect();
                let patch = json!({"metadata": {"annotations": nulls}});
                if let Err(e2) = pods
                    .patch(
                        &args.pod_name,
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    tracing::warn!(
                        "bind of {}/{} failed and its decision could not be removed: {e2}",
                        args.pod_namespace,
                        args.pod_name
                    );
                }
                self.drop_reservation(&uid);
            }
            return Err(format!(
                "binding {}/{} to {} failed: {e}",
                args.pod_namespace, args.pod_name, args.node
            ));
        }
        Ok(())
    }

    fn drop_reservation(&self, uid: &str) {
        let mut view = self.view.lock();
        view.reserved.remove(uid);
        self.update_gauges(&view);
    }
}

fn node_names(args: &ExtenderArgs) -> Vec<String> {
    if let Some(n) = &args.node_names {
        return n.clone();
    }
    args.nodes
        .as_ref()
        .map(|l| {
            l.items
                .iter()
                .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Decodes a scheduler request; what cannot be decoded is answered with
/// HTTP 200 and the reason in `Error` (as gpushare does), so the scheduler
/// logs the reason rather than a bare status code.
fn decode<T: serde::de::DeserializeOwned>(verb: &str, body: &Bytes) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| {
        let msg = format!("cgpu-scheduler-extender cannot decode the {verb} request: {e}");
        tracing::warn!("{msg}");
        msg
    })
}

async fn filter(State(x): State<Arc<Extender>>, body: Bytes) -> Json<ExtenderFilterResult> {
    let args: ExtenderArgs = match decode("filter", &body) {
        Ok(a) => a,
        Err(error) => {
            x.metrics.count("filter", "error");
            return Json(ExtenderFilterResult {
                error,
                ..Default::default()
            });
        }
    };
    let r = x.filter(&args);
    let passed = r.node_names.as_ref().is_some_and(|n| !n.is_empty())
        || r.nodes.as_ref().is_some_and(|n| !n.items.is_empty());
    x.metrics
        .count("filter", if passed { "fit" } else { "no_fit" });
    Json(r)
}

async fn prioritize(State(x): State<Arc<Extender>>, body: Bytes) -> Json<Vec<HostPriority>> {
    // The priority list has no error member: an undecodable request scores
    // no node (the scheduler then ranks by its own plugins).
    let Ok(args) = decode::<ExtenderArgs>("prioritize", &body) else {
        x.metrics.count("prioritize", "error");
        return Json(Vec::new());
    };
    x.metrics.count("prioritize", "ok");
    Json(x.prioritize(&args))
}

async fn bind(State(x): State<Arc<Extender>>, body: Bytes) -> Json<ExtenderBindingResult> {
    let args: ExtenderBindingArgs = match decode("bind", &body) {
        Ok(a) => a,
        Err(error) => {
            x.metrics.count("bind", "error");
            return Json(ExtenderBindingResult { error });
        }
    };
    match x.bind(&args).await {
        Ok(()) => {
            x.metrics.count("bind", "ok");
            Json(ExtenderBindingResult::default())
        }
        Err(error) => {
            tracing::warn!(
                "bind {}/{} on {}: {error}",
                args.pod_namespace,
                args.pod_name,
                args.node
            );
            x.metrics.count("bind", "error");
            Json(ExtenderBindingResult { error })
        }
    }
}

/// gpushare's `/gpushare-scheduler/inspect` answer: per node, its GPUs and
/// the pods on each (GiB).
#[derive(serde::Serialize)]
struct GpushareInspect {
    nodes: Vec<GpushareNode>,
    #[serde(skip_serializing_if = "String::is_empty")]
    error: String,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct GpushareNode {
    name: String,
    #[serde(rename = "totalGPU")]
    total_gpu: u64,
    #[serde(rename = "usedGPU")]
    used_gpu: u64,
    devs: Vec<GpushareDev>,
}

#[derive(serde::Serialize)]
struct GpushareDev {
    id: u32,
    #[serde(rename = "totalGPU")]
    total_gpu: u64,
    #[serde(rename = "usedGPU")]
    used_gpu: u64,
    pods: Vec<GpusharePod>,
}

#[derive(serde::Serialize)]
struct GpusharePod {
    name: String,
    namespace: String,
    #[serde(rename = "usedGPU")]
    used_gpu: u64,
}

impl Extender {
    fn gpushare_inspect(&self, only: Option<&str>) -> GpushareInspect {
        let view = self.view.lock();
        let mut names: Vec<&String> = view
            .nodes
            .keys()
            .filter(|n| only.is_none_or(|o| o == n.as_str()))
            .collect();
        names.sort();
        let mut nodes = Vec::new();
        for name in names {
            let Some((_, usage)) = view.usage(name) else {
                continue;
            };
            if usage.is_empty() {
                continue;
            }
            let devs: Vec<GpushareDev> = usage
                .iter()
                .map(|g| GpushareDev {
                    id: g.index,
                    total_gpu: g.total,
                    used_gpu: g.used,
                    pods: view
                        .pods
                        .values()
                        .filter(|p| p["spec"]["nodeName"].as_str() == Some(name.as_str()))
                        .filter_map(|p| {
                            let gib =
                                *pod_gpu_use(p, &|d| view.verifier.verify(d)).get(&g.index)?;
                            Some(GpusharePod {
                                name: p["metadata"]["name"].as_str().unwrap_or("").into(),
                                namespace: p["metadata"]["namespace"].as_str().unwrap_or("").into(),
                                used_gpu: gib,
                            })
                        })
                        .collect(),
                })
                .collect();
            nodes.push(GpushareNode {
                name: name.clone(),
                total_gpu: usage.iter().map(|g| g.total).sum(),
                used_gpu: usage.iter().map(|g| g.used).sum(),
                devs,
            });
        }
        let error = match only {
            Some(n) if nodes.is_empty() => format!("node {n} has no shared GPUs in the view"),
            _ => String::new(),
        };
        GpushareInspect { nodes, error }
    }
}

async fn inspect_all(State(x): State<Arc<Extender>>) -> Json<GpushareInspect> {
    Json(x.gpushare_inspect(None))
}

async fn inspect_node(
    State(x): State<Arc<Extender>>,
    Path(node): Path<String>,
) -> Json<GpushareInspect> {
    Json(x.gpushare_inspect(Some(&node)))
}

async fn readyz(State(x): State<Arc<Extender>>) -> impl IntoResponse {
    if x.ready() {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first list of pods and nodes",
        )
    }
}

async fn metrics(State(x): State<Arc<Extender>>) -> impl IntoResponse {
    // Per-GPU use, computed when scraped (not on every watch event).
    {
        let view = x.view.lock();
        x.metrics.gpu_allocated.clear();
        x.metrics.gpu_total.clear();
        x.metrics.gpu_pods.clear();
        x.metrics.gpu_healthy.clear();
        x.metrics.ns_allocated.clear();
        x.metrics.ns_requested.clear();
        let mut allocated: BTreeMap<String, u64> = BTreeMap::new();
        let mut requested: BTreeMap<String, u64> = BTreeMap::new();
        for p in view.pods.values() {
            let phase = p["status"]["phase"].as_str().unwrap_or("");
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            let ns = p["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let held: u64 = pod_gpu_use(p, &|d| view.verifier.verify(d)).values().sum();
            if held > 0 {
                *allocated.entry(ns.clone()).or_default() += held;
            }
            if let Ok(r) = pod_request(p) {
                let app: u64 = r.containers.iter().filter(|c| !c.init).map(|c| c.mem).sum();
                let init = r
                    .containers
                    .iter()
                    .filter(|c| c.init)
                    .map(|c| c.mem)
                    .max()
                    .unwrap_or(0);
                if app.max(init) > 0 {
                    *requested.entry(ns).or_default() += app.max(init);
                }
            }
        }
        for (metric, values) in [
            (&x.metrics.ns_allocated, allocated),
            (&x.metrics.ns_requested, requested),
        ] {
            for (namespace, gib) in values {
                metric
                    .get_or_create(&NamespaceLabels { namespace })
                    .set(gib as i64);
            }
        }
        for node in view.nodes.keys() {
            let Some((gpus, usage)) = view.usage(node) else {
                continue;
            };
            for g in &gpus {
                let l = GpuLabels {
                    node: node.clone(),
                    gpu: g.index.to_string(),
                };
                x.metrics
                    .gpu_healthy
                    .get_or_create(&l)
                    .set(i64::from(!g.unhealthy));
            }
            for g in usage {
                let l = GpuLabels {
                    node: node.clone(),
                    gpu: g.index.to_string(),
                };
                x.metrics.gpu_allocated.get_or_create(&l).set(g.used as i64);
                x.metrics.gpu_total.get_or_create(&l).set(g.total as i64);
                x.metrics.gpu_pods.get_or_create(&l).set(i64::from(g.pods));
            }
        }
    }
    let mut s = String::new();
    if prometheus_client::encoding::text::encode(&mut s, &x.metrics.registry).is_err() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain")],
            String::new(),
        );
    }
    (
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s,
    )
}
