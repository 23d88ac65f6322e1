#include "Fusion.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <numeric>
#include <memory>
#include <string>
#include <vector>

#include <ATen/TensorIterator.h>
#include <ATen/ops/mean_cpu_dispatch.h>
#include <ATen/ops/sum_cpu_dispatch.h>
#include <c10/util/Exception.h>

#include "../core/AxonRuntime.h"
#include "../core/CachingAllocator.h"
#include "../core/StreamWork.h"
#include "CpuKernel.h"
#include "KernelSelect.h"

namespace at::axon::fusion {
namespace {

using cpu_kernel::DeviceView;
using cpu_kernel::Fusible;
using cpu_kernel::FusionKind;

std::atomic<int64_t> n_chains{0}, n_fused{0}, n_ops{0}, n_tiles{0}, n_not_written{0};

// Tests: the op (by name) that fails when it runs fused.
std::mutex fail_mutex;
std::string fail_op;
std::atomic<bool> fail_set{false};

bool failsForTest(const char* name) {
  if (!fail_set.load(std::memory_order_relaxed) || name == nullptr) return false;
  std::lock_guard<std::mutex> g(fail_mutex);
  return fail_op == name;
}

// Vector loops step by at most 2 x 64 elements (int8 on AVX-512); tiles that
// start at multiples of this meet the same vector/scalar split as the whole.
constexpr int64_t kAlign = 128;
// Own ops run over blocks of about this many elements (8 KiB of float32).
constexpr int64_t kBlockElements = 2048;

int64_t l2Bytes() {
  static const int64_t bytes = [] {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index2/size");
    std::string s;
    int64_t v = 0;
    if (f >> s && !s.empty()) {
      try {
        v = std::stoll(s);
        if (s.back() == 'K') v <<= 10;
        else if (s.back() == 'M') v <<= 20;
      } catch (...) {
        v = 0;
      }
    }
    return v >= (64 << 10) ? v : int64_t{1} << 20;
  }();
  return bytes;
}

// The bytes of full tensors one tile may hold: L2's size, or
// AXON_FUSION_TILE_BYTES, or what a test set (setTileBytesForTest).
std::atomic<int64_t> tile_bytes_override{0};
// Tests: runs of own ops on the worker (1), on the team in blocks (2), or as
// the thread policy measured (0).
std::atomic<int> own_threads_override{0};

int64_t tileBudget() {
  static const int64_t from_env = [] {
    if (const char* e = std::getenv("AXON_FUSION_TILE_BYTES")) {
      try {
        const int64_t v = std::stoll(e);
        if (v >= 4096) return v;
      } catch (...) {
      }
    }
    return l2Bytes();
  }();
  const int64_t o = tile_bytes_override.load(std::memory_order_relaxed);
  return o > 0 ? o : from_env;
}

enum class Cls : uint8_t { kFull, kCol, kRow, kScalar };

// A device tensor of a fused op in the run's frame (rows x C).
struct Operand {
  const DeviceView* v = nullptr;
  Cls cls = Cls::kScalar;
  const char* base = nullptr;  // element 0
  int64_t stride = 0;          // elements between rows (full, column)
  const char* lo = nullptr;    // bytes spanned
  const char* hi = nullptr;
  bool written = false;
};

// Ops the engine runs with its own loops: each element computed in float
// from the inputs' values and rounded once to the result's dtype, which is
// what ATen's kernels compute for these ops and dtypes (IEEE operations, no
// approximations), so results are bitwise ATen's; the differential tests
// (tests/ops/test_adaptive_eager.py) hold them to it.  Not sqrt: ATen's
// float32 sqrt goes through MKL's VML, which is not correctly rounded.
// Others run ATen's kernel on tile views.
enum class Own : uint8_t { kNone, kAdd, kSub, kMul, kDiv, kNeg, kSquare, kRsqrt, kCopy, kRowSum, kRowMean };

struct OpPlan {
  Fusible* f = nullptr;
  c10::SmallVector<Operand, 6> operands;  // as f->views; the output last
  bool col_space = false;                 // a pointwise op over the columns
  Own own = Own::kNone;
  // The own op's inputs: an operand's index, or -1 for a number (value).
  int8_t in[2] = {-1, -1};
  float number[2] = {0, 0};
};

bool floatType(c10::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

bool nameIs(const char* name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (std::strcmp(name, n) == 0) return true;
  return false;
}

// AXON_FUSION_OWN=0: every fused op runs ATen's kernel (for measuring).
bool ownLoops() {
  static const bool on = [] {
    const char* e = std::getenv("AXON_FUSION_OWN");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

// Which own op runs p (Own::kNone: ATen's kernel), and its inputs.
void chooseOwn(OpPlan& p) {
  const Fusible& f = *p.f;
  if (!ownLoops()) return;
#if defined(__x86_64__)
  // float32 row sums and means: ATen's summation order replayed (rowSum).
  if ((f.kind == FusionKind::kRowSum || f.kind == FusionKind::kRowMean) && f.views.size() == 2 &&
      f.views[0]->scalar_type() == at::kFloat && f.views[1]->scalar_type() == at::kFloat &&
      (!f.reduce_dtype.has_value() || *f.reduce_dtype == at::kFloat)) {
    p.own = f.kind == FusionKind::kRowSum ? Own::kRowSum : Own::kRowMean;
    p.in[0] = 0;
    return;
  }
#endif
  if (f.kind != FusionKind::kPointwise || f.name == nullptr) return;
  Own op = Own::kNone;
  int arity = 2;
  const char* n = f.name;
  if (nameIs(n, {"aten::add.Tensor", "aten::add.out", "aten::add_.Tensor"})) op = Own::kAdd;
  else if (nameIs(n, {"aten::sub.Tensor", "aten::sub.out", "aten::sub_.Tensor"})) op = Own::kSub;
  else if (nameIs(n, {"aten::mul.Tensor", "aten::mul.out", "aten::mul_.Tensor"})) op = Own::kMul;
  else if (nameIs(n, {"aten::div.Tensor", "aten::div.out", "aten::div_.Tensor"})) op = Own::kDiv;
  else if (nameIs(n, {"aten::neg", "aten::neg.out"})) op = Own::kNeg, arity = 1;
  else if (nameIs(n, {"aten::rsqrt", "aten::rsqrt.out"})) op = Own::kRsqrt, arity = 1;
  else if (nameIs(n, {"aten::pow.Tensor_Scalar", "aten::pow.Tensor_Scalar_out"})) op = Own::kSquare, arity = 1;
  else if (nameIs(n, {"aten::copy_"})) op = Own::kCopy, arity = 1;
  if (op == Own::kNone || f.args.size() != static_cast<size_t>(arity) + 1) return;
  // Scalars: add/sub's alpha must be 1, pow's exponent 2.
  if (op == Own::kAdd || op == Own::kSub) {
    if (f.scalars.size() != 1 || !f.scalars[0].equal(1)) return;
  } else if (op == Own::kSquare) {
    if (f.scalars.size() != 1 || !f.scalars[0].equal(2)) return;
  } else if (!f.scalars.empty()) {
    return;
  }
  const c10::ScalarType out = f.views.back()->scalar_type();
  if (!floatType(out)) return;
  int next = 0;
  for (int k = 0; k < arity; ++k) {
    const DeviceView& a = *f.args[k];
    if (a.on_device) {
      if (a.scalar_type() != out && op != Own::kCopy) return;
      if (!floatType(a.scalar_type())) return;
      p.in[k] = static_cast<int8_t>(next++);
    } else if (a.number.has_value() && out == at::kFloat && op != Own::kCopy &&
               a.number->isFloatingPoint()) {
      // A Python float with float32 tensors: computed as float(number).
      p.in[k] = -1;
      p.number[k] = static_cast<float>(a.number->toDouble());
    } else {
      return;
    }
  }
  if (op != Own::kCopy && arity == 2 && p.in[0] < 0) return;  // number first: ATen's
  p.own = op;
}

int64_t numelOf(const DeviceView& v) {
  int64_t n = 1;
  for (int64_t s : v.sizes) n *= s;
  return n;
}

// The dims [0, end) of size > 1 as one dimension: its stride (the innermost
// such dim's), or false if their strides do not nest.
bool collapse(const DeviceView& v, size_t end, int64_t* stride) {
  bool any = false;
  int64_t expected = 0;
  *stride = 1;
  for (size_t d = end; d-- > 0;) {
    if (v.sizes[d] == 1) continue;
    if (!any) {
      *stride = v.strides[d];
      any = true;
    } else if (v.strides[d] != expected) {
      return false;
    }
    expected = v.strides[d] * v.sizes[d];
  }
  return true;
}

void setSpan(Operand& o) {
  const int64_t item = static_cast<int64_t>(o.v->dtype.itemsize());
  int64_t last = 0;
  for (size_t d = 0; d < o.v->sizes.size(); ++d) {
    if (o.v->strides[d] < 0) {
      o.lo = nullptr;  // marks "not fusible"
      return;
    }
    last += (o.v->sizes[d] - 1) * o.v->strides[d];
  }
  o.base = static_cast<const char*>(o.v->data) + o.v->offset * item;
  o.lo = o.base;
  o.hi = o.base + (last + 1) * item;
}

// Classifies v as `cls` in the frame (rows, C); false if it is not one.
bool classify(const DeviceView& v, Cls cls, int64_t rows, int64_t C, Operand* out) {
  if (v.conj || v.neg) return false;
  const int64_t n = numelOf(v);
  const size_t rank = v.sizes.size();
  Operand o;
  o.v = &v;
  o.cls = cls;
  switch (cls) {
    case Cls::kFull: {
      if (rank == 0 || n != rows * C || v.sizes.back() != C || v.strides.back() != 1) return false;
      if (!collapse(v, rank - 1, &o.stride)) return false;
      if (rows == 1) o.stride = C;
      if (o.stride < C) return false;
      break;
    }
    case Cls::kCol: {
      // Not a 0-dim tensor: a (1, 1) view would promote types as a
      // dimensioned tensor does.
      if (n != rows || rank == 0) return false;
      if (!collapse(v, rank, &o.stride)) return false;
      if (rows == 1) o.stride = 1;
      if (o.stride < 1) return false;
      break;
    }
    case Cls::kRow:
      if (rank == 0 || n != C || v.sizes.back() != C || v.strides.back() != 1) return false;
      break;
    case Cls::kScalar:
      if (n != 1) return false;
      break;
  }
  setSpan(o);
  if (o.lo == nullptr) return false;
  *out = o;
  return true;
}

bool overlaps(const Operand& a, const Operand& b) { return a.lo < b.hi && b.lo < a.hi; }

bool sameRegion(const Operand& a, const Operand& b) {
  return a.cls == b.cls && (a.cls == Cls::kFull || a.cls == Cls::kCol) && a.base == b.base &&
         a.stride == b.stride && a.v->dtype == b.v->dtype;
}

// Can a result live in a scratch tile instead (see Dead)?  The free log knows
// blocks by their start; the tile keeps the result's dense layout.
bool scratchable(const Operand& o, int64_t C) {
  if (o.v->offset != 0) return false;
  if (o.cls == Cls::kFull) return o.stride == C;
  return o.cls == Cls::kCol && o.stride == 1;
}

// The run being planned: its frame and the ops taken so far.
struct Plan {
  int64_t rows = -1;  // unknown until the first op
  int64_t C = 0;      // unknown while only column ops were seen
  bool any_aten_col = false;   // an ATen kernel over the columns
  bool any_aten_full = false;  // an ATen pointwise kernel over the full frame
  int64_t row_bytes = 0;  // of the distinct full tensors
  bool counted_scratch = false;
  c10::SmallVector<const char*, 16> full_bases;
  c10::SmallVector<OpPlan, 16> ops;

  int64_t align() const {
    return any_aten_col    ? kAlign
           : any_aten_full ? kAlign / std::gcd(kAlign, std::max<int64_t>(C, 1))
                           : 1;
  }

  const uint64_t* seqs = nullptr;  // the offered tasks' sequence numbers

  // Results freed before the op at `before` was launched (Dead in runFused):
  // (the op that wrote it, the launch count at its free).
  struct Freed {
    size_t op;
    uint64_t at;
  };
  c10::SmallVector<Freed, 8> freed_results;

  // Does op qi's access e go to a scratch tile, the result's memory being
  // free by the launch of sequence number `seq`?
  bool inScratch(size_t qi, const Operand& e, uint64_t seq) const {
    for (const Freed& d : freed_results) {
      if (d.at >= seq || seqs[qi] > d.at) continue;
      if (e.written ? qi < d.op : qi <= d.op) continue;
      if (sameRegion(ops[d.op].operands.back(), e)) return true;
    }
    return false;
  }

  // Appends f if it fits the frame and its memory does not conflict.
  bool add(Fusible* f) {
    if (f->kind == FusionKind::kNone || f->views.empty()) return false;
    const DeviceView& out = *f->views.back();
    const int64_t n_out = numelOf(out);
    if (n_out == 0) return false;
    OpPlan p;
    p.f = f;
    int64_t rows_ = rows, C_ = C;
    if (f->kind == FusionKind::kRowSum || f->kind == FusionKind::kRowMean) {
      if (f->views.size() != 2) return false;
      const DeviceView& in = *f->views[0];
      if (in.sizes.empty()) return false;
      const int64_t c = in.sizes.back();
      if (c < 2) return false;
      const int64_t r = numelOf(in) / c;
      if ((rows_ >= 0 && r != rows_) || (C_ > 0 && c != C_)) return false;
      rows_ = r;
      C_ = c;
      Operand a, b;
      if (!classify(in, Cls::kFull, rows_, C_, &a) || !classify(out, Cls::kCol, rows_, C_, &b))
        return false;
      p.operands.push_back(a);
      p.operands.push_back(b);
      p.col_space = true;  // mean divides the column; sum writes one
    } else {
      // Pointwise: over the full frame or over the columns.
      bool full_space;
      if (out.sizes.empty()) return false;
      const int64_t last = out.sizes.back();
      if (rows_ < 0) {
        full_space = last >= 2;
        if (full_space) {
          C_ = last;
          rows_ = n_out / last;
        } else {
          rows_ = n_out;
        }
      } else if (C_ > 0 && last == C_ && n_out == rows_ * C_) {
        full_space = true;
      } else if (C_ == 0 && last >= 2 && n_out == rows_ * last) {
        full_space = true;
        C_ = last;
      } else if (n_out == rows_) {
        full_space = false;
      } else {
        return false;
      }
      for (size_t i = 0; i + 1 < f->views.size(); ++i) {
        const DeviceView& v = *f->views[i];
        Operand o;
        const bool ok =
            full_space ? (classify(v, Cls::kFull, rows_, C_, &o) ||
                          (!v.sizes.empty() && v.sizes.back() == 1 &&
                           classify(v, Cls::kCol, rows_, C_, &o)) ||
                          classify(v, Cls::kRow, rows_, C_, &o) ||
                          classify(v, Cls::kScalar, rows_, C_, &o))
                       : (classify(v, Cls::kCol, rows_, C_, &o) ||
                          classify(v, Cls::kScalar, rows_, C_, &o));
        if (!ok) return false;
        p.operands.push_back(o);
      }
      Operand o;
      if (!classify(out, full_space ? Cls::kFull : Cls::kCol, rows_, C_, &o)) return false;
      p.operands.push_back(o);
      p.col_space = !full_space;
    }
    Operand& written = p.operands.back();
    written.written = true;
    // Memory: what this op touches against what earlier ops wrote, and what
    // it writes against everything earlier ops touched (and its own inputs):
    // the same region (tiles then meet in order) or disjoint.
    // An earlier access that goes to a dead result's scratch tile touches
    // no memory: the allocator may have handed that memory to this op.
    const uint64_t seq = seqs[ops.size()];
    for (const Operand& o : p.operands) {
      for (size_t qi = 0; qi < ops.size(); ++qi) {
        for (const Operand& e : ops[qi].operands) {
          if ((e.written || o.written) && overlaps(o, e) && !sameRegion(o, e) &&
              !inScratch(qi, e, seq))
            return false;
        }
      }
      if (&o != &written && overlaps(o, written) && !sameRegion(o, written)) return false;
    }
    // The working set of the smallest tile must still fit the budget: a run
    // that outgrows it (say, a chain repeated over other tensors) ends here.
    int64_t more = 0;
    c10::SmallVector<const char*, 6> new_bases;
    // A result already freed on the host will likely stay in scratch tiles,
    // which dead results share: counted once.
    const Operand& out_op = p.operands.back();
    const bool freed = out_op.cls == Cls::kFull && out_op.v->offset == 0 &&
                       freedAt(f->device, f->stream, out_op.v->data, f->free_mark).has_value();
    if (freed && !counted_scratch) {
      more += C_ * static_cast<int64_t>(out_op.v->dtype.itemsize());
    }
    for (const Operand& o : p.operands) {
      if (o.cls != Cls::kFull || (freed && &o == &out_op)) continue;
      if (std::find(full_bases.begin(), full_bases.end(), o.base) != full_bases.end()) continue;
      if (std::find(new_bases.begin(), new_bases.end(), o.base) != new_bases.end()) continue;
      new_bases.push_back(o.base);
      more += C_ * static_cast<int64_t>(o.v->dtype.itemsize());
    }
    chooseOwn(p);
    // A launch on the team runs in parts whose bounds may round an element
    // as ATen's scalar tail instead of its vector loop: only an own op
    // (exactly rounded, the same bits anywhere) takes its place in a run.
    if (f->team && (p.own == Own::kNone || f->kind != FusionKind::kPointwise)) return false;
    // ATen kernels that raise on data (integer division by zero, integers
    // to negative powers) run alone: a fused run cannot stop at one op.
    if (p.own == Own::kNone && f->kind == FusionKind::kPointwise &&
        !c10::isFloatingType(out.scalar_type()) && !c10::isComplexType(out.scalar_type()) &&
        (std::strstr(f->name, "div") != nullptr || std::strstr(f->name, "pow") != nullptr ||
         std::strstr(f->name, "remainder") != nullptr || std::strstr(f->name, "fmod") != nullptr)) {
      return false;
    }
    // Tiles must start where ATen's vector loops would have split: a
    // multiple of 128 elements (of 128 rows for an op over the columns).
    // Own ops and row reductions compute each element (row) alike anywhere.
    const bool aten_pointwise = p.own == Own::kNone && f->kind == FusionKind::kPointwise;
    const bool col = any_aten_col || (aten_pointwise && p.col_space);
    const bool full = any_aten_full || (aten_pointwise && !p.col_space);
    const int64_t min_rows = col    ? kAlign
                             : full ? kAlign / std::gcd(kAlign, std::max<int64_t>(C_, 1))
                                    : 1;
    // (A run whose first op alone is over the budget, rows too long for a
    // cache, goes on in one-row tiles: no locality to lose.)
    const int64_t budget = tileBudget();
    const int64_t tile_rows = std::min(min_rows, rows_);
    if (!ops.empty() && (row_bytes + more) * tile_rows > budget &&
        row_bytes * tile_rows <= budget) {
      return false;
    }
    row_bytes += more;
    counted_scratch = counted_scratch || freed;
    full_bases.append(new_bases.begin(), new_bases.end());
    rows = rows_;
    C = C_;
    any_aten_col = col;
    any_aten_full = full;
    ops.push_back(std::move(p));
    const Operand& res = ops.back().operands.back();
    if (scratchable(res, C)) {
      if (auto at = freedAt(f->device, f->stream, res.v->data, f->free_mark)) {
        if (*at >= seqs[ops.size() - 1]) freed_results.push_back(Freed{ops.size() - 1, *at});
      }
    }
    return true;
  }
};


// One CPU storage per device storage: views of one memory share it, as
// the op-by-op host views do (CpuKernel.h's SameViews).
struct Storages {
  c10::SmallVector<std::pair<const void*, c10::Storage>, 8> list;
  const c10::Storage& of(const DeviceView& v) {
    for (const auto& [p, s] : list)
      if (p == v.data) return s;
    list.emplace_back(v.data, c10::Storage(c10::Storage::use_byte_size_t(), v.nbytes,
                                           c10::DataPtr(v.data, c10::Device(c10::kCPU)),
                                           nullptr, false));
    return list.back().second;
  }
};

at::Tensor tileView(const c10::Storage& storage, const Operand& o, int64_t r0, int64_t rows,
                    int64_t C) {
  const DeviceView& v = *o.v;
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), v.dtype);
  int64_t sizes[2], strides[2], offset = v.offset;
  size_t rank = 2;
  switch (o.cls) {
    case Cls::kFull:
      sizes[0] = rows, sizes[1] = C, strides[0] = o.stride, strides[1] = 1;
      offset += r0 * o.stride;
      break;
    case Cls::kCol:
      sizes[0] = rows, sizes[1] = 1, strides[0] = o.stride, strides[1] = 1;
      offset += r0 * o.stride;
      break;
    case Cls::kRow:
      sizes[0] = 1, sizes[1] = C, strides[0] = C, strides[1] = 1;
      break;
    case Cls::kScalar:
      sizes[0] = sizes[1] = strides[0] = strides[1] = 1;
      if (v.sizes.empty()) rank = 0;
      break;
  }
  impl->set_sizes_and_strides(c10::IntArrayRef(sizes, rank), c10::IntArrayRef(strides, rank),
                              offset);
  return at::Tensor(std::move(impl));
}

// A dead result's tile in its scratch buffer (same strides as in device
// memory: it is dense there too).
at::Tensor scratchView(const c10::Storage& storage, const Operand& o, int64_t rows, int64_t C) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), o.v->dtype);
  const int64_t cols = o.cls == Cls::kFull ? C : 1;
  const int64_t sizes[2] = {rows, cols}, strides[2] = {cols, 1};
  impl->set_sizes_and_strides(c10::IntArrayRef(sizes, 2), c10::IntArrayRef(strides, 2), 0);
  return at::Tensor(std::move(impl));
}

