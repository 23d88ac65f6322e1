#include "SyncDebug.h"

#include <c10/util/Exception.h>

namespace at::axon {

std::atomic<int> g_sync_debug_mode{0};

void setSyncDebugMode(int mode) {
  TORCH_CHECK(mode >= 0 && mode <= 2, "invalid value of debug_mode, expected one of 0,1,2");
  g_sync_debug_mode.store(mode, std::memory_order_relaxed);
}

int syncDebugMode() { return g_sync_debug_mode.load(std::memory_order_relaxed); }

void warnOrErrorOnSyncSlow() {
  const int mode = syncDebugMode();
  if (mode == 2) {
    TORCH_CHECK(false, "called a synchronizing axon operation");
  } else if (mode == 1) {
    TORCH_WARN("called a synchronizing axon operation");
  }
}

void warnOrErrorOnFallbackSyncSlow(const c10::OperatorName& op) {
  static const char* const kDataDependent[] = {
      "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
      "aten::unique_dim_consecutive", "aten::bincount",
  };
  bool flag = op.name == "aten::repeat_interleave" && op.overload_name == "Tensor";
  for (const char* name : kDataDependent) flag = flag || op.name == name;
  if (flag) warnOrErrorOnSyncSlow();
}

}  // namespace at::axon
