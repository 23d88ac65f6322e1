#include "KernelSelect.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include <axon/env.h>

namespace at::axon::kselect {
namespace {

// Measurement bounds: each side runs at least twice and at most kMaxReps
// times; no new pair starts once kBudgetUs has passed.
constexpr int kMaxReps = 5;
constexpr double kBudgetUs = 20000.0;
// ATen's kernel wins when it is faster by this factor: ties (within a shared
// machine's noise) keep our kernel, which runs on fewer threads.
constexpr double kLibraryMargin = 0.95;

enum class Source : uint8_t { kPending, kMeasured, kLoaded, kUnmeasured };

struct Entry {
  Key key;
  Source source = Source::kUnmeasured;
  Impl impl = Impl::kOwn;
  double own_us = 0, library_us = 0;
  int64_t own_runs = 0, library_runs = 0;
};

const char* const kOpNames[] = {"linear",           "softmax",           "log_softmax",
                                "softmax_backward", "log_softmax_backward", "layer_norm",
                                "layer_norm_backward", "rms_norm",        "rms_norm_backward"};
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
  static const char* const linear[] = {"m", "k", "n"};
  static const char* const rows[] = {"rows", "cols", ""};
  const char* const* names = k.op == Op::kLinear ? linear : rows;
  std::string s;
  for (int i = 0; i < 3; ++i) {
    if (names[i][0] == '\0') break;
    if (!s.empty()) s += ' ';
    s += names[i];
    s += "<=" + std::to_string(int64_t{1} << k.dims[i]);
  }
  return s;
}

std::string layoutName(uint8_t layout) {
  std::string s;
  auto add = [&](const char* f) {
    if (!s.empty()) s += ',';
    s += f;
  };
  if (layout & kWeight) add("weight");
  if (layout & kBias) add("bias");
  if (layout & kStrided) add("strided");
  return s.empty() ? "-" : s;
}

Key unpack(uint64_t p) {
  Key k;
  k.op = static_cast<Op>(p & 0xff);
  k.dtype = static_cast<c10::ScalarType>((p >> 8) & 0xff);
  k.dims = {static_cast<uint8_t>((p >> 16) & 0xff), static_cast<uint8_t>((p >> 24) & 0xff),
            static_cast<uint8_t>((p >> 32) & 0xff)};
  k.layout = static_cast<uint8_t>((p >> 40) & 0xff);
  return k;
}

// ------------------------------------------------------------ mode

// The AXON_KERNEL_SELECT parser, with the runtime's wording (axon/env.h).
Mode envMode() {
  const char* v = std::getenv("AXON_KERNEL_SELECT");
  if (v == nullptr) return Mode::kAuto;
  std::string s(v);
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s.empty() || s == "auto") return Mode::kAuto;
  if (s == "own") return Mode::kOwn;
  if (s == "library") return Mode::kLibrary;
  std::fprintf(stderr,
               "axon: ignoring AXON_KERNEL_SELECT='%s' (expected own, library or auto); using "
               "auto\n",
               v);
  return Mode::kAuto;
}

// -1: the environment's; else a Mode set by _set_kernel_select.
std::atomic<int> mode_override{-1};

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
  for (unsigned char c : std::string("kernel_select 1; ") + machine()) {
    hash = (hash ^ c) * 0x100000001b3ULL;
  }
  char name[64];
  std::snprintf(name, sizeof(name), "/kernel_select-%016llx.json",
                static_cast<unsigned long long>(hash));
  return dir + name;
}

// ------------------------------------------------------------ the table

std::mutex table_mutex;
std::unordered_map<uint64_t, Entry> entries;  // guarded by table_mutex
bool loaded = false;                          // guarded by table_mutex
std::mutex file_mutex;                        // one writer per process

const char* implName(Impl i) { return i == Impl::kOwn ? "own" : "library"; }

// The entries of a table file: the flat objects with a "key" (a JSON reader
// for what save() writes, also after a tool re-indented it).
std::vector<Entry> readFile(const std::string& path) {
  std::vector<Entry> out;
  std::ifstream f(path);
  if (!f) return out;
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
    const char* key = field("key");
    const char* choice = field("choice");
    const char* own = field("own_us");
    const char* lib = field("library_us");
    if (!key || !choice || !own || !lib || *key != '"' || *choice != '"') continue;
    char* stop = nullptr;
    const uint64_t packed = std::strtoull(key + 1, &stop, 16);
    if (stop == key + 1 || *stop != '"') continue;
    Entry e;
    e.key = unpack(packed);
    if (e.key.op >= Op::kCount || e.key.packed() != packed) continue;
    if (std::strncmp(choice, "\"own\"", 5) == 0) e.impl = Impl::kOwn;
    else if (std::strncmp(choice, "\"library\"", 9) == 0) e.impl = Impl::kLibrary;
    else continue;
    e.own_us = std::strtod(own, nullptr);
    e.library_us = std::strtod(lib, nullptr);
    e.source = Source::kLoaded;
    out.push_back(e);
  }
  return out;
}