// An operand of an own op on one tile: element (r, c) at
// ptr + (r * row + c * col) * itemsize.
struct Ptr {
  char* ptr = nullptr;
  int64_t row = 0, col = 0;
  c10::ScalarType dtype = at::kFloat;
  float number = 0;
  bool is_number = false;
};

#define AXON_INLINE inline __attribute__((always_inline))

// bfloat16 <-> float: exact one way; the other c10::BFloat16(float), written
// so that it vectorises (round to nearest even, NaN to 0x7FC0).
AXON_INLINE float bf16ToFloat(uint16_t h) { return c10::bit_cast<float>(uint32_t{h} << 16); }
AXON_INLINE uint16_t floatToBf16(float v) {
  const uint32_t u = c10::bit_cast<uint32_t>(v);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(v != v ? 0x7FC0u : rounded);
}

// 16 lanes at a time (GCC's vector extensions: one AVX-512 register, two
// AVX2 halves, or the baseline's pieces, whatever the clone compiles for),
// the same bits as the scalar functions above, lane by lane.
typedef uint16_t U16x16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t U32x16 __attribute__((vector_size(64), aligned(4)));
typedef float F32x16 __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kLanes16 = 16;

// (Vectors by reference: by value they would change the baseline's ABI.)
AXON_INLINE void bf16ToFloat16(const uint16_t* q, F32x16& f) {
  U16x16 h;
  std::memcpy(&h, q, sizeof(h));
  const U32x16 w = __builtin_convertvector(h, U32x16) << 16;
  std::memcpy(&f, &w, sizeof(f));
}
AXON_INLINE void loadFloat16(const float* p, F32x16& f) { std::memcpy(&f, p, sizeof(f)); }
AXON_INLINE void floatToBf16x16(const F32x16& v, uint16_t* q) {
  U32x16 u;
  std::memcpy(&u, &v, sizeof(u));
  U32x16 r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  r = (v != v) ? U32x16{} + 0x7FC0u : r;
  const U16x16 h = __builtin_convertvector(r, U16x16);
  std::memcpy(q, &h, sizeof(h));
}
AXON_INLINE void bf16RowToFloat(const uint16_t* q, float* out, int64_t n) {
  int64_t c = 0;
  for (; c + kLanes16 <= n; c += kLanes16) {
    F32x16 f;
    bf16ToFloat16(q + c, f);
    std::memcpy(out + c, &f, sizeof(f));
  }
  for (; c < n; ++c) out[c] = bf16ToFloat(q[c]);
}
AXON_INLINE void floatRowToBf16(const float* v, uint16_t* q, int64_t n) {
  int64_t c = 0;
  for (; c + kLanes16 <= n; c += kLanes16) {
    F32x16 f;
    loadFloat16(v + c, f);
    floatToBf16x16(f, q + c);
  }
  for (; c < n; ++c) q[c] = floatToBf16(v[c]);
}

