// Internal helpers shared by device memory, pinned memory and copies.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stream_state.h"

namespace axon::rt {

constexpr size_t kAlignment = 64;

// Bytes reserved for a request: whole 64-byte granules and at least one, so
// a zero-byte request still gets a unique, non-null pointer.  0 on overflow.
size_t granule_size(size_t bytes) noexcept;

// True when p is device memory.  Throws Error when [p, p+n) starts inside an
// allocation but runs past its end.
bool is_device_range(const void* p, size_t n, const char* what);
bool is_pinned_range(const void* p, size_t n, const char* what);

// Remembers that task `seq` of `stream` uses the pinned buffer holding p, so
// host_free can wait for it.
void note_pinned_use(const void* p, StreamState& stream, uint64_t seq);

// Shared by the two registries' range checks.
void check_range(uintptr_t base, size_t size, const void* p, size_t n, const char* what,
                 const char* kind);

}  // namespace axon::rt
