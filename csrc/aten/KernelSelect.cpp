#include "KernelSelect.h"

#include <ATen/Context.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <ATen/TensorIterator.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include <axon/env.h>
#include <omp.h>

#include "HostView.h"

namespace at::axon::kselect {
namespace {

// Measurement bounds: each variant runs once untimed, then at least twice
// and at most kMaxReps times; no new round starts once half of kBudgetUs has
// passed (per kernel: ours, then ATen's).
constexpr int kMaxReps = 5;
constexpr double kBudgetUs = 40000.0;
// Handicaps (see KernelSelect.h): ATen's kernel wins when it is faster by
// this factor, so ties (within a shared machine's noise) keep ours ...
constexpr double kLibraryMargin = 0.95;
// ... and a team must be faster by kTeamMargin too (ties stay on the
// worker).  What a team costs besides the kernel's time is in the timings:
// our kernels run on the runtime's compute team (Kernels.cpp), whose helpers
// sleep after a few tens of us; ATen's kernels (and MKL, oneDNN) on the
// worker's OpenMP team, which lives while team kernels follow each other
// and ends before a kernel on the worker alone and when the worker goes idle
// (releaseOpenMpTeam, StreamWork.h), so a measured or trial run on it after
// one on the worker includes starting its threads (~60 us on 2 cores, AMD
// EPYC).  Until 2026-12-04 OpenMP's team outlived its kernels: its threads
// spun for milliseconds on the cores the host and the compute team needed,
// a cost no timing of the kernel showed (measured as ~2.4 ms per team launch
// in decoding), which a handicap of a quarter and at least 2.5 ms stood in
// for; it kept the training step's GEMMs on the worker alone
// (benchmarks/train_step.py: 1,678 ms per step with it, 1,560 without).
constexpr double kTeamMargin = 0.95;
// Timed runs per side before a trial decides (after one that warms up).
constexpr int kTrialRuns = 3;
// The table file is rewritten at most this often (and at exit).
constexpr double kSaveIntervalS = 1.0;
// Confirmation: a decision from fewer than kConfirmations measurements whose
// runner-up (after handicaps) is within kCloseCall of the winner is measured
// again by the next process that uses it, which keeps each variant's minimum
// over the measurements: one measurement on a busy machine does not decide a
// close call for good.
constexpr int kConfirmations = 3;
constexpr double kCloseCall = 1.5;
// A thread policy entry of the compute team whose values do not depend on
// the thread count but for rounding (ours, which split by shape; ATen's
// pointwise kernels in parts; not user kernels) decided by such a close call
// is measured again in the same process once it has run kRecheckRuns more
// times, each measurement counting towards kConfirmations: a transient
// slowdown of one side (a helper the scheduler left on the caller's core, a
// vCPU the hypervisor paused) during the few trial runs does not decide a
// long-running process's choice.
constexpr int64_t kRecheckRuns = 128;
// Times at or above this are failures (infinity, written to the file as 1e300).
constexpr double kFailedTime = 1e299;

enum class Source : uint8_t { kPending, kMeasured, kLoaded, kUnmeasured };

constexpr bool isLibrary(int v) { return v >= 2; }
constexpr bool isTeam(int v) { return (v & 1) != 0; }
Choice variantChoice(int v) { return Choice{isLibrary(v) ? Impl::kLibrary : Impl::kOwn,
                                            isTeam(v) ? 0 : 1}; }
// A time on a team with the team's handicap.
double teamHandicapped(double us) { return us / kTeamMargin; }
// A variant's time with its handicaps, the quantity the choice minimises
// (ours run on the compute team, ATen's on OpenMP's; op gemm's "own" is
// oneDNN's, on OpenMP's too: the same margin, see kTeamMargin).
double handicapped(int v, double us) {
  const double t = isLibrary(v) ? us / kLibraryMargin : us;
  return isTeam(v) ? teamHandicapped(t) : t;
}

struct Entry {
  Key key{};
  Source source = Source::kUnmeasured;
  // Minimum time of each variant; -1: not measured; inf: failed (never chosen).
  std::array<double, kVariants> us{-1, -1, -1, -1};
  // The full auto mode's choice (measured, or as the table file says).
  int auto_variant = -1;
  std::atomic<int64_t> own_runs{0}, library_runs{0};
  // Trials (kernels that update their inputs): launches issued and timed runs.
  std::array<int64_t, kVariants> trial_issued{};
  std::array<int, kVariants> trial_timed{};
  // Measurements behind `us` (processes that measured it); when `confirm`,
  // the table file's times (`prior`, from prior_samples measurements) wait
  // to be merged with this process's.
  int samples = 0;
  bool confirm = false;
  int prior_samples = 0;
  std::array<double, kVariants> prior{-1, -1, -1, -1};
  // Agreement: the job's variant when the modes allow `agreed_mask` (-1:
  // not known yet); `deciding` while a trial's choice is being agreed.
  int agreed = -1;
  uint8_t agreed_mask = 0;
  bool deciding = false;
  // Agreement, kernels that update their inputs (chooseTrial): this job's
  // launches per variant (the first kTrialRuns + 1 of each are trials in
  // every process) and the trial runs recorded since the job's trials began.
  bool job_trial = false;
  std::array<int64_t, kVariants> job_issued{};
  int64_t job_recorded = 0;
};

const char* const kOpNames[] = {"linear",           "softmax",           "log_softmax",
                                "softmax_backward", "log_softmax_backward", "layer_norm",
                                "layer_norm_backward", "rms_norm",        "rms_norm_backward",
                                "attention",        "attention_backward", "adam",
                                "gemm"};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == static_cast<size_t>(Op::kCount));

const char* dtypeName(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float32";
    case c10::kBFloat16: return "bfloat16";
    case c10::kHalf: return "float16";
    case c10::kDouble: return "float64";
    default: return c10::toString(t);
  }
}

std::string shapeName(const Key& k) {
  static const char* const linear[] = {"m", "k", "n", ""};
  static const char* const rows[] = {"rows", "cols", "", ""};
  static const char* const attention[] = {"bh", "q", "kv", "d"};
  static const char* const adam[] = {"elements", "tensors", "", ""};
  static const char* const gemm[] = {"m", "k", "n", "batch"};
  const char* const* names =
      k.op == Op::kLinear ? linear
      : k.op == Op::kGemm ? gemm
      : (k.op == Op::kAttention || k.op == Op::kAttentionBackward) ? attention
      : k.op == Op::kAdam ? adam : rows;
  std::string s;
  for (int i = 0; i < 4; ++i) {
    if (names[i][0] == '\0') break;
    if (!s.empty()) s += ' ';
    s += names[i];
    s += "<=" + std::to_string(int64_t{1} << k.dims[i]);
  }
  return s;
}

std::string layoutName(const Key& k) {
  const bool attention = k.op == Op::kAttention || k.op == Op::kAttentionBackward;
  const bool adam = k.op == Op::kAdam;
  std::string s;
  auto add = [&](const char* f) {
    if (!s.empty()) s += ',';
    s += f;
  };
  if (k.layout & kWeight) add("weight");
  if (k.layout & kBias) add("bias");
  if (k.layout & kStrided) add("strided");
  if (k.layout & 8) add(attention ? "causal" : adam ? "amsgrad" : "flag8");
  if (k.layout & 16) add(attention ? "mask" : adam ? "grad_scale" : "flag16");
  if (k.layout & 32) add("flag32");
  if (k.layout & 64) add("flag64");
  if (k.layout & 128) add("flag128");
  return s.empty() ? "-" : s;
}

Key unpack(uint64_t p) {
  Key k;
  k.op = static_cast<Op>(p & 0xff);
  k.dtype = static_cast<c10::ScalarType>((p >> 8) & 0xff);
  for (int i = 0; i < 4; ++i) k.dims[i] = static_cast<uint8_t>((p >> (16 + 8 * i)) & 0xff);
  k.layout = static_cast<uint8_t>((p >> 48) & 0xff);
  return k;
}

// ------------------------------------------------------------ modes

