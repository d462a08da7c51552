//! cgpu's Kubernetes components: the scheduler extender, the kubelet device
//! plugin and the `kubectl inspect cgpu` plugin (thin `src/bin/*` mains).

pub mod extender;
pub mod inspect;
pub mod kube_io;
pub mod signing;
