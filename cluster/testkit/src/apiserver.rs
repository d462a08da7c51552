//! An in-memory Kubernetes API server for tests.
//!
//! It speaks the real JSON over plain HTTP on 127.0.0.1, enough of it for
//! kube-rs and kubectl: discovery (`/api`, `/apis`, `/api/v1`, `/version`),
//! list and watch (with `resourceVersion`, bookmarks ignored, label and
//! field selectors of the `k=v` form), get, create, merge-patch, graceful
//! delete (`deletionTimestamp` first, gone when [`ApiServer::finalize`] is
//! called or the grace period is 0), `pods/binding` (sets `spec.nodeName`
//! once, 409 after) and node status. Every write bumps one global
//! `resourceVersion`; every change is kept, so a watch from any version
//! replays exactly what followed it.
//!
//! Tests drive it directly too: [`ApiServer::put`], [`ApiServer::get`],
//! [`ApiServer::fail_next`] (inject one error on a matching request),
//! [`ApiServer::requests`] (what clients asked for).

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::broadcast;

/// A change, as a watch sends it.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: String,
    kind_type: &'static str,
    object: Value,
}

#[derive(Default)]
struct Store {
    rv: u64,
    /// (resource, namespace, name) → object. Namespace is "" for nodes.
    objects: BTreeMap<(String, String, String), Value>,
    log: Vec<Change>,
    fail: Vec<(Method, String, u16)>,
    requests: Vec<String>,
    uid: u64,
}

/// A running test API server.
#[derive(Clone)]
pub struct ApiServer {
    store: Arc<Mutex<Store>>,
    tx: broadcast::Sender<Change>,
    pub addr: SocketAddr,
}

const NAMESPACED: &[&str] = &["pods", "events", "configmaps", "secrets"];
const CLUSTER: &[&str] = &["nodes", "namespaces"];

fn kind_of(resource: &str) -> &'static str {
    match resource {
        "pods" => "Pod",
        "nodes" => "Node",
        "events" => "Event",
        "configmaps" => "ConfigMap",
        "secrets" => "Secret",
        "namespaces" => "Namespace",
        _ => "Unknown",
    }
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok_json(v: &Value) -> Response {
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

fn matches_selectors(obj: &Value, query: &BTreeMap<String, String>) -> bool {
    if let Some(sel) = query.get("labelSelector") {
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            let ok = if let Some((k, v)) = term.split_once("!=") {
                obj["metadata"]["labels"][k].as_str() != Some(v)
            } else if let Some((k, v)) = term.split_once('=') {
                obj["metadata"]["labels"][k.trim_end_matches('=')].as_str() == Some(v)
            } else {
                !obj["metadata"]["labels"][term].is_null()
            };
            if !ok {
                return false;
            }
        }
    }
    if let Some(sel) = query.get("fieldSelector") {
        for term in sel.split(',').filter(|t| !t.is_empty()) {
            let (neg, k, v) = if let Some((k, v)) = term.split_once("!=") {
                (true, k, v)
            } else if let Some((k, v)) = term.split_once('=') {
                (false, k.trim_end_matches('='), v)
            } else {
                continue;
            };
            let mut cur = obj;
            for part in k.split('.') {
                cur = &cur[part];
            }
            let actual = cur.as_str().unwrap_or("");
            if (actual == v) == neg {
                return false;
            }
        }
    }
    true
}

fn parse_query(uri: &Uri) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(pct_decode(k), pct_decode(v));
    }
    out
}

