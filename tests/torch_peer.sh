#!/bin/sh
# PyTorch's own DDP as the peer of stage 05, for ctest. Skips (exit 77, with the reason) where
# /usr/bin/python3 has no torch.
#   torch_peer.sh model                 scripts/peers/torch_ddp.py builds exactly our Transformer (tiny and small)
#   torch_peer.sh compare OUT.json BIN  one short alternated comparison over loopback writes its verdict
set -eu
/usr/bin/python3 -c "import torch" 2>/dev/null || {
  echo "SKIP: /usr/bin/python3 has no torch (apt-get install python3-torch, as scripts/setup/install_deps.sh does)"
  exit 77
}
root=$(cd "$(dirname "$0")/.." && pwd)
case $1 in
  model)
    for p in tiny small; do /usr/bin/python3 "$root/scripts/peers/torch_ddp.py" --preset $p --check-only; done ;;
  compare)
    rm -f "$2"
    /usr/bin/python3 "$root/scripts/bench/compare_torch_ddp.py" --net none --preset tiny --context 16 --rounds 1 \
        --warmup 0 --steps 1 --our-bin "$3" --json "$2"
    grep -q '"verdict"' "$2" ;;
  *) echo "torch_peer.sh: unknown mode '$1' (model, compare)" >&2; exit 2 ;;
esac
