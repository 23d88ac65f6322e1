// axon::comm transport policy: what ProcessGroupAxon (csrc/distributed/)
// decides about the transport before it creates a ShmGroup (no PyTorch
// headers).
//
// Environment, read when a group is created (the runtime's parsers,
// axon/env.h: "4MiB" or "4194304"; a bad value prints once per variable and
// process "axon: ignoring AXON_X='value' (expected ...); using <default>" and
// keeps the default):
//   AXON_COMM_SLOT_BYTES   Config::slot_bytes (at least 1; all ranks must agree)
//   AXON_COMM_P2P_BYTES    Config::p2p_bytes (at least 1; all ranks must agree)
//   AXON_COMM_SMALL_BYTES  Config::small_bytes (all ranks must agree)
//   AXON_COMM_INLINE_BYTES the largest synchronous collective that may run on
//                          the calling thread (per process; see inline_bytes)
//
// Segment names: "axon-pg-<pid>-<n>-<random>", created by the host's local
// rank 0 (pid: the creating process; n: a counter within it).  ShmGroup
// unlinks a segment once every rank has attached, so only a process killed
// while a group was forming leaves one behind in /dev/shm;
// remove_stale_segments() removes those whose creator is gone.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "axon/comm.h"

namespace axon::comm {

// Config's defaults with AXON_COMM_SLOT_BYTES, AXON_COMM_P2P_BYTES and
// AXON_COMM_SMALL_BYTES applied, and `timeout`.
Config config_from_env(std::chrono::milliseconds timeout);

// The cores this process may run on: its CPU affinity mask, else
// std::thread::hardware_concurrency(), at least 1.
size_t usable_cores();

// The largest synchronous collective that may run on the calling thread when
// the streams are idle, without AXON_COMM_INLINE_BYTES.  With a core or more
// to spare per local rank (local_ranks < cores), a large collective is left to
// the communication stream, where it overlaps the caller's host work; 4 MiB
// moves in about the 150-200 us a stream task's wake-ups cost.  With no core
// to spare, the stream worker and the host thread share one core per rank,
// nothing overlaps and the wake-ups are pure cost: any size (SIZE_MAX).
size_t default_inline_bytes(size_t local_ranks, size_t cores);

// AXON_COMM_INLINE_BYTES, or default_inline_bytes(local_ranks, usable_cores()).
size_t inline_bytes(size_t local_ranks);

// The prefix of every process group's segment name.
inline constexpr std::string_view kSegmentPrefix = "axon-pg-";

// A fresh segment name for a group this process creates (a POSIX shm name
// without the leading slash): the prefix, this process's pid, a counter and a
// random number.
std::string new_segment_name();

// The pid of the process that created segment `name` (a name in /dev/shm), or
// 0 if `name` is not a process group's segment.
pid_t segment_creator(std::string_view name);

// Unlinks the process groups' segments in /dev/shm whose creator no longer
// exists; returns their names.  Segments of live processes (and of processes
// this one may not signal) stay.
std::vector<std::string> remove_stale_segments();

}  // namespace axon::comm
