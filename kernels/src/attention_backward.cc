// Attention backward, flash-attention style, recomputing the probabilities from
// the saved log-sum-exp: P = exp(scale * Q K^T + mask - lse). With dropout factors
// Z (recomputed from the same seed) and Pd = P * Z:
//   dV = Pd^T dO,  dP = (dO V^T) * Z,  dS = scale * P * (dP - rowsum(dO * O)),
//   dQ = dS K,     dK = dS^T Q.
// A task is one (batch, kv head) group: it owns dK and dV of its kv head and dQ of
// every q head in the group, so tasks never write the same memory and need no
// reduction (and sum over the group's q heads, for grouped-query attention). In a
// task, Q, dO and dQ of all rows live in float32 scratch; each tile of kBlockK keys
// is loaded once and met by every tile of kBlockQ rows that can see it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_common.h"
#include "axon/kernels/parallel.h"

namespace axon::kernels {
namespace {

using namespace attention;

struct Backward {
  DType dt;
  Geometry geo;
  float scale;
  ScoreMask score;
  Tensor4 dout, q, k, v, out;
  const float* lse;
  OutTensor4 dq, dk, dv;
};

// A thread's tiles: all rows of a group for Q, dO and dQ; one kv tile for the rest.
struct Scratch {
  explicit Scratch(const Geometry& g)
      : q(g.rows, g.dim_p), dout(g.rows, g.vdim_p), out(g.rows, g.vdim_p), dq(g.rows, g.dim_p),
        k(kBlockK, g.dim_p),
        kt(g.shape.head_dim, kBlockK), v(kBlockK, g.vdim_p), vt(g.shape.v_head_dim, kBlockK),
        dk(kBlockK, g.dim_p), dv(kBlockK, g.vdim_p), p(kBlockQ, kBlockK), ds(kBlockQ, kBlockK),
        delta(g.rows) {}

