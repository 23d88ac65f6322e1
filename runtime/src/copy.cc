#include <cstring>

#include "axon/runtime.h"
#include "device.h"
#include "graph.h"
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
  std::function<void()> fn = [=] { std::memmove(dst, src, n); };
  if (auto c = active_capture(s)) {
    if (!dst_async || !src_async) {
      capture_violation(c, std::string("a copy ") + (src_async ? "to" : "from") +
                               " pageable host memory (a synchronising copy; pin the host "
                               "memory to capture it)");
    }
    if (capture_task(s, "memcpy", fn)) return;
  }
  const uint64_t seq = st.enqueue("memcpy", std::move(fn));

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