fn pct_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(c) => {
                        out.push(c);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn now_rfc3339() -> String {
    // Seconds since the epoch rendered as a UTC RFC 3339 time.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

impl Store {
    fn record(
        &mut self,
        tx: &broadcast::Sender<Change>,
        resource: &str,
        kind_type: &'static str,
        object: Value,
    ) {
        let change = Change {
            rv: self.rv,
            kind: resource.to_string(),
            kind_type,
            object,
        };
        self.log.push(change.clone());
        let _ = tx.send(change);
    }

    /// Stores `obj` (bumping its resourceVersion), records the change.
    fn write(
        &mut self,
        tx: &broadcast::Sender<Change>,
        resource: &str,
        ns: &str,
        mut obj: Value,
    ) -> Value {
        self.rv += 1;
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        let key = (resource.to_string(), ns.to_string(), name);
        let existed = self.objects.contains_key(&key);
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if !existed {
            if obj["metadata"]["uid"].is_null() {
                self.uid += 1;
                obj["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{:012}", self.uid));
            }
            if obj["metadata"]["creationTimestamp"].is_null() {
                obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
            }
        }
        obj["kind"] = json!(kind_of(resource));
        obj["apiVersion"] = json!("v1");
        if !ns.is_empty() {
            obj["metadata"]["namespace"] = json!(ns);
        }
        if resource == "pods" && obj["status"]["phase"].is_null() {
            obj["status"]["phase"] = json!("Pending");
        }
        self.objects.insert(key, obj.clone());
        self.record(
            tx,
            resource,
            if existed { "MODIFIED" } else { "ADDED" },
            obj.clone(),
        );
        obj
    }

    fn remove(
        &mut self,
        tx: &broadcast::Sender<Change>,
        resource: &str,
        ns: &str,
        name: &str,
    ) -> Option<Value> {
        let mut obj =
            self.objects
                .remove(&(resource.to_string(), ns.to_string(), name.to_string()))?;
        self.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(tx, resource, "DELETED", obj.clone());
        Some(obj)
    }
}

impl ApiServer {
    /// Starts a server on 127.0.0.1 (an ephemeral port) in the current
    /// tokio runtime.
    pub async fn start() -> ApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let (tx, _) = broadcast::channel(4096);
        let server = ApiServer {
            store: Arc::new(Mutex::new(Store::default())),
            tx,
            addr,
        };
        let s = server.clone();
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let s = s.clone();
                async move { s.handle(method, uri, headers, body).await }
            },
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        server
    }

    /// Starts a server on its own runtime thread (for synchronous tests).
    pub fn start_in_background() -> ApiServer {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                let s = ApiServer::start().await;
                tx.send(s).expect("send server");
                std::future::pending::<()>().await;
            });
        });
        rx.recv().expect("test API server started")
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig pointing at this server to `path`.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        let cfg = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\n\
             current-context: test\nusers:\n- name: test\n  user:\n    token: test\n",
            self.url()
        );
        std::fs::write(path, cfg).expect("write kubeconfig");
    }

    /// Creates or replaces an object (`resource` is `pods`, `nodes`, ...;
    /// the namespace is taken from the object, "default" for namespaced
    /// resources without one).
    pub fn put(&self, resource: &str, obj: Value) -> Value {
        let ns = if NAMESPACED.contains(&resource) {
            obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        self.store.lock().write(&self.tx, resource, &ns, obj)
    }

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let ns = if NAMESPACED.contains(&resource) {
            ns
        } else {
            ""
        };
        self.store
            .lock()
            .objects
            .get(&(resource.to_string(), ns.to_string(), name.to_string()))
            .cloned()
    }

    pub fn list(&self, resource: &str) -> Vec<Value> {
        self.store
            .lock()
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Merge-patches an object as a client would.
    pub fn patch(&self, resource: &str, ns: &str, name: &str, patch: &Value) -> Option<Value> {
        let ns = if NAMESPACED.contains(&resource) {
            ns
        } else {
            ""
        };
        let mut st = self.store.lock();
        let mut obj = st
            .objects
            .get(&(resource.to_string(), ns.to_string(), name.to_string()))?
            .clone();
        merge_patch(&mut obj, patch);
        Some(st.write(&self.tx, resource, ns, obj))
    }

    /// Removes an object for good (a terminating pod whose containers are
    /// gone, a pod evicted).
    pub fn finalize(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let ns = if NAMESPACED.contains(&resource) {
            ns
        } else {
            ""
        };
        self.store.lock().remove(&self.tx, resource, ns, name)
    }

    /// The next request whose method is `method` and whose path contains
    /// `path_part` fails with HTTP `code` (once).
    pub fn fail_next(&self, method: Method, path_part: &str, code: u16) {
        self.store
            .lock()
            .fail
            .push((method, path_part.to_string(), code));
    }

    /// `METHOD path?query` of every request served so far.
    pub fn requests(&self) -> Vec<String> {
        self.store.lock().requests.clone()
    }

    async fn handle(&self, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        let path = uri.path().trim_end_matches('/').to_string();
        let query = parse_query(&uri);
        {
            let mut st = self.store.lock();
            st.requests.push(format!("{method} {uri}"));
            if let Some(i) = st
                .fail
                .iter()
                .position(|(m, p, _)| *m == method && path.contains(p.as_str()))
            {
                let (_, _, code) = st.fail.remove(i);
                return status(code, "InternalError", "injected failure");
            }
        }
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        match parts.as_slice() {
            ["version"] => ok_json(
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-cgpu-test",
                                           "platform": "linux/amd64"}),
            ),
            ["api"] => ok_json(&json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.addr.to_string()}]})),
            ["apis"] => ok_json(&json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})),
            ["api", "v1"] => ok_json(&discovery()),
            ["api", "v1", resource]
                if CLUSTER.contains(resource) || NAMESPACED.contains(resource) =>
            {
                self.collection(&method, resource, None, &query, &headers, &body)
                    .await
            }
            ["api", "v1", "namespaces", ns, resource] if NAMESPACED.contains(resource) => {
                self.collection(&method, resource, Some(ns), &query, &headers, &body)
                    .await
            }
            ["api", "v1", "namespaces", ns, "pods", name, "binding"] if method == Method::POST => {
                self.bind(ns, name, &body)
            }
            ["api", "v1", "namespaces", ns, resource, name] if NAMESPACED.contains(resource) => {
                self.item(&method, resource, ns, name, &headers, &body, &query)
            }
            ["api", "v1", "namespaces", ns, resource, name, "status"]
                if NAMESPACED.contains(resource) =>
            {
                self.item(&method, resource, ns, name, &headers, &body, &query)
            }
            ["api", "v1", resource, name] if CLUSTER.contains(resource) => {
                self.item(&method, resource, "", name, &headers, &body, &query)
            }
            ["api", "v1", resource, name, "status"] if CLUSTER.contains(resource) => {
                self.item(&method, resource, "", name, &headers, &body, &query)
            }
            _ => status(
                404,
                "NotFound",
                &format!("the server could not find the requested resource {path}"),
            ),
        }
    }

    async fn collection(
        &self,
        method: &Method,
        resource: &str,
        ns: Option<&str>,
        query: &BTreeMap<String, String>,
        _headers: &HeaderMap,
        body: &Bytes,
    ) -> Response {
        if *method == Method::POST {
            let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
                return status(400, "BadRequest", "body is not JSON");
            };
            let ns = ns.unwrap_or("");
            if obj["metadata"]["name"].as_str().is_none_or(str::is_empty) {
                if let Some(prefix) = obj["metadata"]["generateName"].as_str() {
                    let n = self.store.lock().rv + 1;
                    obj["metadata"]["name"] = json!(format!("{prefix}{n:05}"));
                } else {
                    return status(422, "Invalid", "metadata.name is required");
                }
            }
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            let mut st = self.store.lock();
            if st
                .objects
                .contains_key(&(resource.to_string(), ns.to_string(), name.clone()))
            {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("{resource} \"{name}\" already exists"),
                );
            }
            let obj = st.write(&self.tx, resource, ns, obj);
            return (
                StatusCode::CREATED,
                [("content-type", "application/json")],
                obj.to_string(),
            )
                .into_response();
        }
        if *method != Method::GET {
            return status(405, "MethodNotAllowed", "method not allowed");
        }
        let in_scope = |obj: &Value| {
            ns.is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
                && matches_selectors(obj, query)
        };
        if query.get("watch").is_some_and(|w| w == "true" || w == "1") {
            let from: u64 = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            // Subscribe before reading the log so nothing falls in between.
            let rx = self.tx.subscribe();
            let backlog: Vec<Change> = {
                let st = self.store.lock();
                if from == 0 {
                    // "0" or "": start with the current state as ADDED.
                    st.objects
                        .iter()
                        .filter(|((r, _, _), _)| r == resource)
                        .map(|(_, o)| Change {
                            rv: st.rv,
                            kind: resource.to_string(),
                            kind_type: "ADDED",
                            object: o.clone(),
                        })
                        .collect()
                } else {
                    st.log
                        .iter()
                        .filter(|c| c.rv > from && c.kind == resource)
                        .cloned()
                        .collect()
                }
            };
            let last = backlog.iter().map(|c| c.rv).max().unwrap_or(from);
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(300);
            let resource = resource.to_string();
            let ns = ns.map(str::to_string);
            let query = query.clone();
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
            let stream = async_lines(
                backlog,
                last,
                move |c: &Change| {
                    c.kind == resource
                        && ns
                            .as_deref()
                            .is_none_or(|ns| c.object["metadata"]["namespace"].as_str() == Some(ns))
                        && matches_selectors(&c.object, &query)
                },
                rx,
                deadline,
            );
            return Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .header("transfer-encoding", "chunked")
                .body(Body::from_stream(stream))
                .expect("response");
        }
        let st = self.store.lock();
        let items: Vec<Value> = st
            .objects
            .iter()
            .filter(|((r, _, _), o)| r == resource && in_scope(o))
            .map(|(_, o)| o.clone())
            .collect();
        ok_json(
            &json!({"kind": format!("{}List", kind_of(resource)), "apiVersion": "v1",
                        "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn item(
        &self,
        method: &Method,
        resource: &str,
        ns: &str,
        name: &str,
        headers: &HeaderMap,
        body: &Bytes,
        query: &BTreeMap<String, String>,
    ) -> Response {
        let key = (resource.to_string(), ns.to_string(), name.to_string());
        let mut st = self.store.lock();
        let Some(current) = st.objects.get(&key).cloned() else {
            return status(404, "NotFound", &format!("{resource} \"{name}\" not found"));
        };
        match *method {
            Method::GET => ok_json(&current),
            Method::PATCH => {
                let ctype = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if !ctype.starts_with("application/merge-patch+json")
                    && !ctype.starts_with("application/strategic-merge-patch+json")
                {
                    return status(
                        415,
                        "UnsupportedMediaType",
                        &format!("patch type {ctype} not served"),
                    );
                }
                let Ok(patch) = serde_json::from_slice::<Value>(body) else {
                    return status(400, "BadRequest", "patch is not JSON");
                };
                // A patch naming a resourceVersion is a precondition.
                if let Some(rv) = patch["metadata"]["resourceVersion"].as_str() {
                    if current["metadata"]["resourceVersion"].as_str() != Some(rv) {
                        return status(409, "Conflict", "the object has been modified");
                    }
                }
                let mut obj = current;
                merge_patch(&mut obj, &patch);
                ok_json(&st.write(&self.tx, resource, ns, obj))
            }
            Method::PUT => {
                let Ok(obj) = serde_json::from_slice::<Value>(body) else {
                    return status(400, "BadRequest", "body is not JSON");
                };
                if let Some(rv) = obj["metadata"]["resourceVersion"].as_str() {
                    if current["metadata"]["resourceVersion"].as_str() != Some(rv) {
                        return status(409, "Conflict", "the object has been modified");
                    }
                }
                ok_json(&st.write(&self.tx, resource, ns, obj))
            }
            Method::DELETE => {
                let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                let grace = opts["gracePeriodSeconds"]
                    .as_i64()
                    .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()))
                    .unwrap_or(30);
                if resource == "pods" && grace > 0 && current["spec"]["nodeName"].as_str().is_some()
                {
                    // Graceful: the kubelet stops the containers, then the
                    // pod is removed (here: by finalize()).
                    let mut obj = current;
                    if obj["metadata"]["deletionTimestamp"].is_null() {
                        obj["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                        obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                    }
                    ok_json(&st.write(&self.tx, resource, ns, obj))
                } else {
                    let obj = st.remove(&self.tx, resource, ns, name).unwrap_or(current);
                    ok_json(&obj)
                }
            }
            _ => status(405, "MethodNotAllowed", "method not allowed"),
        }
    }

    fn bind(&self, ns: &str, name: &str, body: &Bytes) -> Response {
        let Ok(b) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "binding is not JSON");
        };
        let Some(node) = b["target"]["name"].as_str() else {
            return status(422, "Invalid", "binding.target.name is required");
        };
        let mut st = self.store.lock();
        let key = ("pods".to_string(), ns.to_string(), name.to_string());
        let Some(mut pod) = st.objects.get(&key).cloned() else {
            return status(404, "NotFound", &format!("pods \"{name}\" not found"));
        };
        if let Some(uid) = b["metadata"]["uid"].as_str() {
            if pod["metadata"]["uid"].as_str() != Some(uid) {
                return status(
                    409,
                    "Conflict",
                    "Precondition failed: UID in precondition does not match",
                );
            }
        }
        if pod["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
        {
            return status(
                409,
                "Conflict",
                &format!("Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node {:?}", pod["spec"]["nodeName"]),
            );
        }
        if !b["metadata"]["annotations"].is_null() {
            merge_patch(
                &mut pod["metadata"]["annotations"],
                &b["metadata"]["annotations"],
            );
        }
        pod["spec"]["nodeName"] = json!(node);
        st.write(&self.tx, "pods", ns, pod);
        (
            StatusCode::CREATED,
            [("content-type", "application/json")],
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}).to_string(),
        )
            .into_response()
    }
}

