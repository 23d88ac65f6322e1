// Attention forward, flash-attention style. A task is one tile of up to kBlockQ rows
// of one (batch, kv head) group (attention_common.h); tasks run in parallel, each
// with its own float32 scratch. With few tasks and many keys (decoding a small
// batch), the keys are split too and the partial softmax states merged at the end.
// Per task, Q is loaded once (times scale), then for each tile of kBlockK keys:
//   S = Q K^T                 tile product; K transposed into the tile, or, for
//                             fewer than kFewRows rows (decoding), dot products
//   S += mask, -inf where hidden (causal, bool mask, padding)
//   online softmax: m' = max(m, rowmax S), P = exp(S - m'), l = l e^(m - m') + rowsum P,
//   O = O e^(m - m') + dropout(P) V
// and finally out = O / l, lse = m + log l. Tiles of keys that causal masking or the
// mask (all false, all -inf) hides from every row of the task are skipped. Only the kBlockQ x kBlockK score tile
// exists at any time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_common.h"
#include "axon/kernels/parallel.h"

namespace axon::kernels {
namespace {

using namespace attention;

// Below this many rows, scores are dot products (no transposed K tile).
constexpr int64_t kFewRows = 8;
// With fewer tasks than this, keys are split too, in runs of at least kMinSplitKeys.
constexpr int64_t kMinWorkItems = 64;
constexpr int64_t kMinSplitKeys = 256;

struct Forward {
  DType dt;
  Geometry geo;
  float scale;
  ScoreMask score;
  Tensor4 q, k, v;
  OutTensor4 out;
  float* lse;
  int64_t blocks;  // q tiles per group
  bool in_place;   // k and v are float32 with unit dim stride and whole vectors per row
};

// A thread's tiles.
struct Scratch {
  explicit Scratch(const Geometry& g)
      : q(kBlockQ, g.dim_p), k(kBlockK, g.dim_p), kt(g.shape.head_dim, kBlockK),
        v(kBlockK, g.vdim_p), s(kBlockQ, kBlockK), o(kBlockQ, g.vdim_p), m(kBlockQ), l(kBlockQ) {}