void loadLocked() {
  if (loaded) return;
  loaded = true;
  const std::string path = cachePath();
  if (path.empty()) return;
  for (const Entry& e : readFile(path)) entries.emplace(e.key.packed(), e);
}

std::string jsonString(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o + "\"";
}

void mkdirs(const std::string& dir) {
  for (size_t p = 1; p <= dir.size(); ++p) {
    if (p == dir.size() || dir[p] == '/') ::mkdir(dir.substr(0, p).c_str(), 0755);
  }
}

// Merges the file's entries with ours (ours win) and writes them back,
// under an exclusive lock on <path>.lock, through <path>.<pid>.tmp + rename.
void save() {
  const std::string path = cachePath();
  if (path.empty()) return;
  std::lock_guard<std::mutex> io(file_mutex);
  mkdirs(path.substr(0, path.rfind('/')));
  const int lock = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0) return;
  ::flock(lock, LOCK_EX);
  std::vector<Entry> all;
  {
    std::lock_guard<std::mutex> g(table_mutex);
    for (const Entry& e : readFile(path)) {
      auto [it, inserted] = entries.emplace(e.key.packed(), e);
      (void)it;
      (void)inserted;
    }
    for (const auto& [k, e] : entries) {
      if (e.source == Source::kMeasured || e.source == Source::kLoaded) all.push_back(e);
    }
  }
  std::sort(all.begin(), all.end(),
            [](const Entry& a, const Entry& b) { return a.key.packed() < b.key.packed(); });
  const std::string tmp = path + "." + std::to_string(::getpid()) + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "{\n  \"format\": \"torch_axon kernel_select 1\",\n  \"machine\": "
      << jsonString(machine()) << ",\n  \"entries\": [\n";
    for (size_t i = 0; i < all.size(); ++i) {
      const Entry& e = all[i];
      char key[24];
      std::snprintf(key, sizeof(key), "%016llx",
                    static_cast<unsigned long long>(e.key.packed()));
      std::ostringstream row;
      row.precision(6);
      row << "    {\"key\": \"" << key << "\", \"op\": \"" << kOpNames[static_cast<int>(e.key.op)]
          << "\", \"dtype\": \"" << dtypeName(e.key.dtype) << "\", \"shape\": \""
          << shapeName(e.key) << "\", \"layout\": \"" << layoutName(e.key.layout)
          << "\", \"choice\": \"" << implName(e.impl) << "\", \"own_us\": " << e.own_us
          << ", \"library_us\": " << e.library_us << "}" << (i + 1 < all.size() ? "," : "")
          << "\n";
      f << row.str();
    }
    f << "  ]\n}\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
  ::flock(lock, LOCK_UN);
  ::close(lock);
}

}  // namespace

uint8_t bucket(int64_t n) {
  uint8_t b = 0;
  while (b < 62 && (int64_t{1} << b) < n) ++b;
  return b;
}

uint64_t Key::packed() const {
  return static_cast<uint64_t>(op) | static_cast<uint64_t>(static_cast<uint8_t>(dtype)) << 8 |
         static_cast<uint64_t>(dims[0]) << 16 | static_cast<uint64_t>(dims[1]) << 24 |
         static_cast<uint64_t>(dims[2]) << 32 | static_cast<uint64_t>(layout) << 40;
}

Key makeKey(Op op, c10::ScalarType dtype, std::initializer_list<int64_t> sizes, uint8_t layout) {
  Key k{op, dtype, {0, 0, 0}, layout};
  size_t i = 0;
  for (int64_t s : sizes) {
    if (i < 3) k.dims[i++] = bucket(s);
  }
  return k;
}

Mode mode() {
  const int o = mode_override.load(std::memory_order_relaxed);
  if (o >= 0) return static_cast<Mode>(o);
  static const Mode env = envMode();
  return env;
}

