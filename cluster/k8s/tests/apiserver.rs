//! The test API server as kube-rs sees it: list and watch from a
//! resourceVersion, get, create, merge-patch, node status, graceful delete,
//! bindings, errors as `Status` objects.

use cgpu_cluster_testkit::apiserver::ApiServer;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

async fn client(api: &ApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_then_watch_from_its_resource_version() {
    let api = ApiServer::start().await;
    api.put(
        "pods",
        json!({"metadata": {"name": "before", "namespace": "default"}}),
    );
    let pods: Api<Pod> = Api::namespaced(client(&api).await, "default");
    let list = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    let p: Pod =
        serde_json::from_value(json!({"metadata": {"name": "after"}, "spec": {"containers": []}}))
            .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    pods.patch(
        "after",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
    // Only what followed the list, in order.
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("after")),
        other => panic!("{other:?}"),
    }
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(p) => assert_eq!(p.metadata.labels.unwrap()["a"], "b"),
        other => panic!("{other:?}"),
    }
    // A watch from the older version replays the same two changes.
    let replay: Vec<_> = pods
        .watch(&WatchParams::default().timeout(1), &rv)
        .await
        .unwrap()
        .take(2)
        .collect()
        .await;
    assert_eq!(replay.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_get_and_errors() {
    let api = ApiServer::start().await;
    api.put("nodes", json!({"metadata": {"name": "n1"}}));
    let nodes: Api<Node> = Api::all(client(&api).await);
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"aliyun.com/gpu-mem": "30"}}})),
        )
        .await
        .unwrap();
    let n = nodes.get("n1").await.unwrap();
    assert_eq!(
        n.status.unwrap().capacity.unwrap()["aliyun.com/gpu-mem"].0,
        "30"
    );
    match nodes.get("missing").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.reason, "NotFound");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_is_once_and_delete_is_graceful_for_bound_pods() {
    let api = ApiServer::start().await;
    let pod = api.put(
        "pods",
        json!({"metadata": {"name": "p", "namespace": "default"}}),
    );
    let pods: Api<Pod> = Api::namespaced(client(&api).await, "default");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "uid": pod["metadata"]["uid"]},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}});
    let _: serde_json::Value = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    assert_eq!(
        pods.get("p")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("n1")
    );
    let again: Result<serde_json::Value, _> = pods
        .create_subresource("binding", "p", &PostParams::default(), &binding)
        .await;
    match again {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409),
        other => panic!("{other:?}"),
    }
    pods.delete("p", &Default::default()).await.unwrap();
    assert!(pods
        .get("p")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_some());
    api.finalize("pods", "default", "p");
    assert!(pods.get_opt("p").await.unwrap().is_none());
}
