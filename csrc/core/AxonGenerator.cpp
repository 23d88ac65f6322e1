#include "AxonGenerator.h"

#include <algorithm>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/CallOnce.h>

#include "AxonGraph.h"
#include "AxonRuntime.h"
#include "AxonStream.h"

#include <atomic>
#include <unordered_map>

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>

namespace at::axon {

AxonGeneratorImpl::AxonGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kAxon, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void AxonGeneratorImpl::set_current_seed(uint64_t seed) {
  // As CUDA's: a capture on the current stream records random ops against the
  // generator's seed; a new one there would not reach the replays.
  if (currentStreamCapturing(device().index())) {
    TORCH_CHECK(seed_ == seed,
                "AxonGeneratorImpl::set_current_seed can be called during stream capture only "
                "if new seed is the same as the original seed.");
    return;
  }
  seed_ = seed;
  offset_ = 0;
}

uint64_t AxonGeneratorImpl::current_seed() const { return seed_; }

uint64_t AxonGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(s);
  return s;
}

namespace {
std::shared_ptr<GraphRng> currentCaptureRng(c10::DeviceIndex device);

// While the current stream of the generator's device captures a graph, the
// generator's state as the capture sees it: (seed, offset at the capture's
// start + the capture's position), and a state set there moves the position
// (the replays then draw what the same calls draw eagerly).  The offset may
// not go before where the capture began.
void moveCapturePosition(const c10::GeneratorImpl* gen, GraphRng& rng, uint64_t base,
                         uint64_t offset) {
  TORCH_CHECK(offset >= base,
              "axon: the generator's offset can be set during a graph capture only to a state "
              "taken in the same capture (offset ", offset, " is before the capture began at ",
              base, ")");
  rng.moveTo(gen, offset - base);
}
}  // namespace

void AxonGeneratorImpl::set_offset(uint64_t offset) {
  if (auto rng = currentCaptureRng(device().index())) {
    moveCapturePosition(this, *rng, offset_, offset);
    return;
  }
  offset_ = offset;
}

uint64_t AxonGeneratorImpl::get_offset() const {
  if (auto rng = currentCaptureRng(device().index())) return offset_ + rng->position(this);
  return offset_;
}

c10::intrusive_ptr<c10::TensorImpl> AxonGeneratorImpl::get_state() const {
  // Not dispatched (as CUDA's generator): a real tensor even under a
  // FakeTensorMode (torch.compile saves generator states while tracing).
  at::Tensor state = at::detail::empty_cpu({16}, at::kByte, std::nullopt, std::nullopt,
                                           std::nullopt, std::nullopt);
  auto* p = static_cast<uint64_t*>(state.data_ptr());
  p[0] = seed_;
  p[1] = get_offset();
  return state.getIntrusivePtr();
}

void AxonGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  new_state.numel() == 16 && new_state.device().is_cpu(),
              "RNG state must be a torch.ByteTensor of 16 bytes on the CPU, got ",
              new_state.numel(), " elements of ", new_state.dtype());
  const auto* p = static_cast<const uint64_t*>(new_state.data());
  if (auto rng = currentCaptureRng(device().index())) {
    TORCH_CHECK(p[0] == seed_,
                "axon: set_rng_state during a graph capture can only restore a state taken in "
                "the same capture (its seed ", p[0], " is not the generator's ", seed_, ")");
    moveCapturePosition(this, *rng, offset_, p[1]);
    return;
  }
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
// The GraphRng of each capture, by the runtime's capture id (shared by the
// stream the capture began on and the streams that joined it).
std::atomic<int> capture_rngs{0};
std::mutex capture_rng_mu;
std::unordered_map<uint64_t, std::shared_ptr<GraphRng>>& captureRngMap() {
  static auto* m = new std::unordered_map<uint64_t, std::shared_ptr<GraphRng>>();
  return *m;
}

// The capture the current stream of `device` records into, if any.
std::shared_ptr<GraphRng> currentCaptureRng(c10::DeviceIndex device) {
  if (capture_rngs.load(std::memory_order_acquire) == 0) return nullptr;
  const rt::Stream s = current_rt_stream(device);
  const uint64_t id = rt_call([&] { return rt::stream_capture_id(s); });
  if (id == 0) return nullptr;
  std::lock_guard<std::mutex> lock(capture_rng_mu);
  auto& m = captureRngMap();
  auto it = m.find(id);
  TORCH_CHECK(it != m.end(), "axon:", static_cast<int>(device),
              ": a random op on a stream that captures a graph without a generator state "
              "(internal error)");
  return it->second;
}
}  // namespace

