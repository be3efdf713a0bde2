# The example worker (examples/worker.rs): a consumer of `mail-sender` with
# the `http` feature's /health/live, /health/ready and /metrics. From the
# repository's root:
#
#   docker build -f deploy/docker/worker.Dockerfile -t peerq-worker:0.1.0 .
#
# Its settings come from the environment (deploy/kubernetes/worker.yaml):
# PEERQ_REDIS_URL (required), PEERQ_SERVICE (mail-sender), PEERQ_HTTP_ADDR
# (0.0.0.0:9000), PEERQ_LEAVE_TIMEOUT_SECS (25). An application's own worker
# image is built the same way, with its own binary in place of the example.
#
# BuildKit reads deploy/docker/worker.Dockerfile.dockerignore beside this
# file, so target/ and .git stay out of the build context. Base images are
# pinned to exact versions; add digests as in peerq.Dockerfile.

FROM rust:1.95.0-slim-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --example worker --features http \
    && install -D -m 0755 target/release/examples/worker /out/worker

FROM debian:12.13-slim
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /out/worker /usr/local/bin/peerq-worker
USER 10001:10001
ENV PEERQ_HTTP_ADDR=0.0.0.0:9000
EXPOSE 9000
# SIGTERM (Kubernetes' stop) starts the graceful leave: the process is PID 1
# itself (exec form), so the signal reaches it.
ENTRYPOINT ["/usr/local/bin/peerq-worker"]