/// The watch body: the backlog, then live changes after `last`, one JSON
/// event per line, until the deadline.
fn async_lines(
    backlog: Vec<Change>,
    last: u64,
    filter: impl Fn(&Change) -> bool + Send + 'static,
    rx: broadcast::Receiver<Change>,
    deadline: tokio::time::Instant,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let line = |c: &Change| {
        Bytes::from(format!(
            "{}\n",
            json!({"type": c.kind_type, "object": c.object})
        ))
    };
    let backlog: std::collections::VecDeque<Bytes> =
        backlog.iter().filter(|c| filter(c)).map(line).collect();
    futures::stream::unfold(
        (backlog, rx, last, filter),
        move |(mut backlog, mut rx, mut last, filter)| async move {
            if let Some(b) = backlog.pop_front() {
                return Some((Ok(b), (backlog, rx, last, filter)));
            }
            loop {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Err(_) => return None,
                    Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                        // The watcher fell behind: end the watch; the client
                        // re-watches from its last version and gets the log.
                        return None;
                    }
                    Ok(Err(_)) => return None,
                    Ok(Ok(c)) => {
                        if c.rv <= last || !filter(&c) {
                            continue;
                        }
                        last = c.rv;
                        let b = Bytes::from(format!(
                            "{}\n",
                            json!({"type": c.kind_type, "object": c.object})
                        ));
                        return Some((Ok(b), (backlog, rx, last, filter)));
                    }
                }
            }
        },
    )
}

