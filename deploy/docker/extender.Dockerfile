# The scheduler extender's image, packaged from dist/ (deploy/scheduler-extender.yaml).
#
#   scripts/build-dist.sh --cluster
#   docker build -f deploy/docker/extender.Dockerfile -t REGISTRY/cgpu-extender:0.1.0 .
#
# The binary needs only glibc 2.17 or newer: a base image with the C library
# and nothing else, running as a user without privileges.
FROM gcr.io/distroless/base-debian12:nonroot
COPY dist/cgpu-scheduler-extender /usr/local/bin/cgpu-scheduler-extender
COPY LICENSE /usr/share/doc/cgpu/LICENSE
ENTRYPOINT ["/usr/local/bin/cgpu-scheduler-extender"]
