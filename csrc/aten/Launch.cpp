// Launching stream work with host-side checks (Launch.h): signatures, the
// synchronous first run of each, host warnings; device allocation helpers.
#include "Launch.h"

#include "../core/AxonGraph.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include <sys/syscall.h>
#include <unistd.h>

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/bit_cast.h>
#include <c10/util/hash.h>
#include <c10/util/overflows.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include "../core/CachingAllocator.h"
#include "HostView.h"

namespace at::axon {

// ------------------------------------------------------------ launching

namespace {

// Signatures whose kernel ran once, synchronously, without error or warning
// (see launchChecked).  Bounded: past kMaxSignatures the set starts afresh
// (some launches then run synchronously once more).
constexpr size_t kMaxSignatures = size_t{1} << 16;
std::mutex signatures_mutex;
std::unordered_set<uint64_t> signatures;
std::atomic<uint64_t> signatures_generation{0};

class CollectWarnings final : public c10::WarningHandler {
 public:
  std::vector<c10::Warning> warnings;
  void process(const c10::Warning& warning) override { warnings.push_back(warning); }
};

thread_local HostWarningScope* current_host_warnings = nullptr;

// Launches that ran synchronously to be checked (a new signature, or a
// kernel that warns): torch.ops.axon._checked_launches(), for tests and for
// finding workloads that keep meeting new signatures.
std::atomic<int64_t> checked_launches{0};

}  // namespace

void launchChecked(c10::DeviceIndex device, const char* name, uint64_t signature, int threads,
                   std::unique_ptr<Work> work) {
  startComputeTeam();
  // A per-thread cache in front of the shared set: no lock on the hot path.
  // The last key seen is checked first (loops launch one kernel over and over).
  thread_local std::unordered_set<uint64_t> verified_here;
  thread_local uint64_t generation_here = 0;
  thread_local uint64_t last_key = 0;
  thread_local bool has_last_key = false;
  const uint64_t key = c10::hash_combine(reinterpret_cast<uintptr_t>(name), signature);
  const uint64_t generation = signatures_generation.load(std::memory_order_relaxed);
  if (generation_here != generation || verified_here.size() > kMaxSignatures) {
    verified_here.clear();
    generation_here = generation;
    has_last_key = false;
  }
  bool verified = has_last_key && last_key == key;
  if (!verified) verified = verified_here.count(key) != 0;
  if (!verified) {
    std::lock_guard<std::mutex> lock(signatures_mutex);
    verified = signatures.count(key) != 0;
    if (verified) verified_here.insert(key);
  }
  if (verified) {
    last_key = key;
    has_last_key = true;
    work->quiet = true;
    return launch(device, name, std::move(work), threads);
  }
  if (currentStreamCapturing(device)) {
    // A graph capture runs nothing: the CPU kernel's own checks run at the
    // replay, whose errors are asynchronous (as a CUDA kernel's in a graph).
    work->quiet = true;
    return launch(device, name, std::move(work), threads);
  }
  // A new signature: the CPU kernel checks it here, at the call.
  checked_launches.fetch_add(1, std::memory_order_relaxed);
  syncCurrentStream(device);
  CollectWarnings collect;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&collect);
    // The device's numbers, not the host's (a deferred decision: the stream
    // is synchronised, so its trials have run).
    const int run_threads =
        work->threads_at_run != nullptr ? work->threads_at_run->threadsAtRun() : threads;
    const KernelThreadsScope team(run_threads);
    // On a thread other than the process's first (autograd's device threads, a
    // user's threads), the OpenMP team the run started ends with it, as a
    // stream worker's does (StreamWork.h releaseOpenMpTeam); the first
    // thread's team is the CPU's own.
    struct Release {
      ~Release() {
        if (static_cast<pid_t>(syscall(SYS_gettid)) != getpid()) releaseOpenMpTeam();
      }
    } release;
    try {
      work->run();
    } catch (...) {
      if (work->timed != nullptr) work->timed->record(run_threads, kFailedRun);
      throw;
    }
    // Ran here, on the host's threads: not a timing of the device's.
    if (work->timed != nullptr) work->timed->record(run_threads, kUntimedRun);
  }
  work.reset();
  bool warned = false;
  const HostWarningScope* host = HostWarningScope::current();
  for (const c10::Warning& w : collect.warnings) {
    if (host != nullptr && host->raised(w.msg())) continue;  // the host's checks raised it
    warned = true;
    c10::warn(w);
  }
  if (warned) return;  // runs at the call every time: its warnings once per call
  verified_here.insert(key);
  std::lock_guard<std::mutex> lock(signatures_mutex);
  if (signatures.size() >= kMaxSignatures) {
    signatures.clear();
    signatures_generation.fetch_add(1, std::memory_order_relaxed);
  }
  signatures.insert(key);
}

