// PowerSGD as a stage-05 communication hook: per bucket, two all-reduces on a worker thread.
#include "extensions/05e_low_byte/powersgd.hpp"

#include "common/base/errors.hpp"
#include "common/base/hash.hpp"
#include "common/model/params.hpp"  // shape_text()

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <limits>
#include <stdexcept>
#include <utility>

namespace dp {

namespace {

// The matrix view of a parameter of shape `shape`: [shape[0], numel / shape[0]], or {0, 0} when it is no
// matrix (fewer than 2 dims, or no element).
std::pair<int64_t, int64_t> matrix_view(const std::vector<int64_t>& shape) {
  if (shape.size() < 2) return {0, 0};
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel == 0) return {0, 0};
  return {shape[0], numel / shape[0]};
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  return numel;
}

// Orthonormalizes the columns of p ([n, r], contiguous) in place: modified Gram-Schmidt column by column, as
// PyTorch's _orthogonalize_gram_schmidt does (normalize column j, then remove its direction from every later
// column), run twice. One pass in fp32 leaves columns orthogonal only up to about u times the condition number
// of p (Bjorck 1967), and a column that cancels out (a gradient of rank below r) keeps only rounding noise,
// which normalization blows up to a unit vector pointing anywhere, earlier columns included. A second pass
// over the nearly orthonormal result brings every pair's inner product down to a few u ("twice is enough",
// Giraud, Langou, Rozloznik 2005), so P P^T is a projector to rounding level: 2 n r^2 more flops per matrix,
// against the 4 n m r of the two products M Q and M^T P. A zero column stays zero: its norm is clamped to
// the smallest normal float instead of PyTorch's epsilon added to every norm (default 0: 0 / 0 = NaN),
// which leaves every column of normal size exactly normalized.
void orthogonalize(const torch::Tensor& p) {
  const int64_t r = p.size(1);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t j = 0; j < r; ++j) {
      auto column = p.narrow(1, j, 1);  // [n, 1]
      column.div_(column.norm().clamp_min(std::numeric_limits<float>::min()));
      if (j + 1 < r) {
        auto rest = p.narrow(1, j + 1, r - j - 1);         // [n, r - j - 1]
        rest.sub_(column * (column * rest).sum(0, true));  // minus [n, 1] x [1, r - j - 1] inner products
      }
    }
  }
}

// True when some column of q ([m, r]) is all zeros. Reads one value back (a sync on a GPU).
bool has_zero_column(const torch::Tensor& q) { return q.abs().amax(0).min().item<float>() == 0.0f; }

}  // namespace

BucketShapes bucket_shapes(const BucketedDdp& ddp) {
  BucketShapes shapes;
  for (const auto& bucket : ddp.buckets()) {
    std::vector<std::vector<int64_t>> params;
    for (size_t i : bucket) params.push_back(ddp.parameters()[i].sizes().vec());
    shapes.push_back(std::move(params));
  }
  return shapes;
}

