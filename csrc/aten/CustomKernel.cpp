// The launch op of the Axon Kernel Interface (torch_axon/include/axon/kernel.h,
// torch_axon/kernel.py):
//
//   axon::_launch_kernel(int fn, str name, Tensor[] tensors, int[] ints, float[] floats,
//                        int[] written) -> ()
//
// `fn` is the address of a user kernel (AxonKernelFn) in a library the Python side
// loaded; `name` labels the launch (errors, profiler, thread policy).  The host checks
// the arguments (one axon device, supported dtypes, strided layout, <= 8 dims), bumps
// the version counters of the tensors in `written`, and launches the kernel as stream
// work on the device's current stream, like an ATen CPU kernel (CpuKernel.h):
// - the launch's signature (Launch.h) holds the kernel, every tensor's geometry and
//   dtype, and the sign class of the int and float arguments: the first launch of a
//   signature runs at the call (after the stream drained), so a kernel's checks of
//   what the host can see raise at the call; later ones run asynchronously, and a
//   kernel's fail() then surfaces as an asynchronous error naming the launch;
// - the thread policy (KernelSelect.h, threadsFor) picks the worker or the compute
//   team, and the context's parallel_for goes through axon::kernels::parallel_for, as
//   our own kernels' loops do;
// - the kernel captures the tensors' data pointers and geometry, no references: memory
//   the host frees meanwhile is reused only by later work on the same stream.
// - scratch memory comes from an arena of the thread that runs the kernel, reset after
//   each kernel (its largest block, up to 64 MiB, is kept for the next one).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <axon/kernels/parallel.h>

#define AXON_KERNEL_C_ABI_ONLY
#include "../../torch_axon/include/axon/kernel.h"

#include "KernelSelect.h"
#include "Launch.h"
#include "Registry.h"
#include "../core/AxonRuntime.h"

namespace at::axon {
namespace {

// Launch names must outlive the process (launch(), the thread policy's table):
// interned, never freed.
const char* internName(const std::string& name) {
  static std::mutex mutex;
  static auto* names = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> g(mutex);
  return names->insert(name).first->c_str();
}

int32_t axonDType(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return AXON_FLOAT32;
    case c10::ScalarType::BFloat16: return AXON_BFLOAT16;
    case c10::ScalarType::Half: return AXON_FLOAT16;
    case c10::ScalarType::Double: return AXON_FLOAT64;
    case c10::ScalarType::Long: return AXON_INT64;
    case c10::ScalarType::Int: return AXON_INT32;
    case c10::ScalarType::Short: return AXON_INT16;
    case c10::ScalarType::Char: return AXON_INT8;
    case c10::ScalarType::Byte: return AXON_UINT8;
    case c10::ScalarType::Bool: return AXON_BOOL;
    default: return -1;
  }
}

// Scratch memory: blocks of the thread running kernels, handed out in 64-byte
// aligned pieces and reset after each kernel.  Thread-safe (parallel_for bodies
// may ask for scratch concurrently).
class ScratchArena {
 public:
  static constexpr size_t kKeepBytes = size_t{64} << 20;
  ~ScratchArena() {
    for (Block& b : blocks_) std::free(b.data);
  }
  void* get(size_t bytes) {
    if (bytes > (size_t{1} << 62)) return nullptr;  // no such memory (and no overflow below)
    bytes = (std::max<size_t>(bytes, 1) + 63) & ~size_t{63};
    std::lock_guard<std::mutex> g(mutex_);
    if (!blocks_.empty()) {
      Block& b = blocks_.back();
      if (b.size - b.used >= bytes) {
        void* p = static_cast<char*>(b.data) + b.used;
        b.used += bytes;
        return p;
      }
    }
    const size_t size = std::max(bytes, blocks_.empty() ? size_t{1} << 16 : blocks_.back().size * 2);
    void* data = std::aligned_alloc(64, size);
    if (data == nullptr) return nullptr;
    blocks_.push_back(Block{data, size, bytes});
    return data;
  }
  // After a kernel: keeps the largest block for the next kernel (unless it is larger
  // than kKeepBytes), frees the others.
  void reset() {
    std::lock_guard<std::mutex> g(mutex_);
    if (blocks_.empty()) return;
    auto largest = std::max_element(blocks_.begin(), blocks_.end(),
                                     [](const Block& a, const Block& b) { return a.size < b.size; });
    Block keep = *largest;
    for (Block& b : blocks_) {
      if (b.data != keep.data) std::free(b.data);
    }
    if (keep.size > kKeepBytes) {
      std::free(keep.data);
      blocks_.clear();
      return;
    }
    keep.used = 0;
    blocks_.assign(1, keep);
  }