AXON_INLINE float loadOne(const char* p, c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return *reinterpret_cast<const float*>(p);
    case at::kBFloat16: return static_cast<float>(*reinterpret_cast<const c10::BFloat16*>(p));
    default: return static_cast<float>(*reinterpret_cast<const c10::Half*>(p));
  }
}

// Row r of an input as floats: a pointer into memory when it is a dense
// float32 row, else converted (or broadcast) into buf.
AXON_INLINE const float* loadRow(const Ptr& a, int64_t r, int64_t cols, float* buf) {
  if (a.is_number) {
    std::fill_n(buf, cols, a.number);
    return buf;
  }
  const int64_t item = static_cast<int64_t>(c10::elementSize(a.dtype));
  const char* p = a.ptr + r * a.row * item;
  if (a.col == 0 || cols == 1) {
    std::fill_n(buf, cols, loadOne(p, a.dtype));
    return buf;
  }
  switch (a.dtype) {
    case at::kFloat:
      return reinterpret_cast<const float*>(p);
    case at::kBFloat16: {
      bf16RowToFloat(reinterpret_cast<const uint16_t*>(p), buf, cols);
      return buf;
    }
    default: {
      const auto* q = reinterpret_cast<const c10::Half*>(p);
      for (int64_t c = 0; c < cols; ++c) buf[c] = static_cast<float>(q[c]);
      return buf;
    }
  }
}

