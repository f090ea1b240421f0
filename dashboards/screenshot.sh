#!/usr/bin/env bash
# Regenerate dashboards/digits-vit-trade.png, the README's screenshot: the default study's dashboard
# (studies/digits-vit-trade.yaml, run first with README command 1), rendered by headless Chromium.
#   bash dashboards/screenshot.sh [study.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
study=${1:-studies/digits-vit-trade.yaml}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
explorer dashboard "$study" --out "$tmp/dashboard.html" >/dev/null
# Chromium writes caches under $HOME whatever --user-data-dir says: keep them in the temp dir
HOME=$tmp XDG_CONFIG_HOME=$tmp/config XDG_CACHE_HOME=$tmp/cache chromium --headless --no-sandbox --disable-gpu \
  --no-first-run --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$tmp/profile" --virtual-time-budget=10000 --hide-scrollbars --window-size=1400,2400 \
  --screenshot="$tmp/shot.png" "file://$tmp/dashboard.html" >/dev/null 2>&1
cp "$tmp/shot.png" dashboards/digits-vit-trade.png
echo "wrote dashboards/digits-vit-trade.png from $study"