void setCaptureRng(uint64_t capture_id, std::shared_ptr<GraphRng> rng) {
  std::lock_guard<std::mutex> lock(capture_rng_mu);
  auto& m = captureRngMap();
  if (rng != nullptr) {
    if (m.emplace(capture_id, std::move(rng)).second) capture_rngs.fetch_add(1);
  } else if (m.erase(capture_id) != 0) {
    capture_rngs.fetch_sub(1);
  }
}

RawRng reserveRawRng(c10::DeviceIndex device, at::Generator gen, uint64_t increment) {
  TORCH_CHECK(gen.device().type() == kAxon,
              "Expected a 'axon' device type for generator but found '", gen.device().type(),
              "'");
  RawRng r;
  if (auto rng = currentCaptureRng(device)) {
    r.slot = rng->rawSlot(gen, increment);
    return r;
  }
  std::lock_guard<std::mutex> lock(gen.mutex());
  std::tie(r.seed, r.offset) = gen.get<AxonGeneratorImpl>()->reserve(increment);
  return r;
}

GraphRng::Counter& GraphRng::counterLocked(const c10::GeneratorImpl* gen) {
  for (Counter& c : counters_)
    if (c.gen == gen) return c;
  return counters_.emplace_back(Counter{gen});
}

void GraphRng::add(Entry e) {
  std::lock_guard<std::mutex> lock(mu_);
  Counter& c = counterLocked(e.axon.unsafeGetGeneratorImpl());
  e.relative = c.cursor;
  c.cursor += e.increment;
  entries_.push_back(std::move(e));
}

uint64_t GraphRng::position(const c10::GeneratorImpl* gen) {
  std::lock_guard<std::mutex> lock(mu_);
  return counterLocked(gen).cursor;
}

void GraphRng::moveTo(const c10::GeneratorImpl* gen, uint64_t position) {
  std::lock_guard<std::mutex> lock(mu_);
  Counter& c = counterLocked(gen);
  c.cursor = position;
}

at::Generator GraphRng::cpuGenerator(const at::Generator& axon_gen) {
  at::Generator cpu = at::make_generator<at::CPUGeneratorImpl>(0);
  add(Entry{axon_gen, cpu, nullptr, 0, 1});
  return cpu;
}

std::shared_ptr<RawRngSlot> GraphRng::rawSlot(const at::Generator& axon_gen, uint64_t increment) {
  auto slot = std::make_shared<RawRngSlot>();
  add(Entry{axon_gen, at::Generator(), slot, 0, increment});
  return slot;
}

bool GraphRng::empty() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.empty();
}

std::function<void()> GraphRng::prepareReplay() {
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.empty()) return {};
  // Each axon generator once, in order of first use, with the counter values
  // the capture took from it: its range for this replay.
  struct Range {
    at::Generator gen;
    uint64_t count = 0;  // counter values the capture took (its final position)
    std::pair<uint64_t, uint64_t> first;  // (seed, offset)
  };
  std::vector<Range> ranges;
  for (const Entry& e : entries_) {
    auto it = std::find_if(ranges.begin(), ranges.end(),
                           [&](const Range& r) { return r.gen == e.axon; });
    if (it == ranges.end()) {
      it = ranges.insert(ranges.end(), Range{e.axon, 0, {0, 0}});
      it->count = counterLocked(e.axon.unsafeGetGeneratorImpl()).cursor;
    }
  }
  for (Range& r : ranges) {
    std::lock_guard<std::mutex> glock(r.gen.mutex());
    r.first = r.gen.get<AxonGeneratorImpl>()->reserve(r.count);
  }
  std::vector<std::pair<at::Generator, uint64_t>> seeds;
  std::vector<std::pair<std::shared_ptr<RawRngSlot>, RawRngSlot>> slots;
  for (const Entry& e : entries_) {
    for (const Range& r : ranges) {
      if (r.gen != e.axon) continue;
      const uint64_t seed = r.first.first, offset = r.first.second + e.relative;
      if (e.slot != nullptr) {
        slots.push_back({e.slot, RawRngSlot{seed, offset}});
      } else {  // as cpuGeneratorFor eagerly
        seeds.emplace_back(e.cpu, splitmix64(seed ^ splitmix64(offset)));
      }
      break;
    }
  }
  return [seeds = std::move(seeds), slots = std::move(slots)]() mutable {
    for (auto& [cpu, seed] : seeds) {
      std::lock_guard<std::mutex> glock(cpu.mutex());
      cpu.get<at::CPUGeneratorImpl>()->set_current_seed(seed);
    }
    for (auto& [slot, value] : slots) *slot = value;
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