  Tile q, dout, out, dq;
  Tile k, kt, v, vt;  // rows and transposed
  Tile dk, dv;
  Tile p, ds;  // probabilities and score gradients of a (q tile, kv tile) pair
  std::vector<float> delta;  // rowsum(dO * O)
};

// Turns the tile of rows [r0, r0 + nq) into P (in p, which holds Q K^T on entry) and
// dS (in ds, which holds dO V^T); with dropout, p becomes P * Z.
AXON_INLINE void scores_to_grads(const Backward& f, Scratch& w, int64_t b, int64_t kvh,
                                 int64_t r0, int64_t nq, int64_t j0, int64_t bk) {
  const Geometry& g = f.geo;
  const float scale = f.scale;
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t h = g.head(kvh, r0 + r), i = g.query(r0 + r);
    float* p = w.p.row(r);
    float* ds = w.ds.row(r);
    const float lse = f.lse[(b * g.shape.q_heads + h) * g.shape.q_len + i];
    if (lse == kNegInf) {  // a fully masked row: no gradient
      std::fill(p, p + kBlockK, 0.0f);
      std::fill(ds, ds + kBlockK, 0.0f);
      continue;
    }
    simd::for_each(kBlockK, [&](auto j) AXON_INLINE_LAMBDA { store(p, j, load(p, j) * scale); });
    f.score.apply(b, h, i, j0, bk, kBlockK, p);
    simd::for_each(kBlockK, [&](auto j) AXON_INLINE_LAMBDA { store(p, j, simd::exp(load(p, j) - lse)); });
    const float delta = w.delta[r0 + r];
    if (!f.score.dropout.enabled) {
      simd::for_each(kBlockK, [&](auto j) AXON_INLINE_LAMBDA {
        store(ds, j, scale * load(p, j) * (load(ds, j) - delta));
      });
      continue;
    }
    const uint64_t index =
        uint64_t(((b * g.shape.q_heads + h) * g.shape.q_len + i) * g.shape.kv_len + j0);
    for (int64_t j = 0; j < kBlockK; ++j) {
      const float z = j < bk ? f.score.dropout.factor(index + uint64_t(j)) : 0.0f;
      ds[j] = scale * p[j] * (ds[j] * z - delta);
      p[j] *= z;
    }
  }
}

AXON_SIMD void backward_task(const Backward& f, Scratch& w, int64_t task) {
  const Geometry& g = f.geo;
  const AttentionShape& sh = g.shape;
  const int64_t b = task / sh.kv_heads, kvh = task % sh.kv_heads;
  const int64_t D = sh.head_dim, Dv = sh.v_head_dim;

  // Q, dO and O of the group's rows, one run per q head.
  for (int64_t r = 0, n; r < g.rows; r += n) {
    const int64_t h = g.head(kvh, r), i = g.query(r);
    n = g.run(r, g.rows - r);
    load_rows(f.dt, f.q.row(f.dt, b, h, i), f.q.st.s[2], f.q.st.s[3], n, D, w.q.row(r), w.q.ld);
    load_rows(f.dt, f.dout.row(f.dt, b, h, i), f.dout.st.s[2], f.dout.st.s[3], n, Dv,
              w.dout.row(r), w.dout.ld);
    load_rows(f.dt, f.out.row(f.dt, b, h, i), f.out.st.s[2], f.out.st.s[3], n, Dv, w.out.row(r),
              w.out.ld);
  }
  for (int64_t r = 0; r < g.rows; ++r) {
    const float* dout = w.dout.row(r);
    const float* out = w.out.row(r);
    w.delta[r] = simd::sum_of(Dv, [&](auto d) AXON_INLINE_LAMBDA { return load(dout, d) * load(out, d); });
  }
  std::fill(w.dq.data.begin(), w.dq.data.end(), 0.0f);

  for (int64_t j0 = 0; j0 < sh.kv_len; j0 += kBlockK) {
    const int64_t bk = std::min(kBlockK, sh.kv_len - j0);
    load_rows(f.dt, f.k.row(f.dt, b, kvh, j0), f.k.st.s[2], f.k.st.s[3], bk, D, w.k.row(0), w.k.ld);
    load_rows(f.dt, f.v.row(f.dt, b, kvh, j0), f.v.st.s[2], f.v.st.s[3], bk, Dv, w.v.row(0), w.v.ld);
    transpose(w.k.row(0), w.k.ld, bk, D, w.kt.row(0), w.kt.ld);
    transpose(w.v.row(0), w.v.ld, bk, Dv, w.vt.row(0), w.vt.ld);
    std::fill(w.dk.data.begin(), w.dk.data.end(), 0.0f);
    std::fill(w.dv.data.begin(), w.dv.data.end(), 0.0f);

    for (int64_t r0 = 0; r0 < g.rows; r0 += kBlockQ) {
      const int64_t nq = std::min(kBlockQ, g.rows - r0);
      if (f.score.causal) {
        int64_t max_i = 0;
        for (int64_t r = r0; r < r0 + nq; ++r) max_i = std::max(max_i, g.query(r));
        if (max_i < j0) continue;  // every row of the tile is before these keys
      }
      const float* q = w.q.row(r0);
      const float* dout = w.dout.row(r0);
      gemm(nq, kBlockK, D, q, w.q.ld, 1, w.kt.row(0), w.kt.ld, w.p.row(0), w.p.ld, false);
      gemm(nq, kBlockK, Dv, dout, w.dout.ld, 1, w.vt.row(0), w.vt.ld, w.ds.row(0), w.ds.ld, false);
      scores_to_grads(f, w, b, kvh, r0, nq, j0, bk);
      // dV += Pd^T dO, dK += dS^T Q, dQ += dS K.
      gemm(bk, w.dv.ld, nq, w.p.row(0), 1, w.p.ld, dout, w.dout.ld, w.dv.row(0), w.dv.ld, true);
      gemm(bk, w.dk.ld, nq, w.ds.row(0), 1, w.ds.ld, q, w.q.ld, w.dk.row(0), w.dk.ld, true);
      gemm(nq, w.dq.ld, bk, w.ds.row(0), w.ds.ld, 1, w.k.row(0), w.k.ld, w.dq.row(r0), w.dq.ld, true);
    }
    store_rows(f.dt, w.dk.row(0), w.dk.ld, bk, D, f.dk.row(f.dt, b, kvh, j0), f.dk.st.s[2],
               f.dk.st.s[3]);
    store_rows(f.dt, w.dv.row(0), w.dv.ld, bk, Dv, f.dv.row(f.dt, b, kvh, j0), f.dv.st.s[2],
               f.dv.st.s[3]);
  }
  for (int64_t r = 0, n; r < g.rows; r += n) {
    n = g.run(r, g.rows - r);
    store_rows(f.dt, w.dq.row(r), w.dq.ld, n, D, f.dq.row(f.dt, b, g.head(kvh, r), g.query(r)),
               f.dq.st.s[2], f.dq.st.s[3]);
  }
}

}  // namespace

void attention_backward(DType dt, const AttentionShape& shape, const AttentionParams& params,
                        const void* dout, Strides4 dos, const void* q, Strides4 qs,
                        const void* k, Strides4 ks, const void* v, Strides4 vs,
                        const AttentionMask& mask, const void* out, Strides4 os,
                        const float* lse, void* dq, Strides4 dqs, void* dk, Strides4 dks,
                        void* dv, Strides4 dvs) {
  const Geometry geo(shape);
  const int64_t tasks = shape.batch * shape.kv_heads;
  if (tasks == 0) return;
  const Backward f{dt, geo, float(params.scale), ScoreMask(shape, params, mask), {dout, dos},
                   {q, qs}, {k, ks}, {v, vs}, {out, os}, lse, {dq, dqs}, {dk, dks}, {dv, dvs}};
  parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    Scratch w(geo);
    for (int64_t t = t0; t < t1; ++t) backward_task(f, w, t);
  });
}

}  // namespace axon::kernels