PowerSgd::PowerSgd(BucketShapes shapes, PowerSgdOptions opts) : opts_(opts) {
  const int64_t r = opts_.rank;
  // The matrix with the smallest smaller side bounds the rank: the one a message names.
  int64_t min_side = 0;
  size_t min_bucket = 0, min_param = 0;
  for (size_t b = 0; b < shapes.size(); ++b)
    for (size_t i = 0; i < shapes[b].size(); ++i) {
      const auto [n, m] = matrix_view(shapes[b][i]);
      if (n > 0 && (min_side == 0 || std::min(n, m) < min_side)) {
        min_side = std::min(n, m);
        min_bucket = b;
        min_param = i;
      }
    }
  const auto smallest = [&] {
    const auto& shape = shapes[min_bucket][min_param];
    const auto [n, m] = matrix_view(shape);
    return fmt::format("bucket {}'s parameter {}, shape {} (a {} x {} matrix)", min_bucket, min_param,
                       shape_text(shape), n, m);
  };
  if (r < 1)
    throw UsageError(fmt::format("PowerSGD: rank {} is below 1: use a rank of at least 1{}", r,
                                 min_side > 0 ? fmt::format(" and at most {} ({})", min_side, smallest()) : ""));
  if (min_side > 0 && r > min_side)
    throw UsageError(fmt::format("PowerSGD: rank {} exceeds the smaller side of {}: use a rank of at most {}", r,
                                 smallest(), min_side));
  if (!(opts_.min_compression_rate >= 0))  // NaN fails too
    throw UsageError(
        fmt::format("PowerSGD: minimum compression rate {} is not a number >= 0: use 2 (PyTorch's "
                    "default), or 0 to compress every matrix",
                    opts_.min_compression_rate));

  for (auto& bucket_shape : shapes) {
    Bucket s;
    for (size_t i = 0; i < bucket_shape.size(); ++i) {
      const int64_t numel = numel_of(bucket_shape[i]);
      const auto [n, m] = matrix_view(bucket_shape[i]);
      // n m elements whole, or r (n + m) as factors: compress when that divides the bytes by at least the rate.
      const bool compress = n > 0 && static_cast<double>(n) * static_cast<double>(m) >=
                                         opts_.min_compression_rate * static_cast<double>(r * (n + m));
      if (compress) {
        s.matrices.push_back(Matrix{s.numel, n, m, s.send_numel, s.q_numel});
        s.send_numel += n * r;
        s.q_numel += m * r;
      } else {
        s.runs.push_back(Run{s.numel, numel, 0});
      }
      s.is_compressed.push_back(compress ? 1 : 0);
      s.numel += numel;
    }
    for (Run& run : s.runs) {  // the uncompressed values follow every P in the first all-reduce's buffer
      run.send_offset = s.send_numel;
      s.send_numel += run.numel;
    }
    if (opts_.error_feedback) s.error = torch::zeros({s.numel});
    buckets_.push_back(std::move(s));
  }
}

int64_t PowerSgd::wire_elements(size_t b) const {
  const Bucket& s = buckets_.at(b);
  return s.send_numel + s.q_numel;  // every P and uncompressed value, then every Q
}

int64_t PowerSgd::wire_elements() const {
  int64_t total = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) total += wire_elements(b);
  return total;
}

torch::Tensor PowerSgd::error(size_t b) const {
  const Bucket& s = buckets_.at(b);
  return s.error.defined() ? s.error.clone() : torch::Tensor();
}

bool PowerSgd::compressed(size_t b, size_t i) const { return buckets_.at(b).is_compressed.at(i) != 0; }

void PowerSgd::draw_q(size_t b, size_t i, const torch::Tensor& q) const {
  // One stream per (seed, bucket, matrix, step): the same numbers on every rank, drawn on the CPU so that a
  // GPU rank gets them too, and independent of torch's global generator.
  const uint64_t key =
      splitmix64(opts_.seed ^ splitmix64(b ^ splitmix64(i ^ splitmix64(static_cast<uint64_t>(buckets_[b].steps)))));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(key);
  q.copy_(torch::randn({q.size(0), q.size(1)}, gen, torch::kFloat));
}

BucketWork PowerSgd::launch(ProcessGroup& pg, torch::Tensor& bucket, const std::string& label) {
  if (bucket.scalar_type() != torch::kFloat || !bucket.is_contiguous())
    throw std::invalid_argument("PowerSGD: a bucket must be a contiguous fp32 tensor");
  size_t b = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (buckets_.empty()) throw std::logic_error("PowerSGD: launched with no bucket shapes");
    b = next_;
    if (bucket.numel() != buckets_[b].numel)
      throw std::logic_error(fmt::format(
          "PowerSGD: call {} of the step is bucket {}, of {} elements, but got {}: the hook must see every bucket "
          "once per step, in bucket order, and the shapes must be the DDP's (bucket_shapes())",
          b, b, buckets_[b].numel, bucket.numel()));
    next_ = (next_ + 1) % buckets_.size();
  }
  auto flat = bucket.view({-1});
  std::shared_future<void> done = worker_.submit([this, &pg, b, flat, label] { reduce(pg, b, flat, label); },
                                                 label.empty() ? "a PowerSGD bucket" : label);
  // No Work to wait for: BucketWork::wait() goes straight to `then`, which waits for the worker and rethrows
  // what it caught.
  BucketWork w;
  w.then = [done] { done.get(); };
  w.wire_bytes = wire_elements(b) * static_cast<int64_t>(bucket.element_size());
  return w;
}