 private:
  struct Block {
    void* data;
    size_t size;
    size_t used;
  };
  std::mutex mutex_;
  std::vector<Block> blocks_;
};

// What one run of a kernel's context points to.
struct RunState {
  ScratchArena* arena;
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string message;
};

void ctxParallelFor(void* /*impl*/, int64_t begin, int64_t end, int64_t grain, void* ctx,
                    AxonParallelBody body) {
  ::axon::kernels::parallel_for(begin, end, std::max<int64_t>(grain, 1), ctx, body);
}

void* ctxScratch(void* impl, size_t bytes) {
  return static_cast<RunState*>(impl)->arena->get(bytes);
}

void ctxFail(void* impl, const char* msg) {
  auto* s = static_cast<RunState*>(impl);
  std::lock_guard<std::mutex> g(s->mutex);
  if (s->failed.load(std::memory_order_relaxed)) return;  // the first error wins
  s->message = msg != nullptr ? msg : "(no message)";
  s->failed.store(true, std::memory_order_release);
}

class CustomKernelWork final : public Work {
 public:
  CustomKernelWork(AxonKernelFn fn, const char* name, c10::DeviceIndex device,
                   std::vector<AxonTensor> tensors, std::vector<int64_t> ints,
                   std::vector<double> floats)
      : fn_(fn), name_(name), device_(device), tensors_(std::move(tensors)),
        ints_(std::move(ints)), floats_(std::move(floats)) {}

  void run() override {
    thread_local ScratchArena arena;
    RunState state;
    state.arena = &arena;
    AxonKernelContext ctx{};
    ctx.abi_version = AXON_KERNEL_ABI_VERSION;
    ctx.device = device_;
    ctx.num_threads = std::max(1, omp_get_max_threads());  // setKernelThreads' choice
    ctx.impl = &state;
    ctx.parallel_for = &ctxParallelFor;
    ctx.scratch = &ctxScratch;
    ctx.fail = &ctxFail;
    AxonKernelArgs args{};
    args.tensors = tensors_.data();
    args.num_tensors = static_cast<int32_t>(tensors_.size());
    args.ints = ints_.data();
    args.num_ints = static_cast<int32_t>(ints_.size());
    args.floats = floats_.data();
    args.num_floats = static_cast<int32_t>(floats_.size());
    struct Reset {
      ScratchArena& a;
      ~Reset() { a.reset(); }
    } reset{arena};
    try {
      fn_(&ctx, &args);
    } catch (const std::exception& e) {  // a C++ kernel that bypassed AXON_KERNEL
      ctxFail(&state, e.what());
    }
    if (state.failed.load(std::memory_order_acquire)) {
      TORCH_CHECK(false, "'", name_, "' failed: ", state.message);
    }
  }

