#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main demo: trains the toy
# edit-diffusion model (about half a minute on two CPU cores) and writes its
# figures into runs/edit_diffusion. Arguments go to train_edit_diffusion.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
TARGET=train_edit_diffusion bash scripts/build.sh
./build/train_edit_diffusion "$@"
