// ShmGroup: the shared-memory segment, the step protocol and the collectives
// (see axon/comm.h for the protocol).
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "axon/comm.h"
#include "axon/runtime.h"

namespace axon::comm {

namespace {

constexpr uint64_t kMagic = 0x41584f4e434f4d32ull;  // "AXONCOM2" (signatures with a layout)
constexpr size_t kAlign = 64;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

using Clock = std::chrono::steady_clock;

// Copies of large collectives go to or come from memory that is not read
// again soon by this core (the peers read the slots; a large output is past
// the cache anyway): non-temporal stores skip the read-for-ownership of every
// destination line (single-thread copy of 128 MiB here: 25 vs 20 GB/s).
constexpr size_t kStreamingCopyBytes = size_t{256} << 10;

void stream_copy(void* dst, const void* src, size_t n);

void copy(void* dst, const void* src, size_t n) {
  if (n >= kStreamingCopyBytes) {
    stream_copy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, n);
}

// A copy with non-temporal stores (memcpy where SSE2 is missing or n is tiny).
void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  if (n >= 256) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t body = n & ~size_t{63};
    for (size_t i = 0; i < body; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    _mm_sfence();  // the stores are visible before the phase is published
    std::memcpy(d + body, s + body, n - body);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace

struct ShmGroup::Header {
  uint64_t magic;
  int32_t size;
  uint64_t slot_bytes;
  uint64_t p2p_bytes;
  alignas(kAlign) std::atomic<uint32_t> bell;      // bumped on every publish (futex word)
  alignas(kAlign) std::atomic<uint32_t> sleepers;  // ranks asleep on the bell
  std::atomic<int32_t> abort_claim;                // 1 + the rank that failed first, or 0
  std::atomic<int32_t> aborted_by;                 // set once abort_message is written
  uint64_t small_bytes;
  char abort_message[1024];                        // that rank's error
};

struct ShmGroup::RankCtl {
  alignas(kAlign) std::atomic<uint64_t> phase;  // 3 * step + k
  std::atomic<uint32_t> attached;
  // 0 while the rank is in the group; 1 + its call count once it destroyed
  // its ShmGroup (a peer still waiting for it then fails at once).
  std::atomic<uint64_t> left;
  int32_t pid;
  // This step's buffer for the shared all_reduce (written before phase 1).
  int32_t sh_fd;
  uint64_t sh_id, sh_size, sh_offset;
  uint32_t sh_ok;  // written before phase 2: 1 mapped every peer, 2 could not
  // The signature of the call whose first step is s, in sig[s % 2] (written
  // before phase 1; rewritten two steps later, when every peer is done with it).
  Sig sig[2];
};

struct ShmGroup::Chan {
  alignas(kAlign) std::atomic<uint64_t> head;  // bytes written by the sender
  alignas(kAlign) std::atomic<uint64_t> tail;  // bytes consumed by the receiver
};

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Layout: Header | RankCtl[size] | Chan[size*size] | slots (per rank: 2 x
// (data, result)) | p2p ring buffers [size*size].
namespace {
struct Layout {
  size_t ctl, chan, slots, p2p, total;
};
Layout layout(int size, size_t slot_bytes, size_t p2p_bytes, size_t header, size_t ctl,
              size_t chan) {
  Layout l;
  l.ctl = round_up(header, 4096);
  l.chan = l.ctl + round_up(ctl * size, kAlign);
  l.slots = round_up(l.chan + chan * size * size, 4096);
  l.p2p = l.slots + size_t(size) * 4 * slot_bytes;
  l.total = l.p2p + size_t(size) * size * p2p_bytes;
  return l;
}
}  // namespace

ShmGroup::ShmGroup(const std::string& name, int rank, int size, const Config& config)
    : name_("/" + name), rank_(rank), size_(size), config_(config) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw CommError("axon process group: invalid rank " + std::to_string(rank) +
                    " for a group of size " + std::to_string(size));
  }
  config_.slot_bytes = round_up(std::max<size_t>(config_.slot_bytes, 4096), 4096);
  config_.p2p_bytes = round_up(std::max<size_t>(config_.p2p_bytes, 4096), 4096);
  Layout l = layout(size, config_.slot_bytes, config_.p2p_bytes, sizeof(Header),
                    sizeof(RankCtl), sizeof(Chan));
  bytes_ = l.total;
  chan_off_ = l.chan;
  slots_off_ = l.slots;
  p2p_off_ = l.p2p;
  int fd = -1;
  if (rank == 0) {
    fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      throw CommError("axon process group: cannot create shared memory " + name_ + ": " +
                      std::strerror(errno));
    }
    if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      int e = errno;
      close(fd);
      shm_unlink(name_.c_str());
      throw CommError("axon process group: cannot size shared memory " + name_ + " to " +
                      std::to_string(bytes_) + " bytes: " + std::strerror(e));
    }
  } else {
    auto deadline = Clock::now() + config_.timeout;
    for (;;) {
      fd = shm_open(name_.c_str(), O_RDWR, 0600);
      if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes_) break;
        close(fd);
        fd = -1;
      }
      if (Clock::now() > deadline) {
        throw CommError("axon process group: rank " + std::to_string(rank) +
                        " could not open shared memory " + name_ + " created by rank 0");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    if (rank == 0) shm_unlink(name_.c_str());
    throw CommError("axon process group: cannot map shared memory: " +
                    std::string(std::strerror(errno)));
  }
  header_ = static_cast<Header*>(base_);
  ctl_ = reinterpret_cast<RankCtl*>(static_cast<char*>(base_) + l.ctl);
  if (rank == 0) {
    // ftruncate zero-fills: atomics start at 0.
    header_->size = size;
    header_->slot_bytes = config_.slot_bytes;
    header_->p2p_bytes = config_.p2p_bytes;
    header_->small_bytes = config_.small_bytes;
    // The release store publishes the fields above to whoever reads kMagic.
    reinterpret_cast<std::atomic<uint64_t>*>(&header_->magic)->store(kMagic, std::memory_order_release);
  } else {
    auto deadline = Clock::now() + config_.timeout;
    while (reinterpret_cast<std::atomic<uint64_t>*>(&header_->magic)->load(
               std::memory_order_acquire) != kMagic) {
      if (Clock::now() > deadline) throw CommError("axon process group: segment not initialised");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (header_->size != size || header_->slot_bytes != config_.slot_bytes ||
        header_->p2p_bytes != config_.p2p_bytes || header_->small_bytes != config_.small_bytes) {
      throw CommError("axon process group: ranks disagree on the group's configuration "
                      "(size or AXON_COMM_* buffer sizes)");
    }
  }
  ctl_[rank].pid = static_cast<int32_t>(getpid());
  ctl_[rank].attached.store(1, std::memory_order_release);
  ring();
}

ShmGroup::~ShmGroup() {
  if (ctl_ != nullptr && header_ != nullptr) {
    ctl_[rank_].left.store(calls_ + 1, std::memory_order_release);
    ring();
  }
  for (auto& [key, m] : peer_maps_) {
    munmap(m.addr, m.size);
    close(m.fd);
  }
  if (base_ != nullptr) {
    if (rank_ == 0 && !unlinked_) shm_unlink(name_.c_str());
    munmap(base_, bytes_);
  }
}

void ShmGroup::attach_all() {
  try {
    wait_for([&] {
      for (int r = 0; r < size_; ++r) {
        if (ctl_[r].attached.load(std::memory_order_acquire) == 0) return false;
      }
      return true;
    }, "init", [&] {
      std::vector<int> v;
      for (int r = 0; r < size_; ++r) {
        if (ctl_[r].attached.load(std::memory_order_acquire) == 0) v.push_back(r);
      }
      return v;
    }, "to attach to the group's shared memory");
  } catch (...) {
    if (rank_ == 0 && !unlinked_) {
      shm_unlink(name_.c_str());
      unlinked_ = true;
    }
    throw;
  }
  if (rank_ == 0 && !unlinked_) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

// ---------------------------------------------------------------- waiting

void ShmGroup::ring() {
  header_->bell.fetch_add(1, std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header_->bell), FUTEX_WAKE, INT_MAX,
            nullptr, nullptr, 0);
  }
}

