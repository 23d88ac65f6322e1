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
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <axon/kernels/parallel.h>

#define AXON_KERNEL_C_ABI_ONLY
#include "../../torch_axon/include/axon/kernel.h"

#include "KernelSelect.h"
#include "CustomKernel.h"
#include "Launch.h"
#include "OpDevice.h"
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

// Checks tensor i of a launch and describes it to the kernel (data NULL when
// `with_data` is false: a shape function's view).  An undefined tensor (a native
// op's optional argument given None) is AXON_NONE when `allow_none`.
AxonTensor viewOf(const at::Tensor& t, size_t i, const std::string& name, c10::Device device,
                  bool allow_none, bool with_data) {
  AxonTensor v{};
  if (!t.defined()) {
    TORCH_CHECK(allow_none, "axon kernel '", name, "': tensor ", i, " is undefined");
    v.dtype = AXON_NONE;  // no elements: a loop over it runs zero times
    v.ndim = 1;
    for (int d = 0; d < AXON_MAX_DIMS; ++d) v.sizes[d] = v.strides[d] = 1;
    v.sizes[0] = 0;
    return v;
  }
  TORCH_CHECK(t.device().type() == device.type() && t.device().index() == device.index(),
              "Expected all tensors to be on the same device, but found at least two devices, ",
              device, " and ", t.device(), "! (when checking arguments for ", name, ")");
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
  v.data = (!with_data || t.numel() == 0) ? nullptr : const_cast<void*>(t.const_data_ptr());
  v.dtype = dt;
  v.ndim = static_cast<int32_t>(t.dim());
  for (int d = 0; d < AXON_MAX_DIMS; ++d) {
    v.sizes[d] = d < t.dim() ? t.size(d) : 1;
    v.strides[d] = d < t.dim() ? t.stride(d) : 1;
  }
  return v;
}

