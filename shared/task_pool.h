#pragma once
// TaskPool: a few threads that run the parts of one job beside the caller's
// thread, for element-wise work large enough to split (the ps's optimizer
// apply of a large chunk, optimizer.apply_threads).
//
//   TaskPool pool(4);                                  // the caller and 3 helpers
//   pool.run(4, [&](std::size_t part) { update(part); });  // returns when all 4 are done
//
// Thread rules: run() is called by one thread at a time (the ps's request
// loop); it runs part 0 itself and each helper thread i runs part i. The
// job's fields are guarded by mutex_; a task runs without it held and must
// not throw.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "shared/thread_annotations.h"

namespace pstrain {

class TaskPool {
 public:
  // `threads` >= 1, the caller's included: threads - 1 helpers start now.
  explicit TaskPool(std::size_t threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  std::size_t threads() const { return helpers_.size() + 1; }
  // Runs task(0) .. task(parts - 1), parts <= threads(), and returns once
  // every one has returned.
  void run(std::size_t parts, const std::function<void(std::size_t)>& task);

 private:
  void serve(std::size_t part);

  Mutex mutex_;
  std::condition_variable_any wake_;  // a new job, or stop
  std::condition_variable_any done_;  // the helpers' parts of a job are done
  const std::function<void(std::size_t)>* task_ GUARDED_BY(mutex_) = nullptr;
  std::size_t parts_ GUARDED_BY(mutex_) = 0;
  std::uint64_t job_ GUARDED_BY(mutex_) = 0;  // counts jobs, so a helper sees each once
  std::size_t running_ GUARDED_BY(mutex_) = 0;
  bool stop_ GUARDED_BY(mutex_) = false;
  std::vector<std::thread> helpers_;
};

}  // namespace pstrain
