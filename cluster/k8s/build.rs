//! Compiles the vendored kubelet protos (device plugin v1beta1, PodResources
//! v1) with protox, a pure-Rust protobuf compiler: no `protoc` needed.

fn main() {
    let protos = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"]).unwrap_or_else(|e| panic!("kubelet protos: {e}"));
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("kubelet protos: {e}"));
}