// Checks, bumps the written tensors' versions and launches `fn` on `tensors`
// (undefined ones only when `allow_none`) as stream work.
void launchOn(AxonKernelFn fn, const char* interned, c10::DeviceIndex device,
              at::TensorList tensors, std::vector<int64_t> ints, std::vector<double> floats,
              at::IntArrayRef written, bool allow_none) {
  const std::string name(interned);
  const c10::Device dev(kAxon, device);
  std::vector<AxonTensor> views(tensors.size());
  Signature signature(HostChecks::kFull);
  signature.mix(reinterpret_cast<uintptr_t>(fn));
  kselect::KernelSize size;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    views[i] = viewOf(t, i, name, dev, allow_none, true);
    if (!t.defined()) {
      signature.undefined();
      continue;
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
  for (int64_t w : written) {
    if (tensors[w].defined()) tensors[w].unsafeGetTensorImpl()->bump_version();
  }
  auto work = std::make_unique<CustomKernelWork>(fn, interned, device, std::move(views),
                                                 std::move(ints), std::move(floats));
  const int threads =
      kselect::threadsFor(interned, size.bytes, size.largest, *work, kselect::TeamKind::kCompute,
                          /*on_worker=*/false, /*remeasure=*/false);  // it sees num_threads
  launchChecked(device, interned, signature.hash, threads, std::move(work));
}

void launchKernel(int64_t fn, c10::string_view name_view, at::TensorList tensors,
                  at::IntArrayRef ints, c10::ArrayRef<double> floats, at::IntArrayRef written) {
  const std::string name(name_view);
  TORCH_CHECK(fn != 0, "axon kernel '", name, "': null kernel function");
  TORCH_CHECK(!tensors.empty(), "axon kernel '", name,
              "': expected at least one axon tensor among the arguments");
  // The device: the first axon tensor's; every tensor must be on it.
  const c10::DeviceIndex device = firstAxonDevice(at::ITensorListRef(tensors));
  TORCH_CHECK(device >= 0, "axon kernel '", name, "': expected axon tensors, but got tensors on ",
              tensors[0].device());
  launchOn(reinterpret_cast<AxonKernelFn>(static_cast<uintptr_t>(fn)), internName(name), device,
           tensors, ints.vec(), floats.vec(), written, /*allow_none=*/false);
}

// CPU tensors only (no axon tensor to dispatch on): the same checks' error.
void launchKernelCpu(int64_t fn, c10::string_view name, at::TensorList tensors,
                     at::IntArrayRef ints, c10::ArrayRef<double> floats, at::IntArrayRef written) {
  launchKernel(fn, name, tensors, ints, floats, written);
}

// ---- native ops: a user kernel registered as the op's PrivateUse1 and Meta kernel ----

enum class ArgKind : uint8_t { kTensor, kOptionalTensor, kInt, kBool, kFloat, kIntList };

std::string schemaTypeError(const c10::FunctionSchema& schema, const c10::Argument& a,
                            const char* what) {
  return c10::str("axon native op '", schema.name(), "': ", what, " '", a.name(), "' has type ",
                  a.type()->str(),
                  "; supported argument types: Tensor, Tensor?, Tensor(a!) (written by the "
                  "kernel), int, SymInt, bool, float, int[], SymInt[]; returns: Tensor "
                  "(new tensors) or ()");
}

int64_t concreteInt(const c10::SymInt& v) { return v.guard_int(__FILE__, __LINE__); }

// What one registration of an op holds: its kernel, output rule, launch name and
// the schema's argument kinds.  Immutable once published; a re-registration
// publishes a new one and the old one is never freed (a call on another thread
// may still read it: the dispatcher's kernel stays registered for the process).
struct NativeOpState {
  AxonKernelFn fn = nullptr;
  AxonShapeFn shape = nullptr;
  const char* name = nullptr;
  std::vector<ArgKind> kinds;
  std::vector<bool> write;
  size_t num_outputs = 0;
};

std::unique_ptr<NativeOpState> makeState(const c10::FunctionSchema& schema, AxonKernelFn fn,
                                         AxonShapeFn shape, const char* name) {
  auto st = std::make_unique<NativeOpState>();
  st->fn = fn;
  st->shape = shape;
  st->name = name;
  for (const c10::Argument& a : schema.arguments()) {
    const c10::TypePtr& t = a.type();
    const bool write = a.alias_info() != nullptr && a.alias_info()->isWrite();
    TORCH_CHECK(a.alias_info() == nullptr || write,
                schemaTypeError(schema, a, "argument (a non-writing alias)"));
    ArgKind kind;
    if (t->kind() == c10::TypeKind::TensorType) {
      kind = ArgKind::kTensor;
    } else if (t->kind() == c10::TypeKind::OptionalType &&
               t->castRaw<c10::OptionalType>()->getElementType()->kind() ==
                   c10::TypeKind::TensorType) {
      TORCH_CHECK(!write, schemaTypeError(schema, a, "argument (an optional written tensor)"));
      kind = ArgKind::kOptionalTensor;
    } else if (t->kind() == c10::TypeKind::IntType || t->kind() == c10::TypeKind::SymIntType) {
      kind = ArgKind::kInt;
    } else if (t->kind() == c10::TypeKind::BoolType) {
      kind = ArgKind::kBool;
    } else if (t->kind() == c10::TypeKind::FloatType) {
      kind = ArgKind::kFloat;
    } else if (t->kind() == c10::TypeKind::ListType &&
               (t->castRaw<c10::ListType>()->getElementType()->kind() == c10::TypeKind::IntType ||
                t->castRaw<c10::ListType>()->getElementType()->kind() ==
                    c10::TypeKind::SymIntType)) {
      kind = ArgKind::kIntList;
    } else {
      TORCH_CHECK(false, schemaTypeError(schema, a, "argument"));
    }
    TORCH_CHECK(!write || kind == ArgKind::kTensor, schemaTypeError(schema, a, "argument"));
    st->kinds.push_back(kind);
    st->write.push_back(write);
  }
  for (const c10::Argument& r : schema.returns()) {
    TORCH_CHECK(r.type()->kind() == c10::TypeKind::TensorType && r.alias_info() == nullptr,
                schemaTypeError(schema, r, "return"));
  }
  st->num_outputs = schema.returns().size();
  TORCH_CHECK(std::count(st->kinds.begin(), st->kinds.end(), ArgKind::kTensor) +
                      std::count(st->kinds.begin(), st->kinds.end(), ArgKind::kOptionalTensor) >
                  0,
              "axon native op '", schema.name(), "' has no Tensor argument: the device of "
              "a call comes from its tensors");
  return st;
}

std::optional<c10::ScalarType> scalarTypeOf(int32_t dt) {
  switch (dt) {
    case AXON_FLOAT32: return c10::ScalarType::Float;
    case AXON_BFLOAT16: return c10::ScalarType::BFloat16;
    case AXON_FLOAT16: return c10::ScalarType::Half;
    case AXON_FLOAT64: return c10::ScalarType::Double;
    case AXON_INT64: return c10::ScalarType::Long;
    case AXON_INT32: return c10::ScalarType::Int;
    case AXON_INT16: return c10::ScalarType::Short;
    case AXON_INT8: return c10::ScalarType::Char;
    case AXON_UINT8: return c10::ScalarType::Byte;
    case AXON_BOOL: return c10::ScalarType::Bool;
    default: return std::nullopt;
  }
}

// The op's PrivateUse1 (or Meta) kernel: parses the boxed stack by the schema into
// the kernel's arguments (tensors, ints, floats), computes the outputs' shapes with
// the op's shape function (or like its first tensor), allocates them and launches
// the kernel (PrivateUse1), or returns meta outputs (Meta: meta tensors and
// torch.compile's fake tensors).  Registered once per op for the process; the
// registration it runs is `state_`.
class NativeOpKernel final : public c10::OperatorKernel {
 public:
  NativeOpKernel(const NativeOpState* state, bool meta) : state_(state), meta_(meta) {}

  void publish(const NativeOpState* state) { state_.store(state, std::memory_order_release); }

  void operator()(const c10::OperatorHandle& /*op*/, c10::DispatchKeySet /*ks*/,
                  torch::jit::Stack* stack) {
    const NativeOpState& st = *state_.load(std::memory_order_acquire);
    const size_t n = st.kinds.size();
    auto args = torch::jit::last(*stack, n);
    c10::SmallVector<at::Tensor, 8> tensors;
    c10::SmallVector<int64_t, 4> written;
    for (size_t i = 0; i < n; ++i) {
      if (st.kinds[i] == ArgKind::kTensor) {
        if (st.write[i]) written.push_back(static_cast<int64_t>(tensors.size()));
        tensors.push_back(args[i].toTensor());
      } else if (st.kinds[i] == ArgKind::kOptionalTensor) {
        tensors.push_back(args[i].isNone() ? at::Tensor() : args[i].toTensor());
      }
    }
    // The device: the first tensor's (axon, or meta for the Meta kernel).
    const at::Tensor* first = nullptr;
    for (const at::Tensor& t : tensors) {
      if (t.defined()) {
        first = &t;
        break;
      }
    }
    TORCH_CHECK(first != nullptr, "axon native op '", st.name, "': every tensor argument is None");
    c10::Device device = first->device();
    if (!meta_) {
      const c10::DeviceIndex axon = firstAxonDevice(at::ITensorListRef(at::TensorList(tensors)));
      if (axon >= 0) device = c10::Device(kAxon, axon);
    }
    const std::string name(st.name);
    c10::SmallVector<at::Tensor, 2> results;
    if (meta_ && st.shape == nullptr) {
      // Outputs like the first tensor: symbolic sizes stay symbolic (no guards).
      for (size_t i = 0; i < tensors.size(); ++i) {
        const at::Tensor& t = tensors[i];
        if (!t.defined()) continue;
        TORCH_CHECK(t.device() == device, "Expected all tensors to be on the same device, but "
                    "found at least two devices, ", device, " and ", t.device(),
                    "! (when checking arguments for ", name, ")");
        TORCH_CHECK(axonDType(t.scalar_type()) >= 0, "axon kernel '", name,
                    "': unsupported dtype ", t.scalar_type(), " of tensor ", i);
      }
      for (size_t k = 0; k < st.num_outputs; ++k) {
        results.push_back(at::empty_symint(first->sym_sizes(), first->options()));
      }
      torch::jit::drop(*stack, n);
      for (at::Tensor& r : results) stack->emplace_back(std::move(r));
      return;
    }
    std::vector<int64_t> ints;
    std::vector<double> floats;
    for (size_t i = 0; i < n; ++i) {
      const c10::IValue& v = args[i];
      switch (st.kinds[i]) {
        case ArgKind::kTensor:
        case ArgKind::kOptionalTensor:
          break;
        case ArgKind::kInt:
          ints.push_back(v.isInt() ? v.toInt() : concreteInt(v.toSymInt()));
          break;
        case ArgKind::kBool:
          ints.push_back(v.toBool() ? 1 : 0);
          break;
        case ArgKind::kFloat:
          floats.push_back(v.toDouble());
          break;
        case ArgKind::kIntList:
          if (v.isIntList()) {
            auto list = v.toIntList();
            ints.push_back(static_cast<int64_t>(list.size()));
            for (int64_t x : list) ints.push_back(x);
          } else {
            auto list = v.toListRef();
            ints.push_back(static_cast<int64_t>(list.size()));
            for (const c10::IValue& x : list) {
              ints.push_back(x.isInt() ? x.toInt() : concreteInt(x.toSymInt()));
            }
          }
          break;
      }
    }
    // Output shapes.
    std::vector<AxonTensor> views(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      views[i] = shapeView(tensors[i], i, name, device);
    }
    std::vector<AxonTensor> outs(st.num_outputs);
    for (AxonTensor& o : outs) {
      o = AxonTensor{};
      o.dtype = AXON_NONE;
      o.ndim = -1;
    }
    if (st.shape != nullptr) {
      AxonKernelArgs in{};
      in.tensors = views.data();
      in.num_tensors = static_cast<int32_t>(views.size());
      in.ints = ints.data();
      in.num_ints = static_cast<int32_t>(ints.size());
      in.floats = floats.data();
      in.num_floats = static_cast<int32_t>(floats.size());
      char err[1024] = {0};
      const int rc = st.shape(&in, outs.data(), static_cast<int32_t>(outs.size()), err, sizeof err);
      err[sizeof err - 1] = 0;
      TORCH_CHECK(rc == 0, name, ": ", err[0] != 0 ? err : "the shape function failed");
    } else {
      for (AxonTensor& o : outs) o = views[first - tensors.data()];
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      const AxonTensor& o = outs[k];
      TORCH_CHECK(o.ndim >= 0 && o.ndim <= AXON_MAX_DIMS, name, ": the shape function gave ",
                  "output ", k, " ndim ", o.ndim, " (expected 0..", AXON_MAX_DIMS, ")");
      const auto dt = scalarTypeOf(o.dtype);
      TORCH_CHECK(dt.has_value(), name, ": the shape function gave output ", k,
                  " an invalid dtype ", o.dtype);
      c10::SmallVector<int64_t, AXON_MAX_DIMS> sizes;
      for (int d = 0; d < o.ndim; ++d) {
        TORCH_CHECK(o.sizes[d] >= 0, name, ": the shape function gave output ", k,
                    " a negative size ", o.sizes[d], " in dimension ", d);
        sizes.push_back(o.sizes[d]);
      }
      results.push_back(meta_ ? at::empty(sizes, at::TensorOptions().dtype(*dt).device(device))
                              : emptyDevice(sizes, *dt, device.index()));
    }
    if (!meta_) {
      TORCH_CHECK(device.type() == kAxon, "axon native op '", name,
                  "': expected axon tensors, but got tensors on ", device);
      std::vector<at::Tensor> all(tensors.begin(), tensors.end());
      for (const at::Tensor& r : results) all.push_back(r);
      // (outputs are new: only the Tensor(a!) arguments' versions are bumped)
      launchOn(st.fn, st.name, device.index(), all, std::move(ints), std::move(floats), written,
               /*allow_none=*/true);
    }
    torch::jit::drop(*stack, n);
    for (at::Tensor& r : results) stack->emplace_back(std::move(r));
  }

 private:
  // A tensor's view for the shape function: checked like a launch's (device,
  // dtype, layout, dims), data NULL; symbolic sizes are specialised.
  AxonTensor shapeView(const at::Tensor& t, size_t i, const std::string& name,
                       c10::Device device) const {
    if (!meta_ || !t.defined()) return viewOf(t, i, name, device, true, false);
    TORCH_CHECK(t.device() == device, "Expected all tensors to be on the same device, but found ",
                "at least two devices, ", device, " and ", t.device(),
                "! (when checking arguments for ", name, ")");
    AxonTensor v{};
    v.dtype = axonDType(t.scalar_type());
    TORCH_CHECK(v.dtype >= 0, "axon kernel '", name, "': unsupported dtype ", t.scalar_type(),
                " of tensor ", i);
    TORCH_CHECK(t.dim() <= AXON_MAX_DIMS, "axon kernel '", name, "': tensor ", i, " has ",
                t.dim(), " dimensions; at most ", AXON_MAX_DIMS, " are supported");
    v.ndim = static_cast<int32_t>(t.dim());
    for (int d = 0; d < AXON_MAX_DIMS; ++d) {
      v.sizes[d] = d < t.dim() ? concreteInt(t.sym_size(d)) : 1;
      v.strides[d] = d < t.dim() ? concreteInt(t.sym_stride(d)) : 1;
    }
    return v;
  }

  std::atomic<const NativeOpState*> state_;
  bool meta_;
};

// One op's dispatcher registrations (kept for the process) and its kernels.
struct NativeOpRegistration {
  std::unique_ptr<torch::Library> device;
  std::unique_ptr<torch::Library> meta;
  NativeOpKernel* device_kernel = nullptr;  // owned by the dispatcher's registration
  NativeOpKernel* meta_kernel = nullptr;
};

std::mutex& nativeOpsMutex() {
  static std::mutex m;
  return m;
}
// Never destroyed: the registrations and every published state live for the process.
std::unordered_map<std::string, NativeOpRegistration>& nativeOps() {
  static auto* ops = new std::unordered_map<std::string, NativeOpRegistration>();
  return *ops;
}
std::vector<std::unique_ptr<NativeOpState>>& nativeOpStates() {
  static auto* states = new std::vector<std::unique_ptr<NativeOpState>>();
  return *states;
}

}  // namespace

