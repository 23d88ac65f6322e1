// ShmGroup tests: ranks are threads, each with its own mapping of the segment
// (as separate processes would have); the dead-rank test forks a process.
#include <dirent.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "axon/comm.h"
#include "axon/kernels/dtype.h"

using namespace axon::comm;
namespace k = axon::kernels;

namespace {

std::string unique_name() {
  static std::atomic<int> counter{0};
  return "axon-comm-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

// This process's test segments (CTest runs other test processes alongside).
std::set<std::string> shm_entries() {
  std::set<std::string> out;
  const std::string mine = "axon-comm-test-" + std::to_string(getpid()) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind(mine, 0) == 0) out.insert(n);
    }
    closedir(d);
  }
  return out;
}

Config small_config() {
  Config c;
  c.slot_bytes = 64 << 10;  // small slots: many steps, wrap-around of both buffers
  c.p2p_bytes = 16 << 10;
  c.small_bytes = 8 << 10;
  c.timeout = std::chrono::milliseconds(20000);
  return c;
}

// Runs fn(group) on `size` threads; rethrows the first failure message.
void run_group(int size, const Config& config, const std::function<void(ShmGroup&)>& fn) {
  std::string name = unique_name();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(size);
  std::atomic<bool> created{false};
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (r != 0) {
          while (!created.load()) std::this_thread::yield();
        }
        ShmGroup g(name, r, size, config);
        if (r == 0) created.store(true);
        g.attach_all();
        fn(g);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        created.store(true);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
}

float value(int rank, size_t i) { return float((rank * 7 + int(i % 1013) * 3) % 11) - 5.0f; }

}  // namespace

TEST(CommReduce, Float32Ops) {
  const int n = 3;
  const size_t count = 5000;
  std::vector<std::vector<float>> in(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = value(r, i) + 0.25f * r;
  const void* srcs[n] = {in[0].data(), in[1].data(), in[2].data()};
  std::vector<float> out(count);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin,
                      ReduceOp::kMax}) {
    reduce(DType::kFloat32, op, out.data(), srcs, n, count);
    for (size_t i = 0; i < count; ++i) {
      float a = in[0][i], b = in[1][i], c = in[2][i], want = 0;
      switch (op) {
        case ReduceOp::kSum: want = (a + b) + c; break;
        case ReduceOp::kAvg: want = ((a + b) + c) / 3; break;
        case ReduceOp::kProduct: want = (a * b) * c; break;
        case ReduceOp::kMin: want = std::min(a, std::min(b, c)); break;
        default: want = std::max(a, std::max(b, c)); break;
      }
      ASSERT_EQ(out[i], want) << reduce_op_name(op) << " at " << i;
    }
  }
}

TEST(CommReduce, HalfAccumulatesInFloat) {
  // 4 x bfloat16(1 + 2^-8): summed in bf16 step by step each add rounds; the
  // float32 accumulation rounds once.
  // 3000 elements: the vector sums, then a tail of 8 through the block loops.
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
  for (int n : {2, 4}) {
    const size_t count = 3000;
    std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(count));
    std::vector<const void*> srcs;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        float v = value(r, i) * 0.37f + 1.0f / 256;
        in[r][i] = dt == DType::kBFloat16 ? k::float_to_bf16(v) : k::float_to_f16(v);
      }
      srcs.push_back(in[r].data());
    }
    std::vector<uint16_t> out(count);
    reduce(dt, ReduceOp::kSum, out.data(), srcs.data(), n, count);
    for (size_t i = 0; i < count; ++i) {
      float acc = 0;
      for (int r = 0; r < n; ++r) {
        acc += dt == DType::kBFloat16 ? k::bf16_to_float(in[r][i]) : k::f16_to_float(in[r][i]);
      }
      uint16_t want = dt == DType::kBFloat16 ? k::float_to_bf16(acc) : k::float_to_f16(acc);
      ASSERT_EQ(out[i], want) << dtype_name(dt) << " at " << i;
    }
  }
}

