// Extension 05e, on stage 05: PowerSGD (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient
// Compression for Distributed Optimization", NeurIPS 2019), PyTorch's powerSGD_hook, as a communication hook.
// A weight's gradient, viewed as an n x m matrix M, is sent as two thin factors instead: P = M Q ([n, r]) and
// Q = M^T P ([m, r]), r (n + m) elements instead of n m, and the average is approximated by P Q^T / W. What the
// approximation misses is kept per rank (error feedback) and added to the next step's gradient, so nothing is
// lost for good, only delayed. Vectors (biases, norms) and matrices too small to gain are sent whole, exactly.
#pragma once

#include "common/comm/comm_hook.hpp"
#include "common/comm/ordered_worker.hpp"
#include "common/dist/dist.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include "common/base/libtorch.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dp {

/// PowerSGD's settings, the same on every rank.
struct PowerSgdOptions {
  int rank = 4;                ///< r: columns of P and Q (PyTorch's matrix_approximation_rank)
  bool error_feedback = true;  ///< carry what the approximation missed into the next step
  bool warm_start = true;      ///< keep Q from the last step (one power iteration per step)
  uint64_t seed = 0;           ///< Q's first values, the same on every rank
  /// Compress an n x m matrix only when n m >= rate * r (n + m) (PyTorch's default 2): below that the two
  /// factors save too little to pay for the approximation. 0 compresses every matrix.
  double min_compression_rate = 2;
};

/// Shapes of each bucket's parameters, bucket by bucket, in the order their gradients lie in the bucket.
using BucketShapes = std::vector<std::vector<std::vector<int64_t>>>;

/// The shapes of `ddp`'s buckets: for bucket b, the sizes of parameters()[i] for each i in buckets()[b], in
/// that order (how stage 05 lays a bucket's gradients out). Taken once: a DDP that later reassigns its
/// buckets (extension 05b) needs a new PowerSgd.
BucketShapes bucket_shapes(const BucketedDdp& ddp);

/// PowerSGD's state and its reduction of one bucket, run on a worker thread of its own.
///
/// Per bucket and step, for each parameter with >= 2 dims, viewed as a matrix M ([n, m] = [shape[0],
/// numel / shape[0]]) that passes the compression-rate test ("compressed"; every other parameter goes
/// "uncompressed"):
///   1. M = this rank's gradient + its error memory (with error feedback);
///   2. P = M Q ([n, r]); one all-reduce (sum) of a flat buffer holding every P and the uncompressed values;
///   3. the uncompressed values become sum / W (exact fp32 average); each P's columns are orthonormalized;
///   4. Q = M^T P ([m, r]); one all-reduce of every Q, then Q / W;
///   5. the bucket gets P Q^T, the approximation of the average; the error memory M - P Q^T.
/// Two collectives per bucket where PyTorch issues three (the uncompressed values, the P's, the Q's). Everything that
/// reaches the bucket is the same on every rank: the all-reduced sums and what is computed from them alone.
///
/// Q's initial values are drawn from `seed` (on the CPU, then moved, so that every rank and device draws the
/// same numbers), separately per bucket and matrix. With warm_start the averaged Q of one step starts the
/// next (subspace iteration: the approximation converges on a gradient that changes slowly); without it, Q
/// is drawn again every step from a seed advanced per step (PyTorch draws each step's seed from a generator
/// seeded once; either way the ranks agree). A warm-start Q with an all-zero column (a gradient that was
/// zero) is drawn again too: P = M Q would stay zero in that column for good.
///
/// Differences from PyTorch's hook: no start_powerSGD_iter (PowerSGD from the first step on); the error
/// memory of uncompressed values is zero (PyTorch keeps local - average there, which sums to zero over the
/// ranks and only adds rounding); Gram-Schmidt runs twice (see orthogonalize() in the .cpp).
class PowerSgd {
 public:
  /// Checks the options against the shapes. Throws dp::UsageError (message names the value and the remedy)
  /// for rank < 1, for a min_compression_rate that is negative or not a number, or when rank exceeds the
  /// smaller side of any matrix (a parameter with >= 2 dims and at least one element), naming the matrix with
  /// the smallest side: its bucket index, its parameter index in the bucket, its shape, and "use a rank of at
  /// most N".
  PowerSgd(BucketShapes shapes, PowerSgdOptions opts = {});
  PowerSgd(const PowerSgd&) = delete;
  PowerSgd& operator=(const PowerSgd&) = delete;

