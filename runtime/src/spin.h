// A busy-wait's pause: tells the core a thread is spinning (x86 PAUSE,
// Arm YIELD), so its sibling hyperthread or the lock holder runs.
#pragma once

namespace axon::rt {

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace axon::rt
