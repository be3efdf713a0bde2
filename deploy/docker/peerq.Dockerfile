# The operator's binary, `peerq` (admin CLI, `peerq dashboard`, `peerq
# exporter`), built with the `cli` feature (which takes `dashboard`, `tls`,
# `postgres` and `etcd` along). From the repository's root:
#
#   docker build -f deploy/docker/peerq.Dockerfile -t peerq:0.1.0 .
#
# BuildKit reads deploy/docker/peerq.Dockerfile.dockerignore beside this
# file, so target/ and .git stay out of the build context.
#
# Base images are pinned to exact versions; add each one's digest
# (`FROM rust:1.95.0-slim-bookworm@sha256:…`) where your registry policy
# wants it: `docker buildx imagetools inspect rust:1.95.0-slim-bookworm`.

# The toolchain the crate is built and tested with (rustc 1.95.0), on the
# same Debian release as the runtime image below, so the binary's glibc
# matches.
FROM rust:1.95.0-slim-bookworm AS builder
WORKDIR /src
# `etcd` builds its gRPC client from etcd's .proto files with protoc.
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler=3.21.12-3+deb12u1 \
    && rm -rf /var/lib/apt/lists/*
COPY . .
# The registry and target caches persist between builds (BuildKit) and are
# not part of any layer; the binary is copied out of the cached target.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin peerq --features cli \
    && install -D -m 0755 target/release/peerq /out/peerq

FROM debian:12.13-slim
# rediss:// URLs (the `tls` feature) verify servers against the system's CA
# certificates: the builder's bundle, so this stage installs nothing.
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /out/peerq /usr/local/bin/peerq
# A numeric non-root user: Kubernetes' runAsNonRoot can check it without a
# passwd entry. The binary writes no files.
USER 10001:10001
# The dashboard (--listen 0.0.0.0:8080) and the exporter (--listen
# 0.0.0.0:9187) listen where their command says; these are their ports in
# deploy/kubernetes/.
EXPOSE 8080 9187
ENTRYPOINT ["/usr/local/bin/peerq"]
CMD ["--help"]