bool ShmGroup::peer_alive(int r) const {
  int pid = ctl_[r].pid;
  if (pid <= 0) return true;  // not attached yet: the timeout decides
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A child that exited but was not reaped yet is a zombie: dead too.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  auto close_paren = line.rfind(')');
  if (close_paren != std::string::npos && close_paren + 2 < line.size()) {
    char state = line[close_paren + 2];
    if (state == 'Z' || state == 'X') return false;
  }
  return true;
}

template <typename Ready>
void ShmGroup::wait_for(Ready&& ready, const char* op,
                        const std::function<std::vector<int>()>& waiting_for,
                        const std::string& what) {
  for (int i = 0; i < 256; ++i) {
    if (ready()) return;
    cpu_relax();
  }
  for (int i = 0; i < 16; ++i) {
    if (ready()) return;
    sched_yield();
  }
  auto start = Clock::now();
  auto deadline = start + config_.timeout;
  auto next_check = start + std::chrono::milliseconds(100);
  for (;;) {
    uint32_t bell = header_->bell.load(std::memory_order_seq_cst);
    if (ready()) return;
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    struct timespec ts{0, 20 * 1000 * 1000};  // 20 ms: liveness and timeout checks
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header_->bell), FUTEX_WAIT, bell, &ts,
            nullptr, 0);
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    if (std::string peer = peer_abort_message(); !peer.empty()) {
      fail(std::string("axon process group: ") + op + " failed on rank " +
           std::to_string(rank_) + " because " + peer);
    }
    auto now = Clock::now();
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(100);
      for (int r : waiting_for()) {
        if (r == rank_) continue;
        if (const uint64_t left = ctl_[r].left.load(std::memory_order_acquire); left != 0) {
          fail(std::string("axon process group: ") + op + " failed on rank " +
               std::to_string(rank_) + ": rank " + std::to_string(r) +
               " destroyed the group after " + std::to_string(left - 1) +
               " collective call(s) while this rank waited for it " + what + " in its call " +
               std::to_string(calls_) +
               " (the ranks made different numbers of calls: a rank that made fewer may have "
               "paired its calls with other calls of its peers)");
        }
        if (!peer_alive(r)) {
          fail(std::string("axon process group: ") + op + " failed on rank " +
               std::to_string(rank_) + ": rank " + std::to_string(r) + " (pid " +
               std::to_string(ctl_[r].pid) + ") exited while this rank waited for it " + what);
        }
      }
    }
    if (now >= deadline) {
      std::vector<int> peers = waiting_for();
      std::ostringstream missing;
      for (size_t i = 0; i < peers.size(); ++i) missing << (i ? ", " : "") << peers[i];
      fail(std::string("axon process group: ") + op + " timed out on rank " +
           std::to_string(rank_) + " after " + std::to_string(config_.timeout.count()) +
           " ms waiting for rank(s) " + missing.str() + " " + what);
    }
  }
}

void ShmGroup::fail(const std::string& message) {
  abort(message);
  throw CommError(message);
}

void ShmGroup::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.empty()) broken_ = why;
  }
  int32_t none = 0;
  if (header_->abort_claim.compare_exchange_strong(none, rank_ + 1)) {
    size_t n = std::min(why.size(), sizeof(header_->abort_message) - 1);
    std::memcpy(header_->abort_message, why.data(), n);
    header_->abort_message[n] = '\0';
    header_->aborted_by.store(rank_ + 1, std::memory_order_release);
  }
  ring();
}

