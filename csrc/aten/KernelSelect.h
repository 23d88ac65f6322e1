// Kernel and thread selection by measurement.
//
// 1. Kernel selection: for an op that has a kernel of ours (kernels/) and
//    ATen's CPU kernel (MKL, oneDNN, ATen's vectorised loops), which one a
//    launch runs and on how many threads, per (op, dtype, shape class, layout).
//    (Op::kGemm's "own" is not ours: oneDNN's float32 GEMM against MKL's.)
// 2. Thread policy: for every other kernel (ATen's CPU kernels run as stream
//    work, CpuKernel.h), whether it runs on the stream worker alone or on the
//    worker's OpenMP team, per (kernel, class of elements touched).
//
// Key of (1): the op (Op below), the input dtype, up to four dimensions
// bucketed by ceil(log2) (class b holds sizes in (2^(b-1), 2^b]; shown as
// "<=2^b"), and layout flags the op defines (bias present, weight present,
// strided rows ...).  Which dimensions: see the op's call site (linalg.cpp:
// m, k, n; normalization.cpp: rows, cols; attention.cpp ...).
//
// Variants of (1): own or library, each on the worker alone ("worker") or on
// the team ("team"; only when the team has more than one thread).
// - Modes: AXON_KERNEL_SELECT=own|library|auto (default auto; a bad value
//   warns once and means auto) restricts the kernel;
//   AXON_KERNEL_THREADS=worker|team|auto (default auto) restricts the
//   threads; torch.ops.axon._set_kernel_select(mode) and
//   _set_kernel_threads(mode) override them in-process ("" goes back to the
//   environment).
// - When a mode leaves one variant, it runs.  Otherwise the first launch of a
//   key the table has not measured in every variant the modes allow
//   measures those variants:
//   on the stream worker it runs them on the launch's own arguments, ours
//   then ATen's, each round-robin over its thread variants (ours on the
//   compute team twice in a row, so the second finds its helpers awake):
//   once untimed, then up to kMaxReps times or until half of kBudgetUs has passed (at
//   least twice each), takes each one's minimum and picks the smallest time
//   after handicaps: ATen's kernel must be 5% faster than ours (ties keep
//   ours); a team (ours: the runtime's compute team; ATen's: the worker's
//   OpenMP team, started anew for each measured run) must be 5% faster than
//   the worker alone.  The winner runs last, so the
//   launch's result is the winner's.  All variants write the same outputs and
//   read inputs the op does not write (callers only select for out-of-place
//   kernels).  Launches of a key whose measurement is still queued run the
//   first variant the modes allow (ours on the worker, unless forced).
//
// Thread policy (2), per (kernel, class of bytes its tensors hold): such
// kernels may write their inputs (in-place ops), so they cannot be run twice;
// instead launches of a key alternate between the worker and the team,
// timed on the worker, until each side has kTrialRuns timed runs after one
// that warms up; then the faster side by the same handicap wins.  A trial's
// side is picked when it runs, so launches queued behind the trials run the
// decision.  Kernels
// whose largest tensor holds fewer elements than ATen's parallel grain
// (at::internal::GRAIN_SIZE) run on the worker without a trial: ATen's loops
// would not split them.  AXON_KERNEL_THREADS forces a side here too.
//
// - torch.use_deterministic_algorithms(True): nothing is measured or tried
//   (variants and thread counts round differently); the auto modes mean our
//   kernels on the team, and ATen's loops on the team from their grain up.
// - Persisted per machine: ${AXON_CACHE_DIR:-~/.cache/torch_axon}/
//   kernel_select-<hash of CPU model, ISA flags, core count, torch version>.json,
//   read at first use and rewritten (under a lock file, through a temporary
//   file and rename) by the host at most once a second while new entries
//   come in, and at exit.  AXON_KERNEL_SELECT_CACHE=0: neither read nor written.
// - Confirmed: each entry counts the measurements behind it (one per process
//   that measured it; "measurements", none written: as good as confirmed;
//   a save keeps the file's entry when it has more).  A close call (the
//   runner-up within 1.5x of the winner, after handicaps) with fewer than 3
//   is measured (or tried) again by the next process that uses it, which
//   keeps each variant's minimum; meanwhile its launches run the file's
//   choice (selection) or the trials (thread policy).
// - Inspect: torch_axon._C._kernel_select_table(), _thread_policy_table(),
//   python -m torch_axon.tune.
//
// Agreement between the processes of a job (torch.distributed ranks): ranks
// that compute the same thing must run the same variants and thread counts
// at every launch, which round differently, or replicated DTensors, DDP's and
// FSDP's replicas and everything computed from them drift apart by an ulp (on
// CUDA identical GPUs take cuBLAS's same heuristic).  While a process group
// of more than one rank lives (ProcessGroupAxon registers its store; the
// first one still alive serves), each decision of (1) and (2) is the job's:
// the first process to decide a key writes its choice to the store, and
// every process runs the store's choice.  What a launch runs depends only on
// the launches of its key before it:
// - selection of out-of-place kernels: a process that finds the store's
//   choice measures nothing; a measuring launch runs the job's choice last;
//   launches queued while the key is measured measure too, or run the job's
//   choice if it is known when they run;
// - kernels that update their inputs (chooseTrial, the thread policy): the
//   job's first kTrialRuns + 1 launches per variant are trials in every
//   process, whatever its table file, the store or earlier trials say; later
//   launches decide on the stream worker when they run (after the trials on
//   that stream), waiting for the job's choice (AXON_KERNEL_SELECT_WAIT seconds; then the
//   job's default, agreed the same way).
// The table file keeps each process's own measurements.
// AXON_KERNEL_SELECT_AGREE=0: no agreement.  A store that fails turns
// agreement off with a warning.
#pragma once