AXON_INLINE void storeRow(const Ptr& o, int64_t r, int64_t cols, const float* v) {
  const int64_t item = static_cast<int64_t>(c10::elementSize(o.dtype));
  char* p = o.ptr + r * o.row * item;
  switch (o.dtype) {
    case at::kFloat: {
      auto* q = reinterpret_cast<float*>(p);
      if (q != v) std::copy_n(v, cols, q);
      return;
    }
    case at::kBFloat16: {
      floatRowToBf16(v, reinterpret_cast<uint16_t*>(p), cols);
      return;
    }
    default: {
      auto* q = reinterpret_cast<c10::Half*>(p);
      for (int64_t c = 0; c < cols; ++c) q[c] = c10::Half(v[c]);
      return;
    }
  }
}

// ATen's sum of a contiguous float32 row, in ATen's order (SumKernel.cpp:
// vectorized_inner_sum -> row_sum -> multi_row_sum, a cascade over 4 levels
// of 4 interleaved vector accumulators), lane by lane: the same additions of
// the same values, so the same bits.  L: the lanes of the Vectorized<float>
// the kernel runs with (8: ATen dispatches its sum kernels with AVX2 at most,
// and its default build's vectors have 8 floats too); a row shorter than L
// takes the scalar path (scalar_inner_sum: the same cascade on single values).
AXON_INLINE int64_t ceilLog2(int64_t x) {
  if (x <= 2) return 1;
  return 64 - __builtin_clzll(static_cast<uint64_t>(x) - 1);
}

// One accumulator of L lanes (GCC's vector extension: lane-wise IEEE adds,
// one register on AVX2/AVX-512, two halves on the baseline), so that the 16
// accumulators live in registers, not on the stack.
template <int L>
struct Lanes {
  typedef float type __attribute__((vector_size(L * sizeof(float)), aligned(4)));
};
template <>
struct Lanes<1> {
  using type = float;
};

// acc += the L floats at p (by reference: a vector passed by value would
// change the baseline build's ABI).
template <int L>
AXON_INLINE void addLanes(typename Lanes<L>::type& acc, const float* p) {
  typename Lanes<L>::type v;
  std::memcpy(&v, p, sizeof(v));
  acc += v;
}