std::string ShmGroup::peer_abort_message() const {
  int32_t by = header_->aborted_by.load(std::memory_order_acquire);
  if (by == 0 || by - 1 == rank_) return {};
  return "rank " + std::to_string(by - 1) + " failed: " + header_->abort_message;
}

std::string ShmGroup::broken() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_;
}

void ShmGroup::check_usable(const char* op) {
  std::string b = broken();
  if (b.empty()) {
    b = peer_abort_message();
    if (!b.empty()) {
      std::lock_guard<std::mutex> lock(broken_mu_);
      if (broken_.empty()) broken_ = b;
    }
  }
  if (!b.empty()) {
    throw CommError(std::string("axon process group: cannot run ") + op +
                    ": the group failed earlier: " + b);
  }
}

// ---------------------------------------------------------------- steps

char* ShmGroup::data_slot(int r) const {
  return static_cast<char*>(base_) + slots_off_ +
         (size_t(r) * 4 + (cur_ % 2) * 2) * config_.slot_bytes;
}

char* ShmGroup::result_slot(int r) const { return data_slot(r) + config_.slot_bytes; }

void ShmGroup::begin_step(const char* op) {
  cur_ = step_++;
  cur_op_ = op;
  if (cur_ >= 2) wait_peers(-3, op);  // peers done with step cur_-2 (3(s-2)+3 = 3s-3)
  if (sig_pending_) {
    sig_pending_ = false;
    ctl_[rank_].sig[cur_ % 2] = sig_;
    sig_step_ = cur_;
  }
}

void ShmGroup::publish(int k) {
  ctl_[rank_].phase.store(3 * cur_ + k, std::memory_order_release);
  ring();
  if (k == 1 && cur_ == sig_step_) {
    // The call's first step: nothing of a peer's has been read or written yet.
    sig_step_ = UINT64_MAX;
    wait_peers(1, cur_op_);
    check_signatures();
  }
}

// ---------------------------------------------------------------- signatures

namespace {
const char* kind_name(uint32_t k) {
  static const char* const names[] = {"?", "barrier", "all_reduce", "broadcast", "reduce",
                                      "all_gather", "gather", "scatter", "reduce_scatter",
                                      "all_to_all"};
  return k < sizeof(names) / sizeof(names[0]) ? names[k] : "?";
}
}  // namespace

int32_t ShmGroup::layout_tag(const int* order, int n) {
  if (n < 0 || n > 7) return -1;
  uint32_t tag = static_cast<uint32_t>(n) << 28;
  bool identity = true;
  for (int i = 0; i < n; ++i) {
    if (order[i] < 0 || order[i] >= n) return -1;
    identity = identity && order[i] == i;
    tag |= static_cast<uint32_t>(order[i]) << (4 * i);
  }
  return identity ? 0 : static_cast<int32_t>(tag);
}

std::string ShmGroup::layout_name(int32_t tag) {
  if (tag < 0) return "";
  if (tag == 0) return "contiguous";
  const int n = static_cast<int>(static_cast<uint32_t>(tag) >> 28);
  if (n == 4 && (tag & 0xffff) == 0x1320) return "channels_last";       // 0, 2, 3, 1
  if (n == 5 && (tag & 0xfffff) == 0x14320) return "channels_last_3d";  // 0, 2, 3, 4, 1
  std::string o = "strided, memory order (";
  for (int i = 0; i < n; ++i) {
    o += (i ? ", " : "") + std::to_string((tag >> (4 * i)) & 0xf);
  }
  return o + ")";
}

void ShmGroup::begin_call(Kind kind, int dtype, uint64_t count, int op, int root) {
  const int32_t layout = kind == Kind::kBarrier || kind == Kind::kAllToAll ? -1 : layout_tag_;
  sig_ = Sig{calls_++, static_cast<uint32_t>(kind), dtype, count, op, root, layout};
  sig_pending_ = size_ > 1;
}

std::string ShmGroup::describe(const Sig& s, bool layout) const {
  std::ostringstream o;
  o << kind_name(s.kind) << " #" << s.seq << " (";
  auto kind = static_cast<Kind>(s.kind);
  bool reducing = kind == Kind::kAllReduce || kind == Kind::kReduce ||
                  kind == Kind::kReduceScatter;
  const char* sep = "";
  if (reducing) {
    o << (s.dtype >= 0 ? dtype_name(static_cast<DType>(s.dtype)) : "?") << ", " << s.count
      << (s.count == 1 ? " element" : " elements");
    sep = ", ";
    if (s.op >= 0) o << sep << reduce_op_name(static_cast<ReduceOp>(s.op));
  } else if (kind != Kind::kBarrier && kind != Kind::kAllToAll) {
    o << s.count << (s.count == 1 ? " byte" : " bytes");
    if (s.dtype >= 0) o << " of " << dtype_name(static_cast<DType>(s.dtype));
    sep = ", ";
  }
  if (s.root >= 0) o << sep << "root " << s.root;
  if (layout && s.layout >= 0) o << sep << layout_name(s.layout);
  o << ")";
  std::string out = o.str();
  if (out.size() >= 2 && out.compare(out.size() - 2, 2, "()") == 0) out.resize(out.size() - 3);
  return out;
}

void ShmGroup::check_signatures() {
  // Every rank compares rank 0's call with each other rank's, in rank order,
  // so every rank reports the same pair.
  auto sig_of = [&](int r) { return r == rank_ ? sig_ : ctl_[r].sig[cur_ % 2]; };
  const Sig first = sig_of(0);
  for (int r = 1; r < size_; ++r) {
    const Sig s = sig_of(r);
    bool same = s.seq == first.seq && s.kind == first.kind && s.count == first.count &&
                s.op == first.op && s.root == first.root &&
                (s.dtype == first.dtype || s.dtype < 0 || first.dtype < 0) &&
                (s.layout == first.layout || s.layout < 0 || first.layout < 0);
    if (same) continue;
    const bool layouts = s.layout != first.layout;
    fail("axon process group: collectives do not match across ranks: rank 0 called " +
         describe(first, layouts) + " but rank " + std::to_string(r) + " called " +
         describe(s, layouts) +
         " (every rank must call the same collectives in the same order, with the same "
         "sizes, dtypes, memory formats, ops and roots; the process group is now unusable)");
  }
}

