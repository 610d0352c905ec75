#pragma once
// Hand-offs between two of our threads that ThreadSanitizer cannot see,
// made visible to it. libzmq, built without ThreadSanitizer, passes a
// zero-copy message's free hint from the thread that sent it to its I/O
// thread through its own atomics; ordered as they are, ThreadSanitizer
// would report the hint's use on the I/O thread as a race with its
// creation. handed_over(p) on the sending thread before the hand-off and
// taken_over(p) on the receiving thread after it say what libzmq
// guarantees. Both are no-ops unless built with -fsanitize=thread
// (PSTRAIN_TSAN).
#if defined(__SANITIZE_THREAD__)
#define PSTRAIN_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PSTRAIN_TSAN_BUILD 1
#endif
#endif

#ifdef PSTRAIN_TSAN_BUILD
#include <sanitizer/tsan_interface.h>
#endif

namespace pstrain::tsan {

inline void handed_over([[maybe_unused]] void* p) {
#ifdef PSTRAIN_TSAN_BUILD
  __tsan_release(p);
#endif
}

inline void taken_over([[maybe_unused]] void* p) {
#ifdef PSTRAIN_TSAN_BUILD
  __tsan_acquire(p);
#endif
}

}  // namespace pstrain::tsan