// The vector sums (2..8 sources) and the block loops (1 or 9 sources, and the
// tails) against a scalar reference in rank order: the same bits, in place
// (out is one of the sources) as well, for every length around the vector
// width.  NaN and infinity pass through.
TEST(CommReduce, SumsMatchAScalarReferenceForEverySourceCount) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kPremulSum})
  for (int n = 1; n <= 9; ++n)
  for (size_t count : {size_t{0}, size_t{5}, size_t{16}, size_t{47}, size_t{1000}})
  for (int alias = -1; alias < n; ++alias) {  // -1: a separate output, else that source
    const bool in_place = alias >= 0;
    const double factor = 0.3;
    const size_t es = dt == DType::kFloat32 ? 4 : 2;
    auto to_float = [&](const char* p) {
      if (dt == DType::kFloat32) { float f; std::memcpy(&f, p, 4); return f; }
      uint16_t b; std::memcpy(&b, p, 2);
      return dt == DType::kBFloat16 ? k::bf16_to_float(b) : k::f16_to_float(b);
    };
    auto store = [&](char* p, float f) {
      if (dt == DType::kFloat32) { std::memcpy(p, &f, 4); return; }
      uint16_t b = dt == DType::kBFloat16 ? k::float_to_bf16(f) : k::float_to_f16(f);
      std::memcpy(p, &b, 2);
    };
    std::vector<std::vector<char>> in(n, std::vector<char>(count * es + 1));
    std::vector<const void*> srcs;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        float v = value(r, i) * 0.37f + 1.0f / 256;
        if (i == 3 && r == n - 1) v = std::numeric_limits<float>::quiet_NaN();
        if (i == 4 && r == 0) v = std::numeric_limits<float>::infinity();
        store(in[r].data() + i * es, v);
      }
      srcs.push_back(in[r].data());
    }
    std::vector<char> want(count * es + 1);
    for (size_t i = 0; i < count; ++i) {
      float acc = to_float(in[0].data() + i * es);
      for (int r = 1; r < n; ++r) acc += to_float(in[r].data() + i * es);
      if (op == ReduceOp::kAvg) acc /= static_cast<float>(n);
      if (op == ReduceOp::kPremulSum) acc *= static_cast<float>(factor);
      store(want.data() + i * es, acc);
    }
    std::vector<char> separate(count * es + 1);
    char* out = in_place ? in[alias].data() : separate.data();
    // A guard byte after the output: nothing may be written past count.
    out[count * es] = 0x5a;
    reduce(dt, op, out, srcs.data(), n, count, factor);
    ASSERT_EQ(out[count * es], 0x5a) << "wrote past the end";
    for (size_t i = 0; i < count; ++i) {
      float got = to_float(out + i * es), exp = to_float(want.data() + i * es);
      if (std::isnan(exp)) {
        ASSERT_TRUE(std::isnan(got)) << i;
        continue;
      }
      ASSERT_EQ(std::memcmp(out + i * es, want.data() + i * es, es), 0)
          << dtype_name(dt) << " " << reduce_op_name(op) << " " << n << " sources, " << count
          << " elements" << (in_place ? " in place of source " + std::to_string(alias) : "")
          << ", at " << i << ": " << got
          << " vs " << exp;
    }
  }
}

TEST(CommReduce, RejectsUndefinedCombinations) {
  EXPECT_THROW(check_reduce(DType::kInt32, ReduceOp::kAvg), CommError);
  EXPECT_THROW(check_reduce(DType::kFloat32, ReduceOp::kBand), CommError);
  EXPECT_NO_THROW(check_reduce(DType::kInt64, ReduceOp::kBxor));
}

class CommGroup : public ::testing::TestWithParam<int> {};

TEST_P(CommGroup, AllReduceSmallAndLarge) {
  const int n = GetParam();
  Config c = small_config();
  // Sizes: zero, small path, exactly one slot, several slots with a tail.
  std::vector<size_t> counts = {0, 1, 100, (64 << 10) / 4, 50000};
  run_group(n, c, [&](ShmGroup& g) {
    for (size_t count : counts) {
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(g.rank(), i);
      g.all_reduce(data.data(), count, DType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += value(r, i);
        ASSERT_EQ(data[i], want) << "count " << count << " i " << i;
      }
      std::vector<int64_t> ints(count);
      for (size_t i = 0; i < count; ++i) ints[i] = (g.rank() + 1) * int64_t(i + 1);
      g.all_reduce(ints.data(), count, DType::kInt64, ReduceOp::kMax);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(ints[i], n * int64_t(i + 1));
    }
  });
}

