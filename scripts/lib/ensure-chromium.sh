# Sourced by scripts/test: makes sure Chromium and ChromeDriver are there
# for the dashboard's browser tests (Debian's `chromium` and
# `chromium-driver`, installed with apt-get when missing; elsewhere it says
# what to install).
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    return 0
  fi
  if command -v apt-get >/dev/null 2>&1; then
    echo "chromium or chromedriver is missing: installing them with apt-get" >&2
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "chromium or chromedriver is missing: install Chromium and a matching ChromeDriver" \
         "(the dashboard's browser tests drive it), then run this again" >&2
    return 1
  fi
}