std::optional<Impl> choose(const Key& key) {
  const Mode m = mode();
  std::lock_guard<std::mutex> g(table_mutex);
  if (m == Mode::kAuto) loadLocked();
  auto [it, inserted] = entries.try_emplace(key.packed());
  Entry& e = it->second;
  if (inserted) e.key = key;
  std::optional<Impl> c;
  if (m == Mode::kOwn) {
    c = Impl::kOwn;
  } else if (m == Mode::kLibrary) {
    c = Impl::kLibrary;
  } else if (e.source == Source::kMeasured || e.source == Source::kLoaded) {
    c = e.impl;
  } else if (e.source == Source::kPending) {
    c = Impl::kOwn;  // its measurement is queued
  } else {
    e.source = Source::kPending;
    return std::nullopt;  // counted by measure()
  }
  ++(*c == Impl::kOwn ? e.own_runs : e.library_runs);
  return c;
}

void measure(const Key& key, const std::function<void()>& own,
             const std::function<void()>& library) {
  using clock = std::chrono::steady_clock;
  auto timed = [](const std::function<void()>& fn) {
    const auto t0 = clock::now();
    fn();
    return std::chrono::duration<double, std::micro>(clock::now() - t0).count();
  };
  double best_own = std::numeric_limits<double>::infinity();
  double best_lib = best_own;
  bool library_ok = true;
  const auto start = clock::now();
  Impl last = Impl::kOwn;
  for (int rep = 0; rep < kMaxReps; ++rep) {
    if (rep >= 2 &&
        std::chrono::duration<double, std::micro>(clock::now() - start).count() > kBudgetUs) {
      break;
    }
    best_own = std::min(best_own, timed(own));
    last = Impl::kOwn;
    if (!library_ok) break;
    // Set before the call: a library kernel that throws may have written part
    // of the outputs, so ours must run again at the end.
    last = Impl::kLibrary;
    try {
      // ATen's kernels' nested ops work on plain CPU buffers: no autograd.
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      best_lib = std::min(best_lib, timed(library));
    } catch (const std::exception&) {
      library_ok = false;  // never chosen
      best_lib = std::numeric_limits<double>::infinity();
    }
  }
  const Impl winner = best_lib < kLibraryMargin * best_own ? Impl::kLibrary : Impl::kOwn;
  if (winner != last) (winner == Impl::kOwn ? own : library)();
  {
    std::lock_guard<std::mutex> g(table_mutex);
    Entry& e = entries[key.packed()];
    e.key = key;
    e.source = Source::kMeasured;
    e.impl = winner;
    e.own_us = best_own;
    e.library_us = library_ok ? best_lib : -1.0;
    ++(winner == Impl::kOwn ? e.own_runs : e.library_runs);
  }
  try {
    save();
  } catch (...) {  // the table stays in memory
  }
}

std::vector<Row> table() {
  std::vector<Entry> all;
  {
    std::lock_guard<std::mutex> g(table_mutex);
    loadLocked();
    for (const auto& [k, e] : entries) all.push_back(e);
  }
  std::sort(all.begin(), all.end(),
            [](const Entry& a, const Entry& b) { return a.key.packed() < b.key.packed(); });
  std::vector<Row> rows;
  for (const Entry& e : all) {
    const bool known = e.source == Source::kMeasured || e.source == Source::kLoaded;
    static const char* const sources[] = {"measuring", "measured", "loaded", "not measured"};
    rows.push_back(Row{kOpNames[static_cast<int>(e.key.op)], dtypeName(e.key.dtype),
                       shapeName(e.key), layoutName(e.key.layout),
                       known ? implName(e.impl) : "-", sources[static_cast<int>(e.source)],
                       known ? e.own_us : -1.0, known ? e.library_us : -1.0, e.own_runs,
                       e.library_runs});
  }
  return rows;
}

TORCH_LIBRARY_FRAGMENT(axon, m) {
  // Forces a side in this process: "own", "library", "auto"; "" goes back to
  // AXON_KERNEL_SELECT.
  m.def("_set_kernel_select(str mode) -> ()", [](c10::string_view s) {
    if (s.empty()) mode_override.store(-1);
    else if (s == "own") mode_override.store(static_cast<int>(Mode::kOwn));
    else if (s == "library") mode_override.store(static_cast<int>(Mode::kLibrary));
    else if (s == "auto") mode_override.store(static_cast<int>(Mode::kAuto));
    else TORCH_CHECK(false, "_set_kernel_select: expected 'own', 'library', 'auto' or '', got '",
                     std::string(s), "'");
  });
  // Forgets the table in memory; the next use reads the file again.
  m.def("_kernel_select_reset() -> ()", [] {
    std::lock_guard<std::mutex> g(table_mutex);
    entries.clear();
    loaded = false;
  });
  // The table's file ("" when AXON_KERNEL_SELECT_CACHE=0 or no home) and the machine.
  m.def("_kernel_select_path() -> str", [] { return cachePath(); });
  m.def("_kernel_select_machine() -> str", [] { return machine(); });
}

}  // namespace at::axon::kselect
