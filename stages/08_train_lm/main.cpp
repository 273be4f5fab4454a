// Stage 08, the capstone: a language model trained on real text with what stages 05-07 built, loss
// curves that match across world sizes, and a killed run resumed from its last checkpoint.
//
// What it adds: every earlier stage trained on random tokens for a handful of steps and showed
// correctness as weight differences. Here the Transformer learns English from the bytes of Debian's
// `fortunes` package (2.4 MB; every 20th 4 KiB block held out for validation). A distributed sampler
// gives every step the same global batch whatever the world size, so 1, 2 and 4 ranks draw the same
// loss curve. --sync picks stage 05's bucketed DDP (with --accumulate K: K micro-batches, the first K-1
// under no_sync()), stage 06's true ZeRO-1 or stage 07's FSDP. Checkpoints are world-size-free and
// replaced atomically; --resume continues exactly where the last one left off, with any world size.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage08_train_lm                    # 100 steps, tiny
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage08_train_lm --steps 600 --curve curve.json
//       --checkpoint lm.ckpt --checkpoint-every 50            (kill it; the same command plus --resume goes on)
//   ./build/bin/ddp_launch --nproc 4 -- ./build/bin/stage08_train_lm --sync zero1 --accumulate 2
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/stage08_train_lm --sync fsdp --clip-grad-norm 1
// Correct output: a PASS line for the check (the synchronization trains a small model like one process
// on the same real batches), the loss falling from ln 256 = 5.55 nats per byte below 2.5 within 100 steps
// (about 2.0 after 500), validation losses, the time per phase, a few lines sampled from the model, and last
// "PASS stage 08".
//
// What it leaves: a dead rank still ends the run, and every step since the last checkpoint is done again;
// stage 09 keeps the run alive through it. Beyond data parallelism (tensor, pipeline and sequence
// parallelism) docs/08_train_lm.md lists the next steps.
#include "stages/08_train_lm/train_loop.hpp"

int main(int argc, char** argv) {
  // The program is stage08_lib's train_lm_main(): extension 10a runs the same one with --sync hsdp added.
  return dp::train_lm_main(argc, argv, "stage08_train_lm",
                           "Stage 08: train a Transformer on real text with DDP, ZeRO-1 or FSDP; resume it");
}
