// The compute team (runtime.h "compute team"): helper threads that run
// chunks of one loop at a time beside its caller.
//
// A loop is published as a generation: the caller writes the loop's fields,
// then stores `ticket` = (generation << 32 | chunks << 16 | next chunk).
// Whoever claims a chunk (helpers and the caller alike) advances `next` with
// a compare-exchange that also checks the generation and the chunk count, so
// a helper that wakes late can never claim a chunk of a later loop with an
// earlier loop's fields, and never one past the end.  The fields of a loop
// stay unchanged until `remaining` (chunks not yet finished) reaches zero,
// which cannot happen before a claimed chunk has run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#ifdef __linux__
#include <pthread.h>
#endif

#include "axon/runtime.h"
#include "placement.h"
#include "spin.h"

namespace axon::rt {
namespace {

// How long a helper spins for the next loop before it sleeps.  Kernels that
// follow each other on a stream (a forward and its backward, the layers of a
// step) start within a few microseconds; a futex wake costs a sleeping
// helper ~10-50 us.  Spinning longer takes that time from the host's thread
// when it shares the core.
constexpr auto kHelperSpin = std::chrono::microseconds(40);
// Chunks per thread: a helper that starts late (woken, or sharing its core
// with the host) leaves its later chunks to the caller.
constexpr int64_t kChunksPerThread = 4;
constexpr int kMaxThreads = 64;
static_assert(kMaxThreads * kChunksPerThread < (1 << 16));

struct Team {
  std::mutex loop;  // held by the caller of the loop on the team
  std::mutex grow;  // starting helpers
  std::atomic<int> helpers{0};

  // The loop (written by its caller before `ticket`, read after a claim).
  int64_t begin = 0, end = 0, chunk = 1;
  void* ctx = nullptr;
  TeamBody body = nullptr;
  std::atomic<int> participants{0};  // helpers asked to join (threads - 1)

  std::atomic<uint64_t> ticket{0};
  std::atomic<uint32_t> generation{0};  // the futex word sleeping helpers wait on
  std::atomic<int64_t> remaining{0};
  std::atomic<int> sleeping{0};

  std::mutex error_mutex;
  std::exception_ptr error;

  // Bit c: a member of the current loop runs on core c (placement.h: a
  // helper woken onto a member's core moves off it).
  std::atomic<uint64_t> cpus_held{0};

