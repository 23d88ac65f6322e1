// Attention forward/backward, single thread: prefill (batch 8, 8 heads, 256 tokens,
// head_dim 64, causal) and decoding (one query against 128..1024 keys).
#include <cmath>
#include <cstdio>
#include <vector>

#include "axon/kernels/attention.h"
#include "bench_util.h"

using namespace axon::kernels;

namespace {

Strides4 contiguous(int64_t h, int64_t s, int64_t d) { return {{h * s * d, s * d, d, 1}}; }

// mask: an additive [batch, 1, q_len, kv_len] mask of dtype dt, as Hugging Face passes.
void run(DType dt, const AttentionShape& sh, bool causal, bool backward, bool mask = false) {
  const int64_t B = sh.batch, H = sh.q_heads, KH = sh.kv_heads, L = sh.q_len, S = sh.kv_len,
                D = sh.head_dim;
  auto q = bench::random_buffer(dt, B * H * L * D), k = bench::random_buffer(dt, B * KH * S * D),
       v = bench::random_buffer(dt, B * KH * S * D), out = q, dout = q, dq = q, dk = k, dv = v;
  std::vector<float> lse(B * H * L);
  const Strides4 qs = contiguous(H, L, D), ks = contiguous(KH, S, D);
  const AttentionParams params{1.0 / std::sqrt(double(D)), causal, 0.0, 0, 0};
  const auto mask_values = bench::random_buffer(dt, B * L * S);
  AttentionMask m;
  if (mask) m = {MaskKind::kAdditive, dt, mask_values.data(), {{L * S, 0, S, 1}}};
  const auto forward = [&] {
    attention_forward(dt, sh, params, q.data(), qs, k.data(), ks, v.data(), ks, m, out.data(), qs,
                      lse.data());
  };
  forward();
  // Score pairs computed (causal: about half), two products of head_dim each.
  double pairs = double(B * H) * L * S;
  if (causal) pairs = double(B * H) * L * (L + 1) / 2;
  const double flops = 4 * pairs * D;
  const double bytes = double(dtype_size(dt)) * (2 * B * H * L * D + 2 * B * KH * S * D);
  char name[128];
  std::snprintf(name, sizeof name, "attention_forward %s b%ld h%ld/%ld q%ld kv%ld d%ld%s%s",
                bench::dtype_name(dt), long(B), long(H), long(KH), long(L), long(S), long(D),
                causal ? " causal" : "", mask ? " mask" : "");
  bench::report(name, bench::seconds_per_call(forward), bytes, flops);
  if (!backward) return;
  std::snprintf(name, sizeof name, "attention_backward %s b%ld h%ld/%ld q%ld kv%ld d%ld%s",
                bench::dtype_name(dt), long(B), long(H), long(KH), long(L), long(S), long(D),
                causal ? " causal" : "");
  bench::report(name, bench::seconds_per_call([&] {
                  attention_backward(dt, sh, params, dout.data(), qs, q.data(), qs, k.data(), ks,
                                     v.data(), ks, m, out.data(), qs, lse.data(), dq.data(), qs,
                                     dk.data(), ks, dv.data(), ks);
                }),
                2 * bytes, 2.5 * flops);
}

}  // namespace

int main() {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    run(dt, {8, 8, 8, 256, 256, 64, 64}, true, true);
    run(dt, {8, 8, 8, 256, 256, 64, 64}, false, false);
    run(dt, {8, 8, 8, 256, 256, 64, 64}, false, false, true);
    for (int64_t kv : {128, 512, 1024}) run(dt, {8, 8, 8, 1, kv, 64, 64}, false, false);
    run(dt, {8, 32, 8, 1, 1024, 128, 128}, false, false);  // grouped-query decoding
  }
}
