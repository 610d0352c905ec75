#include "shared/task_pool.h"

#include <stdexcept>

namespace pstrain {

TaskPool::TaskPool(std::size_t threads) {
  if (threads == 0) throw std::invalid_argument("task pool: at least one thread");
  for (std::size_t part = 1; part < threads; ++part)
    helpers_.emplace_back([this, part] { serve(part); });
}

TaskPool::~TaskPool() {
  {
    MutexLock lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : helpers_) t.join();
}

void TaskPool::run(std::size_t parts, const std::function<void(std::size_t)>& task) {
  if (parts == 0) return;
  if (parts > threads())
    throw std::invalid_argument("task pool: " + std::to_string(parts) + " parts for " +
                                std::to_string(threads()) + " threads");
  {
    MutexLock lock(mutex_);
    task_ = &task;
    parts_ = parts;
    running_ = parts - 1;
    ++job_;
  }
  wake_.notify_all();
  task(0);
  MutexLock lock(mutex_);
  while (running_ > 0) done_.wait(mutex_);
  task_ = nullptr;
}

void TaskPool::serve(std::size_t part) {
  std::uint64_t seen = 0;
  while (true) {
    const std::function<void(std::size_t)>* task = nullptr;
    {
      MutexLock lock(mutex_);
      while (!stop_ && (job_ == seen || part >= parts_)) {
        seen = job_;  // a job without a part for this thread
        wake_.wait(mutex_);
      }
      if (stop_) return;
      seen = job_;
      task = task_;
    }
    (*task)(part);
    bool last = false;
    {
      MutexLock lock(mutex_);
      last = --running_ == 0;
    }
    if (last) done_.notify_one();
  }
}

}  // namespace pstrain
