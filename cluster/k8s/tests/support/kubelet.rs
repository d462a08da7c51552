//! A kubelet double for device-plugin tests. It follows the kubelet's
//! order of calls: it serves `Registration` on `kubelet.sock`; on each
//! `Register` it connects to the plugin and reads `GetDevicePluginOptions`
//! and `ListAndWatch`; at pod admission it picks free device ids and calls
//! `Allocate` once per container (init containers first), recording the
//! allocation (its "checkpoint"), which its PodResources `List` serves; at
//! each container start it calls `PreStartContainer` when the plugin asked
//! for it, and only if that succeeds hands back the environment and mounts
//! to start the process with. A restart removes every socket in the
//! directory (as the kubelet does) and serves `kubelet.sock` anew, keeping
//! the checkpoint.
//!
//! [`Kubelet::start_old`] speaks as kubelets before 1.26 do: every call to
//! a plugin carries the socket path as its HTTP/2 `:authority`,
//! Huffman-coded and indexed in the HPACK dynamic table (as grpc-go's
//! encoder sends it), instead of `localhost`.
//!
//! When it creates a container it resolves the CDI devices the plugin
//! named at `Allocate` as a CDI-enabled runtime (containerd 1.7+, CRI-O)
//! does: from the specs in [`Kubelet::cdi_dir`] as they are at that moment
//! (after `PreStartContainer`), applying their environment edits over the
//! container's; a device without a spec fails the start.
//!
//! It cannot bind-mount (no mount namespace here): [`Started::host_path`]
//! maps a path as the container would see it to the host path mounted
//! there, and [`Started::check_mounts`] checks every mount's source exists.

#![allow(dead_code)]

use cgpu_cluster::device_plugin::uds_channel;
use cgpu_cluster::kubelet_api::deviceplugin as dp;
use cgpu_cluster::kubelet_api::podresources as pr;
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

#[derive(Clone)]
struct Registered {
    endpoint: String,
    options: dp::DevicePluginOptions,
    devices: Vec<String>,
    /// Calls made to the plugin, in order ("Register", "ListAndWatch", ...).
    generation: u64,
}

#[derive(Default)]
struct State {
    plugins: HashMap<String, Registered>,
    /// (namespace, pod, container, resource) → device ids.
    checkpoint: BTreeMap<(String, String, String, String), Vec<String>>,
    /// (namespace, pod, container) of init containers (not listed by
    /// PodResources, like the kubelet's).
    init: Vec<(String, String, String)>,
    calls: Vec<String>,
    /// The ListAndWatch readers (ended when the kubelet "dies").
    readers: Vec<tokio::task::AbortHandle>,
    generation: u64,
    seed: u64,
    /// Dial plugins with the socket path as `:authority`.
    old_authority: bool,
}

/// A channel to a plugin's socket, as this kubelet dials it.
async fn dial(path: &Path, old_authority: bool) -> Result<tonic::transport::Channel, String> {
    if !old_authority {
        return uds_channel(path).await.map_err(|e| e.to_string());
    }
    use cgpu_cluster::h2_authority::{relay, Field, IndexingEncoder};
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::1]:1")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let unix = tokio::net::UnixStream::connect(&path).await?;
                let (ours, theirs) = tokio::io::duplex(64 * 1024);
                let authority = path.display().to_string();
                let mut encoder = IndexingEncoder::new(4096);
                tokio::spawn(relay(
                    theirs,
                    unix,
                    move |mut fields: Vec<Field>, out: &mut Vec<u8>| {
                        for f in &mut fields {
                            if f.name == b":authority" {
                                f.value = authority.as_bytes().to_vec();
                            }
                        }
                        encoder.encode(&fields, out);
                    },
                ));
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(ours))
            }
        }))
        .await
        .map_err(|e| e.to_string())
}

pub struct Kubelet {
    pub dir: PathBuf,
    /// The runtime's CDI spec directory.
    pub cdi_dir: PathBuf,
    pub pod_resources: PathBuf,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
}

#[derive(Clone)]
struct RegistrationSvc {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
}

