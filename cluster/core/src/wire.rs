//! The Kubernetes scheduler-extender protocol (`k8s.io/kube-scheduler/extender/v1`).
//!
//! Its Go structs have no json tags, so the keys on the wire are the Go
//! field names: PascalCase (`Pod`, `NodeNames`, `FailedNodes`, ...). The pod
//! and nodes inside are ordinary Kubernetes JSON, kept here as raw values so
//! this crate needs no Kubernetes types.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `ExtenderArgs`: the body of `filter` and `prioritize`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    pub pod: serde_json::Value,
    /// Full node objects (when the scheduler is not `nodeCacheCapable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Node names only (when `nodeCacheCapable: true`, as ours is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
}

/// The `Nodes` member: a `v1.NodeList` (its own keys are camelCase).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<serde_json::Value>,
}

/// `ExtenderFilterResult`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
    /// Nodes that do not fit now, with the reason (preemption may help).
    #[serde(default)]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that cannot fit whatever is evicted.
    #[serde(default)]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(default)]
    pub error: String,
}

/// One entry of `HostPriorityList` (the prioritize response).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    pub host: String,
    pub score: i64,
}

/// `ExtenderBindingArgs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingArgs {
    pub pod_name: String,
    pub pod_namespace: String,
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    pub node: String,
}

/// `ExtenderBindingResult`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderBindingResult {
    #[serde(default)]
    pub error: String,
}

/// The highest score an extender may give (`MaxExtenderPriority`).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filter_args_as_the_scheduler_sends_them() {
        let wire = r#"{"Pod":{"metadata":{"name":"p","namespace":"default"}},"Nodes":null,"NodeNames":["n1","n2"]}"#;
        let args: ExtenderArgs = serde_json::from_str(wire).unwrap();
        assert_eq!(
            args.node_names.as_deref(),
            Some(&["n1".to_string(), "n2".to_string()][..])
        );
        assert_eq!(args.pod["metadata"]["name"], "p");
        assert!(args.nodes.is_none());
    }

    #[test]
    fn filter_result_keys_are_pascal_case() {
        let mut r = ExtenderFilterResult {
            node_names: Some(vec!["n1".into()]),
            ..Default::default()
        };
        r.failed_nodes.insert("n2".into(), "not enough".into());
        r.failed_and_unresolvable_nodes
            .insert("n3".into(), "too few GPUs".into());
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({
                "NodeNames": ["n1"],
                "FailedNodes": {"n2": "not enough"},
                "FailedAndUnresolvableNodes": {"n3": "too few GPUs"},
                "Error": ""
            })
        );
    }

    #[test]
    fn priorities_and_binding_keys() {
        let p = vec![HostPriority {
            host: "n1".into(),
            score: 7,
        }];
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"[{"Host":"n1","Score":7}]"#
        );
        let b: ExtenderBindingArgs = serde_json::from_str(
            r#"{"PodName":"p","PodNamespace":"ns","PodUID":"u-1","Node":"n1"}"#,
        )
        .unwrap();
        assert_eq!(b.pod_uid, "u-1");
        assert_eq!(b.node, "n1");
        assert_eq!(
            serde_json::to_string(&ExtenderBindingResult {
                error: String::new()
            })
            .unwrap(),
            r#"{"Error":""}"#
        );
    }
}
