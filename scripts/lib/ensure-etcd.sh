# Sourced by scripts/test: makes sure etcd's server and etcdctl are
# installed for the etcd membership backend's tests, and protoc for
# building the `etcd-client` crate (the `etcd` feature; its build script
# compiles etcd's protobuf files). The tests start their own 3-node
# clusters on free loopback ports (tests/support/src/etcd.rs), never
# etcd's own 2379/2380.
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

ensure_etcd() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
  [ ${#missing[@]} -eq 0 ] && return 0
  # Debian's etcd-server starts a system etcd on 2379/2380, which the tests
  # leave alone. Where that start fails (another etcd holds the ports, no
  # init system), dpkg reports an error although the binaries are in
  # place: what counts is that they are there now.
  apt_install "${missing[@]}" || true
  if command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1 \
    && command -v protoc >/dev/null 2>&1; then
    return 0
  fi
  echo "etcd, etcdctl or protoc is missing: install etcd 3.4 or newer with etcdctl, and" \
       "protoc (Debian/Ubuntu: sudo apt-get install etcd-server etcd-client protobuf-compiler;" \
       "macOS: brew install etcd protobuf), then run this again" >&2
  return 1
}
