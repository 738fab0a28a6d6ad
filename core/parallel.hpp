// The one worker pool of the library: compiles, the CPU reference and the test-data fills
// all split their work with these, so thread counts and error handling are decided once.
#pragma once
#include <cstdint>
#include <functional>

namespace moeblaze {

// Runs task(i) for every i in [0, count) on up to `threads` threads (0: the hardware's),
// handing out indices one at a time (uneven tasks balance themselves). The calling thread
// works too. After the first exception no new task starts; it is rethrown once every thread
// has joined. Results must not depend on which thread ran a task.
void parallel_tasks(int64_t count, const std::function<void(int64_t)>& task, unsigned threads = 0);

// Runs fn(begin, end) over [0, n) in one contiguous range per thread, each at least `grain`
// items long (fewer threads for small n): for loops whose items are too cheap to hand out
// one at a time.
void parallel_ranges(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 4096);

// The hardware's thread count (at least 1).
unsigned hardware_threads();

}  // namespace moeblaze