#include <algorithm>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
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
enum class ThreadsMode : uint8_t { kWorker, kTeam, kAuto };

// What a launch runs: a kernel, on the worker alone (threads 1) or on its
// team (threads 0: all).
struct Choice {
  Impl impl;
  int threads;
};
// Variant index: impl * 2 + team.
constexpr int kVariants = 4;

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
  kAttention,           // fused attention forward: batch*heads, q, kv, head dim; causal, mask
  kAttentionBackward,   // its backward: the same
  kAdam,                // _fused_adam(w)_: elements, tensors; amsgrad, grad scale
  // float32 mm / addmm (+ out=) beyond kLinear, and bmm: m, k, n, batch; bias.  "own" is
  // oneDNN's GEMM (ATen's mkldnn_matmul, JIT-generated for the ISA; ATen
  // uses it for 16-bit only), "library" ATen's float32 GEMM (MKL).  Both on
  // OpenMP's team.
  kGemm,
  kCount
};

// Layout flags (per op; unused bits are zero).
constexpr uint8_t kBias = 1;     // linear, layer_norm: a bias
constexpr uint8_t kStrided = 2;  // linear: rows of x, W or out not packed
constexpr uint8_t kWeight = 4;   // norms: a weight
constexpr uint8_t kCausal = 8;     // attention: is_causal
constexpr uint8_t kMask = 16;      // attention: an attention mask
constexpr uint8_t kAmsgrad = 8;    // adam: amsgrad
constexpr uint8_t kGradScale = 16; // adam: grad_scale / found_inf

// The shape class of a size: ceil(log2(max(n, 1))).
uint8_t bucket(int64_t n);

struct Key {
  Op op;
  c10::ScalarType dtype;
  std::array<uint8_t, 4> dims;  // buckets
  uint8_t layout;
  uint64_t packed() const;
};
Key makeKey(Op op, c10::ScalarType dtype, std::initializer_list<int64_t> sizes,
            uint8_t layout = 0);

Mode mode();
ThreadsMode threadsMode();

// What a launch of `key` runs: the only variant the modes allow, the
// table's winner, or none (not measured yet: this launch measures `measure`,
// a bit mask of variants; the key is then marked as being measured).
// Counts the launch.
struct Decision {
  std::optional<Choice> choice;
  uint8_t measure = 0;
};
Decision choose(const Key& key);

// The job's store as kselect sees it (see "Agreement" above).
class Agreement {
 public:
  virtual ~Agreement() = default;
  // The job's value of key, or "" when it has none yet.
  virtual std::string get(const std::string& key) = 0;
  // Sets key to value unless it has a value; returns the job's value.
  virtual std::string propose(const std::string& key, const std::string& value) = 0;
};
// Registered by a process group (owner) of more than one rank while it lives.
void addAgreement(const void* owner, std::shared_ptr<Agreement> agreement);
void removeAgreement(const void* owner);

// Runs the variants in `mask` (see above), records the winner,
// runs it last.  On the stream worker.
void measure(const Key& key, uint8_t mask, const std::function<void()>& own,
             const std::function<void()>& library);

// Launches what choose() picks, or a measurement.  make_own() and
// make_library() return the kernel bodies (callables without arguments);
// only the side that runs is built.
template <typename MakeOwn, typename MakeLibrary>
void launchSelected(c10::DeviceIndex device, const char* name, const Key& key,
                    const MakeOwn& make_own, const MakeLibrary& make_library) {
  const Decision d = choose(key);
  if (d.choice && d.choice->impl == Impl::kOwn) {
    return launch(device, name, make_own(), d.choice->threads);
  }
  auto library = [library = make_library()] {
    // ATen's kernels' nested ops work on plain CPU buffers: no autograd.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    library();
  };
  if (d.choice) return launch(device, name, std::move(library), d.choice->threads);
  launch(device, name, [key, mask = d.measure, own = make_own(), library = std::move(library)] {
    measure(key, mask, own, library);
  }, /*threads=*/1);
}

