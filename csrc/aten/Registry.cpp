#include "Registry.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "GenericKernel.h"

namespace at::axon {
namespace {

// Function-local: registrations run as static initialisers of several
// translation units, in no particular order.
std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::vector<OpRecord>& table() {
  static std::vector<OpRecord> t;
  return t;
}

// __FILE__ as the compiler saw it (absolute in this build): from "csrc/" on.
std::string repo_path(const char* file) {
  const std::string f(file);
  const size_t at = f.rfind("csrc/");
  return at == std::string::npos ? f : f.substr(at);
}

}  // namespace

const char* pathName(Path path) {
  switch (path) {
    case Path::kStructural: return "structural";
    case Path::kNative: return "native stream kernel";
    case Path::kSync: return "synchronous kernel";
    case Path::kGeneric: return "generic stream kernel";
    case Path::kFused: return "fused kernel";
  }
  return "?";
}

void recordOp(const char* op, c10::DispatchKey key, Path path, const char* family,
              const char* file) {
  std::lock_guard<std::mutex> lock(table_mutex());
  const std::string key_name = c10::toString(key);
  for (const OpRecord& r : table()) {
    if (r.op == op && r.key == key_name) {
      // The dispatcher would only warn and keep the later kernel.
      std::fprintf(stderr, "axon: aten::%s is registered twice for %s (%s, then %s)\n", op,
                   key_name.c_str(), r.file.c_str(), repo_path(file).c_str());
      std::abort();
    }
  }
  table().push_back({op, key_name, path, family, repo_path(file)});
}

std::vector<OpRecord> opTable() {
  std::lock_guard<std::mutex> lock(table_mutex());
  return table();
}

OpRegistrar& OpRegistrar::generic(std::initializer_list<const char*> ops) {
  for (const char* op : ops) {
    impl(Path::kGeneric, op, torch::CppFunction::makeFromBoxedFunction<&genericStreamKernel>());
  }
  return *this;
}

}  // namespace at::axon