void launchChecked(c10::DeviceIndex device, const char* name, uint64_t signature, int threads,
                   std::function<void()> fn) {
  launchChecked(device, name, signature, threads, functionWork(std::move(fn)));
}

// ------------------------------------------------------------ signatures

namespace {

// Which conversions of s would overflow (c10::checked_convert, what
// Scalar::to<T>() raises): two Scalars with the same mask pass or fail the
// same conversions.
template <typename... To>
uint64_t overflow_mask(const at::Scalar& s) {
  uint64_t mask = 0;
  int bit = 0;
  if (s.isComplex()) {
    const auto v = s.toComplexDouble();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  } else if (s.isFloatingPoint()) {
    const double v = s.toDouble();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  } else if (s.type() == at::kUInt64) {
    const uint64_t v = s.toUInt64();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  } else if (!s.isBoolean()) {
    const int64_t v = s.toLong();
    ((mask |= uint64_t{c10::overflows<To>(v)} << bit++), ...);
  }
  return mask;
}

}  // namespace

void Signature::scalar(const at::Scalar& s) {
  mix(0x51 + static_cast<uint64_t>(s.type()));
  if (s.isSymbolic()) return;
  if (full) {
    if (s.isComplex()) {
      const auto v = s.toComplexDouble();
      mix(c10::bit_cast<uint64_t>(v.real()));
      mix(c10::bit_cast<uint64_t>(v.imag()));
    } else if (s.isFloatingPoint()) {
      mix(c10::bit_cast<uint64_t>(s.toDouble()));
    } else if (s.type() == at::kUInt64) {
      mix(s.toUInt64());
    } else if (s.isBoolean()) {
      mix(s.toBool());
    } else {
      mix(static_cast<uint64_t>(s.toLong()));
    }
    return;
  }
  // Range class only (a learning rate that changes every step must not make
  // every step synchronous).
  mix(overflow_mask<uint8_t, int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t,
                    c10::Half, c10::BFloat16, float, double, c10::Float8_e4m3fn,
                    c10::Float8_e5m2, c10::complex<c10::Half>, c10::complex<float>>(s));
  if (s.isFloatingPoint()) {
    const double v = s.toDouble();
    mix((std::isnan(v) ? 1 : 0) | (std::isinf(v) ? 2 : 0) | (v < 0 ? 4 : 0) | (v == 0 ? 8 : 0) |
        (std::isfinite(v) && v == std::trunc(v) ? 16 : 0));
  } else if (!s.isComplex() && !s.isBoolean() && s.type() != at::kUInt64) {
    const int64_t v = s.toLong();
    mix((v < 0 ? 4 : 0) | (v == 0 ? 8 : 0));
  }
}

