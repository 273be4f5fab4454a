#!/usr/bin/env bash
# docs/python.md's training script, as the page runs it: under torchrun with the package's DDPBucketed and with
# PyTorch's DistributedDataParallel, and under ddp_launch with ours. All three must print the same losses: both
# wrappers average the same gradients (PyTorch divides each by 2 before its sum, ours after, and x/2 + y/2 equals
# (x + y)/2 exactly in binary), so the runs do the same arithmetic; the losses are compared as printed (6 decimals).
# torchrun is the pip torch 2.x venv's (Debian's 1.13 torchrun fails on Python 3.11), starting PYTHON's script;
# rank 0 hosts the store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), as a torch 1.13 rank cannot join the agent's
# (tests/launcher/torchrun.sh), and agent and ranks meet on 127.0.0.1. Each run has a deadline. A failed run shows
# the head of its stderr too: a rank's own message comes before torchrun's summary of who failed.
#   example_train.sh PYTHON PACKAGE_PARENT DDP_LAUNCH TORCHRUN_PYTHON
set -euo pipefail
py=$1
export PYTHONPATH=$2
launch=$3
trpy=$4
[ -x "$trpy" ] || { echo "example_train: no torchrun at $trpy: bash scripts/setup/install_torch2.sh"; exit 1; }
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 OMP_NUM_THREADS=1
torchrun() {
  timeout -k 5 120 "$trpy" -m torch.distributed.run --standalone --local-addr 127.0.0.1 --nproc_per_node 2 \
    --no-python "$py" "$@"
}
show() { grep -v '^[[:space:]]*$' "$1" | head -8; echo ...; tail -12 "$1"; }
script="$(cd "$(dirname "$0")/../.." && pwd)/python/examples/train.py"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
torchrun "$script" > "$out/ours_torchrun" 2> "$out/err1" || {
  show "$out/err1"; echo "example_train: torchrun with ours failed"; exit 1; }
torchrun "$script" --torch-ddp > "$out/theirs_torchrun" \
  2> "$out/err2" || { show "$out/err2"; echo "example_train: torchrun with PyTorch's DDP failed"; exit 1; }
timeout -k 5 120 "$launch" --nproc 2 -- "$py" "$script" > "$out/ours_launch" 2> "$out/err3" || {
  show "$out/err3"; echo "example_train: ddp_launch with ours failed"; exit 1; }
losses() { grep -o 'step [0-9]*: loss [0-9.]*' "$1" || true; }
for f in ours_torchrun theirs_torchrun ours_launch; do
  echo "$f: $(losses "$out/$f" | tr '\n' ' ')"
done
[ "$(losses "$out/ours_torchrun" | wc -l)" -eq 4 ] || { echo "example_train: FAIL: expected 4 loss lines"; exit 1; }
if [ "$(losses "$out/ours_torchrun")" != "$(losses "$out/theirs_torchrun")" ] ||
   [ "$(losses "$out/ours_torchrun")" != "$(losses "$out/ours_launch")" ]; then
  echo "example_train: FAIL: the losses differ"; exit 1
fi
first=$(losses "$out/ours_torchrun" | head -1 | awk '{print $4}')
last=$(losses "$out/ours_torchrun" | tail -1 | awk '{print $4}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || { echo "example_train: FAIL: loss did not fall"; exit 1; }
echo "example_train: PASS: the same losses under torchrun (ours, PyTorch's DDP) and ddp_launch (ours), falling"