template <int L>
AXON_INLINE float rowSumLanes(const float* x, int64_t n) {
  using V = typename Lanes<L>::type;
  const int64_t vec_size = n / L;
  const int64_t size = vec_size / 4;  // multi_row_sum's rows, 4 vectors each
  const int64_t level_power = std::max<int64_t>(4, ceilLog2(size) / 4);
  const int64_t level_step = int64_t{1} << level_power;
  const int64_t mask1 = (level_step - 1) << level_power;
  const int64_t mask2 = mask1 << level_power;
  const V zero = V{} + 0.0f;
  // acc<level><ilp>: 4 levels of the cascade x 4 interleaved accumulators.
  V a00 = zero, a01 = zero, a02 = zero, a03 = zero;
  V a10 = zero, a11 = zero, a12 = zero, a13 = zero;
  V a20 = zero, a21 = zero, a22 = zero, a23 = zero;
  V a30 = zero, a31 = zero, a32 = zero, a33 = zero;
  const auto level0 = [&](int64_t i) {
    const float* p = x + i * 4 * L;
    addLanes<L>(a00, p);
    addLanes<L>(a01, p + L);
    addLanes<L>(a02, p + 2 * L);
    addLanes<L>(a03, p + 3 * L);
  };
  int64_t i = 0;
  for (; i + level_step <= size;) {
    for (int64_t j = 0; j < level_step; ++j, ++i) level0(i);
    a10 += a00, a11 += a01, a12 += a02, a13 += a03;
    a00 = a01 = a02 = a03 = zero;
    if ((i & mask1) != 0) continue;
    a20 += a10, a21 += a11, a22 += a12, a23 += a13;
    a10 = a11 = a12 = a13 = zero;
    if ((i & mask2) != 0) continue;
    a30 += a20, a31 += a21, a32 += a22, a33 += a23;
    a20 = a21 = a22 = a23 = zero;
  }
  for (; i < size; ++i) level0(i);
  a00 += a10, a01 += a11, a02 += a12, a03 += a13;
  a00 += a20, a01 += a21, a02 += a22, a03 += a23;
  a00 += a30, a01 += a31, a02 += a32, a03 += a33;
  // row_sum: the vectors left over, then the 4 partial sums.
  for (int64_t v = size * 4; v < vec_size; ++v) addLanes<L>(a00, x + v * L);
  a00 += a01;
  a00 += a02;
  a00 += a03;
  if constexpr (L == 1) {
    return a00;
  } else {
    // vectorized_inner_sum: the scalar tail, then the lanes in order.
    float final_acc = 0;
    for (int64_t k = vec_size * L; k < n; ++k) final_acc += x[k];
    for (int l = 0; l < L; ++l) final_acc += a00[l];
    return final_acc;
  }
}

AXON_INLINE float rowSum(const float* x, int64_t n) {
  // The kernel's output starts at 0 and accumulates the row's sum.
  return 0.0f + (n >= 8 ? rowSumLanes<8>(x, n) : rowSumLanes<1>(x, n));
}

// q = op(a, b) over n elements into a bfloat16 row in one pass: each input
// a bfloat16 row (A16/B16) or floats, each element computed in float and
// rounded once, as loadRow + the op + storeRow do in three passes.
template <bool A16, bool B16, typename F>
AXON_INLINE void bf16Binary(const void* a, const void* b, uint16_t* q, int64_t n, F f) {
  const auto* a16 = static_cast<const uint16_t*>(a);
  const auto* b16 = static_cast<const uint16_t*>(b);
  const auto* a32 = static_cast<const float*>(a);
  const auto* b32 = static_cast<const float*>(b);
  int64_t c = 0;
  for (; c + kLanes16 <= n; c += kLanes16) {
    F32x16 x, y;
    if constexpr (A16) bf16ToFloat16(a16 + c, x); else loadFloat16(a32 + c, x);
    if constexpr (B16) bf16ToFloat16(b16 + c, y); else loadFloat16(b32 + c, y);
    F32x16 z;
    f(z, x, y);
    floatToBf16x16(z, q + c);
  }
  for (; c < n; ++c) {
    const float x = A16 ? bf16ToFloat(a16[c]) : a32[c];
    const float y = B16 ? bf16ToFloat(b16[c]) : b32[c];
    float z;
    f(z, x, y);
    q[c] = floatToBf16(z);
  }
}

template <typename F>
AXON_INLINE void bf16BinaryAny(bool a16, bool b16, const void* a, const void* b, uint16_t* q,
                               int64_t n, F f) {
  if (a16 && b16) return bf16Binary<true, true>(a, b, q, n, f);
  if (a16) return bf16Binary<true, false>(a, b, q, n, f);
  if (b16) return bf16Binary<false, true>(a, b, q, n, f);
  bf16Binary<false, false>(a, b, q, n, f);
}