void Signature::device_tensor(const void* storage_data, int64_t offset, c10::IntArrayRef sizes,
                              c10::IntArrayRef strides, caffe2::TypeMeta dtype, bool conj,
                              bool neg, const void* identity) {
  mix(0x61 + static_cast<uint64_t>(dtype.toScalarType()) * 4 + (conj ? 1 : 0) + (neg ? 2 : 0));
  if (!full) {
    return alias_class(storage_data, identity, offset, sizes, strides, dtype.itemsize());
  }
  mix(sizes.size());
  for (int64_t v : sizes) mix(static_cast<uint64_t>(v));
  for (int64_t v : strides) mix(static_cast<uint64_t>(v));
  // Aliasing: which storage (in order of appearance), and where in it,
  // relative to the storage's first tensor here.
  const int64_t byte_offset = offset * static_cast<int64_t>(dtype.itemsize());
  size_t index = 0;
  for (; index < storages.size(); ++index) {
    if (storages[index].first == storage_data) break;
  }
  if (index == storages.size()) storages.emplace_back(storage_data, byte_offset);
  mix(index);
  mix(static_cast<uint64_t>(byte_offset - storages[index].second));
}

void Signature::cpu_tensor(const at::Tensor& t) {
  mix(0x71 + static_cast<uint64_t>(t.scalar_type()));
  if (!full) return;
  mix(t.dim());
  for (int64_t v : t.sizes()) mix(static_cast<uint64_t>(v));
  for (int64_t v : t.strides()) mix(static_cast<uint64_t>(v));
  // The values of a small CPU tensor are host-visible (an index list).
  constexpr size_t kMaxContents = 4096;
  if (t.nbytes() <= kMaxContents && !t.is_conj() && !t.is_neg()) {
    const at::Tensor c = t.contiguous();
    const auto* p = static_cast<const unsigned char*>(c.const_data_ptr());
    const size_t n = c.numel() * c.element_size();
    uint64_t word = 0;
    for (size_t i = 0; i < n; ++i) {
      word = (word << 8) | p[i];
      if (i % 8 == 7) mix(word), word = 0;
    }
    mix(word);
  }
}

void Signature::tensor(const at::Tensor& t) {
  if (!t.defined()) return undefined();
  if (t.is_cpu()) {
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      mix(0x21);
      mix(static_cast<uint64_t>(t.scalar_type()));
      return scalar(wrappedNumberValue(t));
    }
    return cpu_tensor(t);
  }
  device_tensor(t.storage().data(), t.storage_offset(), t.sizes(), t.strides(), t.dtype(),
                t.is_conj(), t.is_neg(), t.unsafeGetTensorImpl());
}

void Signature::alias_class(const void* storage_data, const void* identity, int64_t offset,
                            c10::IntArrayRef sizes, c10::IntArrayRef strides, size_t itemsize) {
  // Itself: 1 when a dim of several elements has stride 0 (expanded); 0 when
  // the dims, by increasing stride, each step past all of the smaller ones
  // (no element is reached twice); 2 when that is not known.  Dense: 0 and no
  // gaps (ATen's non-overlapping and dense).
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size)
  int64_t span = 0;  // elements from the first to the last, minus one
  int64_t numel = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    numel *= sizes[d];
    if (sizes[d] <= 1) continue;
    dims.emplace_back(std::abs(strides[d]), sizes[d]);
    span += (sizes[d] - 1) * std::abs(strides[d]);
  }
  if (numel == 0) return mix(0xd4);  // overlaps nothing
  uint64_t self = 0;
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride == 0) {
      self = 1;
      break;
    }
    if (stride <= reach) self = 2;
    reach += (size - 1) * stride;
  }
  mix(0xd1 + self);
  const int64_t item = static_cast<int64_t>(itemsize);
  const Extent mine{storage_data, identity, offset * item, (offset + span + 1) * item,
                    self == 0 && span + 1 == numel, strides};
  // The earlier tensors of the same storage, as at::get_overlap_status: the
  // same tensor, or both dense with the same bytes and strides: full (1);
  // either not dense: too hard (3); dense with common bytes: partial (2);
  // none (0, not mixed).
  auto relate = [&](size_t i) {
    const Extent& e = extents[i];
    uint64_t relation = 0;
    if (identity != nullptr && e.identity == identity) {
      relation = 1;
    } else if (!e.dense || !mine.dense) {
      relation = 3;
    } else if (e.begin == mine.begin && e.end == mine.end) {
      relation = e.strides.equals(strides) ? 1 : 2;
    } else if (e.begin < mine.end && mine.begin < e.end) {
      relation = 2;
    }
    if (relation != 0) mix(0x10000 + i * 4 + relation);
  };
  if (by_storage == nullptr) {
    for (size_t i = 0; i < extents.size(); ++i) {
      if (extents[i].storage == storage_data) relate(i);
    }
    if (extents.size() + 1 >= kIndexed) {
      by_storage = std::make_unique<
          std::unordered_map<const void*, c10::SmallVector<uint32_t, 2>>>();
      for (size_t i = 0; i < extents.size(); ++i)
        (*by_storage)[extents[i].storage].push_back(static_cast<uint32_t>(i));
      (*by_storage)[storage_data].push_back(static_cast<uint32_t>(extents.size()));
    }
  } else {
    auto& same = (*by_storage)[storage_data];
    for (uint32_t i : same) relate(i);
    same.push_back(static_cast<uint32_t>(extents.size()));
  }
  extents.push_back(mine);
}

