#include "AxonGenerator.h"

#include <algorithm>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/CallOnce.h>

#include "AxonRuntime.h"
#include "AxonStream.h"

#include <atomic>
#include <unordered_map>

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

namespace {
// Captures that registered a GraphRng, by (device, capturing stream).
std::atomic<int> capture_rngs{0};
std::mutex capture_rng_mu;
std::unordered_map<int64_t, std::shared_ptr<GraphRng>>& captureRngMap() {
  static auto* m = new std::unordered_map<int64_t, std::shared_ptr<GraphRng>>();
  return *m;
}
int64_t rngKey(c10::DeviceIndex device, c10::StreamId stream) {
  return static_cast<int64_t>(device) * 4096 + stream;
}

// The capture the current stream of `device` records into, if it registered
// one.  A stream that joined a capture (fork) uses the device's capture when
// there is just one.
std::shared_ptr<GraphRng> currentCaptureRng(c10::DeviceIndex device) {
  if (capture_rngs.load(std::memory_order_acquire) == 0) return nullptr;
  const rt::Stream s = current_rt_stream(device);
  if (!rt_call([&] { return rt::stream_is_capturing(s); })) return nullptr;
  std::lock_guard<std::mutex> lock(capture_rng_mu);
  auto& m = captureRngMap();
  auto it = m.find(rngKey(device, s.id));
  if (it != m.end()) return it->second;
  std::shared_ptr<GraphRng> only;
  for (auto& [key, rng] : m) {
    if (key / 4096 != device) continue;
    if (only != nullptr) return nullptr;
    only = rng;
  }
  return only;
}
}  // namespace

void setCaptureRng(c10::DeviceIndex device, c10::StreamId stream, std::shared_ptr<GraphRng> rng) {
  std::lock_guard<std::mutex> lock(capture_rng_mu);
  auto& m = captureRngMap();
  if (rng != nullptr) {
    if (m.emplace(rngKey(device, stream), std::move(rng)).second) capture_rngs.fetch_add(1);
  } else if (m.erase(rngKey(device, stream)) != 0) {
    capture_rngs.fetch_sub(1);
  }
}

void checkRawRngNotCaptured(c10::DeviceIndex device, const char* op) {
  if (capture_rngs.load(std::memory_order_acquire) == 0) return;
  const rt::Stream s = current_rt_stream(device);
  TORCH_CHECK(!rt_call([&] { return rt::stream_is_capturing(s); }), op,
              " with dropout cannot be captured in an axon graph yet (its random numbers "
              "would repeat at every replay); capture it with dropout_p=0, or run it eagerly");
}

at::Generator GraphRng::cpuGenerator(const at::Generator& axon_gen) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t relative = 0;
  for (const Entry& e : entries_)
    if (e.axon == axon_gen) ++relative;
  at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>(0);
  entries_.push_back(Entry{axon_gen, cpu, relative});
  return cpu;
}

bool GraphRng::empty() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.empty();
}

std::function<void()> GraphRng::prepareReplay() {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.empty()) return {};
  // Each axon generator once, in order of first use: its range for this replay.
  std::vector<std::pair<at::Generator, std::pair<uint64_t, uint64_t>>> ranges;
  for (const Entry& e : entries_) {
    auto it = std::find_if(ranges.begin(), ranges.end(),
                           [&](const auto& r) { return r.first == e.axon; });
    if (it == ranges.end()) ranges.push_back({e.axon, {0, 0}});
  }
  for (auto& [gen, range] : ranges) {
    uint64_t count = 0;
    for (const Entry& e : entries_)
      if (e.axon == gen) ++count;
    std::lock_guard<std::mutex> glock(gen.mutex());
    range = gen.get<AxonGeneratorImpl>()->reserve(count);
  }
  std::vector<std::pair<at::Generator, uint64_t>> seeds;
  seeds.reserve(entries_.size());
  for (const Entry& e : entries_) {
    for (const auto& [gen, range] : ranges) {
      if (gen == e.axon) {
        seeds.emplace_back(e.cpu, splitmix64(range.first ^ splitmix64(range.second + e.relative)));
        break;
      }
    }
  }
  return [seeds = std::move(seeds)]() mutable {
    for (auto& [cpu, seed] : seeds) {
      std::lock_guard<std::mutex> glock(cpu.mutex());
      cpu.get<at::CPUGeneratorImpl>()->set_current_seed(seed);
    }
  };
}

at::Generator cpuGeneratorFor(const std::optional<at::Generator>& gen,
                              c10::DeviceIndex device) {
  at::Generator g = gen.has_value() && gen->defined()
                        ? *gen
                        : getDefaultAxonGenerator(device);
  TORCH_CHECK(g.device().type() == kAxon,
              "Expected a 'axon' device type for generator but found '",
              g.device().type(), "'");
  if (auto rng = currentCaptureRng(device)) return rng->cpuGenerator(g);
  uint64_t seed, offset;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    std::tie(seed, offset) = g.get<AxonGeneratorImpl>()->reserve(1);
  }
  return at::make_generator<at::CPUGeneratorImpl>(splitmix64(seed ^ splitmix64(offset)));
}

}  // namespace at::axon