void ShmGroup::wait_peers(int k, const char* op, int only_rank) {
  uint64_t target = 3 * cur_ + k;
  auto behind = [&] {
    std::vector<int> v;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (only_rank >= 0 && r != only_rank)) continue;
      if (ctl_[r].phase.load(std::memory_order_acquire) < target) v.push_back(r);
    }
    return v;
  };
  auto ready = [&] {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (only_rank >= 0 && r != only_rank)) continue;
      if (ctl_[r].phase.load(std::memory_order_acquire) < target) return false;
    }
    return true;
  };
  if (ready()) return;
  wait_for(ready, op, behind,
           "(call #" + std::to_string(calls_ ? calls_ - 1 : 0) + ", step " +
               std::to_string(cur_) + "; every rank must call the same collectives in the "
               "same order)");
}

// ---------------------------------------------------------------- collectives

void ShmGroup::barrier() {
  check_usable("barrier");
  begin_call(Kind::kBarrier, -1, 0, -1, -1);
  begin_step("barrier");
  publish(1);
  wait_peers(1, "barrier");
  publish(3);
}

void ShmGroup::all_reduce(void* data, size_t count, DType dt, ReduceOp op, double factor,
                          const SharedBuffer* shared) {
  check_usable("all_reduce");
  check_reduce(dt, op);
  begin_call(Kind::kAllReduce, static_cast<int>(dt), count, static_cast<int>(op), -1);
  size_t bytes = count * dtype_size(dt);
  if (size_ == 1) {
    if (op == ReduceOp::kAvg || op == ReduceOp::kPremulSum) {
      const void* src = data;
      axon::comm::reduce(dt, op, data, &src, 1, count, factor);
    }
    return;
  }
  if (bytes <= config_.small_bytes && bytes <= config_.slot_bytes) {
    all_reduce_small(static_cast<char*>(data), count, dt, op, factor);
  } else if (!all_reduce_shared(static_cast<char*>(data), count, dt, op, factor, shared)) {
    all_reduce_large(static_cast<char*>(data), count, dt, op, factor);
  }
}

void ShmGroup::all_reduce_small(char* data, size_t count, DType dt, ReduceOp op,
                                double factor) {
  begin_step("all_reduce");
  size_t bytes = count * dtype_size(dt);
  copy(data_slot(rank_), data, bytes);
  publish(1);
  wait_peers(1, "all_reduce");
  std::vector<const void*> srcs(size_);
  for (int r = 0; r < size_; ++r) srcs[r] = data_slot(r);
  axon::comm::reduce(dt, op, data, srcs.data(), size_, count, factor);
  publish(3);
}

void ShmGroup::all_reduce_large(char* data, size_t count, DType dt, ReduceOp op,
                                double factor) {
  size_t es = dtype_size(dt);
  size_t chunk = config_.slot_bytes / es;  // elements per step
  std::vector<const void*> srcs(size_);
  for (size_t off = 0; off < count; off += chunk) {
    size_t n = std::min(chunk, count - off);
    begin_step("all_reduce");
    char* mine = data + off * es;
    copy(data_slot(rank_), mine, n * es);
    publish(1);
    wait_peers(1, "all_reduce");
    // Reduce-scatter: this rank reduces its slice into its result slot.
    size_t per = (n + size_ - 1) / size_;
    per = round_up(per, 16);
    size_t lo = std::min(n, per * rank_), hi = std::min(n, lo + per);
    if (hi > lo) {
      for (int r = 0; r < size_; ++r) srcs[r] = data_slot(r) + lo * es;
      axon::comm::reduce(dt, op, result_slot(rank_) + lo * es, srcs.data(), size_, hi - lo, factor);
    }
    publish(2);
    wait_peers(2, "all_reduce");
    // All-gather of the reduced slices.
    for (int r = 0; r < size_; ++r) {
      size_t rlo = std::min(n, per * r), rhi = std::min(n, rlo + per);
      if (rhi > rlo) copy(mine + rlo * es, result_slot(r) + rlo * es, (rhi - rlo) * es);
    }
    publish(3);
  }
}

// Peer buffers, mapped once per allocation (id) and kept: the next
// collectives on the same tensors (gradient buckets, FSDP's buffers) find
// them here.  A mapping must not outlive the allocation: the owner truncates
// the memfd when it frees it (the pages go at once, mapped or not), and
// sweep_peer_maps, run by map_all before it maps anything (never between the
// mappings of one step), drops the mappings of truncated memfds and, past
// Config::peer_map_entries or peer_map_bytes, the least recently used.
char* ShmGroup::map_peer(int r, int fd, uint64_t id, size_t size) {
  auto key = std::make_pair(r, id);
  auto it = peer_maps_.find(key);
  if (it != peer_maps_.end()) {
    it->second.last_used = cur_;
    return static_cast<char*>(it->second.addr);
  }
  // nullptr: not (or no longer) the buffer the peer published.
  int local = -1;
  void* p = axon::rt::map_process_memory(ctl_[r].pid, fd, size, /*inode=*/0, &local, nullptr);
  if (p == nullptr) return nullptr;
  peer_maps_.emplace(key, PeerMap{p, size, local, cur_});
  peer_map_bytes_ += size;
  return static_cast<char*>(p);
}

size_t ShmGroup::mapped_peer_bytes() const { return peer_map_bytes_; }