std::string envValue(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return "";
  std::string s(v);
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The AXON_KERNEL_SELECT / AXON_KERNEL_THREADS parsers, with the runtime's
// wording (axon/env.h).
Mode envMode() {
  const std::string s = envValue("AXON_KERNEL_SELECT");
  if (s.empty() || s == "auto") return Mode::kAuto;
  if (s == "own") return Mode::kOwn;
  if (s == "library") return Mode::kLibrary;
  std::fprintf(stderr,
               "axon: ignoring AXON_KERNEL_SELECT='%s' (expected own, library or auto); using "
               "auto\n",
               std::getenv("AXON_KERNEL_SELECT"));
  return Mode::kAuto;
}

ThreadsMode envThreadsMode() {
  const std::string s = envValue("AXON_KERNEL_THREADS");
  if (s.empty() || s == "auto") return ThreadsMode::kAuto;
  if (s == "worker") return ThreadsMode::kWorker;
  if (s == "team") return ThreadsMode::kTeam;
  std::fprintf(stderr,
               "axon: ignoring AXON_KERNEL_THREADS='%s' (expected worker, team or auto); using "
               "auto\n",
               std::getenv("AXON_KERNEL_THREADS"));
  return ThreadsMode::kAuto;
}

// -1: the environment's; else a mode set in-process.
std::atomic<int> mode_override{-1};
std::atomic<int> threads_override{-1};

// Bumped whenever a choice may change (a measurement ends, a table is read or
// forgotten, a mode is set): the per-thread caches start over.
std::atomic<uint64_t> generation{1};
void bump() { generation.fetch_add(1, std::memory_order_release); }

// Whether the team has more than one thread (on the host: the process's
// default, which stream workers inherit).
bool teamAvailable() {
  static const bool available = kernelTeamSize() > 1;
  return available;
}

// The variants the modes allow.
uint8_t allowedVariants() {
  uint8_t mask = 0xf;
  switch (mode()) {
    case Mode::kOwn: mask &= 0b0011; break;
    case Mode::kLibrary: mask &= 0b1100; break;
    case Mode::kAuto: break;
  }
  const ThreadsMode t = threadsMode();
  if (t == ThreadsMode::kWorker || !teamAvailable()) mask &= 0b0101;
  else if (t == ThreadsMode::kTeam) mask &= 0b1010;
  return mask;
}

// ------------------------------------------------------------ the machine

std::string machineDescription() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model, family, model_no, flags;
  while (std::getline(f, line)) {
    auto value = [&] {
      const size_t c = line.find(':');
      return c == std::string::npos ? std::string() : line.substr(std::min(c + 2, line.size()));
    };
    if (model.empty() && line.rfind("model name", 0) == 0) model = value();
    else if (family.empty() && line.rfind("cpu family", 0) == 0) family = value();
    else if (model_no.empty() && line.rfind("model", 0) == 0 && line.rfind("model name", 0) != 0)
      model_no = value();
    else if (flags.empty() && line.rfind("flags", 0) == 0) flags = " " + value() + " ";
    if (!model.empty() && !family.empty() && !model_no.empty() && !flags.empty()) break;
  }
  std::string isa;
  for (const char* flag : {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni",
                           "amx_tile", "amx_bf16", "amx_fp16"}) {
    if (flags.find(std::string(" ") + flag + " ") != std::string::npos) {
      isa += isa.empty() ? "" : " ";
      isa += flag;
    }
  }
  return model + " (family " + family + ", model " + model_no + "); " + isa + "; " +
         std::to_string(std::thread::hardware_concurrency()) + " cpus; torch " TORCH_VERSION;
}

const std::string& machine() {
  static const std::string m = machineDescription();
  return m;
}

std::string cachePath() {
  if (!::axon::rt::env_bool("AXON_KERNEL_SELECT_CACHE", true)) return "";
  std::string dir;
  if (const char* d = std::getenv("AXON_CACHE_DIR"); d != nullptr && *d != '\0') {
    dir = d;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = std::string(h) + "/.cache/torch_axon";
  } else {
    return "";
  }
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a of the format and the machine
  for (unsigned char c : std::string("kernel_select 6; ") + machine()) {
    hash = (hash ^ c) * 0x100000001b3ULL;
  }
  char name[64];
  std::snprintf(name, sizeof(name), "/kernel_select-%016llx.json",
                static_cast<unsigned long long>(hash));
  return dir + name;
}

// ------------------------------------------------------------ the tables

// The tables live as long as the process: stream workers may still use them
// while static destructors run at exit.
std::mutex& table_mutex = *new std::mutex;
// Entries are never freed (the per-thread caches and in-flight trials point
// at them); forgetting the table marks them unmeasured.
auto& entries = *new std::unordered_map<uint64_t, std::unique_ptr<Entry>>;  // table_mutex
bool loaded = false;                                           // guarded by table_mutex
std::mutex& file_mutex = *new std::mutex;  // one writer per process

struct ThreadEntry;
// A trial launch made outside agreement (threadsFor): its side is picked when
// it runs, so launches queued behind the trials run the decision.  It never
// waits: if a job's agreement began while it was queued, it runs the job's
// choice if known, else this process's, else the worker, and its timing is
// not the job's.
struct HostTrial final : TimedRun, ThreadsAtRun {
  ThreadEntry* entry = nullptr;
  void record(int threads, double us) override;
  int threadsAtRun() override;
};

// Thread policy entries, by (kernel name, class of bytes; `elements` below
// holds the bytes class).
struct ThreadEntry final : TimedRun, ThreadsAtRun {
  std::string kernel;
  uint8_t elements = 0;
  TeamKind team = TeamKind::kOpenMp;
  Source source = Source::kUnmeasured;  // guarded by table_mutex
  std::atomic<int> threads{1};          // the choice once measured or loaded
  double best[2] = {-1, -1};            // worker, team; -1: none timed
  int timed[2] = {0, 0};
  int64_t issued[2] = {0, 0};
  int untimed = 0;                      // trial runs at the call (Launch.cpp), not timed
  std::atomic<int64_t> runs[2] = {0, 0};
  int samples = 0;                      // as Entry's
  bool confirm = false;
  int prior_samples = 0;
  double prior[2] = {-1, -1};
  // Runs (both sides) at which a close call is measured again (kRecheckRuns);
  // 0: never.  `remeasured`: the kernel's values do not depend on its thread
  // count (threadsFor's `remeasure`); `rechecking`: its trials now are such a
  // measurement (save() writes the earlier one, `prior`, meanwhile).
  std::atomic<int64_t> recheck_at{0};
  bool remeasured = false;
  bool rechecking = false;
  // Agreement: the job's threads (1 or 0), -1 while not known; `deciding`
  // while the trials' choice is being agreed.
  int agreed = -1;
  bool deciding = false;
  // As Entry's: this job's launches per side and trial runs recorded.
  bool job_trial = false;
  int64_t job_issued[2] = {0, 0};
  int64_t job_recorded = 0;
  HostTrial host_trial;  // entry: this
  void record(int threads, double us) override;
  int threadsAtRun() override;
  int trialSide();  // 0: worker, 1: team; counts the run (table_mutex held)
};
struct NameKey {
  const void* name;
  uint8_t elements;
  bool operator==(const NameKey& o) const { return name == o.name && elements == o.elements; }
};
struct NameKeyHash {
  size_t operator()(const NameKey& k) const {
    return std::hash<const void*>()(k.name) * 31 + k.elements;
  }
};
auto& thread_entries = *new std::unordered_map<NameKey, ThreadEntry*, NameKeyHash>;  // table_mutex
// What the table file says, by (kernel name, elements class): the entries
// created for a name read it when first seen.
struct FileThreadEntry {
  std::string kernel;
  uint8_t elements;
  int threads;
  double worker_us, team_us;
  int samples;
};
auto& file_threads = *new std::unordered_map<std::string, FileThreadEntry>;  // table_mutex
std::string fileThreadKey(const std::string& kernel, uint8_t elements) {
  return kernel + "#" + std::to_string(elements);
}

bool dirty = false;                       // guarded by table_mutex
std::chrono::steady_clock::time_point last_save{};  // guarded by table_mutex

const char* implName(Impl i) { return i == Impl::kOwn ? "own" : "library"; }
const char* threadsName(int threads) { return threads == 1 ? "worker" : "team"; }
const char* const kVariantFields[kVariants] = {"own_worker_us", "own_team_us",
                                               "library_worker_us", "library_team_us"};

struct FileEntry {
  uint64_t packed;
  int auto_variant;
  std::array<double, kVariants> us;
  int samples;
};

// The entries of a table file: the flat objects with a "key" (selection) or
// a "kernel" (thread policy) (a JSON reader for what save() writes, also
// after a tool re-indented it).
void readFile(const std::string& path, std::vector<FileEntry>& out,
              std::vector<FileThreadEntry>& threads_out) {
  std::ifstream f(path);
  if (!f) return;
  std::stringstream buffer;
  buffer << f.rdbuf();
  const std::string text = buffer.str();
  size_t pos = 0;
  while ((pos = text.find('{', pos + 1)) != std::string::npos) {
    const size_t end = text.find('}', pos);
    if (end == std::string::npos) break;
    const std::string obj = text.substr(pos, end - pos);
    auto field = [&](const char* name) -> const char* {
      size_t p = obj.find(std::string("\"") + name + "\"");
      if (p == std::string::npos) return nullptr;
      p = obj.find(':', p);
      if (p == std::string::npos) return nullptr;
      p = obj.find_first_not_of(" \t\r\n", p + 1);
      return p == std::string::npos ? nullptr : obj.c_str() + p;
    };
    auto string_field = [&](const char* name) -> std::optional<std::string> {
      const char* v = field(name);
      if (v == nullptr || *v != '"') return std::nullopt;
      const char* close = std::strchr(v + 1, '"');
      if (close == nullptr) return std::nullopt;
      return std::string(v + 1, close);
    };
    auto number = [&](const char* name) -> double {
      const char* v = field(name);
      return v == nullptr ? -1.0 : std::strtod(v, nullptr);
    };
    const auto threads = string_field("threads");
    if (!threads || (*threads != "worker" && *threads != "team")) continue;
    // Without a count (written by hand): as good as confirmed.
    const double measured = number("measurements");
    const int samples = measured >= 1 ? static_cast<int>(std::min(measured, 1e6)) : kConfirmations;
    const int team = *threads == "team" ? 1 : 0;
    if (const auto kernel = string_field("kernel")) {
      const double cls = number("bytes_class");
      if (cls < 0 || cls > 62) continue;
      threads_out.push_back(FileThreadEntry{*kernel, static_cast<uint8_t>(cls), team ? 0 : 1,
                                            number("worker_us"), number("team_us"), samples});
      continue;
    }
    const auto key = string_field("key");
    const auto choice = string_field("choice");
    if (!key || !choice) continue;
    char* stop = nullptr;
    const uint64_t packed = std::strtoull(key->c_str(), &stop, 16);
    if (stop == key->c_str() || *stop != '\0') continue;
    const Key k = unpack(packed);
    if (k.op >= Op::kCount || k.packed() != packed) continue;
    int impl;
    if (*choice == "own") impl = 0;
    else if (*choice == "library") impl = 1;
    else continue;
    FileEntry e{packed, impl * 2 + team, {}, samples};
    for (int v = 0; v < kVariants; ++v) e.us[v] = number(kVariantFields[v]);
    out.push_back(e);
  }
}

