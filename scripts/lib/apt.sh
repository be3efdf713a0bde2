# Sourced by scripts/lib/ensure-*.sh: installs Debian/Ubuntu packages with
# apt-get (through sudo when not root). Returns 1, having said nothing,
# where there is no apt-get: the caller says what to install instead.
apt_install() {
  command -v apt-get >/dev/null 2>&1 || return 1
  echo "$* missing: installing with apt-get" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
