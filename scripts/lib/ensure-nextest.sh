# Sourced by scripts/test: makes sure cargo-nextest, the test runner, is
# installed (from crates.io when missing).
ensure_nextest() {
  command -v cargo-nextest >/dev/null 2>&1 && return 0
  echo "installing cargo-nextest (the test runner) from crates.io" >&2
  cargo install --locked cargo-nextest
}
