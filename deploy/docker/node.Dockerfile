# The node image: what a GPU node runs, packaged from dist/.
#   /opt/cgpu/libcgpu.so       the interposer; the device plugin's init container
#                              copies it to the node's /opt/cgpu, from where the
#                              kubelet mounts it into every GPU container
#   cgpu-device-plugin         the kubelet's device plugin (deploy/device-plugin.yaml)
#   cgpu-smi, cgpuctl          the operator tools and the exporter (`cgpuctl exporter`)
#
#   scripts/build-dist.sh --cluster
#   docker build -f deploy/docker/node.Dockerfile -t REGISTRY/cgpu-node:0.1.0 .
#
# Every file in dist/ needs only glibc 2.17 or newer; the base image only adds
# the shell and `install` the init container uses.
FROM debian:bookworm-slim
COPY dist/libcgpu.so /opt/cgpu/libcgpu.so
COPY dist/cgpu-device-plugin dist/cgpu-smi dist/cgpuctl /usr/local/bin/
COPY LICENSE /usr/share/doc/cgpu/LICENSE
CMD ["cgpu-device-plugin"]
