// Kernel selection by measurement: for an op that has a kernel of ours
// (kernels/) and ATen's CPU kernel (MKL, oneDNN, ATen's vectorised loops),
// which one a launch runs, per (op, dtype, shape class, layout).
//
// - Key: the op (Op below), the input dtype, up to three dimensions bucketed
//   by ceil(log2) (class b holds sizes in (2^(b-1), 2^b]; shown as "<=2^b"),
//   and layout flags the op defines (bias present, weight present, strided
//   rows ...).  Which dimensions: see the op's call site (linalg.cpp: m, k, n;
//   normalization.cpp: rows, cols).
// - Mode: AXON_KERNEL_SELECT=own|library|auto (default auto; a bad value
//   warns once and means auto); torch.ops.axon._set_kernel_select(mode)
//   overrides it in-process ("" goes back to the environment).
// - auto: the first launch of a key that the table does not hold measures:
//   on the stream worker it runs both kernels on the launch's own arguments,
//   alternating, up to kMaxReps times each or until kBudgetUs has passed
//   (at least twice each), takes each side's minimum, records the winner
//   (ATen's only when at least 5% faster: ties keep ours) and
//   runs the winner last, so the launch's result is the winner's.  Both write
//   the same outputs and read inputs the op does not write (callers only
//   select for out-of-place kernels).  Launches of a key whose measurement
//   is still queued run our kernel.  Every later launch runs the winner.
// - Persisted per machine: ${AXON_CACHE_DIR:-~/.cache/torch_axon}/
//   kernel_select-<hash of CPU model, ISA flags, core count, torch version>.json,
//   read at first use and rewritten (under a lock file, through a temporary
//   file and rename) when a measurement adds an entry.
//   AXON_KERNEL_SELECT_CACHE=0: neither read nor written.
// - Inspect: torch_axon._C._kernel_select_table(), python -m torch_axon.tune.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/ScalarType.h>

#include "../core/StreamWork.h"

namespace at::axon::kselect {

enum class Impl : uint8_t { kOwn = 0, kLibrary = 1 };
enum class Mode : uint8_t { kOwn, kLibrary, kAuto };

enum class Op : uint8_t {
  kLinear,              // mm / addmm (+ out=) of a few rows by W^T: m, k, n; bias, strided
  kSoftmax,             // last-dim _softmax: rows, cols
  kLogSoftmax,          // last-dim _log_softmax: rows, cols
  kSoftmaxBackward,     // _softmax_backward_data: rows, cols
  kLogSoftmaxBackward,  // _log_softmax_backward_data: rows, cols
  kLayerNorm,           // native_layer_norm: rows, cols; weight, bias
  kLayerNormBackward,   // native_layer_norm_backward: rows, cols; weight, bias
  kRmsNorm,             // _fused_rms_norm: rows, cols; weight
  kRmsNormBackward,     // _fused_rms_norm_backward: rows, cols; weight
  kCount
};

// Layout flags (per op; unused bits are zero).
constexpr uint8_t kBias = 1;     // linear, layer_norm: a bias
constexpr uint8_t kStrided = 2;  // linear: rows of x, W or out not packed
constexpr uint8_t kWeight = 4;   // norms: a weight

// The shape class of a size: ceil(log2(max(n, 1))).
uint8_t bucket(int64_t n);

struct Key {
  Op op;
  c10::ScalarType dtype;
  std::array<uint8_t, 3> dims;  // buckets
  uint8_t layout;
  uint64_t packed() const;
};
Key makeKey(Op op, c10::ScalarType dtype, std::initializer_list<int64_t> sizes,
            uint8_t layout = 0);

Mode mode();

// What a launch of `key` runs: the forced side, the table's winner, or none
// (auto mode, not measured yet: this launch measures; the key is then marked
// as being measured).  Counts the launch.
std::optional<Impl> choose(const Key& key);

// Runs own and library alternately (see above), records the winner, runs it
// last.  On the stream worker.
void measure(const Key& key, const std::function<void()>& own,
             const std::function<void()>& library);

// Launches the side choose() picks, or a measurement of both.  make_own()
// and make_library() return the kernel bodies (callables without
// arguments); only the side that runs is built.
template <typename MakeOwn, typename MakeLibrary>
void launchSelected(c10::DeviceIndex device, const char* name, const Key& key, int threads,
                    const MakeOwn& make_own, const MakeLibrary& make_library) {
  const std::optional<Impl> c = choose(key);
  if (c == Impl::kOwn) return launch(device, name, make_own(), threads);
  auto library = [library = make_library()] {
    // ATen's kernels' nested ops work on plain CPU buffers: no autograd.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    library();
  };
  if (c == Impl::kLibrary) return launch(device, name, std::move(library), threads);
  launch(device, name, [key, own = make_own(), library = std::move(library)] {
    measure(key, own, library);
  }, threads);
}

// The table, for torch_axon._C._kernel_select_table().
struct Row {
  std::string op, dtype, shape, layout, choice, source;
  double own_us, library_us;
  int64_t own_runs, library_runs;
};
std::vector<Row> table();

}  // namespace at::axon::kselect