  Tile q;      // the task's rows of Q, times scale
  Tile k, kt;  // a tile of K rows, and transposed
  Tile v;      // a tile of V rows
  Tile s;      // scores, then probabilities
  Tile o;      // output accumulator
  std::vector<float> m, l;  // per row: running max of the scores, running sum of exp
};

// Online-softmax update of one row: s (n_padded scores) becomes P; returns the
// factor by which the row's earlier output must be rescaled.
AXON_INLINE float softmax_update(float* s, int64_t n_padded, float& m, float& l) {
  const float tile_max = simd::max_of(n_padded, [&](auto j) AXON_INLINE_LAMBDA { return load(s, j); });
  const float m_new = std::max(m, tile_max);
  if (m_new == kNegInf) {  // everything so far is masked, or not a number
    bool nan = false;
    for (int64_t j = 0; j < n_padded; ++j) nan = nan || std::isnan(s[j]);
    if (!nan) {
      for (int64_t j = 0; j < n_padded; ++j) s[j] = 0.0f;
      return 1.0f;
    }
    // NaN scores (a NaN in the query row) that the max skipped: the row's result
    // is NaN, as softmax's; a NaN m keeps it so through the later tiles.
    for (int64_t j = 0; j < n_padded; ++j) s[j] = kNaN;
    m = l = kNaN;
    return kNaN;
  }
  const float sum = simd::sum_of(n_padded, [&](auto j) AXON_INLINE_LAMBDA {
    const auto p = simd::exp(load(s, j) - m_new);
    store(s, j, p);
    return p;
  });
  const float alpha = simd::exp(m - m_new);
  l = l * alpha + sum;
  m = m_new;
  return alpha;
}

// Rows [r0, r0 + nr) of the group of kv head kvh in batch b.
struct Task {
  int64_t b, kvh, r0, nr;
};

Task task_at(const Forward& f, int64_t t) {
  const int64_t kv_heads = f.geo.shape.kv_heads;
  const int64_t r0 = t % f.blocks * kBlockQ;
  return {t / (kv_heads * f.blocks), t / f.blocks % kv_heads, r0, std::min(kBlockQ, f.geo.rows - r0)};
}

// Loads the task's rows of Q (times scale) and clears its softmax state; returns the
// end of the keys any of its rows can see.
AXON_INLINE int64_t start(const Forward& f, Scratch& w, const Task& t) {
  const Geometry& g = f.geo;
  const int64_t D = g.shape.head_dim;
  int64_t max_i = 0;
  for (int64_t r = 0, n; r < t.nr; r += n) {
    const int64_t row = t.r0 + r, i = g.query(row);
    n = g.run(row, t.nr - r);
    max_i = std::max(max_i, i + n - 1);
    load_rows(f.dt, f.q.row(f.dt, t.b, g.head(t.kvh, row), i), f.q.st.s[2], f.q.st.s[3], n, D,
              w.q.row(r), w.q.ld);
  }
  for (int64_t r = 0; r < t.nr; ++r) {
    float* q = w.q.row(r);
    for (int64_t d = 0; d < D; ++d) q[d] *= f.scale;
    std::fill(w.o.row(r), w.o.row(r + 1), 0.0f);
    w.m[r] = kNegInf;
    w.l[r] = 0.0f;
  }
  return f.score.causal ? std::min(g.shape.kv_len, max_i + 1) : g.shape.kv_len;
}

// Keys [j_begin, j_end), a tile at a time, into the task's softmax state.
AXON_INLINE void attend(const Forward& f, Scratch& w, const Task& t, int64_t j_begin,
                        int64_t j_end) {
  const Geometry& g = f.geo;
  const int64_t D = g.shape.head_dim, Dv = g.shape.v_head_dim;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBlockK) {
    const int64_t bk = std::min(kBlockK, j_end - j0);
    // A tile the mask hides from every row (a static KV cache's unused
    // positions, left padding) changes nothing: its probabilities are all 0.
    // (Its scores are not computed: a NaN in K or V there is not propagated.)
    if (f.score.mask.kind != MaskKind::kNone) {
      bool hidden = true;
      for (int64_t r = 0; hidden && r < t.nr; ++r) {
        hidden = f.score.hides(t.b, g.head(t.kvh, t.r0 + r), g.query(t.r0 + r), j0, bk);
      }
      if (hidden) continue;
    }
    // K and V rows: read in place when they are float32 rows of whole vectors, else
    // converted into the tiles.
    const float* k = w.k.row(0);
    const float* v = w.v.row(0);
    int64_t ldk = w.k.ld, ldv = w.v.ld;
    if (f.in_place) {
      k = reinterpret_cast<const float*>(f.k.row(f.dt, t.b, t.kvh, j0));
      v = reinterpret_cast<const float*>(f.v.row(f.dt, t.b, t.kvh, j0));
      ldk = f.k.st.s[2];
      ldv = f.v.st.s[2];
    } else {
      load_rows(f.dt, f.k.row(f.dt, t.b, t.kvh, j0), f.k.st.s[2], f.k.st.s[3], bk, D, w.k.row(0), ldk);
      load_rows(f.dt, f.v.row(f.dt, t.b, t.kvh, j0), f.v.st.s[2], f.v.st.s[3], bk, Dv, w.v.row(0), ldv);
    }
    if (t.nr < kFewRows) {
      gemm_nt(t.nr, bk, g.dim_p, w.q.row(0), w.q.ld, k, ldk, w.s.row(0), w.s.ld);
    } else {
      transpose(k, ldk, bk, D, w.kt.row(0), w.kt.ld);
      gemm(t.nr, kBlockK, D, w.q.row(0), w.q.ld, 1, w.kt.row(0), w.kt.ld, w.s.row(0), w.s.ld, false);
    }
    for (int64_t r = 0; r < t.nr; ++r) {
      const int64_t h = g.head(t.kvh, t.r0 + r), i = g.query(t.r0 + r);
      float* s = w.s.row(r);
      f.score.apply(t.b, h, i, j0, bk, kBlockK, s);
      const float alpha = softmax_update(s, kBlockK, w.m[r], w.l[r]);
      if (alpha != 1.0f) {
        float* o = w.o.row(r);
        simd::for_each(w.o.ld, [&](auto d) AXON_INLINE_LAMBDA { store(o, d, load(o, d) * alpha); });
      }
      if (f.score.dropout.enabled) f.score.drop(t.b, h, i, j0, bk, s);
    }
    gemm(t.nr, w.o.ld, bk, w.s.row(0), w.s.ld, 1, v, ldv, w.o.row(0), w.o.ld, true);
  }
}

// out = O / l and lse = m + log l from the task's state.
AXON_INLINE void finish(const Forward& f, Scratch& w, const Task& t) {
  const Geometry& g = f.geo;
  const AttentionShape& sh = g.shape;
  for (int64_t r = 0; r < t.nr; ++r) {
    const int64_t h = g.head(t.kvh, t.r0 + r), i = g.query(t.r0 + r);
    const float l = w.l[r], inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* o = w.o.row(r);
    for (int64_t d = 0; d < sh.v_head_dim; ++d) o[d] *= inv;
    if (f.lse != nullptr)
      f.lse[(t.b * sh.q_heads + h) * sh.q_len + i] =
          l > 0.0f ? w.m[r] + std::log(l) : std::isnan(l) ? kNaN : kNegInf;
  }
  for (int64_t r = 0, n; r < t.nr; r += n) {
    const int64_t row = t.r0 + r;
    n = g.run(row, t.nr - r);
    store_rows(f.dt, w.o.row(r), w.o.ld, n, sh.v_head_dim,
               f.out.row(f.dt, t.b, g.head(t.kvh, row), g.query(row)), f.out.st.s[2], f.out.st.s[3]);
  }
}

AXON_SIMD void forward_task(const Forward& f, Scratch& w, int64_t task) {
  const Task t = task_at(f, task);
  attend(f, w, t, 0, start(f, w, t));
  finish(f, w, t);
}

// Keys split over several work items (decoding with few groups): each item saves its
// partial state, rows of (m, l, O), in `partial`; combine() merges them.
int64_t partial_row(const Geometry& g) { return 2 + g.vdim_p; }
int64_t partial_size(const Geometry& g) { return kBlockQ * partial_row(g); }

AXON_SIMD void forward_split(const Forward& f, Scratch& w, int64_t task, int64_t j_begin,
                             int64_t j_end, float* partial) {
  const Task t = task_at(f, task);
  attend(f, w, t, j_begin, std::min(j_end, start(f, w, t)));
  for (int64_t r = 0; r < t.nr; ++r) {
    float* p = partial + r * partial_row(f.geo);
    p[0] = w.m[r];
    p[1] = w.l[r];
    std::copy(w.o.row(r), w.o.row(r + 1), p + 2);
  }
}

AXON_SIMD void combine(const Forward& f, Scratch& w, int64_t task, int64_t splits,
                       const float* partials) {
  const Task t = task_at(f, task);
  const auto state = [&](int64_t split, int64_t r) AXON_INLINE_LAMBDA {
    return partials + split * partial_size(f.geo) + r * partial_row(f.geo);
  };
  for (int64_t r = 0; r < t.nr; ++r) {
    float m = kNegInf, l = 0.0f;
    float* o = w.o.row(r);
    std::fill(o, o + w.o.ld, 0.0f);
    bool nan = false;
    for (int64_t s = 0; s < splits; ++s) {
      m = std::max(m, state(s, r)[0]);
      nan = nan || std::isnan(state(s, r)[0]) || std::isnan(state(s, r)[1]);
    }
    if (nan) {  // a split's row is NaN (softmax_update): so is the row
      std::fill(o, o + w.o.ld, kNaN);
      w.m[r] = w.l[r] = kNaN;
      continue;
    }
    for (int64_t s = 0; m != kNegInf && s < splits; ++s) {
      const float* p = state(s, r);
      const float weight = simd::exp(p[0] - m);
      l += p[1] * weight;
      simd::for_each(w.o.ld, [&](auto d) AXON_INLINE_LAMBDA {
        store(o, d, load(o, d) + load(p + 2, d) * weight);
      });
    }
    w.m[r] = m;
    w.l[r] = l;
  }
  finish(f, w, t);
}

}  // namespace

