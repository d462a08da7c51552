# The operator tools and the Prometheus exporter: cgpu-smi and cgpuctl in a
# small image (the DaemonSet in the README runs `cgpuctl exporter` from it).
#
#   docker build -t cgpu-tools:0.1.0 .
#   docker run --rm -v /run/cgpu:/run/cgpu cgpu-tools:0.1.0 cgpu-smi
#   docker run -d -p 9400:9400 -v /run/cgpu:/run/cgpu cgpu-tools:0.1.0 \
#       cgpuctl --dir /run/cgpu exporter --listen 0.0.0.0:9400
#
# It runs as root: the ledgers in /run/cgpu belong to the jobs' users, and the
# tools map them (they only read, except `cgpuctl set` and `gc`). The
# injected library is not in this image: build it with scripts/build-dist.sh
# (glibc 2.17 floor) and install it on the hosts at /opt/cgpu/libcgpu.so.
ARG RUST_VERSION=1.85

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p cgpu-tools --bins \
 && objcopy --strip-all target/release/cgpu-smi /cgpu-smi \
 && objcopy --strip-all target/release/cgpuctl /cgpuctl

FROM debian:bookworm-slim
COPY --from=build /cgpu-smi /cgpuctl /usr/local/bin/
COPY LICENSE /usr/share/doc/cgpu/LICENSE
EXPOSE 9400
ENTRYPOINT []
CMD ["cgpuctl", "--dir", "/run/cgpu", "exporter", "--listen", "0.0.0.0:9400"]