#[tonic::async_trait]
impl dp::registration_server::Registration for RegistrationSvc {
    async fn register(
        &self,
        req: Request<dp::RegisterRequest>,
    ) -> Result<Response<dp::Empty>, Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "unsupported version {}",
                r.version
            )));
        }
        let generation = {
            let mut st = self.state.lock();
            st.calls.push(format!("Register {}", r.resource_name));
            st.generation += 1;
            st.generation
        };
        // Like the kubelet: connect back asynchronously, then list.
        let dir = self.dir.clone();
        let state = self.state.clone();
        let old = self.state.lock().old_authority;
        let reader = tokio::spawn(async move {
            let Ok(ch) = dial(&dir.join(&r.endpoint), old).await else {
                return;
            };
            let mut c = dp::device_plugin_client::DevicePluginClient::new(ch);
            let Ok(opts) = c.get_device_plugin_options(dp::Empty {}).await else {
                return;
            };
            let Ok(stream) = c.list_and_watch(dp::Empty {}).await else {
                return;
            };
            let mut stream = stream.into_inner();
            state
                .lock()
                .calls
                .push(format!("ListAndWatch {}", r.resource_name));
            while let Ok(Some(list)) = stream.message().await {
                let devices = list
                    .devices
                    .iter()
                    .filter(|d| d.health == "Healthy")
                    .map(|d| d.id.clone())
                    .collect();
                state.lock().plugins.insert(
                    r.resource_name.clone(),
                    Registered {
                        endpoint: r.endpoint.clone(),
                        options: *opts.get_ref(),
                        devices,
                        generation,
                    },
                );
            }
        });
        self.state.lock().readers.push(reader.abort_handle());
        Ok(Response::new(dp::Empty {}))
    }
}

#[derive(Clone)]
struct PodResourcesSvc {
    state: Arc<Mutex<State>>,
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for PodResourcesSvc {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        let st = self.state.lock();
        let mut pods: BTreeMap<(String, String), pr::PodResources> = BTreeMap::new();
        for ((ns, pod, container, resource), ids) in &st.checkpoint {
            if st
                .init
                .contains(&(ns.clone(), pod.clone(), container.clone()))
            {
                continue;
            }
            let p = pods
                .entry((ns.clone(), pod.clone()))
                .or_insert_with(|| pr::PodResources {
                    name: pod.clone(),
                    namespace: ns.clone(),
                    containers: Vec::new(),
                });
            let c = match p.containers.iter_mut().position(|c| &c.name == container) {
                Some(i) => &mut p.containers[i],
                None => {
                    p.containers.push(pr::ContainerResources {
                        name: container.clone(),
                        devices: Vec::new(),
                    });
                    p.containers.last_mut().expect("just pushed")
                }
            };
            c.devices.push(pr::ContainerDevices {
                resource_name: resource.clone(),
                device_ids: ids.clone(),
            });
        }
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: pods.into_values().collect(),
        }))
    }

    async fn get(
        &self,
        _: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("Get"))
    }
}

/// What a container is started with.
#[derive(Clone, Debug)]
pub struct Started {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<dp::Mount>,
}

impl Started {
    /// The host path a process in the container reaches at `path`.
    pub fn host_path(&self, path: &str) -> PathBuf {
        for m in &self.mounts {
            if path == m.container_path {
                return PathBuf::from(&m.host_path);
            }
            if let Some(rest) = path.strip_prefix(&format!("{}/", m.container_path)) {
                return Path::new(&m.host_path).join(rest);
            }
        }
        PathBuf::from(path)
    }

    /// The environment with paths rewritten through the mounts.
    pub fn env_on_host(&self) -> Vec<(String, String)> {
        self.envs
            .iter()
            .map(|(k, v)| {
                let mapped = if v.starts_with('/') {
                    self.host_path(v).display().to_string()
                } else {
                    v.clone()
                };
                (k.clone(), mapped)
            })
            .collect()
    }

    /// Every mount's source exists (a container runtime refuses to create
    /// the container otherwise).
    pub fn check_mounts(&self) -> Result<(), String> {
        for m in &self.mounts {
            if !Path::new(&m.host_path).exists() {
                return Err(format!("mount source {} does not exist", m.host_path));
            }
        }
        Ok(())
    }
}

fn container_requests(pod: &Value) -> Vec<(String, u64, bool)> {
    let mut out = Vec::new();
    for (key, init) in [("initContainers", true), ("containers", false)] {
        for c in pod["spec"][key].as_array().into_iter().flatten() {
            let q = &c["resources"]["limits"]["aliyun.com/gpu-mem"];
            let n = q
                .as_str()
                .and_then(|s| s.parse().ok())
                .or_else(|| q.as_u64())
                .unwrap_or(0);
            out.push((c["name"].as_str().unwrap_or("").to_string(), n, init));
        }
    }
    out
}

