#!/usr/bin/env bash
# Headless Chromium + chromedriver for the API's browser test (Debian packages; a browser download of a test
# tool's own fails on these machines). Idempotent: does nothing when both are present.
set -euo pipefail
# One install at a time: `make test` runs the browser tests on two pytest-xdist workers, and a second apt-get beside
# the first fails on dpkg's lock (its tests would be skipped); the second waits here, then finds both installed.
exec 9>"${TMPDIR:-/tmp}/topotune-setup-browser.lock"
flock 9
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
