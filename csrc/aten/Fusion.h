// Adaptive eager: the device fuses eager ops on its streams.
//
// Elementwise kernels (TensorIterator ops, dtype conversions) and sums/means
// over the last dimension are launched as fusible stream work
// (launchFusibleCpuKernel, CpuKernel.h) when they run on the stream worker
// alone, and elementwise kernels on the team too.  When the worker takes one
// and the next queued task is fusible too, the runtime hands it the run of
// fusible tasks queued now (rt::FusionHook).  The engine here takes the
// longest prefix that shares one iteration space, rows x C (the last
// dimension): every device tensor of those ops is either full (rows x C), a
// column (one value per row), a row (C values, the same for every row) or a
// single value, and tensors that one op writes and another touches are
// either the same (same memory and geometry) or disjoint.  It then runs the
// ops tile by tile (a tile is a range of rows that fits the core's L2
// cache): for each tile, each op's own CPU kernel on views of that tile.  So
// each op still computes each element with its own code, which is what keeps
// results bitwise equal: tiles start at multiples of 128 elements (of 128
// rows when a column is computed), so the kernels' vector loops and their
// scalar tails meet the same elements as over the whole tensor; reductions
// are per row.  A launch the thread policy gives the team runs in parts
// whose bounds may fall anywhere, so it joins a run only as one of the
// engine's own exactly rounded ops (the same bits wherever a loop splits).
// Sequence numbers, events and errors are the runtime's (rt::launch with a
// FusibleTask): an event marker or any other task ends a run.
#pragma once

#include <cstdint>
#include <string>

namespace at::axon::fusion {

// Installs the engine as the runtime's fusion hook (at module init).
void install();

struct Stats {
  int64_t chains_seen = 0;        // runs of >= 2 fusible tasks offered by a stream
  int64_t fused_kernels = 0;      // of them, run fused
  int64_t ops_fused = 0;          // ops in those
  int64_t tiles = 0;              // tiles run
  int64_t intermediate_bytes_not_written = 0;
  int64_t kernels_compiled = 0;   // always 0: the engine interprets, it compiles nothing
};
Stats stats();
void resetStats();

// Tests: fused runs of `op` (e.g. "aten::mul.Tensor") throw; "" stops it.
void failForTest(const std::string& op);
// Tests: the bytes a tile's full tensors may hold (0: back to the default).
void setTileBytesForTest(int64_t bytes);
// Runs of own ops on the worker (1), spread over the compute team block by
// block (2), or as the thread policy measured (0, the default).
void setOwnThreadsForTest(int mode);

}  // namespace at::axon::fusion
