# Sourced by scripts/test: makes sure Chromium and ChromeDriver are there
# for the dashboard's browser tests (Debian's `chromium` and
# `chromium-driver`, installed with apt-get when missing; elsewhere it says
# what to install).
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

ensure_chromium() {
  command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && return 0
  apt_install chromium chromium-driver && return 0
  echo "chromium or chromedriver is missing: install Chromium and a matching ChromeDriver" \
       "(the dashboard's browser tests drive it), then run this again" >&2
  return 1
}