// out = op(a[, b]) over rows x cols, each element in float, rounded once.
// Compiled for AVX-512, AVX2 and the baseline (picked at load time); this
// file is built without floating-point contraction (an FMA would round once
// where the op rounds twice).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void runOwn(Own op, const Ptr* in, const Ptr& out, int64_t rows, int64_t cols) {
  thread_local std::vector<float> bufs;
  if (bufs.size() < static_cast<size_t>(3 * cols)) bufs.resize(3 * cols);
  float* ba = bufs.data();
  float* bb = ba + cols;
  float* bo = bb + cols;
  const int64_t item = static_cast<int64_t>(c10::elementSize(out.dtype));
  if (op == Own::kRowSum || op == Own::kRowMean) {
    // float32 rows of `cols` elements to one float32 each (mean: sum_out,
    // then div_ by the row length, as ATen's CPU mean).
    const float n = static_cast<float>(cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float sum = rowSum(reinterpret_cast<const float*>(in[0].ptr) + r * in[0].row, cols);
      reinterpret_cast<float*>(out.ptr)[r * out.row] = op == Own::kRowSum ? sum : sum / n;
    }
    return;
  }
  // Bytes, not values: a copy within one dtype, and the negation of a 16-bit
  // float (ATen flips the sign bit; through float a NaN would lose its bits).
  if ((op == Own::kCopy || (op == Own::kNeg && item == 2)) && !in[0].is_number &&
      in[0].dtype == out.dtype) {
    const uint16_t flip = op == Own::kNeg ? 0x8000 : 0;
    for (int64_t r = 0; r < rows; ++r) {
      const char* a = in[0].ptr + r * in[0].row * item;
      char* o = out.ptr + r * out.row * item;
      if (item == 2) {
        const auto* a16 = reinterpret_cast<const uint16_t*>(a);
        auto* o16 = reinterpret_cast<uint16_t*>(o);
        for (int64_t c = 0; c < cols; ++c) o16[c] = a16[c * in[0].col] ^ flip;
      } else if (in[0].col == 1 || cols == 1) {
        std::memmove(o, a, static_cast<size_t>(cols * item));
      } else {
        const auto* a32 = reinterpret_cast<const float*>(a);
        std::fill_n(reinterpret_cast<float*>(o), cols, *a32);
      }
    }
    return;
  }
  const bool direct = out.dtype == at::kFloat && (out.col == 1 || cols == 1);
  // An input the same for every row (a row vector, a single value, a
  // number) is converted once; one value per element is a broadcast scalar.
  const auto uniform = [&](const Ptr& a) { return a.is_number || a.row == 0; };
  const auto single = [&](const Ptr& a) { return a.is_number || a.col == 0 || cols == 1; };
  const float* fixed[2] = {nullptr, nullptr};
  float* bufs_in[2] = {ba, bb};
  const int arity = op == Own::kAdd || op == Own::kSub || op == Own::kMul || op == Own::kDiv ? 2 : 1;
  for (int k = 0; k < arity; ++k) {
    if (uniform(in[k]) && !single(in[k])) fixed[k] = loadRow(in[k], 0, cols, bufs_in[k]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = direct ? reinterpret_cast<float*>(out.ptr + r * out.row * item) : bo;
    // A copy converts straight into the result row.
    if (op == Own::kCopy) {
      const float* a = loadRow(in[0], r, cols, o);
      if (!direct) {
        storeRow(out, r, cols, a);  // converted from where the row is
      } else if (a != o) {
        std::copy_n(a, cols, o);
      }
      continue;
    }
    if (arity == 2 && (single(in[0]) || single(in[1]))) {
      // vector op scalar (or scalar op vector): no broadcast buffer.
      const bool first = single(in[0]);
      const float sv = single(in[first ? 0 : 1]) ? loadRow(in[first ? 0 : 1], r, 1, bufs_in[first ? 0 : 1])[0] : 0.0f;
      const int vk = first ? 1 : 0;
      const float* v = fixed[vk] != nullptr ? fixed[vk] : loadRow(in[vk], r, cols, bufs_in[vk]);
      if (single(in[vk])) {
        const float x = v[0];
        const float a0 = first ? sv : x, b0 = first ? x : sv;
        float y = 0;
        switch (op) {
          case Own::kAdd: y = a0 + b0; break;
          case Own::kSub: y = a0 - b0; break;
          case Own::kMul: y = a0 * b0; break;
          default: y = a0 / b0; break;
        }
        std::fill_n(o, cols, y);
      } else if (first) {
        switch (op) {
          case Own::kAdd: for (int64_t c = 0; c < cols; ++c) o[c] = sv + v[c]; break;
          case Own::kSub: for (int64_t c = 0; c < cols; ++c) o[c] = sv - v[c]; break;
          case Own::kMul: for (int64_t c = 0; c < cols; ++c) o[c] = sv * v[c]; break;
          default: for (int64_t c = 0; c < cols; ++c) o[c] = sv / v[c]; break;
        }
      } else {
        switch (op) {
          case Own::kAdd: for (int64_t c = 0; c < cols; ++c) o[c] = v[c] + sv; break;
          case Own::kSub: for (int64_t c = 0; c < cols; ++c) o[c] = v[c] - sv; break;
          case Own::kMul: for (int64_t c = 0; c < cols; ++c) o[c] = v[c] * sv; break;
          default: for (int64_t c = 0; c < cols; ++c) o[c] = v[c] / sv; break;
        }
      }
      if (!direct) storeRow(out, r, cols, o);
      continue;
    }
    if (arity == 2 && out.dtype == at::kBFloat16 && out.col == 1 && cols > 1) {
      // Into a bfloat16 row: one pass, reading bfloat16 rows where they are.
      const auto row16 = [&](int k) {
        return fixed[k] == nullptr && in[k].dtype == at::kBFloat16 && in[k].col == 1;
      };
      const bool a16 = row16(0), b16 = row16(1);
      const void* a = a16 ? static_cast<const void*>(in[0].ptr + r * in[0].row * 2)
                          : (fixed[0] != nullptr ? fixed[0] : loadRow(in[0], r, cols, ba));
      const void* b = b16 ? static_cast<const void*>(in[1].ptr + r * in[1].row * 2)
                          : (fixed[1] != nullptr ? fixed[1] : loadRow(in[1], r, cols, bb));
      auto* q = reinterpret_cast<uint16_t*>(out.ptr + r * out.row * 2);
      switch (op) {
        case Own::kAdd: bf16BinaryAny(a16, b16, a, b, q, cols, [](auto& z, const auto& x, const auto& y) { z = x + y; }); break;
        case Own::kSub: bf16BinaryAny(a16, b16, a, b, q, cols, [](auto& z, const auto& x, const auto& y) { z = x - y; }); break;
        case Own::kMul: bf16BinaryAny(a16, b16, a, b, q, cols, [](auto& z, const auto& x, const auto& y) { z = x * y; }); break;
        default: bf16BinaryAny(a16, b16, a, b, q, cols, [](auto& z, const auto& x, const auto& y) { z = x / y; }); break;
      }
      continue;
    }
    const float* a = fixed[0] != nullptr ? fixed[0] : loadRow(in[0], r, cols, ba);
    const float* b = arity == 2 ? (fixed[1] != nullptr ? fixed[1] : loadRow(in[1], r, cols, bb))
                                : nullptr;
    switch (op) {
      case Own::kAdd:
        for (int64_t c = 0; c < cols; ++c) o[c] = a[c] + b[c];
        break;
      case Own::kSub:
        for (int64_t c = 0; c < cols; ++c) o[c] = a[c] - b[c];
        break;
      case Own::kMul:
        for (int64_t c = 0; c < cols; ++c) o[c] = a[c] * b[c];
        break;
      case Own::kDiv:
        for (int64_t c = 0; c < cols; ++c) o[c] = a[c] / b[c];
        break;
      case Own::kNeg:
        for (int64_t c = 0; c < cols; ++c) o[c] = -a[c];
        break;
      case Own::kSquare:
        for (int64_t c = 0; c < cols; ++c) o[c] = a[c] * a[c];
        break;
      case Own::kRsqrt:
        for (int64_t c = 0; c < cols; ++c) o[c] = 1.0f / std::sqrt(a[c]);
        break;
      case Own::kCopy:
      case Own::kRowSum:
      case Own::kRowMean:
      case Own::kNone:
        break;
    }
    if (!direct) storeRow(out, r, cols, o);
  }
}

// One own op of a run over a tile (runFused), for blocks of rows.  An
// operand in a block buffer (slot >= 0) is the same block-sized buffer for
// every block, one per thread; every other pointer is the tile's first row.
struct Step {
  Own op;
  Ptr in[2];
  Ptr out;
  int64_t cols;
  int8_t slot[3];  // in[0], in[1], out: a block buffer, or -1
};
constexpr int kBlockSlots = 8;

struct OwnRun {
  const Step* steps;
  size_t n_steps;
  int64_t rows, block, slot_floats;
};

// Blocks [b_begin, b_end) of the run: each op over a block in turn.
void runOwnBlocks(void* ctx, int64_t b_begin, int64_t b_end) {
  const OwnRun& run = *static_cast<const OwnRun*>(ctx);
  thread_local std::vector<float> block_buffers;
  const size_t need = static_cast<size_t>(kBlockSlots * run.slot_floats);
  if (block_buffers.size() < need) block_buffers.resize(need);
  for (int64_t b = b_begin; b < b_end; ++b) {
    const int64_t b0 = b * run.block;
    const int64_t n = std::min(run.block, run.rows - b0);
    for (size_t k = 0; k < run.n_steps; ++k) {
      const Step& st = run.steps[k];
      const auto at = [&](Ptr q, int slot) {
        if (slot >= 0) {
          q.ptr = reinterpret_cast<char*>(block_buffers.data() + slot * run.slot_floats);
        } else if (!q.is_number) {
          q.ptr += b0 * q.row * static_cast<int64_t>(c10::elementSize(q.dtype));
        }
        return q;
      };
      const Ptr in[2] = {at(st.in[0], st.slot[0]), at(st.in[1], st.slot[1])};
      runOwn(st.op, in, at(st.out, st.slot[2]), n, st.cols);
    }
  }
}

