// Per-device state, created on first use and kept for the whole process.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

#include "axon/runtime.h"
#include "stream_state.h"

namespace axon::rt {

struct Capture;  // graph.h

constexpr int kStreamsPerDevice = 1 + 2 * kStreamPoolSize + kDedicatedStreams;

struct Device {
  Device(int index, size_t capacity);

  const int index;
  const size_t capacity;
  std::atomic<size_t> used{0};  // bytes of device memory handed out
  std::array<std::atomic<uint32_t>, 2> next_in_pool{};  // round robin: normal, high
  std::atomic<uint32_t> next_dedicated{0};
  // Every stream exists up front (cheap); only its worker thread is lazy.
  std::array<std::unique_ptr<StreamState>, kStreamsPerDevice> streams;
  // Captures in progress (graph.cc): how many streams capture, and the
  // capture each stream records into (guarded by capture_mu).
  std::atomic<int> capturing{0};
  std::mutex capture_mu;
  std::array<std::shared_ptr<Capture>, kStreamsPerDevice> captures;
};

// Validates the index; creates the device's state on first use.
Device& device(int d);
// The device's state if something already created it, else nullptr.
Device* created_device(int d) noexcept;
// Validates the stream (see check_stream).
StreamState& stream_state(Stream s);

}  // namespace axon::rt