  /// Starts reducing one bucket (flat fp32 [numel], contiguous, untouched by the caller until wait()) and
  /// returns at once: the work runs on an OrderedWorker. Calls are counted: the i-th call is bucket
  /// i mod bucket_count(), as stage 05 calls its hook (bucket-index order, every bucket once per step). The
  /// BucketWork's wait() returns once the bucket holds the approximation of the average (identical on every
  /// rank); it rethrows what the worker caught (and after one failure every later bucket fails). Throws
  /// std::logic_error when the bucket's numel is not its shapes' total (the counter does not advance then),
  /// std::invalid_argument for a bucket that is not contiguous fp32. `pg` must outlive the work.
  BucketWork launch(ProcessGroup& pg, torch::Tensor& bucket, const std::string& label);

  /// Elements this rank hands to all-reduces per step for bucket b: sum over compressed matrices of
  /// r (n + m), plus the numel of everything sent uncompressed. Times 4 = bytes.
  int64_t wire_elements(size_t b) const;
  /// wire_elements(b) summed over all buckets.
  int64_t wire_elements() const;
  /// A copy of the error-feedback memory of bucket b ([numel], on the bucket's device after its first step;
  /// zeros before it, and at uncompressed parameters always), or an undefined tensor when error feedback is
  /// off. Read it between steps (no bucket in flight).
  torch::Tensor error(size_t b) const;
  const PowerSgdOptions& options() const { return opts_; }
  size_t bucket_count() const { return buckets_.size(); }
  /// True when parameter i of bucket b is sent as factors P and Q (false: sent whole).
  bool compressed(size_t b, size_t i) const;

 private:
  struct Matrix {          // one compressed parameter
    int64_t offset = 0;    // its first element in the bucket
    int64_t n = 0, m = 0;  // the matrix view [n, m] of its gradient
    int64_t p_offset = 0;  // where its P ([n, r]) starts in Bucket::send
    int64_t q_offset = 0;  // where its Q ([m, r]) starts in Bucket::q
  };
  struct Run {                      // one uncompressed parameter
    int64_t offset = 0, numel = 0;  // in the bucket
    int64_t send_offset = 0;        // in Bucket::send, after every P
  };
  struct Bucket {
    int64_t numel = 0;
    std::vector<Matrix> matrices;
    std::vector<Run> runs;
    std::vector<char> is_compressed;  // per parameter
    int64_t send_numel = 0;           // every P, then every uncompressed value: the first all-reduce
    int64_t q_numel = 0;              // every Q: the second all-reduce
    torch::Tensor send;               // [send_numel], allocated at the first step on the bucket's device
    torch::Tensor q;                  // [q_numel], kept between steps: the warm start
    torch::Tensor error;              // [numel] or undefined without error feedback
    int64_t steps = 0;                // steps reduced: advances the seed of Q's draws
  };

  void reduce(ProcessGroup& pg, size_t b, torch::Tensor bucket, const std::string& label);  // on the worker
  void draw_q(size_t b, size_t i, const torch::Tensor& q) const;  // fills q ([m, r]) from the seed

  PowerSgdOptions opts_;
  std::vector<Bucket> buckets_;
  std::mutex mu_;         // guards next_: launch may come from autograd's thread or finish's
  size_t next_ = 0;       // the bucket the next launch() reduces
  OrderedWorker worker_;  // last: destroyed first, its running bucket finished, before the state it uses
};

/// The hook that hands each bucket to `state`'s launch() (the state is shared by every copy of the hook and
/// kept alive by it): give it to BucketedDdp::register_comm_hook() on every rank, built with the same shapes
/// and options, and keep `state` to read wire_elements() and error(). Throws std::invalid_argument for a null
/// state; the hook throws what launch() throws (std::logic_error for a bucket of the wrong numel).
CommHook powersgd_hook(std::shared_ptr<PowerSgd> state);

}  // namespace dp
