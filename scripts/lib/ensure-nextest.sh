# Sourced by scripts/test: makes sure cargo-nextest, the test runner, is
# installed (from crates.io when missing).
ensure_nextest() {
  # .config/nextest.toml needs 0.9.91 or later (test priorities).
  if command -v cargo-nextest >/dev/null 2>&1; then
    version=$(cargo nextest --version 2>/dev/null | awk '{print $2}')
    lowest=$(printf '%s\n0.9.91\n' "$version" | sort -V | head -1)
    [ "$lowest" = "0.9.91" ] && return 0
    echo "cargo-nextest $version is older than 0.9.91; installing a newer one" >&2
  fi
  echo "installing cargo-nextest (the test runner) from crates.io" >&2
  cargo install --locked cargo-nextest
}