 private:
  AxonKernelFn fn_;
  const char* name_;
  c10::DeviceIndex device_;
  std::vector<AxonTensor> tensors_;
  std::vector<int64_t> ints_;
  std::vector<double> floats_;
};

// The sign class of a number: what a kernel's host-visible checks most often
// look at (positive sizes, non-negative eps ...), without making every new value
// (a step counter, a learning rate) a new signature.
uint64_t numberClass(double v) {
  return (std::isnan(v) ? 1 : 0) | (std::isinf(v) ? 2 : 0) | (v < 0 ? 4 : 0) | (v == 0 ? 8 : 0);
}

void launchKernel(int64_t fn, c10::string_view name_view, at::TensorList tensors,
                  at::IntArrayRef ints, c10::ArrayRef<double> floats, at::IntArrayRef written) {
  const std::string name(name_view);
  TORCH_CHECK(fn != 0, "axon kernel '", name, "': null kernel function");
  TORCH_CHECK(!tensors.empty(), "axon kernel '", name,
              "': expected at least one axon tensor among the arguments");
  // The device: the first axon tensor's; every tensor must be on it.
  c10::DeviceIndex device = -1;
  for (const at::Tensor& t : tensors) {
    if (t.defined() && t.device().type() == kAxon) {
      device = t.device().index();
      break;
    }
  }
  TORCH_CHECK(device >= 0, "axon kernel '", name, "': expected axon tensors, but got tensors on ",
              tensors[0].device());
  const char* interned = internName(name);
  std::vector<AxonTensor> views(tensors.size());
  Signature signature(HostChecks::kFull);
  signature.mix(static_cast<uint64_t>(fn));
  kselect::KernelSize size;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined(), "axon kernel '", name, "': tensor ", i, " is undefined");
    TORCH_CHECK(t.device().type() == kAxon && t.device().index() == device,
                "Expected all tensors to be on the same device, but found at least two devices, ",
                c10::Device(kAxon, device), " and ", t.device(),
                "! (when checking arguments for ", name, ")");
    TORCH_CHECK(t.layout() == c10::kStrided, "axon kernel '", name, "': tensor ", i,
                " has layout ", t.layout(), "; only strided tensors are supported");
    const int32_t dt = axonDType(t.scalar_type());
    TORCH_CHECK(dt >= 0, "axon kernel '", name, "': unsupported dtype ", t.scalar_type(),
                " of tensor ", i, " (supported: float32, bfloat16, float16, float64, int64, "
                "int32, int16, int8, uint8, bool)");
    TORCH_CHECK(!t.is_conj() && !t.is_neg(), "axon kernel '", name, "': tensor ", i,
                " has its conjugate or negative bit set; resolve it first (resolve_conj(), "
                "resolve_neg())");
    TORCH_CHECK(t.dim() <= AXON_MAX_DIMS, "axon kernel '", name, "': tensor ", i, " has ",
                t.dim(), " dimensions; at most ", AXON_MAX_DIMS, " are supported");
    AxonTensor& v = views[i];
    v.data = t.numel() == 0 ? nullptr : const_cast<void*>(t.const_data_ptr());
    v.dtype = dt;
    v.ndim = static_cast<int32_t>(t.dim());
    for (int d = 0; d < AXON_MAX_DIMS; ++d) {
      v.sizes[d] = d < t.dim() ? t.size(d) : 1;
      v.strides[d] = d < t.dim() ? t.stride(d) : 1;
    }
    signature.device_tensor(t.storage().data(), t.storage_offset(), t.sizes(), t.strides(),
                            t.dtype(), false, false);
    size.add(t.numel(), static_cast<int64_t>(t.element_size()));
  }
  signature.mix(ints.size());
  for (int64_t v : ints) signature.mix(numberClass(static_cast<double>(v)));
  signature.mix(floats.size() + 0x100);
  for (double v : floats) signature.mix(numberClass(v));
  for (int64_t w : written) {
    TORCH_CHECK(w >= 0 && w < static_cast<int64_t>(tensors.size()), "axon kernel '", name,
                "': written index ", w, " is out of range for ", tensors.size(), " tensors");
  }
  for (int64_t w : written) tensors[w].unsafeGetTensorImpl()->bump_version();
  auto work = std::make_unique<CustomKernelWork>(
      reinterpret_cast<AxonKernelFn>(static_cast<uintptr_t>(fn)), interned, device,
      std::move(views), ints.vec(), floats.vec());
  const int threads =
      kselect::threadsFor(interned, size.bytes, size.largest, *work, kselect::TeamKind::kCompute);
  launchChecked(device, interned, signature.hash, threads, std::move(work));
}

// CPU tensors only (no axon tensor to dispatch on): the same checks' error.
void launchKernelCpu(int64_t fn, c10::string_view name, at::TensorList tensors,
                     at::IntArrayRef ints, c10::ArrayRef<double> floats, at::IntArrayRef written) {
  launchKernel(fn, name, tensors, ints, floats, written);
}

TORCH_LIBRARY_FRAGMENT(axon, m) {
  m.def("_launch_kernel(int fn, str name, Tensor[] tensors, int[] ints, float[] floats, "
        "int[] written) -> ()");
}

TORCH_LIBRARY_IMPL(axon, PrivateUse1, m) {
  OpRegistrar(m, "custom kernel").impl(Path::kNative, "axon::_launch_kernel", &launchKernel);
}
TORCH_LIBRARY_IMPL(axon, CPU, m) { m.impl("_launch_kernel", &launchKernelCpu); }

}  // namespace
}  // namespace at::axon
