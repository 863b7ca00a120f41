#!/usr/bin/env bash
# Create the Secrets the manifests read; none ships with a value. Run once per cluster (kubectl in PATH).
#   argus-token       the bearer token every agent sends and every server requires (ARGUS_TOKEN)
#   argus-clickhouse  the store URL, over HTTPS (clickhouses://, port 8443): the password never crosses the network in clear
#   argus-tls         the servers' certificate and key (gRPC 7470 and HTTP 7471 both serve TLS); its names must
#                     include argus-collector.argus.svc, and the agents trust its tls.crt
set -euo pipefail
: "${CLICKHOUSE_PASSWORD:?set CLICKHOUSE_PASSWORD}" "${TLS_CERT:?set TLS_CERT (PEM)}" "${TLS_KEY:?set TLS_KEY (PEM)}"
kubectl -n argus create secret generic argus-token --from-literal=token="$(openssl rand -hex 32)"
kubectl -n argus create secret generic argus-clickhouse \
  --from-literal=store-url="clickhouses://argus:${CLICKHOUSE_PASSWORD}@clickhouse.argus.svc:8443/argus"
kubectl -n argus create secret tls argus-tls --cert="$TLS_CERT" --key="$TLS_KEY"