void saveAtExit();

// Registered when _C loads, before any device's runtime registers its own
// exit work: exit handlers run in reverse, so the stream workers have drained
// (their measurements recorded) when the table is written.
const bool save_at_exit_registered = [] {
  std::atexit(saveAtExit);
  return true;
}();

// Whether a decision from these times is a close call (see kCloseCall): the
// best two finite times after handicaps within kCloseCall of each other.
bool closeCall(const std::array<double, kVariants>& us) {
  double first = std::numeric_limits<double>::infinity(), second = first;
  for (int v = 0; v < kVariants; ++v) {
    if (us[v] < 0 || us[v] >= kFailedTime) continue;
    const double h = handicapped(v, us[v]);
    if (h < first) {
      second = first;
      first = h;
    } else if (h < second) {
      second = h;
    }
  }
  return std::isfinite(second) && second < first * kCloseCall;
}
bool closeCall(double worker_us, double team_us) {
  if (worker_us < 0 || team_us < 0 || worker_us >= kFailedTime || team_us >= kFailedTime) {
    return false;
  }
  const double a = worker_us, b = teamHandicapped(team_us);
  return std::max(a, b) < std::min(a, b) * kCloseCall;
}

// The table file's entry for t: decides, or (a close call from too few
// measurements) waits for this process's trials to be merged with it.
void adoptFileEntry(ThreadEntry& t, const FileThreadEntry& f) {
  t.samples = f.samples;
  if (f.samples < kConfirmations && closeCall(f.worker_us, f.team_us)) {
    t.confirm = true;
    t.prior_samples = f.samples;
    t.prior[0] = f.worker_us;
    t.prior[1] = f.team_us;
    return;
  }
  t.source = Source::kLoaded;
  t.threads = f.threads;
  t.best[0] = f.worker_us;
  t.best[1] = f.team_us;
}

// A selection entry's new times: merged with the file's when confirming.
void mergePrior(Entry& e) {
  if (!e.confirm) {
    e.samples = std::max(e.samples, 1);
    return;
  }
  // A failed run stays failed (the file writes infinity as 1e300).
  const auto failed = [](double t) { return t >= kFailedTime; };
  for (int v = 0; v < kVariants; ++v) {
    const double p = e.prior[v];
    if (p < 0) continue;
    double& u = e.us[v];
    u = u < 0 ? p : (failed(p) || failed(u)) ? std::numeric_limits<double>::infinity()
                                             : std::min(u, p);
  }
  e.samples = e.prior_samples + 1;
  e.confirm = false;
}

void loadLocked() {
  if (loaded) return;
  loaded = true;
  const std::string path = cachePath();
  if (path.empty()) return;
  std::vector<FileEntry> file;
  std::vector<FileThreadEntry> file_thread;
  readFile(path, file, file_thread);
  for (const FileEntry& f : file) {
    auto& slot = entries[f.packed];
    if (!slot) slot = std::make_unique<Entry>();
    Entry& e = *slot;
    if (e.source == Source::kMeasured || e.source == Source::kPending) continue;
    e.key = unpack(f.packed);
    e.source = Source::kLoaded;
    e.us = f.us;
    e.auto_variant = f.auto_variant;
    e.samples = f.samples;
    e.confirm = f.samples < kConfirmations && closeCall(f.us);
    e.prior_samples = f.samples;
    e.prior = f.us;
  }
  for (const FileThreadEntry& f : file_thread) {
    file_threads[fileThreadKey(f.kernel, f.elements)] = f;
  }
  for (auto& [k, t] : thread_entries) {
    if (t->source != Source::kUnmeasured) continue;
    auto it = file_threads.find(fileThreadKey(t->kernel, t->elements));
    if (it != file_threads.end()) adoptFileEntry(*t, it->second);
  }
  bump();
}

std::string jsonString(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

std::string jsonNumber(double v) {
  if (v == std::numeric_limits<double>::infinity()) return "1e300";  // failed
  std::ostringstream o;
  o.precision(6);
  o << v;
  return o.str();
}

void mkdirs(const std::string& dir) {
  for (size_t p = 1; p <= dir.size(); ++p) {
    if (p == dir.size() || dir[p] == '/') ::mkdir(dir.substr(0, p).c_str(), 0755);
  }
}

bool known(Source s) { return s == Source::kMeasured || s == Source::kLoaded; }

// Merges the file's entries with ours (ours win) and writes them back,
// under an exclusive lock on <path>.lock, through <path>.<pid>.tmp + rename.
void save() {
  const std::string path = cachePath();
  if (path.empty()) return;
  std::lock_guard<std::mutex> io(file_mutex);
  mkdirs(path.substr(0, path.rfind('/')));
  const int lock = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return;
  // Another process writing (or a stopped one holding the lock): try again
  // later rather than wait on the host's dispatch path.
  if (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock);
    return;
  }
  std::vector<FileEntry> file;
  std::vector<FileThreadEntry> file_thread;
  readFile(path, file, file_thread);
  std::map<uint64_t, FileEntry> all;
  std::map<std::string, FileThreadEntry> all_threads;
  for (const FileEntry& f : file) all[f.packed] = f;
  for (const FileThreadEntry& f : file_thread) {
    all_threads[fileThreadKey(f.kernel, f.elements)] = f;
  }
  {
    std::lock_guard<std::mutex> g(table_mutex);
    // Ours win, unless the file's entry rests on more measurements (another
    // process confirmed it since we read it).
    for (const auto& [k, e] : entries) {
      if (!known(e->source) || e->auto_variant < 0) continue;
      auto it = all.find(k);
      if (it != all.end() && it->second.samples > e->samples) continue;
      all[k] = FileEntry{k, e->auto_variant, e->us, e->samples};
    }
    for (const auto& [k, t] : thread_entries) {
      if (!known(t->source) && !t->rechecking) continue;
      const std::string key = fileThreadKey(t->kernel, t->elements);
      auto it = all_threads.find(key);
      if (t->rechecking) {  // measured again: the earlier measurement meanwhile
        if (it == all_threads.end() || it->second.samples < t->prior_samples) {
          all_threads[key] = FileThreadEntry{t->kernel, t->elements, t->threads, t->prior[0],
                                             t->prior[1], t->prior_samples};
        }
        continue;
      }
      if (it != all_threads.end() && it->second.samples > t->samples) continue;
      all_threads[key] =
          FileThreadEntry{t->kernel, t->elements, t->threads, t->best[0], t->best[1], t->samples};
    }
    last_save = std::chrono::steady_clock::now();
  }
  const std::string tmp = path + "." + std::to_string(::getpid()) + ".tmp";
  bool written = false;
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "{\n  \"format\": \"torch_axon kernel_select 2\",\n  \"machine\": "
      << jsonString(machine()) << ",\n  \"entries\": [";
    const char* sep = "\n";
    for (const auto& [packed, e] : all) {
      const Key k = unpack(packed);
      char key[24];
      std::snprintf(key, sizeof(key), "%016llx", static_cast<unsigned long long>(packed));
      const Choice c = variantChoice(e.auto_variant);
      f << sep << "    {\"key\": \"" << key << "\", \"op\": \""
        << kOpNames[static_cast<int>(k.op)] << "\", \"dtype\": \"" << dtypeName(k.dtype)
        << "\", \"shape\": \"" << shapeName(k) << "\", \"layout\": \"" << layoutName(k)
        << "\", \"choice\": \"" << implName(c.impl) << "\", \"threads\": \""
        << threadsName(c.threads) << "\"";
      for (int v = 0; v < kVariants; ++v) {
        f << ", \"" << kVariantFields[v] << "\": " << jsonNumber(e.us[v]);
      }
      f << ", \"measurements\": " << e.samples << "}";
      sep = ",\n";
    }
    f << "\n  ],\n  \"threads\": [";
    sep = "\n";
    for (const auto& [name, t] : all_threads) {
      f << sep << "    {\"kernel\": " << jsonString(t.kernel)
        << ", \"bytes_class\": " << static_cast<int>(t.elements) << ", \"bytes\": \"<=2^"
        << static_cast<int>(t.elements) << "\", \"threads\": \""
        << threadsName(t.threads) << "\", \"worker_us\": " << jsonNumber(t.worker_us)
        << ", \"team_us\": " << jsonNumber(t.team_us) << ", \"measurements\": " << t.samples
        << "}";
      sep = ",\n";
    }
    f << "\n  ]\n}\n";
    f.close();
    written = !f.fail();
  }
  // Only a complete file replaces the table (a full disk leaves the old one).
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
  } else {
    std::lock_guard<std::mutex> g(table_mutex);
    dirty = false;
  }
  ::flock(lock, LOCK_UN);
  ::close(lock);
}

