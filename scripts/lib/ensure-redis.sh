# Sourced by scripts/test and scripts/demo: makes sure cargo and
# `redis-server` are installed (apt-get on Debian/Ubuntu; elsewhere it says
# what to install).
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

ensure_redis() {
  command -v redis-server >/dev/null 2>&1 && return 0
  # Only the binary is needed: every test and the demo start their own server.
  apt_install redis-server && return 0
  echo "redis-server is missing: install Redis 6.2 or newer (macOS: brew install redis;" \
       "Fedora: sudo dnf install redis; Arch: sudo pacman -S redis), then run this again" >&2
  return 1
}

ensure_cargo() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo is missing: install Rust (https://rustup.rs), then run this again" >&2
    return 1
  fi
}