bool attention_dropout_keep(uint64_t seed, uint64_t offset, uint64_t index, double p) {
  AttentionParams params{1.0, false, p, seed, offset};
  return p <= 0 || Dropout(params).factor(index) != 0.0f;
}

void attention_forward(DType dt, const AttentionShape& shape, const AttentionParams& params,
                       const void* q, Strides4 qs, const void* k, Strides4 ks, const void* v,
                       Strides4 vs, const AttentionMask& mask, void* out, Strides4 os,
                       float* lse) {
  const Geometry geo(shape);
  const int64_t blocks = (geo.rows + kBlockQ - 1) / kBlockQ;
  const int64_t tasks = shape.batch * shape.kv_heads * blocks;
  if (tasks == 0 || shape.v_head_dim == 0) return;
  const bool in_place = dt == DType::kFloat32 && ks.s[3] == 1 && vs.s[3] == 1 &&
                        shape.head_dim == geo.dim_p && shape.v_head_dim == geo.vdim_p;
  const Forward f{dt, geo, float(params.scale), ScoreMask(shape, params, mask), {q, qs}, {k, ks},
                  {v, vs}, {out, os}, lse, blocks, in_place};
  // Few tasks but many keys (decoding a small batch): split the keys too.
  int64_t splits = 1;
  if (tasks < kMinWorkItems)
    splits = std::max<int64_t>(1, std::min(kMinWorkItems / tasks, shape.kv_len / kMinSplitKeys));
  if (splits == 1) {
    parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
      Scratch w(geo);
      for (int64_t t = t0; t < t1; ++t) forward_task(f, w, t);
    });
    return;
  }
  const int64_t split_keys = round_up((shape.kv_len + splits - 1) / splits, kBlockK);
  splits = (shape.kv_len + split_keys - 1) / split_keys;
  std::vector<float> partials(tasks * splits * partial_size(geo));
  parallel_for(0, tasks * splits, 1, [&](int64_t i0, int64_t i1) {
    Scratch w(geo);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i % splits;
      forward_split(f, w, i / splits, s * split_keys, (s + 1) * split_keys,
                    partials.data() + i * partial_size(geo));
    }
  });
  parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    Scratch w(geo);
    for (int64_t t = t0; t < t1; ++t)
      combine(f, w, t, splits, partials.data() + t * splits * partial_size(geo));
  });
}

}  // namespace axon::kernels
