// Tier 2: native ops run as stream work.  The host thread checks arguments,
// works out the result's shape, allocates it and enqueues a kernel on the
// device's current stream; it does not wait.  Kernels read and write device
// memory through host views (axon memory is host-addressable), so a kernel is
// either one of ours (kernels/) or an ATen CPU kernel.
//
// launch() and the lifetime of what kernels capture: core/StreamWork.h.
// Defined in Launch.cpp; the device of an op's arguments: OpDevice.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include <ATen/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include "../core/AxonRuntime.h"
#include "../core/AxonStream.h"
#include "../core/StreamWork.h"

namespace at::axon {

// Host-visible errors are raised at the call, every time; only what depends
// on the data in device memory (an index value out of range, as CUDA's
// device-side asserts) may surface later.  The host checks what it can
// before launching (meta functions, checks written out), but a CPU kernel
// often checks more.  So every launch carries a *signature*: a hash of
// everything about its arguments the host can see, except device data.  The
// first launch of a kernel with a signature runs synchronously on the
// calling thread after the stream has drained: the CPU kernel's own checks
// raise its own exception (IndexError, NotImplementedError ...) at the call,
// and its warnings go to the caller.  Later launches with that signature
// differ from a launch that succeeded only in device data, and are
// asynchronous.  A signature whose kernel warned always runs synchronously,
// so its warnings reach the caller once per call (TORCH_WARN_ONCE stays
// once); warnings of asynchronous kernels are dropped on the worker.
//
// How much a signature holds (Signature below):
enum class HostChecks {
  // The host ran the op's complete checks (a structured meta function on the
  // axon tensors, or checks written out): dtypes, conj/neg bits, the kind
  // and range class of Scalars (what conversions to each dtype would
  // overflow), the values of non-tensor arguments, and how device tensors
  // overlap themselves and one another (which meta functions leave to the
  // CPU kernel).
  kMeta,
  // The host's checks may be partial (Meta kernels on meta stand-ins, hand
  // written shape logic): kMeta plus every tensor's sizes and strides, which
  // arguments share memory and where (overlap), exact Scalar values, and the
  // contents of small CPU tensors.
  kFull,
};

void launchChecked(c10::DeviceIndex device, const char* name, uint64_t signature, int threads,
                   std::unique_ptr<Work> work);
void launchChecked(c10::DeviceIndex device, const char* name, uint64_t signature, int threads,
                   std::function<void()> fn);

// Builds a launch signature (see HostChecks).
struct Signature {
  explicit Signature(HostChecks checks) : full(checks == HostChecks::kFull) {}
  bool full;
  uint64_t hash = 0x6a09e667f3bcc909ULL;
  // Device storages seen so far (data pointer, byte offset of the first view
  // of it): aliasing is hashed as (which storage, offset relative to it).
  c10::SmallVector<std::pair<const void*, int64_t>, 6> storages;
  // kMeta: the device tensors seen so far (alive while the signature is
  // built), for the aliasing class below; past kIndexed of them, an index
  // by storage keeps the comparisons linear.
  struct Extent {
    const void* storage;
    const void* identity;  // the TensorImpl, or null
    int64_t begin, end;    // bytes
    bool dense;            // non-overlapping and dense
    c10::IntArrayRef strides;
  };
  c10::SmallVector<Extent, 6> extents;
  static constexpr size_t kIndexed = 16;
  std::unique_ptr<std::unordered_map<const void*, c10::SmallVector<uint32_t, 2>>> by_storage;

  void mix(uint64_t v) {
    uint64_t z = hash ^ (v + 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    hash = z ^ (z >> 31);
  }
  void undefined() { mix(0x11); }
  void scalar(const at::Scalar& s);
  // A device tensor given by its storage's data, geometry and dtype.
  // `identity`: the tensor's TensorImpl where known (the same tensor passed
  // twice overlaps itself fully, whatever its layout).
  void device_tensor(const void* storage_data, int64_t offset, c10::IntArrayRef sizes,
                     c10::IntArrayRef strides, caffe2::TypeMeta dtype, bool conj, bool neg,
                     const void* identity = nullptr);
  // kMeta: how a device tensor overlaps itself (at::has_internal_overlap's
  // classes) and each earlier argument of its storage (at::get_overlap_status's:
  // none, full, partial, too hard to tell).  Meta functions do not check
  // that (TensorIterator and the CPU kernels do, an out= that overlaps its
  // input or itself), so a new aliasing class is a new signature, checked
  // by the CPU kernel at the call.
  void alias_class(const void* storage_data, const void* identity, int64_t offset,
                   c10::IntArrayRef sizes, c10::IntArrayRef strides, size_t itemsize);
  void cpu_tensor(const at::Tensor& t);  // not a wrapped number
  void tensor(const at::Tensor& t);      // any tensor
  void string(std::string_view s);
};

// While alive, warnings raised on this thread are also recorded: an op's
// host-side checks (meta functions) run inside one, so that launchChecked
// does not raise the same warning again when the CPU kernel (which reruns
// them) repeats it.
class HostWarningScope final : public c10::WarningHandler {
 public:
  HostWarningScope();
  ~HostWarningScope() override;
  HostWarningScope(const HostWarningScope&) = delete;
  HostWarningScope& operator=(const HostWarningScope&) = delete;
  void process(const c10::Warning& warning) override;
  bool raised(const std::string& message) const;
  bool any() const { return !messages_.empty(); }  // raised on this scope
  static HostWarningScope* current();

 private:
  c10::WarningHandler* prev_;
  HostWarningScope* outer_;
  c10::SmallVector<std::string, 1> messages_;
};

// An uninitialised axon tensor on `device` (allocated on its current stream).
at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                       c10::ScalarType dtype, c10::DeviceIndex device);
at::Tensor emptyDevice(c10::IntArrayRef sizes, c10::ScalarType dtype,
                       c10::DeviceIndex device);  // contiguous
// Laid out like t when t is dense (channels_last stays channels_last), else
// dense in t's dimension order: empty_like's preserve_format.
at::Tensor emptyDeviceLike(const at::Tensor& t, c10::ScalarType dtype);

// A CPU argument an asynchronous kernel reads later: copied now, as CUDA
// copies host arguments at launch, so the caller may change it meanwhile.
at::Tensor snapshotCpuTensor(const at::Tensor& t);

}  // namespace at::axon
