#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "axon/runtime.h"
#include "bytes.h"
#include "memory.h"
#include "registry.h"

namespace axon::rt {
namespace {

// Per pinned buffer: the last task of each stream that copies to or from it.
// At most one entry per stream, so it stays small.
using Uses = std::vector<std::pair<StreamState*, uint64_t>>;

RangeRegistry<Uses>& pinned() {
  static auto* r = new RangeRegistry<Uses>;
  return *r;
}

}  // namespace

void* host_alloc(size_t bytes) {
  const size_t size = granule_size(bytes);
  void* p = size ? std::aligned_alloc(kAlignment, size) : nullptr;
  if (p == nullptr) {
    throw OutOfMemoryError("axon: out of pinned host memory: tried to allocate " +
                               format_bytes(bytes),
                           -1, bytes, 0, 0);
  }
  pinned().insert(p, size, Uses{});
  return p;
}

void host_free(void* ptr) {
  if (ptr == nullptr) return;
  auto e = pinned().erase(ptr);
  if (!e) {
    char buf[128];
    std::snprintf(buf, sizeof buf,
                  "axon: host_free of %p, which is not a pointer returned by host_alloc", ptr);
    throw Error(buf);
  }
  for (auto [stream, seq] : e->payload) stream->wait(seq);
  std::free(ptr);
}

bool host_in_use(const void* ptr) {
  bool busy = false;
  pinned().with(ptr, [&](auto& e) {
    for (auto [stream, seq] : e.payload) busy = busy || stream->completed() < seq;
  });
  return busy;
}

bool is_host_pinned(const void* ptr) noexcept {
  return pinned().with(ptr, [](auto&) {});
}

bool is_pinned_range(const void* p, size_t n, const char* what) {
  return pinned().with(p, [&](auto& e) { check_range(e.base, e.size, p, n, what, "pinned"); });
}

void note_pinned_use(const void* p, StreamState& stream, uint64_t seq) {
  pinned().with(p, [&](auto& e) {
    auto it = std::find_if(e.payload.begin(), e.payload.end(),
                           [&](const auto& use) { return use.first == &stream; });
    if (it == e.payload.end()) e.payload.emplace_back(&stream, seq);
    else it->second = std::max(it->second, seq);
  });
}

}  // namespace axon::rt