fn discovery() -> Value {
    let r = |name: &str, kind: &str, namespaced: bool, verbs: &[&str]| json!({"name": name, "singularName": kind.to_lowercase(), "namespaced": namespaced, "kind": kind, "verbs": verbs});
    let all = [
        "create", "delete", "get", "list", "patch", "update", "watch",
    ];
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        r("pods", "Pod", true, &all),
        r("pods/binding", "Binding", true, &["create"]),
        r("pods/status", "Pod", true, &["get", "patch", "update"]),
        r("nodes", "Node", false, &all),
        r("nodes/status", "Node", false, &["get", "patch", "update"]),
        r("namespaces", "Namespace", false, &all),
        r("events", "Event", true, &all),
        r("configmaps", "ConfigMap", true, &all),
        r("secrets", "Secret", true, &all),
    ]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn selectors() {
        let pod = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "n1"}});
        let q = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(matches_selectors(&pod, &q("labelSelector", "app=x")));
        assert!(!matches_selectors(&pod, &q("labelSelector", "app=y")));
        assert!(matches_selectors(
            &pod,
            &q("fieldSelector", "spec.nodeName=n1")
        ));
        assert!(!matches_selectors(
            &pod,
            &q("fieldSelector", "spec.nodeName!=n1")
        ));
        assert_eq!(pct_decode("spec.nodeName%3Dn1"), "spec.nodeName=n1");
    }
}