// Makes room for `incoming` new mappings: drops those whose memfd the owner
// truncated (freed), then the least recently used past the caps.
void ShmGroup::sweep_peer_maps(size_t incoming_entries, size_t incoming_bytes) {
  auto drop = [&](decltype(peer_maps_)::iterator it) {
    munmap(it->second.addr, it->second.size);
    close(it->second.fd);
    peer_map_bytes_ -= it->second.size;
    return peer_maps_.erase(it);
  };
  for (auto it = peer_maps_.begin(); it != peer_maps_.end();) {
    struct stat st;
    if (fstat(it->second.fd, &st) != 0 || static_cast<size_t>(st.st_size) < it->second.size) {
      it = drop(it);
    } else {
      ++it;
    }
  }
  while (!peer_maps_.empty() &&
         (peer_maps_.size() + incoming_entries > config_.peer_map_entries ||
          peer_map_bytes_ + incoming_bytes > config_.peer_map_bytes)) {
    auto lru = peer_maps_.end();
    for (auto it = peer_maps_.begin(); it != peer_maps_.end(); ++it) {
      if (it->second.last_used == cur_) continue;  // needed by this step
      if (lru == peer_maps_.end() || it->second.last_used < lru->second.last_used) lru = it;
    }
    if (lru == peer_maps_.end()) break;
    drop(lru);
  }
}

// All ranks' buffers mapped: rank r reduces slice r, reading it from every
// buffer chunk by chunk, and writes the result into every buffer.  Memory
// traffic per rank: the message read once and written once (the staged path
// moves it about 5.5 times).  The last phase is a barrier: a rank returns only
// when every slice is in its buffer and nobody touches it any more.  Returns
// false (having finished the step) when some rank could not take part; all
// ranks then agree to stage.
// Starts a step in which every rank publishes its shared buffer (or none) and
// maps its peers'; true when all could, with bufs[r] rank r's buffer as seen
// here (own: `mine`).  False: the step is finished and the ranks stage (they
// all decide the same).  On true, the caller works on the buffers and ends
// with finish_shared(): a barrier, since a rank may reuse its buffer once it
// returns.
bool ShmGroup::map_all(const char* op, const SharedBuffer* shared, char* mine,
                       std::vector<char*>& bufs) {
  begin_step(op);
  RankCtl& me = ctl_[rank_];
  me.sh_fd = shared != nullptr ? shared->fd : -1;
  me.sh_id = shared != nullptr ? shared->id : 0;
  me.sh_size = shared != nullptr ? shared->size : 0;
  me.sh_offset = shared != nullptr ? shared->offset : 0;
  publish(1);
  wait_peers(1, op);
  bufs.assign(size_, nullptr);
  bool ok = shared != nullptr;
  if (ok) {
    // The mappings this step needs are kept (used now); the rest may go.
    size_t new_entries = 0, new_bytes = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || ctl_[r].sh_fd < 0) continue;
      auto it = peer_maps_.find(std::make_pair(r, ctl_[r].sh_id));
      if (it != peer_maps_.end()) {
        it->second.last_used = cur_;
      } else {
        ++new_entries;
        new_bytes += ctl_[r].sh_size;
      }
    }
    sweep_peer_maps(new_entries, new_bytes);
  }
  for (int r = 0; r < size_ && ok; ++r) {
    if (r == rank_) {
      bufs[r] = mine;
    } else if (ctl_[r].sh_fd < 0) {
      ok = false;
    } else {
      char* base = map_peer(r, ctl_[r].sh_fd, ctl_[r].sh_id, ctl_[r].sh_size);
      ok = base != nullptr;
      if (ok) bufs[r] = base + ctl_[r].sh_offset;
    }
  }
  me.sh_ok = ok ? 1 : 2;
  publish(2);
  wait_peers(2, op);
  for (int r = 0; r < size_; ++r) ok = ok && ctl_[r].sh_ok == 1;
  if (!ok) publish(3);
  return ok;
}

void ShmGroup::finish_shared(const char* op) {
  publish(3);
  wait_peers(3, op);
}

// Rank r reduces slice r, reading it from every buffer chunk by chunk, and
// writes the result into every buffer: the message is read once and written
// once per rank (the staged path moves it about 5.5 times).  The result goes
// into this rank's own buffer (the reduction may work in place), then into
// the peers' with ordinary stores: the chunk was just read from each of them,
// so its lines are in the cache and need no read for ownership; streaming
// stores would evict them first (2 ranks, 256 MiB float32: 17-19 ms vs 21-22
// ms with streaming stores, 4 ranks 37 vs 44-48 ms; axoncomm_bench).
bool ShmGroup::all_reduce_shared(char* data, size_t count, DType dt, ReduceOp op, double factor,
                                 const SharedBuffer* shared) {
  const size_t es = dtype_size(dt);
  std::vector<char*> bufs;
  if (!map_all("all_reduce", shared, data, bufs)) return false;
  constexpr size_t kChunkBytes = size_t{256} << 10;
  const size_t per = round_up((count + size_ - 1) / size_, 64);
  const size_t lo = std::min(count, per * rank_), hi = std::min(count, lo + per);
  const size_t chunk = kChunkBytes / es;
  std::vector<const void*> srcs(size_);
  for (size_t off = lo; off < hi; off += chunk) {
    size_t n = std::min(chunk, hi - off);
    for (int r = 0; r < size_; ++r) srcs[r] = bufs[r] + off * es;
    char* own = bufs[rank_] + off * es;
    axon::comm::reduce(dt, op, own, srcs.data(), size_, n, factor);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) std::memcpy(bufs[r] + off * es, own, n * es);
  }
  finish_shared("all_reduce");
  return true;
}

