#!/bin/sh
# Certificates for the compose stack, made with openssl into secrets/tls/ (or the folder given):
#   ca.crt                      the stack's own CA (it signs everything below; its key goes to
#                               ../tls-ca/ca.key, beside this folder, and is mounted nowhere)
#   server.crt, server.key      the replicas' (both ports): DNS:shadowlimit-1..3, DNS:shadowlimit,
#                               DNS:localhost, IP:127.0.0.1 (the published port)
#   envoy.crt, envoy.key        Envoy's client certificate to the gRPC port (DNS:envoy)
#   prometheus.crt, .key        Prometheus's client certificate for its HTTPS scrapes (DNS:prometheus)
#   operator.crt, .key          a person's client certificate (CN=operator) for the CLI and dashboard
# Valid for DAYS (default 365). The containers read the keys as their own user (uid 10001 for
# shadowlimit): the keys are made readable by all, for this folder on one machine only; give a
# real deployment's keys to their user alone. docs/tls.md#compose.
set -eu
dir=${1:-"$(dirname "$0")/secrets/tls"}
days=${DAYS:-365}
mkdir -p "$dir" "$dir/../tls-ca"
cd "$dir"
ca_key=../tls-ca/ca.key
cnf=$(mktemp)
trap 'rm -f "$cnf" ./*.csr' EXIT
cat > "$cnf" <<'CNF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:shadowlimit, DNS:shadowlimit-1, DNS:shadowlimit-2, DNS:shadowlimit-3, DNS:localhost, IP:127.0.0.1
[envoy]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:envoy
[prometheus]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:prometheus
[operator]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
CNF
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 644 "$1"; }
key "$ca_key"
chmod 600 "$ca_key"
openssl req -config "$cnf" -x509 -new -key "$ca_key" -sha256 -days "$days" -subj "/CN=shadowlimit compose CA" \
  -extensions ca -out ca.crt
for leaf in server envoy prometheus operator; do
  key "$leaf.key"
  openssl req -config "$cnf" -new -key "$leaf.key" -subj "/CN=$leaf" -out "$leaf.csr"
  openssl x509 -req -in "$leaf.csr" -CA ca.crt -CAkey "$ca_key" -set_serial "0x$(openssl rand -hex 16)" -sha256 \
    -days "$days" -extfile "$cnf" -extensions "$leaf" -out "$leaf.crt" 2>/dev/null
done
echo "certificates for the compose stack in $dir (valid $days days)"
