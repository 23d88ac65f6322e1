#include <cstring>

#include "axon/runtime.h"
#include "device.h"
#include "memory.h"

namespace axon::rt {

void memcpy(void* dst, const void* src, size_t n, Stream s) {
  StreamState& st = stream_state(s);
  if (n == 0) return;
  if (dst == nullptr || src == nullptr) throw Error("axon: memcpy with a null pointer");
  const bool dst_async = is_device_range(dst, n, "memcpy destination") ||
                         is_pinned_range(dst, n, "memcpy destination");
  const bool src_async = is_device_range(src, n, "memcpy source") ||
                         is_pinned_range(src, n, "memcpy source");

  // memmove: a device-to-device copy within one allocation may overlap.
  const uint64_t seq = st.enqueue("memcpy", [=] { std::memmove(dst, src, n); });

  if (dst_async && src_async && !launch_blocking()) {
    // No-ops for device memory; lets host_free wait for this copy.
    note_pinned_use(dst, st, seq);
    note_pinned_use(src, st, seq);
    return;
  }
  // Pageable memory may be reused as soon as we return.
  st.wait(seq);
  st.throw_pending_error();
}

}  // namespace axon::rt