void ShmGroup::broadcast(void* data, size_t bytes, int root, const SharedBuffer* shared) {
  check_usable("broadcast");
  begin_call(Kind::kBroadcast, dtype_tag_, bytes, -1, root);
  if (size_ == 1) return;
  char* p = static_cast<char*>(data);
  // One reader (2 ranks): it copies from the root's buffer directly, one copy
  // instead of two (256 MiB: 10.6 vs 21.3 ms).  With more readers the staged
  // path is faster (4 ranks on 2 cores: 40 vs 48 ms): its 4 MiB slots stay in
  // the cache for all of them, while direct readers each fetch the root's
  // buffer from memory.  The same decision on every rank.
  if (size_ == 2 && bytes > config_.small_bytes) {
    std::vector<char*> bufs;
    if (map_all("broadcast", shared, p, bufs)) {
      if (rank_ != root) copy(p, bufs[root], bytes);
      finish_shared("broadcast");
      return;
    }
  }
  size_t chunk = config_.slot_bytes;
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t n = std::min(chunk, bytes - off);
    begin_step("broadcast");
    if (rank_ == root) copy(data_slot(rank_), p + off, n);
    publish(1);
    if (rank_ != root) {
      wait_peers(1, "broadcast", root);
      copy(p + off, data_slot(root), n);
    }
    publish(3);
  }
}

void ShmGroup::reduce(void* data, size_t count, DType dt, ReduceOp op, int root,
                      double factor) {
  check_usable("reduce");
  check_reduce(dt, op);
  begin_call(Kind::kReduce, static_cast<int>(dt), count, static_cast<int>(op), root);
  if (size_ == 1) {
    if (op == ReduceOp::kAvg || op == ReduceOp::kPremulSum) {
      const void* src = data;
      axon::comm::reduce(dt, op, data, &src, 1, count, factor);
    }
    return;
  }
  size_t es = dtype_size(dt);
  size_t chunk = config_.slot_bytes / es;
  char* p = static_cast<char*>(data);
  std::vector<const void*> srcs(size_);
  for (size_t off = 0; off < count; off += chunk) {
    size_t n = std::min(chunk, count - off);
    begin_step("reduce");
    copy(data_slot(rank_), p + off * es, n * es);
    publish(1);
    if (rank_ == root) {
      wait_peers(1, "reduce");
      for (int r = 0; r < size_; ++r) srcs[r] = data_slot(r);
      axon::comm::reduce(dt, op, p + off * es, srcs.data(), size_, n, factor);
    }
    publish(3);
  }
}

void ShmGroup::all_gather(const void* input, size_t bytes, void* const* outputs,
                          const SharedBuffer* shared) {
  check_usable("all_gather");
  begin_call(Kind::kAllGather, dtype_tag_, bytes, -1, -1);
  if (size_ > 1 && bytes * size_ > config_.small_bytes) {
    // Each rank copies every peer's input straight into its output (one copy).
    std::vector<char*> bufs;
    if (map_all("all_gather", shared, const_cast<char*>(static_cast<const char*>(input)), bufs)) {
      for (int r = 0; r < size_; ++r) {
        if (outputs[r] != bufs[r]) copy(outputs[r], bufs[r], bytes);
      }
      finish_shared("all_gather");
      return;
    }
  }
  gather_to(input, bytes, outputs, -1, "all_gather");
}

void ShmGroup::gather(const void* input, size_t bytes, void* const* outputs, int root) {
  check_usable("gather");
  begin_call(Kind::kGather, dtype_tag_, bytes, -1, root);
  gather_to(input, bytes, outputs, root, "gather");
}

// Every rank stages its input; root (every rank when root < 0) copies all.
void ShmGroup::gather_to(const void* input, size_t bytes, void* const* outputs, int root,
                         const char* op) {
  check_usable(op);
  const char* in = static_cast<const char*>(input);
  if (size_ == 1) {
    if (outputs[0] != input && bytes) std::memmove(outputs[0], input, bytes);
    return;
  }
  size_t chunk = config_.slot_bytes;
  for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += chunk) {
    size_t n = std::min(chunk, bytes - off);
    begin_step(op);
    copy(data_slot(rank_), in + off, n);
    publish(1);
    if (root < 0 || rank_ == root) {
      wait_peers(1, op);
      for (int r = 0; r < size_; ++r) {
        copy(static_cast<char*>(outputs[r]) + off, data_slot(r), n);
      }
    }
    publish(3);
    if (bytes == 0) break;
  }
}

void ShmGroup::scatter(const void* const* inputs, size_t bytes, void* output, int root) {
  check_usable("scatter");
  begin_call(Kind::kScatter, dtype_tag_, bytes, -1, root);
  char* out = static_cast<char*>(output);
  if (size_ == 1) {
    if (inputs[0] != output && bytes) std::memmove(output, inputs[0], bytes);
    return;
  }
  size_t chunk = config_.slot_bytes / size_;
  for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += chunk) {
    size_t n = std::min(chunk, bytes - off);
    begin_step("scatter");
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        copy(data_slot(rank_) + r * chunk, static_cast<const char*>(inputs[r]) + off, n);
      }
    }
    publish(1);
    wait_peers(1, "scatter", root);
    copy(out + off, data_slot(root) + rank_ * chunk, n);
    publish(3);
    if (bytes == 0) break;
  }
}