impl Kubelet {
    pub async fn start(dir: &Path) -> Kubelet {
        Kubelet::start_with(dir, false).await
    }

    /// A kubelet before 1.26 (socket path as `:authority`).
    pub async fn start_old(dir: &Path) -> Kubelet {
        Kubelet::start_with(dir, true).await
    }

    async fn start_with(dir: &Path, old_authority: bool) -> Kubelet {
        std::fs::create_dir_all(dir).unwrap();
        let cdi_dir = dir.parent().unwrap_or(dir).join("cdi");
        std::fs::create_dir_all(&cdi_dir).unwrap();
        let mut k = Kubelet {
            cdi_dir,
            dir: dir.to_path_buf(),
            pod_resources: dir.join("pod-resources.sock"),
            state: Arc::new(Mutex::new(State {
                seed: 0x9e37_79b9_7f4a_7c15,
                old_authority,
                ..Default::default()
            })),
            stop: None,
        };
        k.serve().await;
        k
    }

    async fn serve(&mut self) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let sock = self.dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&sock);
        let l = tokio::net::UnixListener::bind(&sock).unwrap();
        let svc = RegistrationSvc {
            dir: self.dir.clone(),
            state: self.state.clone(),
        };
        let mut r1 = rx.clone();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(dp::registration_server::RegistrationServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(l), async move {
                    let _ = r1.changed().await;
                })
                .await;
        });
        let _ = std::fs::remove_file(&self.pod_resources);
        let l = tokio::net::UnixListener::bind(&self.pod_resources).unwrap();
        let svc = PodResourcesSvc {
            state: self.state.clone(),
        };
        let mut r2 = rx;
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(pr::pod_resources_lister_server::PodResourcesListerServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(l), async move {
                    let _ = r2.changed().await;
                })
                .await;
        });
        self.stop = Some(tx);
    }

    /// Stops, removes every socket of the directory (the plugins' too),
    /// and serves again; the checkpoint survives.
    pub async fn restart(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        {
            let mut st = self.state.lock();
            st.plugins.clear();
            for r in st.readers.drain(..) {
                r.abort();
            }
        }
        for e in std::fs::read_dir(&self.dir).unwrap().flatten() {
            if e.file_name().to_string_lossy().ends_with(".sock") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        self.serve().await;
    }

    /// Waits until a plugin for `resource` registered and listed devices.
    pub async fn devices(&self, resource: &str, timeout: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(p) = self.state.lock().plugins.get(resource) {
                if !p.devices.is_empty() {
                    return p.devices.clone();
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no plugin registered {resource} in {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.state.lock().calls.clone()
    }

    async fn plugin_client(
        &self,
        resource: &str,
    ) -> Result<
        (
            dp::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
            bool,
        ),
        String,
    > {
        let (reg, old) = {
            let st = self.state.lock();
            let reg = st
                .plugins
                .get(resource)
                .cloned()
                .ok_or_else(|| format!("no device plugin for {resource}"))?;
            (reg, st.old_authority)
        };
        let ch = dial(&self.dir.join(&reg.endpoint), old).await?;
        Ok((
            dp::device_plugin_client::DevicePluginClient::new(ch),
            reg.options.pre_start_required,
        ))
    }

    /// Admission: device ids picked (pseudo-randomly, like the kubelet's
    /// map order) from the free ones, `Allocate` per container, checkpoint.
    /// Returns each container's Allocate response.
    pub async fn admit(
        &self,
        pod: &Value,
    ) -> Result<BTreeMap<String, dp::ContainerAllocateResponse>, String> {
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
        let resource = "aliyun.com/gpu-mem".to_string();
        let mut out = BTreeMap::new();
        // Devices an init container held are handed on to the pod's later
        // containers first (the kubelet's devicesToReuse).
        let mut reuse: Vec<String> = Vec::new();
        for (container, n, init) in container_requests(pod) {
            if n == 0 {
                continue;
            }
            let ids = {
                let mut st = self.state.lock();
                let all = st
                    .plugins
                    .get(&resource)
                    .map(|p| p.devices.clone())
                    .unwrap_or_default();
                let used: Vec<String> = st.checkpoint.values().flatten().cloned().collect();
                let mut free: Vec<String> = all.into_iter().filter(|d| !used.contains(d)).collect();
                let mut ids: Vec<String> = reuse.iter().take(n as usize).cloned().collect();
                reuse.retain(|d| !ids.contains(d));
                if ((free.len() + ids.len()) as u64) < n {
                    return Err(format!(
                        "insufficient {resource}: {} free, {n} asked",
                        free.len()
                    ));
                }
                while (ids.len() as u64) < n {
                    st.seed = st
                        .seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let i = (st.seed >> 33) as usize % free.len();
                    ids.push(free.swap_remove(i));
                }
                if init {
                    st.init.push((ns.clone(), name.clone(), container.clone()));
                    reuse = ids.clone();
                }
                ids
            };
            let (mut c, _) = self.plugin_client(&resource).await?;
            let resp = c
                .allocate(dp::AllocateRequest {
                    container_requests: vec![dp::ContainerAllocateRequest {
                        devices_ids: ids.clone(),
                    }],
                })
                .await
                .map_err(|e| format!("Allocate: {}", e.message()))?
                .into_inner();
            self.state
                .lock()
                .calls
                .push(format!("Allocate {ns}/{name}/{container}"));
            let r = resp
                .container_responses
                .into_iter()
                .next()
                .ok_or("Allocate returned no response")?;
            self.state.lock().checkpoint.insert(
                (
                    ns.clone(),
                    name.clone(),
                    container.clone(),
                    resource.clone(),
                ),
                ids,
            );
            out.insert(container, r);
        }
        Ok(out)
    }

    /// A container's start: `PreStartContainer` (when asked for), then what
    /// the process is started with.
    pub async fn start_container(
        &self,
        pod: &Value,
        container: &str,
        allocated: &dp::ContainerAllocateResponse,
    ) -> Result<Started, String> {
        let ns = pod["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
        let resource = "aliyun.com/gpu-mem".to_string();
        let ids = self
            .state
            .lock()
            .checkpoint
            .get(&(
                ns.clone(),
                name.clone(),
                container.to_string(),
                resource.clone(),
            ))
            .cloned()
            .ok_or("container holds no devices")?;
        let (mut c, pre_start) = self.plugin_client(&resource).await?;
        if pre_start {
            self.state
                .lock()
                .calls
                .push(format!("PreStartContainer {ns}/{name}/{container}"));
            c.pre_start_container(dp::PreStartContainerRequest { devices_ids: ids })
                .await
                .map_err(|e| format!("PreStartContainer: {}", e.message()))?;
        }
        let mut envs: BTreeMap<String, String> = BTreeMap::new();
        for e in pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["name"] == container)
        {
            for v in e["env"].as_array().into_iter().flatten() {
                envs.insert(
                    v["name"].as_str().unwrap_or("").into(),
                    v["value"].as_str().unwrap_or("").into(),
                );
            }
        }
        // Device-plugin environment first, the pod's own after (the
        // kubelet's order: the container spec's value wins a clash).
        let mut merged: BTreeMap<String, String> = allocated.envs.clone().into_iter().collect();
        merged.extend(envs);
        // The runtime applies the CDI devices' edits last.
        for dev in &allocated.cdi_devices {
            for (k, v) in self.cdi_env(&dev.name)? {
                merged.insert(k, v);
            }
        }
        let s = Started {
            envs: merged,
            mounts: allocated.mounts.clone(),
        };
        s.check_mounts()?;
        Ok(s)
    }

    /// The environment edits of CDI device `kind=name`, from the specs now
    /// in the CDI directory.
    fn cdi_env(&self, qualified: &str) -> Result<Vec<(String, String)>, String> {
        let (kind, name) = qualified
            .split_once('=')
            .ok_or_else(|| format!("CDI device {qualified:?} is not kind=name"))?;
        for e in std::fs::read_dir(&self.cdi_dir).unwrap().flatten() {
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let Ok(spec) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            if spec["kind"] != kind {
                continue;
            }
            for d in spec["devices"].as_array().into_iter().flatten() {
                if d["name"] == name {
                    return Ok(d["containerEdits"]["env"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str()?.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect());
                }
            }
        }
        Err(format!("unresolvable CDI devices {qualified}"))
    }

    /// The pod is gone: its devices are free again.
    pub fn remove_pod(&self, ns: &str, name: &str) {
        self.state
            .lock()
            .checkpoint
            .retain(|(n, p, _, _), _| !(n == ns && p == name));
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(true);
        }
    }
}
