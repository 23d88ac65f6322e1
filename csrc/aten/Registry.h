// Where each op runs: every axon kernel registration goes through an
// OpRegistrar, which records (op, dispatch key, path, family, source file)
// and then calls torch::Library::impl.  The records are the op table
// (torch_axon._C._op_table(), `python -m torch_axon.ops`, docs/OPS.md); an op
// registered twice for one dispatch key aborts the import, naming both files.
//
// The paths (docs/ARCHITECTURE.md, "csrc/aten: where an op runs"):
//   structural: tier 1, allocation, views, resizing, copies (ops/copy_view_factory.cpp);
//   native stream kernel: an unboxed kernel for the op; the host checks arguments
//     (the op's structured meta function, or checks written out) and enqueues the
//     at::cpu:: kernel (CpuKernel.h, StructuredKernel.h);
//   generic stream kernel: the boxed kernel driven by the op's Meta kernel
//     (GenericKernel.h);
//   fused kernel: our kernels from kernels/ (ATen's CPU kernel, as stream work, for
//     inputs they do not take), or a composition of axon ops;
//   fallback: everything else, synchronously on the CPU (Fallback.h).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/DispatchKey.h>
#include <torch/library.h>

namespace at::axon {

// kSync: an unboxed kernel that waits for the stream and runs on the host
// (result shapes that depend on device data: nonzero, masked_select).
enum class Path { kStructural, kNative, kSync, kGeneric, kFused };

const char* pathName(Path path);  // "structural", "native stream kernel", ...

struct OpRecord {
  std::string op;      // "add.Tensor" (without "aten::")
  std::string key;     // "PrivateUse1", "AutogradPrivateUse1"
  Path path;
  std::string family;  // "elementwise"
  std::string file;    // "csrc/aten/ops/elementwise.cpp"
};

// Every registration so far, in registration order.
std::vector<OpRecord> opTable();

// Records a registration; aborts if (key, op) was recorded before.
void recordOp(const char* op, c10::DispatchKey key, Path path, const char* family,
              const char* file);

// Registers the ops of one family into a TORCH_LIBRARY_IMPL block:
//   OpRegistrar reg(m, "elementwise");
//   reg.impl(Path::kNative, "relu", relu);
//   reg.generic({"abs.out", "sign.out"});
class OpRegistrar {
 public:
  OpRegistrar(torch::Library& m, const char* family,
              c10::DispatchKey key = c10::DispatchKey::PrivateUse1,
              const char* file = __builtin_FILE())
      : m_(m), family_(family), key_(key), file_(file) {}

  template <typename Fn>
  OpRegistrar& impl(Path path, const char* op, Fn&& fn) {
    recordOp(op, key_, path, family_, file_);
    m_.impl(op, std::forward<Fn>(fn));
    return *this;
  }

  // Each op to the generic stream kernel (GenericKernel.h).
  OpRegistrar& generic(std::initializer_list<const char*> ops);

 private:
  torch::Library& m_;
  const char* family_;
  c10::DispatchKey key_;
  const char* file_;
};

}  // namespace at::axon
