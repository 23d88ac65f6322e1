// How kernels spread work over threads. The kernels library owns no threads: the
// caller installs a backend (csrc installs one over ATen's thread pool); without
// one, work runs serially on the calling thread.
#pragma once

#include <cstdint>

namespace axon::kernels {

// Runs the iterations [begin, end) of a loop.
using ParallelBody = void (*)(void* ctx, int64_t begin, int64_t end);
// Splits [begin, end) into chunks of at least `grain` iterations (except possibly
// the last), calls body(ctx, chunk_begin, chunk_end) for each, possibly
// concurrently, and returns when all have run.
using ParallelBackend = void (*)(int64_t begin, int64_t end, int64_t grain, void* ctx,
                                 ParallelBody body);

// Installs the backend used by every later parallel_for; nullptr = serial.
void set_parallel_backend(ParallelBackend fn);

// Runs body over [begin, end) through the installed backend; nothing if begin >= end.
void parallel_for(int64_t begin, int64_t end, int64_t grain, void* ctx, ParallelBody body);

// f(chunk_begin, chunk_end) over [begin, end).
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  parallel_for(begin, end, grain, const_cast<F*>(&f), [](void* ctx, int64_t b, int64_t e) {
    (*static_cast<const F*>(ctx))(b, e);
  });
}

}  // namespace axon::kernels
