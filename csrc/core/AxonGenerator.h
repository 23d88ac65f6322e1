// The per-device random generator.  Counter-based, like CUDA's Philox state:
// its whole state is (seed, offset), every random op reserves a range of the
// counter, so results depend on the seed and the sequence of ops only, never
// on thread scheduling.  get_state() is 16 bytes: seed, then offset.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

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

}  // namespace at::axon
