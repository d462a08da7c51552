//! A kube-scheduler double for extender tests: it encodes the extender
//! requests and decodes the answers as kube-scheduler's HTTP extender
//! (`pkg/scheduler/extender.go`) does, in either `nodeCacheCapable` mode:
//!
//! - `true`: `ExtenderArgs` carries `NodeNames` (and `"Nodes": null`); the
//!   answer's `NodeNames` are the nodes that pass, each of which must be
//!   one it sent. A nil `NodeNames` falls back to `Nodes`.
//! - `false`: `ExtenderArgs` carries `Nodes`, a `v1.NodeList` of the full
//!   node objects (and `"NodeNames": null`); the answer's `Nodes.items` are
//!   the nodes that pass. An answer without `Nodes` passes no node.
//!
//! Any non-200 status is an error that names only the code, and a non-empty
//! `Error` is an error with that text. Keys are matched case-insensitively,
//! as Go's `encoding/json` does.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An extender as configured in `KubeSchedulerConfiguration`.
#[derive(Clone, Debug)]
pub struct Scheduler {
    /// `host:port` of the extender.
    pub addr: String,
    /// `urlPrefix`'s path ("" or e.g. "/gpushare-scheduler").
    pub prefix: String,
    pub node_cache_capable: bool,
}

/// What the scheduler keeps of a filter answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filtered {
    /// Names of the nodes that pass, in the extender's order.
    pub nodes: Vec<String>,
    pub failed: BTreeMap<String, String>,
    pub unresolvable: BTreeMap<String, String>,
}

/// Go's case-insensitive member lookup.
fn member<'a>(v: &'a Value, key: &str) -> &'a Value {
    static NULL: Value = Value::Null;
    v.as_object()
        .and_then(|o| {
            o.get(key).or_else(|| {
                o.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(key))
                    .map(|(_, v)| v)
            })
        })
        .unwrap_or(&NULL)
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// One HTTP/1.1 POST: (status, body).
pub async fn http_post(addr: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code: u16 = text
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not HTTP: {text}"))?;
    let (head, rest) = text.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok((code, rest.to_string()));
    }
    let mut out = String::new();
    let mut rest = rest;
    while let Some((len, tail)) = rest.split_once("\r\n") {
        let len = usize::from_str_radix(len.trim(), 16).map_err(|e| e.to_string())?;
        if len == 0 {
            break;
        }
        out.push_str(&tail[..len]);
        rest = &tail[len + 2..];
    }
    Ok((code, out))
}

impl Scheduler {
    pub fn new(addr: &str, node_cache_capable: bool) -> Scheduler {
        Scheduler {
            addr: addr.to_string(),
            prefix: String::new(),
            node_cache_capable,
        }
    }

    pub fn with_prefix(mut self, prefix: &str) -> Scheduler {
        self.prefix = prefix.to_string();
        self
    }

    /// The `ExtenderArgs` the scheduler sends for `pod` over `nodes`.
    pub fn args(&self, pod: &Value, nodes: &[Value]) -> Value {
        if self.node_cache_capable {
            let names: Vec<&str> = nodes
                .iter()
                .map(|n| n["metadata"]["name"].as_str().unwrap_or(""))
                .collect();
            json!({"Pod": pod, "Nodes": null, "NodeNames": names})
        } else {
            json!({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": null})
        }
    }

    async fn send(&self, verb: &str, args: &Value) -> Result<Value, String> {
        let url = format!("{}/{verb}", self.prefix);
        let (code, body) = http_post(&self.addr, &url, &args.to_string()).await?;
        if code != 200 {
            return Err(format!(
                "failed {verb} with extender at URL {url}, code {code}"
            ));
        }
        serde_json::from_str(&body).map_err(|e| format!("{verb}: cannot decode {body:?}: {e}"))
    }

    pub async fn filter(&self, pod: &Value, nodes: &[Value]) -> Result<Filtered, String> {
        let r = self.send("filter", &self.args(pod, nodes)).await?;
        let error = member(&r, "Error").as_str().unwrap_or("");
        if !error.is_empty() {
            return Err(error.to_string());
        }
        let names = member(&r, "NodeNames");
        let list = member(&r, "Nodes");
        let passed: Vec<String> = if self.node_cache_capable && !names.is_null() {
            let mut out = Vec::new();
            for n in names.as_array().into_iter().flatten() {
                let n = n.as_str().unwrap_or("");
                if !nodes.iter().any(|m| m["metadata"]["name"] == n) {
                    return Err(format!(
                        "extender claims a filtered node {n:?} which is not found in the input node list"
                    ));
                }
                out.push(n.to_string());
            }
            out
        } else if !list.is_null() {
            member(list, "items")
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| n["metadata"]["name"].as_str().unwrap_or("").to_string())
                .collect()
        } else {
            Vec::new()
        };
        Ok(Filtered {
            nodes: passed,
            failed: string_map(member(&r, "FailedNodes")),
            unresolvable: string_map(member(&r, "FailedAndUnresolvableNodes")),
        })
    }

    pub async fn prioritize(
        &self,
        pod: &Value,
        nodes: &[Value],
    ) -> Result<Vec<(String, i64)>, String> {
        let r = self.send("prioritize", &self.args(pod, nodes)).await?;
        Ok(r.as_array()
            .into_iter()
            .flatten()
            .map(|h| {
                (
                    member(h, "Host").as_str().unwrap_or("").to_string(),
                    member(h, "Score").as_i64().unwrap_or(0),
                )
            })
            .collect())
    }

    pub async fn bind(&self, pod: &Value, node: &str) -> Result<(), String> {
        let args = json!({"PodName": pod["metadata"]["name"],
                          "PodNamespace": pod["metadata"]["namespace"].as_str().unwrap_or("default"),
                          "PodUID": pod["metadata"]["uid"], "Node": node});
        let r = self.send("bind", &args).await?;
        match member(&r, "Error").as_str().unwrap_or("") {
            "" => Ok(()),
            e => Err(e.to_string()),
        }
    }
}