// A float buffer in a memfd (as the runtime allocates device memory), with
// its SharedBuffer description; `offset` floats into the mapping.
struct MemfdBuffer {
  MemfdBuffer(size_t count, size_t offset) {
    bytes = (count + offset) * sizeof(float) + 4096;
    fd = memfd_create("comm-test", MFD_CLOEXEC);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    base = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    static std::atomic<uint64_t> ids{1};
    shared = SharedBuffer{fd, ids++, bytes, offset * sizeof(float)};
    data = reinterpret_cast<float*>(base + shared.offset);
  }
  // Released as axon::rt::free does: truncated first, so peers' cached
  // mappings hold no pages and are dropped at their next shared step.
  ~MemfdBuffer() {
    EXPECT_EQ(ftruncate(fd, 0), 0);
    munmap(base, bytes);
    close(fd);
  }
  size_t bytes;
  int fd;
  char* base;
  float* data;
  SharedBuffer shared;
};

TEST_P(CommGroup, AllReduceReadsAndWritesPeersBuffersDirectly) {
  const int n = GetParam();
  // Mapped buffers at different offsets, two sizes (with a tail), two calls
  // on the same buffers (the mapping cache); then one rank without a shared
  // buffer: every rank stages instead.
  run_group(n, small_config(), [&](ShmGroup& g) {
    for (size_t count : {size_t{50000}, size_t{300001}}) {
      MemfdBuffer buf(count, 16 * g.rank() + 3);
      for (int call = 0; call < 2; ++call) {
        for (size_t i = 0; i < count; ++i) buf.data[i] = value(g.rank(), i + call);
        g.all_reduce(buf.data, count, DType::kFloat32, ReduceOp::kSum, 1.0, &buf.shared);
        for (size_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += value(r, i + call);
          ASSERT_EQ(buf.data[i], want) << "count " << count << " call " << call << " i " << i;
        }
      }
    }
    const size_t count = 70000;
    MemfdBuffer buf(count, 0);
    for (size_t i = 0; i < count; ++i) buf.data[i] = value(g.rank(), i);
    g.all_reduce(buf.data, count, DType::kFloat32, ReduceOp::kMax, 1.0,
                 g.rank() == n - 1 ? nullptr : &buf.shared);
    for (size_t i = 0; i < count; ++i) {
      float want = value(0, i);
      for (int r = 1; r < n; ++r) want = std::max(want, value(r, i));
      ASSERT_EQ(buf.data[i], want);
    }
  });
}

TEST_P(CommGroup, AllGatherReduceScatterAndBroadcastReadPeersDirectly) {
  const int n = GetParam();
  run_group(n, small_config(), [&](ShmGroup& g) {
    const int r = g.rank();
    const size_t count = 40000;  // per rank: past the small size, several slots
    for (bool shared : {true, false}) {
      // all_gather from a shared input into a private output.
      MemfdBuffer in(count, 8 * r + 1);
      for (size_t i = 0; i < count; ++i) in.data[i] = value(r, i);
      std::vector<float> out(count * n);
      std::vector<void*> outs;
      for (int q = 0; q < n; ++q) outs.push_back(out.data() + q * count);
      g.all_gather(in.data, count * sizeof(float), outs.data(), shared ? &in.shared : nullptr);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; i += 7) ASSERT_EQ(out[q * count + i], value(q, i));
      // reduce_scatter of a shared flat input.
      MemfdBuffer flat(count * n, 4 * r);
      for (size_t i = 0; i < count * n; ++i) flat.data[i] = value(r, i);
      std::vector<const void*> ins;
      for (int q = 0; q < n; ++q) ins.push_back(flat.data + q * count);
      std::vector<float> mine(count);
      g.reduce_scatter(ins.data(), mine.data(), count, DType::kFloat32, ReduceOp::kSum, 1.0,
                       shared ? &flat.shared : nullptr);
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += value(q, r * count + i);
        ASSERT_EQ(mine[i], want) << i;
      }
      // broadcast from the last rank: the others copy from its buffer.
      MemfdBuffer b(count, 8 * r + 5);
      for (size_t i = 0; i < count; ++i) b.data[i] = value(r, i);
      g.broadcast(b.data, count * sizeof(float), n - 1, shared ? &b.shared : nullptr);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(b.data[i], value(n - 1, i)) << i;
    }
  });
}