void PowerSgd::reduce(ProcessGroup& pg, size_t b, torch::Tensor g, const std::string& label) {
  torch::NoGradGuard no_grad;
  Bucket& s = buckets_[b];
  const int64_t r = opts_.rank;
  const int world = pg.world_size();
  if (!s.send.defined() || s.send.device() != g.device()) {
    s.send = torch::empty({s.send_numel}, g.options());
    s.q = s.q.defined() ? s.q.to(g.device()) : torch::zeros({s.q_numel}, g.options());
  }
  if (s.error.defined() && s.error.device() != g.device()) s.error = s.error.to(g.device());
  // Views: M_i ([n, m]) of the bucket, its error memory alike, P_i ([n, r]) of `send`, Q_i ([m, r]) of `q`.
  const auto m_of = [&](const Matrix& x) { return g.narrow(0, x.offset, x.n * x.m).view({x.n, x.m}); };
  const auto e_of = [&](const Matrix& x) { return s.error.narrow(0, x.offset, x.n * x.m).view({x.n, x.m}); };
  const auto p_of = [&](const Matrix& x) { return s.send.narrow(0, x.p_offset, x.n * r).view({x.n, r}); };
  const auto q_of = [&](const Matrix& x) { return s.q.narrow(0, x.q_offset, x.m * r).view({x.m, r}); };

  // 1-2. M = gradient + what earlier steps missed; P = M Q; one all-reduce of every P and uncompressed value.
  for (size_t i = 0; i < s.matrices.size(); ++i) {
    const Matrix& x = s.matrices[i];
    auto M = m_of(x);
    if (opts_.error_feedback) M.add_(e_of(x));
    auto Q = q_of(x);
    if (!opts_.warm_start || s.steps == 0 || has_zero_column(Q)) draw_q(b, i, Q);
    auto P = p_of(x);
    torch::mm_out(P, M, Q);  // [n, m] x [m, r]
  }
  for (const Run& run : s.runs) s.send.narrow(0, run.send_offset, run.numel).copy_(g.narrow(0, run.offset, run.numel));
  if (s.send_numel > 0) pg.all_reduce(s.send, label + " (PowerSGD P)");
  // 3. Uncompressed: the exact fp32 average, sum then / W. Each P (a sum over ranks, the same everywhere):
  // orthonormal columns, the basis the average is projected onto.
  for (const Run& run : s.runs)
    g.narrow(0, run.offset, run.numel).copy_(s.send.narrow(0, run.send_offset, run.numel)).div_(world);
  if (!s.matrices.empty()) {
    for (const Matrix& x : s.matrices) orthogonalize(p_of(x));
    // 4. Q = M^T P per rank; one all-reduce; / W: the average's coordinates in the basis P.
    for (const Matrix& x : s.matrices) {
      auto Q = q_of(x);
      torch::mm_out(Q, m_of(x).t(), p_of(x));  // [m, n] x [n, r]
    }
    pg.all_reduce(s.q, label + " (PowerSGD Q)");
    s.q.div_(world);
    // 5. The bucket gets P Q^T ([n, r] x [r, m]); the error memory what this rank's M had beyond it.
    for (const Matrix& x : s.matrices) {
      auto M = m_of(x);
      if (opts_.error_feedback) e_of(x).copy_(M);
      torch::mm_out(M, p_of(x), q_of(x).t());
      if (opts_.error_feedback) e_of(x).sub_(M);
    }
  }
  ++s.steps;
}

CommHook powersgd_hook(std::shared_ptr<PowerSgd> state) {
  if (!state) throw std::invalid_argument("powersgd_hook: null state");
  return [state](ProcessGroup& pg, torch::Tensor& bucket, const std::string& label) {
    return state->launch(pg, bucket, label);
  };
}

}  // namespace dp
