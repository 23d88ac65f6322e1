#include "AxonStorage.h"

#include <c10/core/DeviceGuard.h>

#include "AxonRuntime.h"
#include "AxonStream.h"
#include "CachingAllocator.h"

namespace at::axon {

void resizeStorageBytes(c10::StorageImpl* storage, size_t new_bytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  c10::DeviceIndex device = storage->device().index();
  c10::DeviceGuard guard(storage->device());
  c10::DataPtr fresh = getCachingAllocator()->allocate(new_bytes);
  size_t n = std::min(storage->nbytes(), new_bytes);
  if (n > 0) {
    rt::Stream s = current_rt_stream(device);
    rt_call([&] { rt::memcpy(fresh.get(), storage->data(), n, s); });
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_bytes);
}

}  // namespace at::axon
