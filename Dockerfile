# The ctxpod node image, for the Helm chart in helm/ctxpod.
#   docker build -t ghcr.io/ctxpod/ctxpod:0.1.0 .
# Build: Rust on Debian bookworm (clang and libclang for RocksDB's bindings, protoc for
# etcd-client's gRPC code).
FROM rust:1-bookworm AS build
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends clang libclang-dev g++ make \
      protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin ctxpod \
 && cp target/release/ctxpod /ctxpod

# Run: a slim Debian with the binary, as an unprivileged user (the chart runs it as 10001,
# with a read-only root filesystem; state lives on the /data volume).
FROM debian:bookworm-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home --home-dir /data ctxpod
COPY --from=build /ctxpod /usr/local/bin/ctxpod
USER 10001
VOLUME ["/data"]
EXPOSE 7400 7401
ENTRYPOINT ["/usr/local/bin/ctxpod"]
CMD ["serve", "--data-dir=/data", "--listen=0.0.0.0:7400", "--transfer-listen=0.0.0.0:7401"]