// Selection for kernels that update their inputs (they cannot be run twice):
// the first launches of a key alternate between the variants the modes
// allow, each timed on the worker, until each has kTrialRuns timed runs; then
// the same handicapped minimum decides.  A trial's launch reports its time
// through recordTrial().
struct TrialDecision {
  Choice choice;
  void* trial = nullptr;  // the key's entry while it is a trial
  int variant = 0;
  // Agreement: the trials are issued, the job's choice is not known yet: the
  // launch decides when it runs (decidedVariant), among `allowed`.
  bool deferred = false;
  uint8_t allowed = 0;
};
TrialDecision chooseTrial(const Key& key);
void recordTrial(void* trial, int variant, double us);
// On the stream worker: the variant a deferred launch runs (the job's
// choice, waiting for it while the trials are out).
int decidedVariant(void* trial, uint8_t allowed);
// Sets the worker's threads for variant v.
void setVariantThreads(int v);

template <typename Fn>
class TrialWork final : public Work, public TimedRun {
 public:
  TrialWork(Fn fn, const TrialDecision& d) : fn_(std::move(fn)), trial_(d.trial),
                                             variant_(d.variant) {}
  void run() override { fn_(); }
  void record(int /*threads*/, double us) override { recordTrial(trial_, variant_, us); }

 private:
  Fn fn_;
  void* trial_;
  int variant_;
};

template <typename MakeOwn, typename MakeLibrary>
void launchSelectedInPlace(c10::DeviceIndex device, const char* name, const Key& key,
                           const MakeOwn& make_own, const MakeLibrary& make_library) {
  const TrialDecision d = chooseTrial(key);
  auto library = [&] {
    return [library = make_library()]() mutable {
      // ATen's kernels' nested ops work on plain CPU buffers: no autograd.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      library();
    };
  };
  if (d.deferred) {
    launch(device, name, [own = make_own(), library = library(), d]() mutable {
      const int v = decidedVariant(d.trial, d.allowed);
      setVariantThreads(v);
      if (v < 2) own();  // variants 0, 1: ours
      else library();
    }, /*threads=*/1);
    return;
  }
  auto go = [&](auto fn) {
    auto work = std::make_unique<TrialWork<decltype(fn)>>(std::move(fn), d);
    if (d.trial != nullptr) work->timed = work.get();
    launch(device, name, std::unique_ptr<Work>(std::move(work)), d.choice.threads);
  };
  if (d.choice.impl == Impl::kOwn) return go(make_own());
  go(library());
}

// A kernel's size for the thread policy: the bytes its device tensors hold
// and the elements of the largest (CpuKernel.h and GenericKernel.cpp count them).
struct KernelSize {
  int64_t bytes = 0;
  int64_t largest = 0;
  void add(int64_t numel, int64_t itemsize) {
    bytes += numel * itemsize;
    largest = std::max(largest, numel);
  }
};

// Which team a kernel's loops run on: ATen's kernels on OpenMP's, ours
// (kernels/, user kernels) on the runtime's compute team (Kernels.cpp).  The
// trials' order depends on it (worker, team, team on the compute team, whose
// helpers sleep after a run on the worker alone), and whether a close call is
// measured again in the process (KernelSelect.cpp kRecheckRuns).
enum class TeamKind : uint8_t { kOpenMp, kCompute };

// The thread policy of a kernel without a selection (CpuKernel.h): the
// threads of this launch of `name` (an interned or literal name) whose
// tensors hold `bytes`, the largest of them `largest` elements; sets
// work.timed when the launch is a trial, and from the host work.threads_at_run
// too (its side is picked when it runs; the value returned is then 1, a
// placeholder).  A name is measured for one team.
// From a stream worker (adaptive eager's runs), pass on_worker: the table
// file is then left for the host to write.  `remeasure`: the kernel's values
// do not depend on its thread count but for rounding, so a close call may be
// measured again later in the process (KernelSelect.cpp kRecheckRuns).
int threadsFor(const char* name, int64_t bytes, int64_t largest, Work& work,
               TeamKind team = TeamKind::kOpenMp, bool on_worker = false,
               bool remeasure = true);

// Launches fn (a callable without arguments: one of our kernels) on the
// threads threadsFor() picks (sizes as there).
template <typename Fn>
void launchWithThreadPolicy(c10::DeviceIndex device, const char* name, int64_t bytes,
                            int64_t largest, Fn&& fn) {
  std::unique_ptr<Work> work = functionWork(std::function<void()>(std::forward<Fn>(fn)));
  const int threads = threadsFor(name, bytes, largest, *work, TeamKind::kCompute);
  launch(device, name, std::move(work), threads);
}

// The tables, for torch_axon._C._kernel_select_table() and
// _thread_policy_table().  Times are -1 where not measured.
struct Row {
  std::string op, dtype, shape, layout, choice, threads, source;
  std::array<double, kVariants> us;  // own/worker, own/team, library/worker, library/team
  int64_t own_runs, library_runs;
  int samples;  // measurements behind `us` (processes that measured them)
};
std::vector<Row> table();

struct ThreadRow {
  std::string kernel, bytes, choice, source;
  double worker_us, team_us;
  int64_t worker_runs, team_runs;
  int samples;
};
std::vector<ThreadRow> threadTable();

}  // namespace at::axon::kselect