void Signature::string(std::string_view s) { mix(std::hash<std::string_view>{}(s)); }

// ------------------------------------------------------------ host warnings

HostWarningScope::HostWarningScope()
    : prev_(c10::WarningUtils::get_warning_handler()), outer_(current_host_warnings) {
  c10::WarningUtils::set_warning_handler(this);
  current_host_warnings = this;
}

HostWarningScope::~HostWarningScope() {
  c10::WarningUtils::set_warning_handler(prev_);
  current_host_warnings = outer_;
}

void HostWarningScope::process(const c10::Warning& warning) {
  messages_.push_back(warning.msg());
  prev_->process(warning);
}

bool HostWarningScope::raised(const std::string& message) const {
  for (const std::string& m : messages_) {
    if (m == message) return true;
  }
  return outer_ != nullptr && outer_->raised(message);
}

HostWarningScope* HostWarningScope::current() { return current_host_warnings; }

at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                       c10::ScalarType dtype, c10::DeviceIndex device) {
  c10::OptionalDeviceGuard guard;
  if (device != current_device()) guard.reset_device(c10::Device(kAxon, device));
  return at::detail::empty_strided_generic(
      sizes, strides, getCachingAllocator(),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
}

at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::ScalarType dtype,
                       c10::DeviceIndex device) {
  return emptyDevice(sizes, c10::contiguous_strides(sizes), dtype, device);
}

at::Tensor emptyDeviceLike(const at::Tensor& t, c10::ScalarType dtype) {
  // As at::empty_like(t) (preserve_format): t's strides when t is dense, else
  // dense strides in t's dimension order (what Meta kernels, and so
  // torch.compile's stride checks, expect).
  return t.is_non_overlapping_and_dense()
             ? emptyDevice(t.sizes(), t.strides(), dtype, t.device().index())
             : emptyDevice(t.sizes(), at::infer_dense_strides(t.sizes(), t.strides()), dtype,
                           t.device().index());
}

at::Tensor snapshotCpuTensor(const at::Tensor& t) {
  at::Tensor c;
  if (t.dim() == 0 && !t.is_conj() && !t.is_neg()) {  // the common case: a scalar
    c = at::detail::empty_cpu({}, t.scalar_type());
    std::memcpy(c.data_ptr(), t.const_data_ptr(), t.element_size());
  } else {
    c = t.clone();
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    c.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return c;
}

namespace {

TORCH_LIBRARY_FRAGMENT(axon, m) {
  m.def("_checked_launches() -> int", []() -> int64_t { return checked_launches.load(); });
}

}  // namespace
}  // namespace at::axon
