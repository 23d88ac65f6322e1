#include "AxonGenerator.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/CallOnce.h>

#include "AxonRuntime.h"

#include <ATen/ops/empty.h>

namespace at::axon {

AxonGeneratorImpl::AxonGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kAxon, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void AxonGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

uint64_t AxonGeneratorImpl::current_seed() const { return seed_; }

uint64_t AxonGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(s);
  return s;
}

void AxonGeneratorImpl::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t AxonGeneratorImpl::get_offset() const { return offset_; }

c10::intrusive_ptr<c10::TensorImpl> AxonGeneratorImpl::get_state() const {
  at::Tensor state = at::empty({16}, at::TensorOptions().dtype(at::kByte));
  auto* p = static_cast<uint64_t*>(state.data_ptr());
  p[0] = seed_;
  p[1] = offset_;
  return state.getIntrusivePtr();
}

void AxonGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  new_state.numel() == 16 && new_state.device().is_cpu(),
              "RNG state must be a torch.ByteTensor of 16 bytes on the CPU, got ",
              new_state.numel(), " elements of ", new_state.dtype());
  const auto* p = static_cast<const uint64_t*>(new_state.data());
  seed_ = p[0];
  offset_ = p[1];
}

std::pair<uint64_t, uint64_t> AxonGeneratorImpl::reserve(uint64_t increment) {
  uint64_t first = offset_;
  offset_ += increment;
  return {seed_, first};
}

c10::DeviceType AxonGeneratorImpl::device_type() { return kAxon; }

AxonGeneratorImpl* AxonGeneratorImpl::clone_impl() const {
  auto* g = new AxonGeneratorImpl(device().index(), seed_);
  g->offset_ = offset_;
  return g;
}

const at::Generator& getDefaultAxonGenerator(c10::DeviceIndex device) {
  static std::vector<at::Generator> generators = [] {
    std::vector<at::Generator> v(std::max<int>(device_count(), 0));
    for (int i = 0; i < static_cast<int>(v.size()); ++i) {
      v[i] = at::make_generator<AxonGeneratorImpl>(static_cast<c10::DeviceIndex>(i));
    }
    return v;
  }();
  if (device < 0) device = current_device();
  check_device(device);
  return generators[device];
}

at::Generator createAxonGenerator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device(device);
  return at::make_generator<AxonGeneratorImpl>(device);
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

at::Generator cpuGeneratorFor(const std::optional<at::Generator>& gen,
                              c10::DeviceIndex device) {
  at::Generator g = gen.has_value() && gen->defined()
                        ? *gen
                        : getDefaultAxonGenerator(device);
  TORCH_CHECK(g.device().type() == kAxon,
              "Expected a 'axon' device type for generator but found '",
              g.device().type(), "'");
  uint64_t seed, offset;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    std::tie(seed, offset) = g.get<AxonGeneratorImpl>()->reserve(1);
  }
  return at::make_generator<at::CPUGeneratorImpl>(splitmix64(seed ^ splitmix64(offset)));
}

}  // namespace at::axon
