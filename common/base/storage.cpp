#include "common/base/storage.hpp"

#include <c10/core/DeviceGuard.h>

namespace dp {

void free_storage(const torch::Tensor& t) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void alloc_storage(const torch::Tensor& t) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = t.nbytes();
  // CUDA's allocator allocates on the current GPU (and stream): make it t's, whichever thread asks
  // (FSDP's backward hooks run on autograd's).
  c10::OptionalDeviceGuard on_device;
  if (t.is_cuda()) on_device.reset_device(t.device());
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace dp