void registerNativeOp(const std::string& qualname, int64_t fn, int64_t shape_fn,
                      const std::string& launch_name) {
  TORCH_CHECK(fn != 0, "axon native op '", qualname, "': null kernel function");
  const auto sep = qualname.find("::");
  TORCH_CHECK(sep != std::string::npos && sep > 0, "axon native op '", qualname,
              "': expected a qualified name 'namespace::name[.overload]'");
  const std::string ns = qualname.substr(0, sep);
  const std::string rest = qualname.substr(sep + 2);
  const auto dot = rest.find('.');
  const std::string opname = dot == std::string::npos ? rest : rest.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : rest.substr(dot + 1);
  auto handle = c10::Dispatcher::singleton().findSchema({ns + "::" + opname, overload});
  TORCH_CHECK(handle.has_value(), "axon native op '", qualname,
              "': no such operator (define its schema first)");
  const char* interned = internName(launch_name.empty() ? qualname : launch_name);
  auto state = makeState(handle->schema(), reinterpret_cast<AxonKernelFn>(static_cast<uintptr_t>(fn)),
                         reinterpret_cast<AxonShapeFn>(static_cast<uintptr_t>(shape_fn)),
                         interned);  // (checks the schema)
  std::lock_guard<std::mutex> g(nativeOpsMutex());
  const NativeOpState* published = state.get();
  nativeOpStates().push_back(std::move(state));
  auto it = nativeOps().find(qualname);
  if (it != nativeOps().end()) {
    // Calls in flight on other threads finish with the state they loaded.
    it->second.device_kernel->publish(published);
    it->second.meta_kernel->publish(published);
    return;
  }
  NativeOpRegistration r;
  auto deviceKernel = std::make_unique<NativeOpKernel>(published, false);
  auto metaKernel = std::make_unique<NativeOpKernel>(published, true);
  r.device_kernel = deviceKernel.get();
  r.meta_kernel = metaKernel.get();
  r.device = std::make_unique<torch::Library>(torch::Library::IMPL, ns,
                                              c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  r.device->impl(rest.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(deviceKernel)));
  r.meta = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::Meta,
                                            __FILE__, __LINE__);
  r.meta->impl(rest.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(metaKernel)));
  nativeOps().emplace(qualname, std::move(r));
}

namespace {

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
