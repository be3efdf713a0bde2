# Sourced by scripts/test: makes sure iproute2's `ip` is installed, with
# which the Sentinel tests cut a master off from its replicas (Linux network
# namespaces, made by the tests themselves; they also need root). apt-get
# on Debian/Ubuntu, whose minimal images lack it; elsewhere it says what to
# install.
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

ensure_iproute2() {
  # Some distributions put it in /sbin or /usr/sbin, which a PATH may lack;
  # the tests look there too.
  command -v ip >/dev/null 2>&1 && return 0
  [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] && return 0
  apt_install iproute2 && return 0
  echo "ip is missing: install iproute2 (Fedora: sudo dnf install iproute;" \
       "Arch: sudo pacman -S iproute2), then run this again" >&2
  return 1
}
