// The per-device random generator.  Counter-based, like CUDA's Philox state:
// its whole state is (seed, offset), every random op reserves a range of the
// counter, so results depend on the seed and the sequence of ops only, never
// on thread scheduling.  get_state() is 16 bytes: seed, then offset.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace at::axon {

class AxonGeneratorImpl : public c10::GeneratorImpl {
 public:
  explicit AxonGeneratorImpl(c10::DeviceIndex device,
                             uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // Reserves `increment` counter values; returns (seed, first offset).
  std::pair<uint64_t, uint64_t> reserve(uint64_t increment);

  static c10::DeviceType device_type();

 private:
  AxonGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& getDefaultAxonGenerator(c10::DeviceIndex device = -1);
at::Generator createAxonGenerator(c10::DeviceIndex device = -1);

// A CPU generator whose stream is determined by the next counter range of
// `gen` (or of the device's default generator when gen is undefined): how the
// CPU fallback runs a random op reproducibly on axon.
at::Generator cpuGeneratorFor(const std::optional<at::Generator>& gen,
                              c10::DeviceIndex device);

// A counter range that a kernel draws from directly (the attention kernels'
// dropout).  Eagerly, `seed` and `offset` are reserved when the op is queued.
// While a graph captures, `slot` is set instead: the kernel reads the range
// from it when it runs, and each replay of the graph fills it with the range
// this replay reserved.
struct RawRngSlot {
  uint64_t seed = 0;
  uint64_t offset = 0;
};
struct RawRng {
  uint64_t seed = 0;
  uint64_t offset = 0;
  std::shared_ptr<RawRngSlot> slot;
};
// Reserves `increment` counter values of `gen` for an op on `device`.
RawRng reserveRawRng(c10::DeviceIndex device, at::Generator gen, uint64_t increment);

// Graph capture (core/AxonGraph.cpp).  A random op captured in a graph must
// draw new numbers at each replay, exactly those it would draw if it ran
// eagerly at that point: while a graph captures on a stream, cpuGeneratorFor
// on that stream hands out a CPU generator the graph owns, and reserveRawRng
// a slot the graph owns; the capture records the counter values each took.
// Each replay reserves, from each axon generator the capture used, as many
// counter values as the capture took, and reseeds the CPU generators and
// fills the slots on the stream before the graph's work runs.
class GraphRng {
 public:
  at::Generator cpuGenerator(const at::Generator& axon_gen);
  std::shared_ptr<RawRngSlot> rawSlot(const at::Generator& axon_gen, uint64_t increment);
  // On the host at replay: reserves the counter ranges now and returns the
  // reseeding to run on the stream ahead of the graph (empty if the capture
  // drew no random numbers).
  std::function<void()> prepareReplay();
  bool empty();
  // Where the capture stands in gen's counter, relative to where it began
  // (get_state/get_offset while capturing), and moving it back or forth
  // (set_state/set_offset while capturing: torch.utils.checkpoint restores a
  // state it saved in the capture, so the replay recomputes the same numbers).
  uint64_t position(const c10::GeneratorImpl* gen);
  void moveTo(const c10::GeneratorImpl* gen, uint64_t position);

 private:
  struct Entry {
    at::Generator axon;
    at::Generator cpu;                 // a random op of the CPU kernels, or
    std::shared_ptr<RawRngSlot> slot;  // a raw range
    uint64_t relative;                 // its first counter value within the capture
    uint64_t increment;
  };
  void add(Entry e);
  struct Counter {
    const c10::GeneratorImpl* gen;
    // The next relative counter value.  A replay reserves the capture's final
    // position: a capture that moved back ends where it stood last, and the
    // next draws reuse the values past it, as the same calls eagerly.
    uint64_t cursor = 0;
  };
  Counter& counterLocked(const c10::GeneratorImpl* gen);
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<Counter> counters_;
};
// Registers (rng != nullptr) or removes the GraphRng of a capture (the
// runtime's capture id).
void setCaptureRng(uint64_t capture_id, std::shared_ptr<GraphRng> rng);

}  // namespace at::axon
