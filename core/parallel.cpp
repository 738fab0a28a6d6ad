#include "parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace moeblaze {

unsigned hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

void parallel_tasks(int64_t count, const std::function<void(int64_t)>& task, unsigned threads) {
  if (count <= 0) return;
  if (threads == 0) threads = hardware_threads();
  const int64_t workers = std::min<int64_t>(threads, count);
  std::atomic<int64_t> next{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (int64_t i; (i = next.fetch_add(1)) < count;) task(i);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
      next.store(count);  // no new task starts
    }
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain) {
  if (n <= 0) return;
  const int64_t ranges = std::max<int64_t>(1, std::min<int64_t>(hardware_threads(), n / std::max<int64_t>(grain, 1)));
  const int64_t length = (n + ranges - 1) / ranges;
  parallel_tasks(ranges, [&](int64_t r) {
    const int64_t begin = r * length, end = std::min(n, begin + length);
    if (begin < end) fn(begin, end);
  }, static_cast<unsigned>(ranges));
}

}  // namespace moeblaze