void saveAtExit() {
  bool pending;
  {
    std::lock_guard<std::mutex> g(table_mutex);
    pending = dirty;
  }
  if (!pending) return;
  try {
    save();
  } catch (...) {
  }
}

// On the host, outside table_mutex: writes new entries, at most once per
// kSaveIntervalS.
void maybeSave() {
  {
    std::lock_guard<std::mutex> g(table_mutex);
    if (!dirty) return;
    const double since =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save).count();
    if (since < kSaveIntervalS) return;
  }
  try {
    save();
  } catch (...) {  // the table stays in memory
  }
}

// The variant with the smallest handicapped time among `mask`, or -1.
int best(const std::array<double, kVariants>& us, uint8_t mask) {
  int winner = -1;
  double score = std::numeric_limits<double>::infinity();
  for (int v = 0; v < kVariants; ++v) {
    if (!(mask & (1 << v)) || us[v] < 0) continue;
    const double s = handicapped(v, us[v]);
    if (s < score) {
      score = s;
      winner = v;
    }
  }
  return winner;
}

uint8_t measuredMask(const Entry& e) {
  uint8_t m = 0;
  for (int v = 0; v < kVariants; ++v) {
    if (e.us[v] >= 0) m |= 1 << v;
  }
  return m;
}

// The table's choice among `allowed` from e's times (the full auto mode's
// recorded choice when every variant is allowed), or -1 when it has none.
int tableVariant(const Entry& e, uint8_t allowed) {
  if ((allowed & ~measuredMask(e)) != 0) return -1;
  return allowed == 0xf && e.auto_variant >= 0 ? e.auto_variant : best(e.us, allowed);
}

// Runs variant v of a selection on this worker (ATen's kernel without
// autograd: its nested ops work on plain CPU buffers).
void runVariant(int v, const std::function<void()>& own, const std::function<void()>& library) {
  setKernelThreads(isTeam(v) ? 0 : 1);
  if (!isLibrary(v)) return own();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  library();
}

// ------------------------------------------------------------ agreement

// A deferred launch waits at most this long on its worker for the job's
// choice (its trials run on another stream that may be waiting for this
// one), then proposes this process's (its table's, else the default) and
// runs the job's.  AXON_KERNEL_SELECT_WAIT: seconds, default 10.
std::chrono::seconds decisionWait() {
  static const std::chrono::seconds s(
      ::axon::rt::env_int("AXON_KERNEL_SELECT_WAIT", 10, 0, 24 * 3600));
  return s;
}

std::mutex& agreement_mutex = *new std::mutex;
// Registered stores, oldest first: the first serves.
auto& agreements =
    *new std::vector<std::pair<const void*, std::shared_ptr<Agreement>>>;  // agreement_mutex
std::atomic<bool> agreement_on{false};  // a store serves and has not failed
// Signalled (under table_mutex) when a decision is made or agreement ends.
std::condition_variable& decided = *new std::condition_variable;

bool agreementOn() { return agreement_on.load(std::memory_order_acquire); }

// Bumped when a job begins (or the tables are forgotten): a decision whose
// store call began before is dropped.  Guarded by table_mutex.
uint64_t job_epoch = 0;

// Forgets the job's choices (a new store serves): they are agreed again.
void forgetAgreedLocked() {
  ++job_epoch;
  for (auto& [k, e] : entries) {
    e->agreed = -1;
    e->agreed_mask = 0;
    e->job_trial = false;
    e->job_issued = {};
    e->job_recorded = 0;
  }
  for (auto& [k, t] : thread_entries) {
    t->agreed = -1;
    t->recheck_at = 0;  // a job's choices are agreed, not measured again
    t->job_trial = false;
    t->job_issued[0] = t->job_issued[1] = 0;
    t->job_recorded = 0;
  }
  bump();
}

std::atomic<bool> wait_warned{false};
void warnDecisionWait(const std::string& what) {
  if (wait_warned.exchange(true)) return;
  std::fprintf(stderr,
               "axon: %s waited %lld s for this process's kernel trials (queued on another "
               "stream); it runs the job's default instead, agreed with the other ranks\n",
               what.c_str(), static_cast<long long>(decisionWait().count()));
}