void ShmGroup::reduce_scatter(const void* const* inputs, void* output, size_t count, DType dt,
                              ReduceOp op, double factor, const SharedBuffer* inputs_shared) {
  check_usable("reduce_scatter");
  check_reduce(dt, op);
  begin_call(Kind::kReduceScatter, static_cast<int>(dt), count, static_cast<int>(op), -1);
  size_t es = dtype_size(dt);
  if (size_ == 1) {
    axon::comm::reduce(dt, op, output, inputs, 1, count, factor);
    return;
  }
  if (count * es * size_ > config_.small_bytes) {  // the same decision on every rank
    // Direct: rank r reduces its part reading it from every rank's input (the
    // inputs for the ranks lie one after another in one buffer).
    std::vector<char*> bufs;
    if (map_all("reduce_scatter", inputs_shared,
                const_cast<char*>(static_cast<const char*>(inputs[0])), bufs)) {
      std::vector<const void*> srcs(size_);
      for (int r = 0; r < size_; ++r) srcs[r] = bufs[r] + rank_ * count * es;
      axon::comm::reduce(dt, op, output, srcs.data(), size_, count, factor);
      finish_shared("reduce_scatter");
      return;
    }
  }
  size_t chunk = std::max<size_t>(1, config_.slot_bytes / size_ / es);  // elements per rank
  std::vector<const void*> srcs(size_);
  for (size_t off = 0; off < count || (count == 0 && off == 0); off += chunk) {
    size_t n = std::min(chunk, count - off);
    begin_step("reduce_scatter");
    for (int r = 0; r < size_; ++r) {
      copy(data_slot(rank_) + r * chunk * es,
                  static_cast<const char*>(inputs[r]) + off * es, n * es);
    }
    publish(1);
    wait_peers(1, "reduce_scatter");
    for (int r = 0; r < size_; ++r) srcs[r] = data_slot(r) + rank_ * chunk * es;
    if (n) axon::comm::reduce(dt, op, static_cast<char*>(output) + off * es, srcs.data(), size_, n, factor);
    publish(3);
    if (count == 0) break;
  }
}

void ShmGroup::all_to_all(const void* const* inputs, const size_t* send_bytes,
                          void* const* outputs, const size_t* recv_bytes,
                          const SharedBuffer* inputs_shared) {
  check_usable("all_to_all");
  begin_call(Kind::kAllToAll, -1, 0, -1, -1);
  if (size_ == 1) {
    if (send_bytes[0] != recv_bytes[0]) {
      fail("axon process group: all_to_all: rank 0 sends " + std::to_string(send_bytes[0]) +
           " bytes to itself but expects " + std::to_string(recv_bytes[0]));
    }
    if (outputs[0] != inputs[0] && send_bytes[0]) std::memmove(outputs[0], inputs[0], send_bytes[0]);
    return;
  }
  // Agree on the number of steps: the largest message of any pair, and check
  // that every rank expects what its peers send.
  size_t window = config_.slot_bytes / size_;
  begin_step("all_to_all");
  uint64_t* sizes = reinterpret_cast<uint64_t*>(data_slot(rank_));
  for (int r = 0; r < size_; ++r) sizes[r] = send_bytes[r];
  publish(1);
  wait_peers(1, "all_to_all");
  size_t longest = 0, total = 0;
  std::string mismatch;
  // Where this rank's part starts in each rank's inputs (for the direct copy).
  std::vector<size_t> offset_in(size_, 0);
  for (int r = 0; r < size_; ++r) {
    const uint64_t* theirs = reinterpret_cast<const uint64_t*>(data_slot(r));
    for (int d = 0; d < size_; ++d) {
      longest = std::max<size_t>(longest, theirs[d]);
      total += theirs[d];
      if (d < rank_) offset_in[r] += theirs[d];
    }
    if (theirs[rank_] != recv_bytes[r] && mismatch.empty()) {
      mismatch = "axon process group: all_to_all: rank " + std::to_string(r) + " sends " +
                 std::to_string(theirs[rank_]) + " bytes to rank " + std::to_string(rank_) +
                 ", which expects " + std::to_string(recv_bytes[r]) +
                 " (input/output split sizes disagree)";
    }
  }
  publish(3);
  if (!mismatch.empty()) fail(mismatch);
  if (total > config_.small_bytes) {  // the same decision on every rank
    // Direct: each rank copies its part of every peer's inputs straight into
    // its outputs.  The last phase is a barrier: no rank changes its inputs
    // before every peer has read them.
    std::vector<char*> bufs;
    if (map_all("all_to_all", inputs_shared,
                const_cast<char*>(static_cast<const char*>(inputs[0])), bufs)) {
      for (int r = 0; r < size_; ++r) {
        if (recv_bytes[r]) copy(outputs[r], bufs[r] + offset_in[r], recv_bytes[r]);
      }
      finish_shared("all_to_all");
      return;
    }
  }
  for (size_t off = 0; off < longest; off += window) {
    begin_step("all_to_all");
    for (int r = 0; r < size_; ++r) {
      if (send_bytes[r] > off) {
        copy(data_slot(rank_) + r * window, static_cast<const char*>(inputs[r]) + off,
                    std::min(window, send_bytes[r] - off));
      }
    }
    publish(1);
    wait_peers(1, "all_to_all");
    for (int r = 0; r < size_; ++r) {
      if (recv_bytes[r] > off) {
        copy(static_cast<char*>(outputs[r]) + off, data_slot(r) + rank_ * window,
                    std::min(window, recv_bytes[r] - off));
      }
    }
    publish(3);
  }
}

// ---------------------------------------------------------------- point to point

ShmGroup::Chan& ShmGroup::chan(int from, int to) const {
  return reinterpret_cast<Chan*>(static_cast<char*>(base_) + chan_off_)[from * size_ + to];
}

char* ShmGroup::chan_buf(int from, int to) const {
  return static_cast<char*>(base_) + p2p_off_ + size_t(from * size_ + to) * config_.p2p_bytes;
}

void ShmGroup::send(const void* data, size_t bytes, int peer) {
  send_recv_batch({P2POp{true, peer, const_cast<void*>(data), bytes}});
}

void ShmGroup::recv(void* data, size_t bytes, int peer) {
  send_recv_batch({P2POp{false, peer, data, bytes}});
}

