//! The few API-server reads every component needs, as Kubernetes JSON.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::Client;
use serde_json::Value;

/// A client from the usual places: `KUBECONFIG`/`~/.kube/config`, else the
/// in-cluster service account.
pub async fn client() -> Result<Client, String> {
    Client::try_default()
        .await
        .map_err(|e| format!("cannot reach the Kubernetes API server: {e}"))
}

pub async fn list_nodes(client: &Client) -> Result<Vec<Value>, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list nodes: {e}"))?;
    Ok(list.items.iter().map(to_value).collect())
}

/// Pods, all namespaces; with `node`, only those bound to it.
pub async fn list_pods(client: &Client, node: Option<&str>) -> Result<Vec<Value>, String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut lp = ListParams::default();
    if let Some(n) = node {
        lp = lp.fields(&format!("spec.nodeName={n}"));
    }
    let list = pods
        .list(&lp)
        .await
        .map_err(|e| format!("cannot list pods: {e}"))?;
    Ok(list.items.iter().map(to_value).collect())
}

pub fn to_value<T: serde::Serialize>(o: &T) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}
