#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/attention_demo