// Each message is a 16-byte header (length, dtype) followed by the payload,
// streamed through the pair's ring buffer.
void ShmGroup::send_recv_batch(const std::vector<P2POp>& ops) {
  check_usable("send/recv");
  for (const P2POp& op : ops) {
    if (op.peer < 0 || op.peer >= size_ || op.peer == rank_) {
      throw CommError("axon process group: invalid peer rank " + std::to_string(op.peer) +
                      " for " + (op.send ? "send" : "recv") + " on rank " +
                      std::to_string(rank_) + " of a group of size " + std::to_string(size_));
    }
  }
  const size_t cap = config_.p2p_bytes;
  constexpr size_t kHeader = 16;
  struct State {
    size_t done = 0;     // payload bytes moved
    bool header = false; // length word moved
  };
  std::vector<State> st(ops.size());
  auto copy_ring = [&](char* ring, uint64_t pos, char* dst, const char* src, size_t n, bool in) {
    // in: src -> ring at pos; else ring at pos -> dst.
    size_t at = pos % cap;
    size_t first = std::min(n, cap - at);
    if (in) {
      std::memcpy(ring + at, src, first);
      std::memcpy(ring, src + first, n - first);
    } else {
      std::memcpy(dst, ring + at, first);
      std::memcpy(dst + first, ring, n - first);
    }
  };
  // Ops on the same pair and direction must run in order.
  auto blocked = [&](size_t i) {
    for (size_t j = 0; j < i; ++j) {
      if (ops[j].send == ops[i].send && ops[j].peer == ops[i].peer &&
          !(st[j].header && st[j].done == ops[j].bytes)) return true;
    }
    return false;
  };
  auto progress = [&]() -> bool {  // true when all are done
    bool all = true;
    bool moved = false;
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      State& s = st[i];
      if (s.header && s.done == op.bytes) continue;
      if (blocked(i)) { all = false; continue; }
      if (op.send) {
        Chan& c = chan(rank_, op.peer);
        char* ring = chan_buf(rank_, op.peer);
        uint64_t head = c.head.load(std::memory_order_relaxed);
        uint64_t tail = c.tail.load(std::memory_order_acquire);
        size_t space = cap - (head - tail);
        bool wrote = false;
        if (!s.header) {
          if (space < kHeader) { all = false; continue; }
          int64_t hdr[2] = {static_cast<int64_t>(op.bytes), op.dtype};
          copy_ring(ring, head, nullptr, reinterpret_cast<const char*>(hdr), kHeader, true);
          head += kHeader;
          space -= kHeader;
          s.header = true;
          wrote = true;
        }
        size_t n = std::min(space, op.bytes - s.done);
        if (n) copy_ring(ring, head, nullptr, static_cast<const char*>(op.data) + s.done, n, true);
        head += n;
        s.done += n;
        if (wrote || n) {
          c.head.store(head, std::memory_order_release);
          moved = true;  // only real progress rings: a ring of our own would wake our wait
        }
      } else {
        Chan& c = chan(op.peer, rank_);
        char* ring = chan_buf(op.peer, rank_);
        uint64_t tail = c.tail.load(std::memory_order_relaxed);
        uint64_t head = c.head.load(std::memory_order_acquire);
        size_t avail = head - tail;
        bool read_header = false;
        if (!s.header) {
          if (avail < kHeader) { all = false; continue; }
          int64_t hdr[2] = {0, -1};
          copy_ring(ring, tail, reinterpret_cast<char*>(hdr), nullptr, kHeader, false);
          uint64_t len = static_cast<uint64_t>(hdr[0]);
          if (len != op.bytes) {
            fail("axon process group: recv on rank " + std::to_string(rank_) + " expects " +
                 std::to_string(op.bytes) + " bytes from rank " + std::to_string(op.peer) +
                 ", which sent " + std::to_string(len) + " (tensor sizes of send and recv differ)");
          }
          if (hdr[1] >= 0 && op.dtype >= 0 && hdr[1] != op.dtype) {
            fail("axon process group: recv on rank " + std::to_string(rank_) + " expects " +
                 dtype_name(static_cast<DType>(op.dtype)) + " from rank " +
                 std::to_string(op.peer) + ", which sent " +
                 dtype_name(static_cast<DType>(hdr[1])) + " (" + std::to_string(len) +
                 " bytes; the dtypes of send and recv differ)");
          }
          tail += kHeader;
          avail -= kHeader;
          s.header = true;
          read_header = true;
        }
        size_t n = std::min(avail, op.bytes - s.done);
        if (n) copy_ring(ring, tail, static_cast<char*>(op.data) + s.done, nullptr, n, false);
        tail += n;
        s.done += n;
        if (read_header || n) {
          c.tail.store(tail, std::memory_order_release);
          moved = true;
        }
      }
      if (!(s.header && s.done == op.bytes)) all = false;
    }
    if (moved) ring();
    return all;
  };
  std::vector<int> peers;
  for (const P2POp& op : ops) peers.push_back(op.peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  // Progress until done; wait_for sleeps only when a pass moved nothing.
  for (;;) {
    // The bell is read before looking at the rings: a peer that writes and
    // rings after the look changes it, so the wait below cannot miss it.
    uint32_t bell_before = header_->bell.load(std::memory_order_seq_cst);
    if (progress()) return;
    wait_for([&] { return header_->bell.load(std::memory_order_seq_cst) != bell_before; },
             ops.size() == 1 ? (ops[0].send ? "send" : "recv") : "batch_isend_irecv",
             [&] { return peers; },
             "(point-to-point; the peer must post the matching send/recv)");
  }
}

// ---------------------------------------------------------------- reference

double memcpy_bandwidth(size_t bytes, int reps) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto s = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    std::chrono::duration<double> d = Clock::now() - s;
    t.push_back(d.count());
    a[i % bytes] = b[(i * 7) % bytes];
  }
  std::sort(t.begin(), t.end());
  return bytes / t[t.size() / 2];
}

}  // namespace axon::comm
