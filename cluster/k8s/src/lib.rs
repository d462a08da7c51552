//! cgpu's Kubernetes components: the scheduler extender, the kubelet device
//! plugin and the `kubectl inspect cgpu` plugin (thin `src/bin/*` mains).

pub mod device_plugin;
pub mod extender;
pub mod h2_authority;
pub mod inspect;
pub mod kube_io;
pub mod nvml;
pub mod signing;

/// The kubelet's gRPC APIs, generated from `proto/`.
pub mod kubelet_api {
    /// Device plugin API v1beta1.
    pub mod deviceplugin {
        tonic::include_proto!("v1beta1");
    }
    /// PodResources API v1.
    pub mod podresources {
        tonic::include_proto!("v1");
    }
}
