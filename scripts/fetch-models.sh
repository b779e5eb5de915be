#!/usr/bin/env bash
# Makes the models available under models/: symlinks into ../shared/models when it
# exists (or $KVP_SHARED/models), otherwise downloads them from their public URLs.
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${KVP_SHARED:-$(pwd)/../shared}/models"
mkdir -p models

declare -A URLS=(
  [stories260K.bin]=https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K/stories260K.bin
  [tok512.bin]=https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K/tok512.bin
  [stories260K.gguf]=https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf
)

for f in "${!URLS[@]}"; do
    [ -s "models/$f" ] && continue
    if [ -f "$shared/$f" ]; then
        ln -sfn "$(cd "$shared" && pwd)/$f" "models/$f"
    else
        echo "fetch-models: downloading $f"
        curl -fsSL --retry 3 -o "models/$f.part" "${URLS[$f]}"
        mv "models/$f.part" "models/$f"
    fi
done
# Test-only files exist only in ../shared; link whatever else is there.
if [ -d "$shared" ]; then
    for p in "$shared"/*; do
        b=$(basename "$p")
        [ -e "models/$b" ] || ln -sfn "$(cd "$shared" && pwd)/$b" "models/$b"
    done
fi
