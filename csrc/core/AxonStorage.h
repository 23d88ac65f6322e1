// Growing or shrinking an axon storage in place: allocate, copy on the
// current stream, swap.  Used by resize_ and untyped_storage().resize_().
#pragma once

#include <c10/core/StorageImpl.h>

namespace at::axon {

void resizeStorageBytes(c10::StorageImpl* storage, size_t new_bytes);

}  // namespace at::axon
