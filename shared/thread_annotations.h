#pragma once
// Clang's thread-safety annotations, in leveldb's style: a member declared
// `T x GUARDED_BY(mutex_);` may only be touched while mutex_ is held, and a
// clang build with -Wthread-safety (the top-level CMakeLists adds it) checks
// that at compile time. Other compilers read them as documentation.
//
// std::mutex carries no annotations in libstdc++, so guarded state uses the
// annotated Mutex and MutexLock below.
#include <mutex>

#if defined(__clang__)
#define PSTRAIN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PSTRAIN_THREAD_ANNOTATION(x)
#endif

#ifndef GUARDED_BY
#define GUARDED_BY(x) PSTRAIN_THREAD_ANNOTATION(guarded_by(x))
#endif
#ifndef CAPABILITY
#define CAPABILITY(x) PSTRAIN_THREAD_ANNOTATION(capability(x))
#endif
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY PSTRAIN_THREAD_ANNOTATION(scoped_lockable)
#endif
#ifndef ACQUIRE
#define ACQUIRE(...) PSTRAIN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) PSTRAIN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif

namespace pstrain {

class CAPABILITY("mutex") Mutex {
 public:
  void lock() ACQUIRE() { mutex_.lock(); }
  void unlock() RELEASE() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};

// Holds a Mutex for its lifetime.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace pstrain