TEST_P(CommGroup, RootedAndGatherCollectives) {
  const int n = GetParam();
  Config c = small_config();
  const size_t bytes = 150000;  // several slots
  run_group(n, c, [&](ShmGroup& g) {
    const int r = g.rank();
    const int root = n - 1;
    // broadcast
    std::vector<char> b(bytes);
    for (size_t i = 0; i < bytes; ++i) b[i] = char(r == root ? (i * 13) % 251 : 0);
    g.broadcast(b.data(), bytes, root);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(b[i], char((i * 13) % 251));
    // reduce to root
    const size_t count = bytes / 4;
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = value(r, i);
    g.reduce(v.data(), count, DType::kFloat32, ReduceOp::kSum, root);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value(q, i);
      ASSERT_EQ(v[i], r == root ? want : value(r, i));
    }
    // all_gather / gather
    std::vector<char> in(bytes);
    for (size_t i = 0; i < bytes; ++i) in[i] = char(r * 31 + i % 97);
    std::vector<std::vector<char>> out(n, std::vector<char>(bytes));
    std::vector<void*> outs;
    for (auto& o : out) outs.push_back(o.data());
    g.all_gather(in.data(), bytes, outs.data());
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(out[q][i], char(q * 31 + i % 97));
    for (auto& o : out) std::fill(o.begin(), o.end(), 0);
    g.gather(in.data(), bytes, outs.data(), 0);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < bytes; i += 101)
        ASSERT_EQ(out[q][i], r == 0 ? char(q * 31 + i % 97) : 0);
    // scatter from root
    std::vector<std::vector<char>> parts(n, std::vector<char>(bytes));
    std::vector<const void*> ins;
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < bytes; ++i) parts[q][i] = char(r == root ? q * 5 + i % 89 : 0);
      ins.push_back(parts[q].data());
    }
    std::vector<char> got(bytes);
    g.scatter(ins.data(), bytes, got.data(), root);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(got[i], char(r * 5 + i % 89));
    // reduce_scatter
    std::vector<std::vector<float>> rs(n, std::vector<float>(count));
    std::vector<const void*> rsin;
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; ++i) rs[q][i] = value(r, i + q);
      rsin.push_back(rs[q].data());
    }
    std::vector<float> rsout(count);
    g.reduce_scatter(rsin.data(), rsout.data(), count, DType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value(q, i + r);
      ASSERT_EQ(rsout[i], want);
    }
    g.barrier();
  });
}

TEST_P(CommGroup, AllToAllUneven) {
  const int n = GetParam();
  run_group(n, small_config(), [&](ShmGroup& g) {
    const int r = g.rank();
    // rank r sends (r + 1) * 7000 + d bytes to rank d: uneven, some over a window.
    auto len = [](int from, int to) { return size_t((from + 1) * 7000 + to * 3); };
    std::vector<std::vector<char>> in(n), out(n);
    std::vector<const void*> ins;
    std::vector<void*> outs;
    std::vector<size_t> sb(n), rb(n);
    for (int d = 0; d < n; ++d) {
      sb[d] = len(r, d);
      rb[d] = len(d, r);
      in[d].resize(sb[d]);
      for (size_t i = 0; i < sb[d]; ++i) in[d][i] = char(r * 17 + d * 3 + i % 71);
      out[d].resize(rb[d]);
      ins.push_back(in[d].data());
      outs.push_back(out[d].data());
    }
    g.all_to_all(ins.data(), sb.data(), outs.data(), rb.data());
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < rb[s]; ++i) ASSERT_EQ(out[s][i], char(s * 17 + r * 3 + i % 71));
  });
}

TEST_P(CommGroup, AllToAllReadsPeersInputsDirectly) {
  const int n = GetParam();
  // Inputs one after another in a shared buffer (all_to_all_single): uneven
  // parts, one empty (rank 0 sends nothing to the last rank), the buffer at
  // another offset on every rank; then one rank without a shared buffer:
  // every rank stages instead.
  run_group(n, small_config(), [&](ShmGroup& g) {
    const int r = g.rank();
    auto len = [n](int from, int to) {  // floats
      return from == 0 && to == n - 1 && n > 1 ? size_t{0} : size_t((from + 1) * 9000 + to * 5);
    };
    for (bool all_shared : {true, false}) {
      size_t total = 0;
      for (int d = 0; d < n; ++d) total += len(r, d);
      MemfdBuffer in(total, 8 * r + 3);
      std::vector<const void*> ins;
      std::vector<size_t> sb(n), rb(n);
      std::vector<std::vector<float>> out(n);
      std::vector<void*> outs;
      size_t at = 0;
      for (int d = 0; d < n; ++d) {
        sb[d] = len(r, d) * sizeof(float);
        rb[d] = len(d, r) * sizeof(float);
        for (size_t i = 0; i < len(r, d); ++i) in.data[at + i] = value(r * 31 + d, i);
        ins.push_back(in.data + at);
        at += len(r, d);
        out[d].assign(len(d, r) + 1, -1.0f);  // one guard element
        outs.push_back(out[d].data());
      }
      const bool shared = all_shared || r != n - 1;
      g.all_to_all(ins.data(), sb.data(), outs.data(), rb.data(), shared ? &in.shared : nullptr);
      for (int s = 0; s < n; ++s) {
        for (size_t i = 0; i < len(s, r); ++i)
          ASSERT_EQ(out[s][i], value(s * 31 + r, i)) << "from " << s << " i " << i;
        ASSERT_EQ(out[s][len(s, r)], -1.0f) << "written past the part from " << s;
      }
    }
  });
}