// The thread policy's hook for one run of own ops (a plain object: the run
// happens inside the fused task, which is timed as a whole).
struct OwnRunWork final : Work {
  void run() override {}
};

// A result nothing outside the run can read: the op that writes it, the
// last op (by sequence number) that may touch it, and its scratch tile.
struct Dead {
  size_t op;
  uint64_t until;
  const Operand* region;
  c10::Storage scratch;
  size_t last = 0;  // the last op of the run that touches it
};

// Buffers for dead results' tiles, reused by the worker's later runs.
c10::Storage scratchStorage(std::vector<std::unique_ptr<char[]>>& arena, size_t nbytes) {
  arena.emplace_back(new char[nbytes + 64]);
  void* p = arena.back().get();
  size_t space = nbytes + 64;
  std::align(64, nbytes, p, space);
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes,
                      c10::DataPtr(p, c10::Device(c10::kCPU)), nullptr, false);
}

rt::FusionResult runFused(rt::FusibleTask* const* tasks, const uint64_t* seqs, size_t n) noexcept {
  rt::FusionResult result;
  Plan plan;
  plan.seqs = seqs;
  try {
    for (size_t i = 0; i < n; ++i) {
      if (!plan.add(static_cast<Fusible*>(tasks[i]))) break;
    }
  } catch (...) {
    return result;
  }
  static const bool debug = std::getenv("AXON_FUSION_DEBUG") != nullptr;
  if (debug) {
    std::string line = "axon fusion: " + std::to_string(plan.ops.size()) + " of " + std::to_string(n) + ":";
    for (size_t i = 0; i < n; ++i) {
      line += std::string(i == plan.ops.size() ? " |" : "") + " " +
              static_cast<Fusible*>(tasks[i])->name;
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  n_chains.fetch_add(1, std::memory_order_relaxed);
  if (plan.ops.size() < 2) return result;
  const int64_t R = plan.rows;
  const int64_t C = std::max<int64_t>(plan.C, 1);
  // Tile rows: a multiple of the alignment whose full tensors fit the budget.
  const int64_t align = plan.align();
  int64_t tile = R;
  if (plan.row_bytes > 0) {
    tile = std::max<int64_t>(1, tileBudget() / plan.row_bytes);
    tile = std::max<int64_t>(align, tile / align * align);
  }
  result.ran = plan.ops.size();
  // Results freed before any work outside the run was launched are written
  // to a scratch tile instead of device memory (the allocator may already
  // have handed their blocks to later ops of the run).
  const uint64_t last_seq = seqs[plan.ops.size() - 1];
  std::vector<Dead> dead;
  std::vector<std::unique_ptr<char[]>> arena;
  int64_t not_written = 0;
  try {
    // The frees the plan saw (it relied on them where memory was reused):
    // looked up once, so planning and running agree.
    for (const Plan::Freed& fr : plan.freed_results) {
      if (fr.at > last_seq) continue;
      const size_t i = fr.op;
      const Operand& o = plan.ops[i].operands.back();
      bool inside = false;  // an interval already covers it (an in-place op)
      for (const Dead& d : dead)
        if (sameRegion(*d.region, o) && d.op < i && seqs[i] <= d.until) inside = true;
      if (inside) continue;
      const int64_t item = static_cast<int64_t>(o.v->dtype.itemsize());
      const int64_t per_row = o.cls == Cls::kFull ? C * item : item;
      dead.push_back(Dead{i, fr.at, &o, c10::Storage()});
      not_written += R * per_row;
    }
    // Scratch tiles are shared between dead results whose uses do not
    // overlap (every access is to the tile's own rows, in op order).
    struct Buffer {
      c10::Storage storage;
      size_t bytes;
      size_t free_after;  // the last op that uses it
    };
    std::vector<Buffer> buffers;
    for (Dead& d : dead) {
      size_t last = d.op;
      for (size_t k = d.op + 1; k < plan.ops.size() && seqs[k] <= d.until; ++k)
        for (const Operand& o : plan.ops[k].operands)
          if (sameRegion(*d.region, o)) last = k;
      const int64_t item = static_cast<int64_t>(d.region->v->dtype.itemsize());
      const size_t bytes = static_cast<size_t>(
          std::min(tile, R) * (d.region->cls == Cls::kFull ? C * item : item));
      Buffer* use = nullptr;
      for (Buffer& b : buffers)
        if (b.bytes == bytes && b.free_after < d.op) use = &b;
      if (use == nullptr) {
        buffers.push_back(Buffer{scratchStorage(arena, bytes), bytes, last});
        use = &buffers.back();
      }
      use->free_after = last;
      d.scratch = use->storage;
      d.last = last;
    }
  } catch (...) {
    // No scratch (out of host memory): the ops run one by one instead; the
    // plan relied on the scratch tiles.
    return rt::FusionResult{};
  }
  size_t current = 0;  // the op running (errors name it)
  try {
    c10::WarningUtils::WarningHandlerGuard guard(dropWarnings());
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    setKernelThreads(1);
    Storages storages;
    c10::SmallVector<at::Tensor, 6> views;
    int64_t tiles = 0;
    for (int64_t r0 = 0; r0 < R; r0 += tile) {
      const int64_t rows = std::min(tile, R - r0);
      ++tiles;
      for (size_t i = 0; i < plan.ops.size(); ++i) {
        current = i;
        const OpPlan& p = plan.ops[i];
        // A dead result's scratch tile: for the op that writes it, its output
        // only (its inputs still read what was there before).
        const auto scratchFor = [&](size_t op, const Operand& o) -> const Dead* {
          const Dead* found = nullptr;
          for (const Dead& d : dead)
            if ((o.written ? op >= d.op : op > d.op) && seqs[op] <= d.until &&
                sameRegion(*d.region, o))
              found = &d;
          return found;
        };
        const auto scratchOf = [&](const Operand& o) { return scratchFor(i, o); };
        if (p.own != Own::kNone) {
          // A run of own ops goes block by block (a few rows, in L1), each
          // op over the block in turn.
          const auto ptrOf = [&](size_t op, const Operand& o) {
            Ptr q;
            q.dtype = o.v->scalar_type();
            const int64_t item = static_cast<int64_t>(o.v->dtype.itemsize());
            if (const Dead* d = scratchFor(op, o)) {
              q.ptr = static_cast<char*>(d->scratch.mutable_data());
              q.row = o.cls == Cls::kFull ? C : 1;
              q.col = o.cls == Cls::kFull ? 1 : 0;
              return q;
            }
            char* base = const_cast<char*>(o.base);
            switch (o.cls) {
              case Cls::kFull: q.ptr = base + r0 * o.stride * item, q.row = o.stride, q.col = 1; break;
              case Cls::kCol: q.ptr = base + r0 * o.stride * item, q.row = o.stride, q.col = 0; break;
              case Cls::kRow: q.ptr = base, q.row = 0, q.col = 1; break;
              case Cls::kScalar: q.ptr = base, q.row = 0, q.col = 0; break;
            }
            return q;
          };
          size_t j = i;
          while (j < plan.ops.size() && plan.ops[j].own != Own::kNone && !failsForTest(plan.ops[j].f->name))
            ++j;
          const int64_t block = std::max<int64_t>(1, kBlockElements / C);
          // A dead full-frame result that only ops [i, j) touch lives in a
          // block-sized buffer that stays in L1 (written by one step, read by
          // the next, block after block), not in its tile-sized scratch.
          // Buffers are shared by results whose uses do not overlap.
          struct Slot {
            const Dead* d;
            size_t free_after;
          };
          c10::SmallVector<Slot, kBlockSlots> slots;
          // A result gets its slot at the op that writes it (or never): a
          // later reader finds that slot, or the scratch tile.
          const auto slotOf = [&](const Dead* d, bool writer) -> int {
            for (size_t k = 0; k < slots.size(); ++k)
              if (slots[k].d == d) return static_cast<int>(k);
            if (!writer || d->region->cls != Cls::kFull || d->op < i || d->last >= j) return -1;
            for (size_t k = 0; k < slots.size(); ++k)
              if (slots[k].free_after < d->op) {
                slots[k] = Slot{d, d->last};
                return static_cast<int>(k);
              }
            if (slots.size() == kBlockSlots) return -1;
            slots.push_back(Slot{d, d->last});
            return static_cast<int>(slots.size() - 1);
          };
          c10::SmallVector<Step, 16> steps;
          int64_t step_bytes = 0;
          for (size_t k = i; k < j; ++k) {
            const OpPlan& q = plan.ops[k];
            Step st;
            st.op = q.own;
            const auto place = [&](const Operand& o, Ptr* dst, int8_t* slot) {
              const Dead* d = scratchFor(k, o);
              const bool writer = d != nullptr && d->op == k && &o == &q.operands.back();
              *slot = static_cast<int8_t>(d != nullptr ? slotOf(d, writer) : -1);
              *dst = ptrOf(k, o);
            };
            for (int m = 0; m < 2; ++m) {
              if (q.in[m] >= 0) {
                place(q.operands[q.in[m]], &st.in[m], &st.slot[m]);
              } else {
                st.slot[m] = -1;
                st.in[m].is_number = true;
                st.in[m].number = q.number[m];
              }
            }
            place(q.operands.back(), &st.out, &st.slot[2]);
            st.cols = q.col_space && q.own != Own::kRowSum && q.own != Own::kRowMean ? 1 : C;
            step_bytes += rows * st.cols * static_cast<int64_t>(c10::elementSize(st.out.dtype));
            steps.push_back(st);
          }
          // Blocks are independent (every op is row by row): on the worker
          // alone or spread over the compute team, as the thread policy
          // measured for runs of this size.
          const OwnRun run{steps.data(), steps.size(), rows, block, block * C};
          const int64_t n_blocks = (rows + block - 1) / block;
          OwnRunWork policy;
          const int forced = own_threads_override.load(std::memory_order_relaxed);
          // Chunks of half ATen's grain (a test's forced team: single blocks);
          // a run of fewer than two chunks stays on the worker.
          const int64_t grain =
              forced != 0 ? 1 : std::max<int64_t>(1, at::internal::GRAIN_SIZE / 2 / (block * C));
          int threads = 1;
          if (forced != 0) {
            threads = forced == 2 ? 0 : 1;
          } else if (n_blocks >= 2 * grain) {
            threads = kselect::threadsFor("axon::fused", step_bytes, rows * C, policy,
                                          kselect::TeamKind::kCompute, true);
          }
          const auto t0 = std::chrono::steady_clock::now();
          if (threads == 1) {
            runOwnBlocks(const_cast<OwnRun*>(&run), 0, n_blocks);
          } else {
            ::axon::rt::team_parallel_for(threads == 0 ? kernelTeamSize() : threads, 0, n_blocks,
                                          grain, const_cast<OwnRun*>(&run), &runOwnBlocks);
          }
          if (policy.timed != nullptr) {
            policy.timed->record(
                threads, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          }
          if (j < plan.ops.size() && plan.ops[j].own != Own::kNone) {  // the test's failure
            result.failed = j;
            result.error = "injected failure of a fused op (test)";
            r0 = R;
            break;
          }
          i = j - 1;
          continue;
        }
        views.clear();
        for (size_t k = 0; k < p.operands.size(); ++k) {
          const Operand& o = p.operands[k];
          // The same region twice in one op (in place): one tensor, unless the
          // output goes to a scratch tile and the input comes from memory.
          const Dead* scratch = scratchOf(o);
          size_t same = k;
          for (size_t j = 0; j < k; ++j)
            if (p.operands[j].base == o.base && sameRegion(p.operands[j], o) &&
                scratchOf(p.operands[j]) == scratch)
              same = j;
          if (same != k) {
            views.push_back(views[same]);
            continue;
          }
          views.push_back(scratch != nullptr ? scratchView(scratch->scratch, o, rows, C)
                                             : tileView(storages.of(*o.v), o, r0, rows, C));
        }
        try {
          TORCH_CHECK(!failsForTest(p.f->name), "injected failure of a fused op (test)");
          switch (p.f->kind) {
            case FusionKind::kRowSum:
              at::cpu::sum_outf(views[0], {-1}, true, p.f->reduce_dtype, views[1]);
              break;
            case FusionKind::kRowMean:
              at::cpu::mean_outf(views[0], {-1}, true, p.f->reduce_dtype, views[1]);
              break;
            default:
              p.f->runMapped(views);
          }
        } catch (const c10::Error& e) {
          result.failed = i;
          result.error = e.what_without_backtrace();
          r0 = R;
          break;
        } catch (const std::exception& e) {
          result.failed = i;
          result.error = e.what();
          r0 = R;
          break;
        }
      }
    }
    n_tiles.fetch_add(tiles, std::memory_order_relaxed);
    n_not_written.fetch_add(not_written, std::memory_order_relaxed);
  } catch (const std::exception& e) {
    if (result.error.empty()) result.failed = current, result.error = e.what();
  } catch (...) {
    if (result.error.empty()) result.failed = current, result.error = "unknown exception";
  }
  for (const OpPlan& p : plan.ops) retireWork(p.f->work);
  n_fused.fetch_add(1, std::memory_order_relaxed);
  n_ops.fetch_add(static_cast<int64_t>(plan.ops.size()), std::memory_order_relaxed);
  return result;
}

}  // namespace

void install() { rt::set_fusion_hook(&runFused); }

void setTileBytesForTest(int64_t bytes) { tile_bytes_override.store(bytes); }

void setOwnThreadsForTest(int mode) { own_threads_override.store(mode); }

void failForTest(const std::string& op) {
  std::lock_guard<std::mutex> g(fail_mutex);
  fail_op = op;
  fail_set.store(!op.empty());
}

Stats stats() {
  Stats s;
  s.chains_seen = n_chains.load();
  s.fused_kernels = n_fused.load();
  s.ops_fused = n_ops.load();
  s.tiles = n_tiles.load();
  s.intermediate_bytes_not_written = n_not_written.load();
  return s;
}

void resetStats() {
  n_chains = 0;
  n_fused = 0;
  n_ops = 0;
  n_tiles = 0;
  n_not_written = 0;
}

}  // namespace at::axon::fusion
