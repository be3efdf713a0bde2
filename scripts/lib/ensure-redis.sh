# Sourced by scripts/test and scripts/demo: makes sure `redis-server` is
# installed (apt-get on Debian/Ubuntu; elsewhere it says what to install).
ensure_redis() {
  if command -v redis-server >/dev/null 2>&1; then
    return 0
  fi
  if command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing: installing it with apt-get" >&2
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
    # Only the binary is needed: every test and the demo start their own server.
  else
    echo "redis-server is missing: install Redis 6.2 or newer (macOS: brew install redis;" \
         "Fedora: sudo dnf install redis; Arch: sudo pacman -S redis), then run this again" >&2
    return 1
  fi
}

ensure_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing: install Rust (https://rustup.rs), then run this again" >&2
    return 1
  fi
}
