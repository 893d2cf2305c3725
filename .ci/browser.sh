#!/usr/bin/env bash
# The headless browser of tests/web: Debian's Chromium, which Playwright drives through
# `executable_path=/usr/bin/chromium` (the suite never runs `playwright install`: no browser is
# downloaded). Installed with apt-get when missing and possible (root or password-less sudo);
# otherwise one line says what to install. Never fatal: the servers start either way, and the
# browser tests say what is missing.
#
#   bash .ci/browser.sh           install chromium if it is missing
#   bash .ci/browser.sh --check   only report whether it is there
set -u

BROWSER=/usr/bin/chromium
[ -x "$BROWSER" ] && exit 0
if [ "${1:-}" = "--check" ]; then
    echo "browser: missing $BROWSER (apt-get install chromium)"
    exit 1
fi
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
    echo "browser: installing chromium"
    export DEBIAN_FRONTEND=noninteractive
    # a fresh image has no package lists; an old one may name versions that are gone
    if as_root apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
        || { as_root apt-get update -qq >/dev/null 2>&1 \
            && as_root apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; then
        exit 0
    fi
    echo "browser: apt-get could not install chromium; the browser tests will fail" >&2
    exit 1
fi
echo "browser: no $BROWSER; install it (e.g. sudo apt-get install chromium) for tests/web" >&2
exit 1