  std::atomic<uint64_t> loops{0}, serial_loops{0}, helper_chunks{0}, helper_moves{0};
};

Team& team() {
  static Team* t = new Team();  // never destroyed: helpers may be asleep in it at exit
  return *t;
}

thread_local bool in_team_loop = false;

constexpr uint64_t ticketOf(uint32_t gen, int64_t chunks, int64_t next) {
  return (uint64_t{gen} << 32) | (static_cast<uint64_t>(chunks) << 16) |
         static_cast<uint64_t>(next);
}

// Claims and runs chunks of loop `gen` until none is left; returns how many ran.
int64_t runChunks(Team& t, uint32_t gen) {
  int64_t ran = 0;
  uint64_t tk = t.ticket.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(tk >> 32) != gen) return ran;
    const int64_t chunks = static_cast<int64_t>((tk >> 16) & 0xffff);
    const int64_t next = static_cast<int64_t>(tk & 0xffff);
    if (next >= chunks) return ran;
    if (!t.ticket.compare_exchange_weak(tk, tk + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      continue;
    }
    const int64_t b = t.begin + next * t.chunk;
    const int64_t e = std::min(t.end, b + t.chunk);
    try {
      t.body(t.ctx, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> g(t.error_mutex);
      if (!t.error) t.error = std::current_exception();
    }
    ++ran;
    t.remaining.fetch_sub(1, std::memory_order_acq_rel);
    tk = t.ticket.load(std::memory_order_acquire);
  }
}

// A helper's place in a loop: claims its core in the loop's `cpus_held`; on a
// core another member holds, moves to one none holds, if any (placement.h).
void joinLoop(Team& t) {
  const uint64_t bit = current_cpu_bit();
  if (bit == 0) return;
  const uint64_t held = t.cpus_held.fetch_or(bit, std::memory_order_acq_rel);
  if ((held & bit) == 0 || !move_off(held)) return;
  t.helper_moves.fetch_add(1, std::memory_order_relaxed);
  t.cpus_held.fetch_or(current_cpu_bit(), std::memory_order_acq_rel);
}

void helperMain(Team& t, int index) {
#ifdef __linux__
  // As the stream workers ("axon0:s0"), for gdb, top and perf; 15 characters max.
  const std::string name = "axon-team" + std::to_string(index + 1);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
#endif
  in_team_loop = true;  // a loop nested in a chunk runs serially
  uint32_t seen = t.generation.load(std::memory_order_acquire);
  for (;;) {
    uint32_t gen = t.generation.load(std::memory_order_acquire);
    if (gen == seen) {
      const auto until = std::chrono::steady_clock::now() + kHelperSpin;
      int n = 0;
      while ((gen = t.generation.load(std::memory_order_acquire)) == seen) {
        spin_pause();
        if (++n % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
      }
      while (gen == seen) {
        t.sleeping.fetch_add(1, std::memory_order_seq_cst);
        t.generation.wait(seen, std::memory_order_seq_cst);
        t.sleeping.fetch_sub(1, std::memory_order_relaxed);
        gen = t.generation.load(std::memory_order_acquire);
      }
    }
    seen = gen;
    if (index >= t.participants.load(std::memory_order_relaxed)) continue;
    // Not for a loop whose chunks are all claimed (a late wake).
    const uint64_t tk = t.ticket.load(std::memory_order_acquire);
    if (static_cast<uint32_t>(tk >> 32) != gen || (tk & 0xffff) >= ((tk >> 16) & 0xffff)) continue;
    joinLoop(t);
    const int64_t ran = runChunks(t, gen);
    if (ran > 0) t.helper_chunks.fetch_add(ran, std::memory_order_relaxed);
  }
}

void ensureHelpers(Team& t, int want) {
  if (t.helpers.load(std::memory_order_acquire) >= want) return;
  std::lock_guard<std::mutex> g(t.grow);
  for (int i = t.helpers.load(std::memory_order_relaxed); i < want; ++i) {
    std::thread(helperMain, std::ref(t), i).detach();
    t.helpers.store(i + 1, std::memory_order_release);
  }
}

}  // namespace

void team_parallel_for(int threads, int64_t begin, int64_t end, int64_t grain, void* ctx,
                       TeamBody body) {
  if (begin >= end) return;
  Team& t = team();
  grain = std::max<int64_t>(grain, 1);
  threads = std::min(threads, kMaxThreads);
  const int64_t n = end - begin;
  // At least `grain` iterations per chunk (n / chunks >= grain), the last
  // possibly fewer after rounding the chunk size up.
  int64_t chunks = std::min<int64_t>(n / grain, threads * kChunksPerThread);
  std::unique_lock<std::mutex> lk(t.loop, std::defer_lock);
  if (threads <= 1 || chunks <= 1 || in_team_loop || !lk.try_lock()) {
    t.serial_loops.fetch_add(1, std::memory_order_relaxed);
    body(ctx, begin, end);
    return;
  }
  ensureHelpers(t, threads - 1);
  const int64_t chunk = (n + chunks - 1) / chunks;
  chunks = (n + chunk - 1) / chunk;  // no empty chunk at the end

  t.begin = begin;
  t.end = end;
  t.chunk = chunk;
  t.ctx = ctx;
  t.body = body;
  t.participants.store(threads - 1, std::memory_order_relaxed);
  t.remaining.store(chunks, std::memory_order_relaxed);
  t.cpus_held.store(current_cpu_bit(), std::memory_order_relaxed);
  const uint32_t gen = t.generation.load(std::memory_order_relaxed) + 1;
  t.ticket.store(ticketOf(gen, chunks, 0), std::memory_order_release);
  t.generation.store(gen, std::memory_order_seq_cst);
  if (t.sleeping.load(std::memory_order_seq_cst) > 0) t.generation.notify_all();

  in_team_loop = true;
  runChunks(t, gen);
  in_team_loop = false;
  // Chunks helpers claimed: wait for them (spinning; they are running).
  int n_spins = 0;
  while (t.remaining.load(std::memory_order_acquire) != 0) {
    spin_pause();
    if (++n_spins % 4096 == 0) std::this_thread::yield();  // a helper was preempted
  }
  t.loops.fetch_add(1, std::memory_order_relaxed);
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> g(t.error_mutex);
    std::swap(error, t.error);
  }
  lk.unlock();
  if (error) std::rethrow_exception(error);
}

void team_start(int threads) {
  ensureHelpers(team(), std::min(threads, kMaxThreads) - 1);
}

TeamStats team_stats() noexcept {
  Team& t = team();
  TeamStats s;
  s.helpers = t.helpers.load(std::memory_order_acquire);
  s.sleeping = t.sleeping.load(std::memory_order_relaxed);
  s.loops = t.loops.load(std::memory_order_relaxed);
  s.serial_loops = t.serial_loops.load(std::memory_order_relaxed);
  s.helper_chunks = t.helper_chunks.load(std::memory_order_relaxed);
  s.helper_moves = t.helper_moves.load(std::memory_order_relaxed);
  return s;
}

}  // namespace axon::rt