// The job's value of key, proposing `value` unless it is empty; "" when the
// job has none or there is no agreement.  Never under table_mutex: a round
// trip to the store.
std::string agree(const std::string& key, const std::string& value) {
  std::shared_ptr<Agreement> a;
  {
    std::lock_guard<std::mutex> g(agreement_mutex);
    if (agreements.empty() || !agreementOn()) return "";
    a = agreements.front().second;
  }
  std::string error;
  try {
    return value.empty() ? a->get(key) : a->propose(key, value);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  bool first;
  {
    std::lock_guard<std::mutex> g(agreement_mutex);
    first = agreement_on.exchange(false);
  }
  if (first) {
    std::fprintf(stderr,
                 "axon: kernel selection cannot reach the process group's store (%s); from now "
                 "on this process chooses kernels and threads alone, and results may differ "
                 "from other ranks' in the last bits\n",
                 error.c_str());
  }
  {
    std::lock_guard<std::mutex> g(table_mutex);
  }
  decided.notify_all();
  return "";
}

// The job's variant of a key under the modes' `allowed` variants, proposing
// `proposal` (a variant, or -1: only look); -1 when none and no proposal.
int agreeVariant(uint64_t packed, uint8_t allowed, int proposal) {
  char key[64];
  std::snprintf(key, sizeof(key), "axon_kselect/%016llx/%x",
                static_cast<unsigned long long>(packed), static_cast<unsigned>(allowed));
  const std::string v = agree(key, proposal >= 0 ? std::to_string(proposal) : "");
  if (v.size() == 1 && v[0] >= '0' && v[0] < '0' + kVariants && (allowed & (1 << (v[0] - '0')))) {
    return v[0] - '0';
  }
  return proposal;
}

// The job's threads (1 or 0) of a thread policy key, proposing `proposal`
// (or -1: only look); -1 when none and no proposal.
int agreeThreads(const std::string& kernel, uint8_t elements, int proposal) {
  const std::string v = agree("axon_kthreads/" + fileThreadKey(kernel, elements),
                              proposal < 0 ? "" : threadsName(proposal));
  if (v == "worker") return 1;
  if (v == "team") return 0;
  return proposal;
}

// ------------------------------------------------------------ per-thread caches

struct CachedChoice {
  uint64_t packed = 0;
  uint64_t generation = 0;
  Entry* entry = nullptr;
  Choice choice{Impl::kOwn, 1};
};
struct CachedThreads {
  const void* name = nullptr;
  uint8_t elements = 0;
  uint64_t generation = 0;
  ThreadEntry* entry = nullptr;
  int threads = 1;
};
constexpr size_t kCacheSlots = 64;
thread_local std::array<CachedChoice, kCacheSlots> choice_cache;
CachedChoice& choiceSlot(uint64_t packed) {
  return choice_cache[(packed * 0x9e3779b97f4a7c15ULL) >> 58];
}
thread_local std::array<CachedThreads, kCacheSlots> threads_cache;

void count(Entry& e, Impl impl) {
  (impl == Impl::kOwn ? e.own_runs : e.library_runs).fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

uint8_t bucket(int64_t n) {
  uint8_t b = 0;
  while (b < 62 && (int64_t{1} << b) < n) ++b;
  return b;
}

uint64_t Key::packed() const {
  uint64_t p = static_cast<uint64_t>(op) | static_cast<uint64_t>(static_cast<uint8_t>(dtype)) << 8;
  for (int i = 0; i < 4; ++i) p |= static_cast<uint64_t>(dims[i]) << (16 + 8 * i);
  return p | static_cast<uint64_t>(layout) << 48;
}

Key makeKey(Op op, c10::ScalarType dtype, std::initializer_list<int64_t> sizes, uint8_t layout) {
  Key k{op, dtype, {0, 0, 0, 0}, layout};
  size_t i = 0;
  for (int64_t s : sizes) {
    if (i < 4) k.dims[i++] = bucket(s);
  }
  return k;
}

namespace {
// torch.use_deterministic_algorithms(True): the same op on the same inputs
// gives the same bits at every call and in every process, so nothing is
// chosen by measurement (variants and thread counts round differently):
// auto modes mean our kernels, on the team (ATen's loops: the team from
// their grain up, as they split).  A change of the flag starts the
// per-thread caches over.
bool deterministic() {
  static std::atomic<int> seen{-1};
  const int now = at::globalContext().deterministicAlgorithms() ? 1 : 0;
  if (seen.load(std::memory_order_relaxed) != now && seen.exchange(now) != now) bump();
  return now != 0;
}
}  // namespace

Mode mode() {
  const int o = mode_override.load(std::memory_order_relaxed);
  static const Mode env = envMode();
  const Mode m = o >= 0 ? static_cast<Mode>(o) : env;
  return m == Mode::kAuto && deterministic() ? Mode::kOwn : m;
}

ThreadsMode threadsMode() {
  const int o = threads_override.load(std::memory_order_relaxed);
  static const ThreadsMode env = envThreadsMode();
  const ThreadsMode t = o >= 0 ? static_cast<ThreadsMode>(o) : env;
  return t == ThreadsMode::kAuto && deterministic() ? ThreadsMode::kTeam : t;
}

namespace {

// What a launch of `key` runs when that is decided: the calling thread's
// cached choice, the one variant the modes leave, or the table's (counted,
// and cached).  Otherwise the key's entry, with table_mutex held, for the
// caller to measure.
struct Lookup {
  std::optional<Choice> choice;
  Entry* entry = nullptr;
  uint8_t allowed = 0;
  std::unique_lock<std::mutex> lock;
};
Lookup lookup(const Key& key) {
  const uint64_t packed = key.packed();
  const uint64_t gen = generation.load(std::memory_order_acquire);
  CachedChoice& slot = choiceSlot(packed);
  if (slot.packed == packed && slot.generation == gen) {
    count(*slot.entry, slot.choice.impl);
    Lookup hit;
    hit.choice = slot.choice;
    return hit;
  }
  maybeSave();
  Lookup l;
  l.allowed = allowedVariants();
  l.lock = std::unique_lock<std::mutex>(table_mutex);
  loadLocked();
  auto& ptr = entries[packed];
  if (!ptr) ptr = std::make_unique<Entry>();
  Entry& e = *ptr;
  e.key = key;
  l.entry = &e;
  if (__builtin_popcount(l.allowed) == 1) {
    l.choice = variantChoice(__builtin_ctz(l.allowed));
  } else if (e.agreed >= 0 && e.agreed_mask == l.allowed) {
    l.choice = variantChoice(e.agreed);  // the job's
  } else {
    // The table's choice (as measured, or as someone edited the file).
    int v = known(e.source) && !e.confirm ? tableVariant(e, l.allowed) : -1;
    if (agreementOn() && (v >= 0 || e.source != Source::kPending)) {
      // The job's choice: ours proposed when we have one, else another
      // process's, looked up before measuring (a measurement's launch runs
      // the job's choice last, so its result does not depend on who measured).
      const uint8_t allowed = l.allowed;
      const uint64_t epoch = job_epoch;
      l.lock.unlock();
      v = agreeVariant(packed, allowed, v);
      l.lock.lock();
      if (v >= 0 && agreementOn() && epoch == job_epoch) {
        e.agreed = v;
        e.agreed_mask = allowed;
      }
    }
    if (v >= 0) l.choice = variantChoice(v);
  }
  if (l.choice) {
    count(e, l.choice->impl);
    slot = CachedChoice{packed, gen, &e, *l.choice};
  }
  return l;
}

}  // namespace

Decision choose(const Key& key) {
  Lookup l = lookup(key);
  if (l.choice) return Decision{l.choice, 0};
  Entry& e = *l.entry;
  if (e.source == Source::kPending) {
    // Agreement: measured again, unless the job's choice is known by then
    // (measure()): what runs does not depend on when the measurement ends.
    if (agreementOn()) return Decision{std::nullopt, l.allowed};
    // Its measurement is queued: the file's choice while confirming it, else
    // the first variant the modes allow (ours on the worker unless forced).
    const Choice c = variantChoice(e.confirm && l.allowed == 0xf && e.auto_variant >= 0
                                       ? e.auto_variant
                                       : __builtin_ctz(l.allowed));
    count(e, c.impl);
    return Decision{c, 0};
  }
  e.source = Source::kPending;
  return Decision{std::nullopt, l.allowed};  // counted by measure()
}

void measureVariants(const Key& key, uint8_t mask, const std::function<void()>& own,
                     const std::function<void()>& library);

void measure(const Key& key, uint8_t mask, const std::function<void()>& own,
             const std::function<void()>& library) {
  int agreed = -1;
  {
    std::lock_guard<std::mutex> g(table_mutex);
    Entry& e = *entries.at(key.packed());
    if (e.agreed >= 0 && e.agreed_mask == mask) {
      agreed = e.agreed;
      // Not measured here: a later launch without the job's choice measures.
      if (e.source == Source::kPending) e.source = Source::kUnmeasured;
      count(e, variantChoice(agreed).impl);
    }
  }
  if (agreed >= 0) {  // a launch queued while the key was measured: the job's choice
    return runVariant(agreed, own, library);
  }
  try {
    measureVariants(key, mask, own, library);
  } catch (...) {
    // Measured again by a later launch (this one's error is the launch's).
    std::lock_guard<std::mutex> g(table_mutex);
    Entry& e = *entries.at(key.packed());
    if (e.source == Source::kPending) e.source = Source::kUnmeasured;
    throw;
  }
}

void measureVariants(const Key& key, uint8_t mask, const std::function<void()>& own,
                     const std::function<void()>& library) {
  using clock = std::chrono::steady_clock;
  const uint8_t allowed = mask;  // the modes' (the job's choice is per modes)
  if (kernelTeamSize() <= 1) {
    // No team on this worker: its variants run on the worker.
    mask = (mask | (mask >> 1)) & 0b0101;
  }
  std::array<double, kVariants> us{-1, -1, -1, -1};
  for (int v = 0; v < kVariants; ++v) {
    if (mask & (1 << v)) us[v] = std::numeric_limits<double>::infinity();
  }
  bool library_ok = true;
  // Runs variant v; false when ATen's kernel threw (it is never chosen).
  auto run = [&](int v) {
    setKernelThreads(isTeam(v) ? 0 : 1);
    // OpenMP's threads end with each run (timed with it), as when a team
    // kernel follows one on the worker alone.
    struct Release {
      ~Release() { releaseOpenMpTeam(); }
    } release;
    if (!isLibrary(v)) {
      own();
      return true;
    }
    try {
      // ATen's kernels' nested ops work on plain CPU buffers: no autograd.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      library();
      return true;
    } catch (const std::exception&) {
      library_ok = false;
      return false;
    }
  };
  // Ours first, then ATen's, each round-robin over its thread variants with
  // half the budget.
  int last = -1;
  for (int impl = 0; impl < 2; ++impl) {
    const uint8_t group = mask & (impl == 0 ? 0b0011 : 0b1100);
    if (group == 0) continue;
    const auto start = clock::now();
    // Round 0 warms up (a team's threads may not exist yet, and caches are
    // cold); it is not timed.
    for (int rep = 0; rep <= kMaxReps; ++rep) {
      if (rep >= 3 && std::chrono::duration<double, std::micro>(clock::now() - start).count() >
                          kBudgetUs / 2) {
        break;
      }
      for (int v = 0; v < kVariants; ++v) {
        if (!(group & (1 << v)) || (isLibrary(v) && !library_ok)) continue;
        // Ours on the compute team twice in a row: the second run finds its
        // helpers awake, as a kernel among others on the team does (after a
        // run on the worker alone they may be asleep, and waking them can
        // cost the whole of a short kernel: linear 1 x 512 -> 1408 float32
        // measured 31 us on the team, as alone, where it takes 20 us in a
        // loop).  OpenMP's team starts anew for every run (releaseOpenMpTeam).
        const int runs = isTeam(v) && !isLibrary(v) && key.op != Op::kGemm ? 2 : 1;
        for (int k = 0; k < runs; ++k) {
          // Set before the call: a library kernel that throws may have written
          // part of the outputs, so another must run again at the end.
          last = v;
          const auto t0 = clock::now();
          if (run(v) && rep > 0) {
            us[v] = std::min(us[v],
                             std::chrono::duration<double, std::micro>(clock::now() - t0).count());
          }
        }
      }
    }
  }
  if (!library_ok) {
    for (int v = 2; v < kVariants; ++v) {
      if (mask & (1 << v)) us[v] = std::numeric_limits<double>::infinity();
    }
  }
  int winner = best(us, mask);
  if (winner < 0) {
    // Only ATen's kernel was allowed, and it failed: run it once more so that
    // its error is the launch's.
    TORCH_INTERNAL_ASSERT((mask & 0b0011) == 0 && mask != 0);
    winner = __builtin_ctz(mask);
    runVariant(winner, own, library);
  }
  bool agreed = false;
  uint64_t epoch = 0;
  if (agreementOn()) {
    {
      std::lock_guard<std::mutex> g(table_mutex);
      epoch = job_epoch;
    }
    // The job's choice (a variant this worker cannot time, a team without
    // threads, runs all the same).
    int proposal = winner;  // a worker without a team timed team variants alone
    if (!(allowed & (1 << proposal))) proposal |= 1;
    if (!(allowed & (1 << proposal))) proposal = __builtin_ctz(allowed);
    const int a = agreeVariant(key.packed(), allowed, proposal);
    agreed = agreementOn();
    if (agreed) winner = a;
  }
  if (isLibrary(winner) && !library_ok) {
    // The job's choice is ATen's kernel, which threw here: its error is the
    // launch's.
    runVariant(winner, own, library);
  }
  if (winner != last) run(winner);
  const Impl impl = variantChoice(winner).impl;
  std::lock_guard<std::mutex> g(table_mutex);
  Entry& e = *entries.at(key.packed());
  if (agreed && epoch == job_epoch) {
    e.agreed = winner;
    e.agreed_mask = allowed;
  }
  for (int v = 0; v < kVariants; ++v) {
    if (mask & (1 << v)) e.us[v] = us[v];
  }
  mergePrior(e);
  e.source = Source::kMeasured;
  // The full auto mode's choice, once every variant this machine has is measured.
  const uint8_t available = teamAvailable() && kernelTeamSize() > 1 ? 0xf : 0b0101;
  if ((available & ~measuredMask(e)) == 0) e.auto_variant = best(e.us, available);
  count(e, impl);
  dirty = true;
  bump();
  decided.notify_all();
}

void setVariantThreads(int v) { setKernelThreads(isTeam(v) ? 0 : 1); }

// ------------------------------------------------------------ trials

namespace {
void startTrial(Entry& e, uint8_t allowed) {
  e.source = Source::kPending;
  e.trial_issued = {};
  e.trial_timed = {};
  for (int v = 0; v < kVariants; ++v) {
    if (allowed & (1 << v)) e.us[v] = -1;
  }
}

// chooseTrial while ranks agree: the key's first launches in this job are
// trials in every process, whatever its table file, the store or earlier
// trials say (their results are their variants'), kTrialRuns + 1 of each
// variant in turn; every later launch runs the job's choice, deciding on the
// worker when it runs if the host does not know it yet.  Which launch runs
// what depends only on how many launches of the key came before it.
TrialDecision chooseTrialInJob(const Key& key) {
  const uint64_t packed = key.packed();
  const uint64_t gen = generation.load(std::memory_order_acquire);
  CachedChoice& slot = choiceSlot(packed);
  if (slot.packed == packed && slot.generation == gen) {
    count(*slot.entry, slot.choice.impl);
    return TrialDecision{slot.choice};
  }
  maybeSave();
  const uint8_t allowed = allowedVariants();
  std::lock_guard<std::mutex> g(table_mutex);
  loadLocked();
  auto& ptr = entries[packed];
  if (!ptr) ptr = std::make_unique<Entry>();
  Entry& e = *ptr;
  e.key = key;
  std::optional<int> decided_variant;
  if (__builtin_popcount(allowed) == 1) decided_variant = __builtin_ctz(allowed);
  if (!decided_variant) {
    if (!e.job_trial) {
      e.job_trial = true;
      e.job_issued = {};
      e.job_recorded = 0;
      e.agreed = -1;
      startTrial(e, allowed);
    }
    int pick = -1;
    for (int v = 0; v < kVariants; ++v) {
      if ((allowed & (1 << v)) && e.job_issued[v] < kTrialRuns + 1 &&
          (pick < 0 || e.job_issued[v] < e.job_issued[pick])) {
        pick = v;
      }
    }
    if (pick >= 0) {
      if (e.source != Source::kPending) startTrial(e, allowed);  // decided early: timed again
      ++e.job_issued[pick];
      ++e.trial_issued[pick];
      const Choice choice = variantChoice(pick);
      count(e, choice.impl);
      return TrialDecision{choice, &e, pick};
    }
    if (e.agreed >= 0 && e.agreed_mask == allowed) decided_variant = e.agreed;
  }
  if (decided_variant) {
    const Choice c = variantChoice(*decided_variant);
    count(e, c.impl);
    slot = CachedChoice{packed, gen, &e, c};
    return TrialDecision{c};
  }
  TrialDecision d{variantChoice(__builtin_ctz(allowed)), &e, -1};
  d.deferred = true;
  d.allowed = allowed;
  return d;
}
}  // namespace

TrialDecision chooseTrial(const Key& key) {
  if (agreementOn()) return chooseTrialInJob(key);
  Lookup l = lookup(key);
  if (l.choice) return TrialDecision{*l.choice};
  Entry& e = *l.entry;
  const uint8_t allowed = l.allowed;
  // A trial: the allowed variant issued least so far.
  if (e.source != Source::kPending) startTrial(e, allowed);
  int pick = -1;
  for (int v = 0; v < kVariants; ++v) {
    if ((allowed & (1 << v)) && (pick < 0 || e.trial_issued[v] < e.trial_issued[pick])) pick = v;
  }
  ++e.trial_issued[pick];
  const Choice choice = variantChoice(pick);
  count(e, choice.impl);
  return TrialDecision{choice, &e, pick};
}

void recordTrial(void* trial, int variant, double us) {
  Entry& e = *static_cast<Entry*>(trial);
  const uint8_t allowed = allowedVariants();
  std::unique_lock<std::mutex> g(table_mutex);
  if (e.source != Source::kPending || e.deciding) return;  // decided meanwhile, or forgotten
  if (us == kUntimedRun) return;              // ran at the call: issued again later
  // In a job: decided at the latest once every trial it issued has run.
  bool all_ran = false;
  if (e.job_trial) {
    int64_t issued_in_job = 0;
    for (int v = 0; v < kVariants; ++v) {
      if (allowed & (1 << v)) issued_in_job += e.job_issued[v];
    }
    all_ran = ++e.job_recorded >= issued_in_job &&
              issued_in_job >= int64_t{kTrialRuns + 1} * __builtin_popcount(allowed);
  }
  if (us >= kFailedRun) {
    // The kernel threw (its error is the launch's): never chosen, done.
    e.us[variant] = std::numeric_limits<double>::infinity();
    e.trial_timed[variant] = kTrialRuns + 1;
  } else if (e.trial_timed[variant]++ == 0) {
    if (!all_ran) return;  // each variant's first timed run warms up
  } else {
    e.us[variant] = e.us[variant] < 0 ? us : std::min(e.us[variant], us);
  }
  // Done when every variant the modes allow (now) has its timed runs.
  uint8_t issued = 0;
  for (int v = 0; v < kVariants; ++v) {
    if (e.trial_issued[v] > 0) issued |= 1 << v;
    if ((allowed & (1 << v)) && e.trial_timed[v] <= kTrialRuns && !all_ran) return;
  }
  mergePrior(e);
  const uint8_t available = teamAvailable() ? 0xf : 0b0101;
  if ((available & ~issued) == 0) e.auto_variant = best(e.us, available);
  if (e.job_trial && agreementOn()) {
    int local = tableVariant(e, allowed);
    if (local < 0) local = __builtin_ctz(allowed);  // every variant failed
    const uint64_t packed = e.key.packed();
    const uint64_t epoch = job_epoch;
    e.deciding = true;
    g.unlock();
    const int a = agreeVariant(packed, allowed, local);
    g.lock();
    e.deciding = false;
    if (e.source != Source::kPending || epoch != job_epoch) {  // forgotten meanwhile
      decided.notify_all();
      return;
    }
    if (agreementOn()) {
      e.agreed = a;
      e.agreed_mask = allowed;
    }
  }
  e.source = Source::kMeasured;
  dirty = true;
  bump();
  decided.notify_all();
}

int decidedVariant(void* trial, uint8_t allowed) {
  Entry& e = *static_cast<Entry*>(trial);
  std::unique_lock<std::mutex> g(table_mutex);
  const auto agreed = [&] { return e.agreed >= 0 && e.agreed_mask == allowed; };
  const auto ready = [&] {
    return agreed() || (e.source != Source::kPending && !e.deciding) || !agreementOn();
  };
  bool waited_out = false;
  if (!ready()) waited_out = !decided.wait_for(g, decisionWait(), ready);
  // This process's choice: its table's, else the default.
  int v = known(e.source) ? tableVariant(e, allowed) : -1;
  if (v < 0) v = __builtin_ctz(allowed);
  if (!agreed() && agreementOn()) {
    // Not the job's yet (the trials are still out after the wait, or were
    // decided under other modes): proposed, so that every rank whose launch
    // ends here runs the same (a rank whose trials ended first may have
    // written its choice: taken).
    const uint64_t packed = e.key.packed();
    const uint64_t epoch = job_epoch;
    g.unlock();
    if (waited_out) warnDecisionWait(std::string("a launch of ") +
                                     kOpNames[static_cast<int>(unpack(packed).op)]);
    const int a = agreeVariant(packed, allowed, v);
    g.lock();
    if (agreementOn() && epoch == job_epoch && !agreed()) {
      e.agreed = a;
      e.agreed_mask = allowed;
      bump();
      decided.notify_all();
    }
    v = a;
  }
  if (agreed()) v = e.agreed;
  count(e, variantChoice(v).impl);
  return v;
}

// ------------------------------------------------------------ thread policy

void ThreadEntry::record(int threads, double us) {
  const int side = threads == 1 ? 0 : 1;
  std::unique_lock<std::mutex> g(table_mutex);
  if (source != Source::kPending || deciding) return;  // decided meanwhile, or forgotten
  // In a job: decided at the latest once every trial it issued has run
  // (whether timed or run at the call).
  const bool all_ran = job_trial && ++job_recorded >= job_issued[0] + job_issued[1] &&
                       job_issued[0] > kTrialRuns && job_issued[1] > kTrialRuns;
  if (us == kUntimedRun) {
    // Ran at the call (a new signature, or one whose kernel warns and so
    // always runs there): a kernel that never runs on the worker stays there.
    if ((++untimed < 4 * (kTrialRuns + 1) || timed[0] + timed[1] > 0) && !all_ran) return;
  } else if (timed[side]++ == 0) {
    if (!all_ran) return;  // each side's first timed run warms up (cold caches, a sleeping team)
  } else {
    best[side] = best[side] < 0 ? us : std::min(best[side], us);  // a failed run: 1e300
    if ((timed[0] <= kTrialRuns || timed[1] <= kTrialRuns) && !all_ran) return;
  }
  if (confirm && timed[0] + timed[1] == 0) {
    // Decided without a timed run (it always ran at the call): no measurement
    // to add; the file's count stays.
    samples = prior_samples;
    confirm = false;
  } else if (confirm) {
    for (int k = 0; k < 2; ++k) {
      if (prior[k] >= 0) best[k] = best[k] < 0 ? prior[k] : std::min(best[k], prior[k]);
    }
    samples = prior_samples + 1;
    confirm = false;
  } else {
    samples = 1;
  }
  this->threads = best[0] >= 0 && best[1] >= 0 && teamHandicapped(best[1]) < best[0] ? 0 : 1;
  if (job_trial && agreementOn()) {
    const uint64_t epoch = job_epoch;
    deciding = true;
    g.unlock();
    const int a = agreeThreads(kernel, elements, this->threads);
    g.lock();
    deciding = false;
    if (source != Source::kPending || epoch != job_epoch) {  // forgotten meanwhile
      decided.notify_all();
      return;
    }
    if (agreementOn()) agreed = a;
  }
  source = Source::kMeasured;
  rechecking = false;
  recheck_at = team == TeamKind::kCompute && remeasured && !job_trial &&
                       samples < kConfirmations && closeCall(best[0], best[1])
                   ? runs[0].load() + runs[1].load() + kRecheckRuns
                   : 0;
  dirty = true;
  bump();
  decided.notify_all();
}

int HostTrial::threadsAtRun() {
  std::lock_guard<std::mutex> g(table_mutex);
  ThreadEntry& e = *entry;
  if (e.source == Source::kPending && !e.deciding && !e.job_trial && e.agreed < 0) {
    return e.trialSide() == 0 ? 1 : 0;
  }
  const int t = e.agreed >= 0 ? e.agreed : known(e.source) ? e.threads.load() : 1;
  e.runs[t == 1 ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
  return t;
}

void HostTrial::record(int threads, double us) {
  {
    std::lock_guard<std::mutex> g(table_mutex);
    if (entry->job_trial) return;  // a job's trials began meanwhile: not one of them
  }
  entry->record(threads, us);
}

int ThreadEntry::threadsAtRun() {
  std::unique_lock<std::mutex> g(table_mutex);
  const auto ready = [&] {
    return agreed >= 0 || (source != Source::kPending && !deciding) || !agreementOn();
  };
  bool waited_out = false;
  if (!ready()) waited_out = !decided.wait_for(g, decisionWait(), ready);
  int t = known(source) ? threads.load() : 1;  // this process's, else the worker
  if (agreed < 0 && agreementOn()) {
    // As decidedVariant: proposed, so that every rank ending here agrees.
    const uint64_t epoch = job_epoch;
    g.unlock();
    if (waited_out) warnDecisionWait("a launch of " + kernel);
    const int a = agreeThreads(kernel, elements, t);
    g.lock();
    if (agreementOn() && epoch == job_epoch && agreed < 0) {
      agreed = a;
      bump();
      decided.notify_all();
    }
    t = a;
  }
  if (agreed >= 0) t = agreed;
  runs[t == 1 ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
  return t;
}

int threadsFor(const char* name, int64_t bytes, int64_t largest, Work& work, TeamKind team,
               bool on_worker, bool remeasure) {
  // ATen's loops do not split fewer elements than their grain (the largest
  // tensor holds at least the elements a kernel iterates over).
  const bool unsplit = largest < at::internal::GRAIN_SIZE || !teamAvailable();
  switch (threadsMode()) {
    case ThreadsMode::kWorker: return 1;
    case ThreadsMode::kTeam: return deterministic() && unsplit ? 1 : 0;
    case ThreadsMode::kAuto: break;
  }
  if (unsplit) return 1;
  const uint8_t cls = bucket(bytes);
  const uint64_t gen = generation.load(std::memory_order_acquire);
  CachedThreads& slot =
      threads_cache[((reinterpret_cast<uintptr_t>(name) >> 3) * 31 + cls) % kCacheSlots];
  if (slot.name == name && slot.elements == cls && slot.generation == gen) {
    ThreadEntry& e = *slot.entry;
    const int64_t recheck = e.recheck_at.load(std::memory_order_relaxed);
    if (recheck == 0 || e.runs[0].load(std::memory_order_relaxed) +
                                e.runs[1].load(std::memory_order_relaxed) < recheck) {
      e.runs[slot.threads == 1 ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
      return slot.threads;
    }
  }
  if (!on_worker) maybeSave();
  std::unique_lock<std::mutex> g(table_mutex);
  loadLocked();
  ThreadEntry*& slot_entry = thread_entries[NameKey{name, cls}];
  if (slot_entry == nullptr) {
    slot_entry = new ThreadEntry();  // never freed (see entries)
    slot_entry->kernel = name;
    slot_entry->elements = cls;
    slot_entry->team = team;
    slot_entry->remeasured = remeasure;
    slot_entry->host_trial.entry = slot_entry;
    auto it = file_threads.find(fileThreadKey(slot_entry->kernel, cls));
    if (it != file_threads.end()) adoptFileEntry(*slot_entry, it->second);
  }
  ThreadEntry* const t = slot_entry;
  const int64_t recheck = t->recheck_at.load(std::memory_order_relaxed);
  if (recheck > 0 && (agreementOn() || t->agreed >= 0 || t->source != Source::kMeasured)) {
    t->recheck_at = 0;  // agreed (a job's ranks keep it), or measuring already
  } else if (recheck > 0 && t->runs[0] + t->runs[1] >= recheck) {
    // A close call measured again (kRecheckRuns), merged with the earlier
    // measurements as a later process would (save() writes the earlier ones
    // meanwhile).
    t->recheck_at = 0;
    t->rechecking = true;
    t->confirm = true;
    t->prior_samples = t->samples;
    t->prior[0] = t->best[0];
    t->prior[1] = t->best[1];
    t->best[0] = t->best[1] = -1;
    t->timed[0] = t->timed[1] = 0;
    t->issued[0] = t->issued[1] = 0;
    t->untimed = 0;
    t->source = Source::kUnmeasured;  // to the trials below
    bump();  // cached choices (every thread's) come here
  }
  if (!on_worker && agreementOn()) {
    // Agreement (not from a worker: its fused runs split rows, which rounds
    // the same on any threads).  As chooseTrialInJob: the key's first
    // launches in this job are trials in every process, kTrialRuns + 1 a
    // side in turn, whatever its table file, the store or earlier trials say;
    // every later launch runs the job's choice, deciding when it runs if the
    // host does not know it yet (threadsAtRun).
    if (!t->job_trial) {
      t->job_trial = true;
      t->job_issued[0] = t->job_issued[1] = 0;
      t->job_recorded = 0;
      t->agreed = -1;
      t->source = Source::kUnmeasured;  // earlier trials' timings start over below
    }
    if (t->job_issued[0] <= kTrialRuns || t->job_issued[1] <= kTrialRuns) {
      if (t->source != Source::kPending) {  // this job's trials (again, if decided early)
        t->source = Source::kPending;
        t->best[0] = t->best[1] = -1;
        t->timed[0] = t->timed[1] = 0;
        t->issued[0] = t->issued[1] = 0;
        t->untimed = 0;
      }
      const int side = t->job_issued[0] <= t->job_issued[1] ? 0 : 1;
      ++t->job_issued[side];
      ++t->issued[side];
      t->runs[side].fetch_add(1, std::memory_order_relaxed);
      work.timed = t;
      return side == 0 ? 1 : 0;
    }
    if (t->agreed >= 0) {
      slot = CachedThreads{name, cls, gen, t, t->agreed};
      t->runs[t->agreed == 1 ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
      return t->agreed;
    }
    work.threads_at_run = t;
    return 0;
  }
  if (t->agreed >= 0 || known(t->source)) {
    const int threads = t->agreed >= 0 ? t->agreed : t->threads.load();
    slot = CachedThreads{name, cls, gen, t, threads};
    t->runs[threads == 1 ? 0 : 1].fetch_add(1, std::memory_order_relaxed);
    return threads;
  }
  t->source = Source::kPending;
  if (!on_worker) {
    // A trial whose side is picked when it runs (HostTrial): launches queued
    // while the trials are out run the decision once it is made instead of
    // sides picked at the call (a host far ahead of its stream would run a
    // third of them on the losing side).  The 1 is a placeholder.
    work.timed = &t->host_trial;
    work.threads_at_run = &t->host_trial;
    return 1;
  }
  work.timed = t;
  return t->trialSide() == 0 ? 1 : 0;  // on the worker: running now
}

int ThreadEntry::trialSide() {
  // A trial: the side issued less often so far, timed on the worker.  On the
  // compute team, two team runs in a row (worker, team, team, ...): the
  // second finds the helpers awake, as a kernel that runs on the team among
  // others does (after a run on the worker alone they sleep, and waking them
  // can cost the whole of a short kernel); the minimum of its times counts.
  const int side = team == TeamKind::kCompute ? (issued[1] < 2 * issued[0] ? 1 : 0)
                                              : (issued[0] <= issued[1] ? 0 : 1);
  ++issued[side];
  runs[side].fetch_add(1, std::memory_order_relaxed);
  return side;
}

// ------------------------------------------------------------ agreement (registration)

void addAgreement(const void* owner, std::shared_ptr<Agreement> agreement) {
  static const bool enabled = ::axon::rt::env_bool("AXON_KERNEL_SELECT_AGREE", true);
  if (!enabled) return;
  std::lock_guard<std::mutex> g(agreement_mutex);
  agreements.emplace_back(owner, std::move(agreement));
  if (agreements.size() == 1) {
    // A new job: its store knows none of our choices, and its trials start
    // now.  (The only place that holds both locks: agreement_mutex first.)
    std::lock_guard<std::mutex> t(table_mutex);
    forgetAgreedLocked();
    agreement_on = true;
  }
}

void removeAgreement(const void* owner) {
  {
    std::lock_guard<std::mutex> g(agreement_mutex);
    for (auto it = agreements.begin(); it != agreements.end(); ++it) {
      if (it->first != owner) continue;
      agreements.erase(it);
      break;
    }
    if (agreements.empty()) agreement_on = false;
  }
  // Another group of the job serves (the same store under its prefixes: the
  // job's choices and trials go on, with no restart that the ranks could
  // reach at different launches), or none: what was agreed stays this
  // process's choice.
  std::lock_guard<std::mutex> g(table_mutex);
  decided.notify_all();
}

// ------------------------------------------------------------ inspection

std::vector<Row> table() {
  std::vector<Row> rows;
  std::lock_guard<std::mutex> g(table_mutex);
  loadLocked();
  std::map<uint64_t, const Entry*> sorted;
  for (const auto& [k, e] : entries) {
    if (e->source != Source::kUnmeasured || e->own_runs.load() + e->library_runs.load() > 0) {
      sorted[k] = e.get();
    }
  }
  static const char* const sources[] = {"measuring", "measured", "loaded", "not measured"};
  for (const auto& [k, e] : sorted) {
    // The job's choice where ranks agreed on one, else this process's.
    const bool agreed = e->agreed >= 0;
    const bool has = agreed || (known(e->source) && e->auto_variant >= 0);
    const Choice c = agreed ? variantChoice(e->agreed)
                     : has  ? variantChoice(e->auto_variant)
                            : Choice{Impl::kOwn, 1};
    std::string source = sources[static_cast<int>(e->source)];
    if (agreed) source = known(e->source) ? source + ", agreed" : "agreed";
    rows.push_back(Row{kOpNames[static_cast<int>(e->key.op)], dtypeName(e->key.dtype),
                       shapeName(e->key), layoutName(e->key), has ? implName(c.impl) : "-",
                       has ? threadsName(c.threads) : "-", source, e->us, e->own_runs.load(),
                       e->library_runs.load(), e->samples});
  }
  return rows;
}

std::vector<ThreadRow> threadTable() {
  std::vector<ThreadRow> rows;
  std::lock_guard<std::mutex> g(table_mutex);
  loadLocked();
  static const char* const sources[] = {"measuring", "measured", "loaded", "not measured"};
  // Entries seen in this process, then the file's others.
  std::map<std::string, ThreadRow> sorted;
  for (const auto& [k, t] : thread_entries) {
    if (t->source == Source::kUnmeasured && t->runs[0].load() + t->runs[1].load() == 0) continue;
    std::string source = sources[static_cast<int>(t->source)];
    if (t->agreed >= 0) source = known(t->source) ? source + ", agreed" : "agreed";
    sorted[fileThreadKey(t->kernel, t->elements)] = ThreadRow{
        t->kernel, "<=2^" + std::to_string(t->elements),
        t->agreed >= 0     ? threadsName(t->agreed)
        : known(t->source) ? threadsName(t->threads)
                           : "-",
        source, t->best[0], t->best[1], t->runs[0].load(), t->runs[1].load(), t->samples};
  }
  for (const auto& [key, f] : file_threads) {
    sorted.try_emplace(key, ThreadRow{f.kernel, "<=2^" + std::to_string(f.elements),
                                      threadsName(f.threads), "loaded", f.worker_us, f.team_us,
                                      0, 0, f.samples});
  }
  for (auto& [k, r] : sorted) rows.push_back(std::move(r));
  return rows;
}

namespace {
// What `probe` returns when run as a kernel launched on `threads` on
// device's current stream.
template <typename Probe>
int64_t probeOnWorker(int64_t device, int64_t threads, Probe probe) {
  auto seen = std::make_shared<std::atomic<int>>(-2);
  const auto d = static_cast<c10::DeviceIndex>(device);
  launch(d, "axon::_worker_probe", [seen, probe] { seen->store(probe()); },
         static_cast<int>(threads));
  syncCurrentStream(d);
  return static_cast<int64_t>(seen->load());
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(axon, m) {
  // Forces a kernel in this process: "own", "library", "auto"; "" goes back
  // to AXON_KERNEL_SELECT.
  m.def("_set_kernel_select(str mode) -> ()", [](c10::string_view s) {
    int v;
    if (s.empty()) v = -1;
    else if (s == "own") v = static_cast<int>(Mode::kOwn);
    else if (s == "library") v = static_cast<int>(Mode::kLibrary);
    else if (s == "auto") v = static_cast<int>(Mode::kAuto);
    else TORCH_CHECK(false, "_set_kernel_select: expected 'own', 'library', 'auto' or '', got '",
                     std::string(s), "'");
    if (mode_override.exchange(v) != v) bump();
  });
  // Forces the threads in this process: "worker", "team", "auto"; "" goes
  // back to AXON_KERNEL_THREADS.
  m.def("_set_kernel_threads(str mode) -> ()", [](c10::string_view s) {
    int v;
    if (s.empty()) v = -1;
    else if (s == "worker") v = static_cast<int>(ThreadsMode::kWorker);
    else if (s == "team") v = static_cast<int>(ThreadsMode::kTeam);
    else if (s == "auto") v = static_cast<int>(ThreadsMode::kAuto);
    else TORCH_CHECK(false, "_set_kernel_threads: expected 'worker', 'team', 'auto' or '', got '",
                     std::string(s), "'");
    if (threads_override.exchange(v) != v) bump();
  });
  // Forgets the tables in memory; the next use reads the file again.
  m.def("_kernel_select_reset() -> ()", [] {
    std::lock_guard<std::mutex> g(table_mutex);
    for (auto& [k, e] : entries) {
      e->source = Source::kUnmeasured;
      e->us = {-1, -1, -1, -1};
      e->auto_variant = -1;
      e->own_runs = 0;
      e->library_runs = 0;
      e->samples = 0;
      e->confirm = false;
    }
    for (auto& [k, t] : thread_entries) {
      t->source = Source::kUnmeasured;
      t->threads = 1;
      t->best[0] = t->best[1] = -1;
      t->timed[0] = t->timed[1] = 0;
      t->issued[0] = t->issued[1] = 0;
      t->untimed = 0;
      t->runs[0] = 0;
      t->runs[1] = 0;
      t->samples = 0;
      t->confirm = false;
      t->recheck_at = 0;
      t->rechecking = false;
    }
    forgetAgreedLocked();  // and bumps
    file_threads.clear();
    loaded = false;
    dirty = false;
    decided.notify_all();
  });
  // Writes the tables' new entries to the file now (else: at most once a
  // second while entries come in, and at exit).
  m.def("_kernel_select_save() -> ()", [] { save(); });
  // The OpenMP team size, and MKL's per-thread count (-1: no MKL), that a
  // kernel launched on `threads` (1, or 0: the team) on device's current
  // stream sees (tests: the worker's counts are never stale).
  m.def("_worker_omp_threads(int device, int threads) -> int", [](int64_t device,
                                                                  int64_t threads) {
    return probeOnWorker(device, threads, [] { return omp_get_max_threads(); });
  });
  m.def("_worker_mkl_threads(int device, int threads) -> int", [](int64_t device,
                                                                  int64_t threads) {
    return probeOnWorker(device, threads, [] { return kernelMklThreads(); });
  });
  // The table's file ("" when AXON_KERNEL_SELECT_CACHE=0 or no home) and the machine.
  m.def("_kernel_select_path() -> str", [] { return cachePath(); });
  m.def("_kernel_select_machine() -> str", [] { return machine(); });
}

}  // namespace at::axon::kselect