TEST_P(CommGroup, SendRecvBatchBothSendFirst) {
  const int n = GetParam();
  run_group(n, small_config(), [&](ShmGroup& g) {
    if (n == 1) {  // no peer: sending to oneself is an error
      char c = 0;
      EXPECT_THROW(g.send(&c, 1, 0), CommError);
      return;
    }
    const int r = g.rank();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t bytes = 100000;  // larger than the ring buffer: needs interleaving
    std::vector<char> out(bytes), in(bytes);
    for (size_t i = 0; i < bytes; ++i) out[i] = char(r + i % 13);
    g.send_recv_batch({P2POp{true, next, out.data(), bytes}, P2POp{false, prev, in.data(), bytes}});
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(in[i], char(prev + i % 13));
    // Plain send/recv in a ring, two messages in a row.
    if (r == 0) {
      g.send(out.data(), 10, next);
      g.send(out.data(), 0, next);
      g.recv(in.data(), 10, prev);
    } else {
      g.recv(in.data(), 10, prev);
      g.recv(in.data(), 0, prev);
      g.send(out.data(), 10, next);
      g.send(out.data(), 0, next);
    }
    if (r == 0) g.recv(in.data(), 0, prev);
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, CommGroup, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(CommErrors, RecvSizeMismatchNamesBothSizes) {
  run_group(2, small_config(), [&](ShmGroup& g) {
    char buf[64] = {};
    if (g.rank() == 0) {
      g.send(buf, 16, 1);
    } else {
      try {
        g.recv(buf, 32, 0);
        FAIL() << "no error";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("expects 32 bytes from rank 0, which sent 16"),
                  std::string::npos) << e.what();
      }
    }
  });
}

TEST(CommErrors, LargeSendToAMismatchedRecvFailsFast) {
  // The receiver detects the mismatch; the sender, blocked on a full ring
  // buffer, learns it through the segment instead of waiting for the timeout.
  auto start = std::chrono::steady_clock::now();
  run_group(2, small_config(), [&](ShmGroup& g) {
    std::vector<char> buf(100000);
    try {
      if (g.rank() == 0) {
        g.send(buf.data(), buf.size(), 1);
      } else {
        g.recv(buf.data(), 32, 0);
      }
      FAIL() << "no error on rank " << g.rank();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("which sent 100000"), std::string::npos) << e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(CommErrors, AllToAllSplitMismatchNamesTheSizes) {
  run_group(2, small_config(), [&](ShmGroup& g) {
    char in[64] = {}, out[64] = {};
    const void* ins[2] = {in, in};
    void* outs[2] = {out, out};
    // Rank 0 sends 16 bytes to rank 1, which expects 8.
    size_t send[2] = {8, 16}, recv[2] = {8, 8};
    if (g.rank() == 1) send[0] = 8, recv[0] = 8;
    try {
      g.all_to_all(ins, send, outs, recv);
      FAIL() << "no error on rank " << g.rank();
    } catch (const CommError& e) {
      // Rank 1 sees the mismatch; rank 0 learns it through the abort.
      EXPECT_NE(std::string(e.what()).find("rank 0 sends 16 bytes to rank 1, which expects 8"),
                std::string::npos) << e.what();
    }
  });
}

TEST(CommErrors, RanksMustAgreeOnTheConfiguration) {
  std::string name = unique_name();
  Config a = small_config(), b = small_config();
  b.small_bytes = a.small_bytes * 2;
  ShmGroup g0(name, 0, 2, a);
  try {
    ShmGroup g1(name, 1, 2, b);
    FAIL() << "no error";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks disagree on the group's configuration"),
              std::string::npos) << e.what();
  }
}

TEST(CommErrors, AbortReachesWaitingPeers) {
  run_group(3, small_config(), [&](ShmGroup& g) {
    if (g.rank() == 2) {
      g.abort("the link between hosts went down");
    } else {
      EXPECT_THROW(g.barrier(), CommError);
    }
    std::string b = g.broken();
    EXPECT_NE(b.find("the link between hosts went down"), std::string::npos) << b;
  });
}

TEST(CommErrors, MissingRankTimesOutNamingIt) {
  Config c = small_config();
  c.timeout = std::chrono::milliseconds(300);
  run_group(3, c, [&](ShmGroup& g) {
    if (g.rank() == 2) {  // never arrives (and stays in the group past the timeout)
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return;
    }
    float x = 1;
    auto start = std::chrono::steady_clock::now();
    try {
      g.all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
      FAIL() << "no error";
    } catch (const CommError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("all_reduce timed out"), std::string::npos) << m;
      EXPECT_NE(m.find("rank(s) 2"), std::string::npos) << m;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    // The group is broken from now on: later calls fail at once.
    EXPECT_FALSE(g.broken().empty());
    EXPECT_THROW(g.barrier(), CommError);
  });
}

TEST(CommErrors, DeadRankIsReportedBeforeTheTimeout) {
  Config c = small_config();
  c.timeout = std::chrono::milliseconds(60000);
  std::string name = unique_name();
  auto before = shm_entries();
  ShmGroup g(name, 0, 2, c);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* peer = new ShmGroup(name, 1, 2, c);  // never destroyed: the process dies
    peer->attach_all();
    _exit(0);  // dies without joining the collective
  }
  g.attach_all();
  auto start = std::chrono::steady_clock::now();
  float x = 1;
  std::string message;
  try {
    g.all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
  } catch (const CommError& e) {
    message = e.what();
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_NE(message.find("rank 1 (pid " + std::to_string(child) + ") exited"), std::string::npos)
      << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // The name was unlinked once both ranks attached: nothing left in /dev/shm.
  EXPECT_EQ(shm_entries(), before);
}

TEST(CommErrors, RankThatDestroyedTheGroupIsReportedAtOnce) {
  // Rank 1 makes one call fewer and destroys its group (destroy_process_group)
  // while its process lives on: rank 0's extra call fails at once, naming the
  // mismatch, instead of waiting out the timeout.
  Config c = small_config();
  c.timeout = std::chrono::milliseconds(60000);
  run_group(2, c, [&](ShmGroup& g) {
    float x = 1;
    g.all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
    if (g.rank() == 1) return;
    auto start = std::chrono::steady_clock::now();
    try {
      g.all_reduce(&x, 1, DType::kFloat32, ReduceOp::kSum);
      FAIL() << "no error";
    } catch (const CommError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("rank 1 destroyed the group after 1 collective call(s)"),
                std::string::npos) << m;
      EXPECT_NE(m.find("different numbers of calls"), std::string::npos) << m;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  });
}

TEST(CommErrors, NoSegmentLeftAfterGroups) {
  auto before = shm_entries();
  run_group(2, small_config(), [](ShmGroup& g) { g.barrier(); });
  EXPECT_EQ(shm_entries(), before);
}

// ---------------------------------------------------------------- peer mappings

TEST(CommPeerMaps, MappingsDoNotOutliveTheBuffers) {
  // Buffers of changing sizes, created and freed in a loop: a peer's cache
  // keeps only the mappings of live buffers (the freed ones were truncated).
  run_group(2, small_config(), [&](ShmGroup& g) {
    for (int it = 0; it < 24; ++it) {
      size_t count = 20000 + size_t(it % 5) * 7001;
      MemfdBuffer buf(count, 3);
      for (size_t i = 0; i < count; ++i) buf.data[i] = value(g.rank(), i);
      g.all_reduce(buf.data, count, DType::kFloat32, ReduceOp::kSum, 1.0, &buf.shared);
      ASSERT_EQ(buf.data[7], value(0, 7) + value(1, 7));
      // Only the peer's current buffer is mapped here.
      EXPECT_EQ(g.mapped_peer_count(), 1u) << "iteration " << it;
      EXPECT_LE(g.mapped_peer_bytes(), (count + 3) * sizeof(float) + 4096);
      g.barrier();  // no rank frees its buffer while the peer might map it
    }
  });
}

TEST(CommPeerMaps, CacheIsCappedInEntriesAndBytes) {
  // Live buffers, all kept: the cache stays within both caps (least recently
  // used dropped), and the results stay right when a dropped one is remapped.
  for (bool by_bytes : {false, true}) {
    Config c = small_config();
    const size_t count = 30000;
    const size_t one = (count + 1) * sizeof(float) + 4096;
    if (by_bytes) c.peer_map_bytes = 2 * one + 100; else c.peer_map_entries = 3;
    run_group(2, c, [&](ShmGroup& g) {
      std::vector<std::unique_ptr<MemfdBuffer>> bufs;
      for (int i = 0; i < 6; ++i) bufs.push_back(std::make_unique<MemfdBuffer>(count, 1));
      for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < 6; ++i) {
          auto& b = *bufs[i];
          for (size_t k = 0; k < count; ++k) b.data[k] = value(g.rank(), k + i);
          g.all_reduce(b.data, count, DType::kFloat32, ReduceOp::kSum, 1.0, &b.shared);
          ASSERT_EQ(b.data[11], value(0, 11 + i) + value(1, 11 + i));
          EXPECT_LE(g.mapped_peer_count(), by_bytes ? 2u : 3u);
          EXPECT_LE(g.mapped_peer_bytes(), by_bytes ? 2 * one : 3 * one);
        }
      }
      g.barrier();
    });
  }
}

// ---------------------------------------------------------------- signatures

namespace {
// Runs a(g) on rank 0 and b(g) on the others; every rank must fail with the
// mismatch message, containing `want`; the group is then unusable.
void expect_mismatch(int size, const std::function<void(ShmGroup&)>& a,
                     const std::function<void(ShmGroup&)>& b, const std::string& want) {
  auto start = std::chrono::steady_clock::now();
  run_group(size, small_config(), [&](ShmGroup& g) {
    try {
      if (g.rank() == 0) a(g); else b(g);
      FAIL() << "no error on rank " << g.rank() << " (" << want << ")";
    } catch (const CommError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("do not match across ranks"), std::string::npos) << m;
      EXPECT_NE(m.find(want), std::string::npos) << "rank " << g.rank() << ": " << m;
    }
    EXPECT_FALSE(g.broken().empty());
    EXPECT_THROW(g.barrier(), CommError);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}
}  // namespace

TEST(CommSignatures, MismatchedCallsFailOnEveryRank) {
  static std::vector<float> buf0(600000), buf1(600000), buf2(600000);
  auto buf = [](ShmGroup& g) { return g.rank() == 0 ? buf0.data() : g.rank() == 1 ? buf1.data() : buf2.data(); };
  auto ar = [&](size_t n, DType dt, ReduceOp op) {
    return [=](ShmGroup& g) { g.all_reduce(buf(g), n, dt, op); };
  };
  for (int size : {2, 3}) {
    // Element counts (small and large paths), dtypes, ops.
    expect_mismatch(size, ar(100, DType::kFloat32, ReduceOp::kSum),
                    ar(120, DType::kFloat32, ReduceOp::kSum),
                    "rank 0 called all_reduce #0 (float32, 100 elements, SUM) but rank 1 called "
                    "all_reduce #0 (float32, 120 elements, SUM)");
    expect_mismatch(size, ar(500000, DType::kFloat32, ReduceOp::kSum),
                    ar(500020, DType::kFloat32, ReduceOp::kSum), "500020 elements");
    expect_mismatch(size, ar(64, DType::kFloat32, ReduceOp::kSum),
                    ar(64, DType::kBFloat16, ReduceOp::kSum), "(bfloat16, 64 elements, SUM)");
    expect_mismatch(size, ar(64, DType::kFloat32, ReduceOp::kSum),
                    ar(64, DType::kFloat32, ReduceOp::kMax), "(float32, 64 elements, MAX)");
    // Kinds and roots.
    expect_mismatch(size, ar(64, DType::kFloat32, ReduceOp::kSum),
                    [&](ShmGroup& g) { g.broadcast(buf(g), 256, 0); },
                    "but rank 1 called broadcast #0 (256 bytes, root 0)");
    expect_mismatch(size, [&](ShmGroup& g) { g.broadcast(buf(g), 256, 0); },
                    [&](ShmGroup& g) { g.broadcast(buf(g), 256, 1); },
                    "rank 0 called broadcast #0 (256 bytes, root 0) but rank 1 called "
                    "broadcast #0 (256 bytes, root 1)");
    expect_mismatch(size, [&](ShmGroup& g) { g.reduce(buf(g), 64, DType::kInt32, ReduceOp::kSum, 0); },
                    [&](ShmGroup& g) { g.reduce(buf(g), 64, DType::kInt32, ReduceOp::kSum, 1); },
                    "(int32, 64 elements, SUM, root 1)");
    expect_mismatch(size, [&](ShmGroup& g) { g.barrier(); },
                    [&](ShmGroup& g) { g.reduce(buf(g), 64, DType::kInt8, ReduceOp::kSum, 0); },
                    "rank 0 called barrier #0 but rank 1 called reduce #0");
    expect_mismatch(size, [&](ShmGroup& g) {
                      std::vector<void*> outs(g.size(), buf(g) + 1000);
                      g.gather(buf(g), 16, outs.data(), 0);
                    }, [&](ShmGroup& g) {
                      std::vector<const void*> ins(g.size(), buf(g) + 1000);
                      g.scatter(ins.data(), 16, buf(g), 0);
                    }, "rank 0 called gather #0 (16 bytes, root 0) but rank 1 called scatter #0");
    // A tagged dtype (what the process group passes for byte-moving calls).
    expect_mismatch(size, [&](ShmGroup& g) {
                      g.set_dtype_tag(static_cast<int>(DType::kFloat32));
                      std::vector<void*> outs;
                      for (int r = 0; r < g.size(); ++r) outs.push_back(buf(g) + 1000 + r * 64);
                      g.all_gather(buf(g), 256, outs.data());
                    }, [&](ShmGroup& g) {
                      g.set_dtype_tag(static_cast<int>(DType::kInt64));
                      std::vector<void*> outs;
                      for (int r = 0; r < g.size(); ++r) outs.push_back(buf(g) + 1000 + r * 64);
                      g.all_gather(buf(g), 256, outs.data());
                    }, "all_gather #0 (256 bytes of int64)");
    // Memory layouts (what the process group tags every call with).
    const int cl[] = {0, 2, 3, 1};
    const int odd[] = {1, 0, 2};
    expect_mismatch(size, [&](ShmGroup& g) {
                      g.set_layout_tag(0);
                      g.all_reduce(buf(g), 64, DType::kFloat32, ReduceOp::kSum);
                    }, [&](ShmGroup& g) {
                      g.set_layout_tag(ShmGroup::layout_tag(cl, 4));
                      g.all_reduce(buf(g), 64, DType::kFloat32, ReduceOp::kSum);
                    }, "rank 0 called all_reduce #0 (float32, 64 elements, SUM, contiguous) but "
                       "rank 1 called all_reduce #0 (float32, 64 elements, SUM, channels_last)");
    expect_mismatch(size, [&](ShmGroup& g) {
                      g.set_layout_tag(ShmGroup::layout_tag(odd, 3));
                      g.broadcast(buf(g), 256, 0);
                    }, [&](ShmGroup& g) {
                      g.set_layout_tag(0);
                      g.broadcast(buf(g), 256, 0);
                    }, "(256 bytes, root 0, strided, memory order (1, 0, 2))");
    // A rank that skipped a call pairs its next one with the others' earlier one.
    expect_mismatch(size, [&](ShmGroup& g) {
                      g.all_reduce(buf(g), 64, DType::kFloat32, ReduceOp::kSum);
                      g.broadcast(buf(g), 256, 0);
                    }, [&](ShmGroup& g) { g.broadcast(buf(g), 256, 0); },
                    "rank 0 called all_reduce #0 (float32, 64 elements, SUM) but rank 1 called "
                    "broadcast #0");
  }
}

TEST(CommSignatures, MatchingCallsAfterManyStepsStillCompare) {
  // Sequence numbers advance per call, whatever the number of steps.
  static std::vector<float> a0(300000), a1(300000);
  run_group(2, small_config(), [&](ShmGroup& g) {
    float* a = g.rank() == 0 ? a0.data() : a1.data();
    for (int i = 0; i < 5; ++i) g.all_reduce(a, 300000, DType::kFloat32, ReduceOp::kSum);
    try {
      if (g.rank() == 0) g.all_reduce(a, 10, DType::kFloat32, ReduceOp::kSum);
      else g.all_reduce(a, 10, DType::kFloat32, ReduceOp::kMin);
      FAIL() << "no error";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce #5 (float32, 10 elements, MIN)"),
                std::string::npos) << e.what();
    }
  });
}

TEST(CommSignatures, RecvOfAnotherDtypeFails) {
  run_group(2, small_config(), [&](ShmGroup& g) {
    char buf[64] = {};
    try {
      if (g.rank() == 0) {
        g.send_recv_batch({P2POp{true, 1, buf, 16, static_cast<int>(DType::kFloat32)}});
        g.barrier();  // learns the receiver's failure here
      } else {
        g.send_recv_batch({P2POp{false, 0, buf, 16, static_cast<int>(DType::kInt32)}});
      }
      FAIL() << "no error on rank " << g.rank();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("expects int32 from rank 0, which sent float32"),
                std::string::npos) << e.what();
    }
  });
}
