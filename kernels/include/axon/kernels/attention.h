// Fused scaled-dot-product attention, forward and backward, flash-attention style:
// scores are computed a (query block x key block) tile at a time with an online
// softmax, so the full q_len x kv_len matrix is never materialised. Math in float32.
#pragma once

#include <cstdint>

#include "axon/kernels/dtype.h"

namespace axon::kernels {

struct AttentionShape {
  // q_heads % kv_heads == 0: q head h attends with kv head h / (q_heads / kv_heads)
  // (grouped-query attention).
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, v_head_dim;
};

// Element strides for a [batch, heads, seq, dim] tensor (any layout).
struct Strides4 {
  int64_t s[4];
};

enum class MaskKind : int {
  kNone = 0,
  kAdditive = 1,  // float mask of dtype AttentionMask::dt added to the scaled scores
  kBool = 2,      // uint8/bool: nonzero = keep
};

struct AttentionMask {
  MaskKind kind = MaskKind::kNone;
  DType dt = DType::kFloat32;  // for kAdditive
  const void* data = nullptr;
  Strides4 strides{};  // layout [batch, q_heads, q_len, kv_len]; broadcast dims have stride 0
};

struct AttentionParams {
  double scale;      // usually 1 / sqrt(head_dim)
  bool is_causal;    // PyTorch convention: query i sees keys j <= i (top-left aligned)
  double dropout_p;  // 0 = no dropout
  uint64_t seed, offset;  // dropout RNG, see attention_dropout_keep
};

// Dropout of attention weight (b, h, i, j) (h the q head). With
//   index = ((b * q_heads + h) * q_len + i) * kv_len + j,
//   z     = SplitMix64 output number (offset + index) of the stream seeded with seed,
//           i.e. mix(seed + (offset + index + 1) * 0x9e3779b97f4a7c15) with SplitMix64's
//           finaliser mix,
// the weight is kept iff (z >> 40) >= round(p * 2^24), so with probability ~1 - p.
// A pure function of its arguments: the backward recomputes the forward's decisions.
// Kept weights are scaled by 1 / (1 - p); p >= 1 drops everything.
bool attention_dropout_keep(uint64_t seed, uint64_t offset, uint64_t index, double p);

// out = dropout(softmax(scale * q k^T + mask)) v, per (batch, q head).
// q: [batch, q_heads, q_len, head_dim], k: [batch, kv_heads, kv_len, head_dim],
// v: [batch, kv_heads, kv_len, v_head_dim], out: [batch, q_heads, q_len, v_head_dim],
// each with its own strides. lse (nullable): [batch, q_heads, q_len] contiguous,
// log-sum-exp of the scaled and masked scores (before dropout). A fully masked row
// gives out = 0 and lse = -inf.
void attention_forward(DType dt, const AttentionShape& shape, const AttentionParams& params,
                       const void* q, Strides4 qs, const void* k, Strides4 ks, const void* v,
                       Strides4 vs, const AttentionMask& mask, void* out, Strides4 os,
                       float* lse);

// Gradients of attention_forward from dout, given the forward's out and lse (same
// params, so dropout decisions are recomputed). dq, dk, dv are overwritten; dk and dv
// sum over the q heads of a group. Fully masked rows give zero gradients.
void attention_backward(DType dt, const AttentionShape& shape, const AttentionParams& params,
                        const void* dout, Strides4 dos, const void* q, Strides4 qs,
                        const void* k, Strides4 ks, const void* v, Strides4 vs,
                        const AttentionMask& mask, const void* out, Strides4 os,
                        const float* lse, void* dq, Strides4 dqs, void* dk, Strides4 dks,
                        void* dv, Strides4 dvs);

}  // namespace axon::kernels
