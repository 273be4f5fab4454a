// Memory that comes and goes under a tensor: its storage freed and allocated again while the tensor, and
// every view of it, keeps its shape, dtype, device and identity. A tensor with no memory costs nothing
// and may stay registered in a model and saved by autograd; once allocated again (and filled) every
// view reads the new values. PyTorch's FSDP does this with _free_storage and _alloc_storage
// (torch/distributed/utils.py, storage().resize_(0) and back).
#pragma once

#include "common/base/libtorch.hpp"

namespace dp {

/// Releases the memory of `t`'s storage; `t` and its views keep their metadata and read as nothing until
/// alloc_storage(). Never while a collective or a kernel still writes into it.
void free_storage(const torch::Tensor& t);

/// Gives `t`'s storage t.nbytes() bytes again (uninitialized), from the storage's own allocator (CPU, or
/// CUDA's caching allocator on `t`'s device, whichever thread asks). `t` must start at the storage's start.
void alloc_storage(const torch::Tensor& t);

}  // namespace dp
