#include "kernel_timer.hpp"

namespace moeblaze {

void KernelTimer::before(KernelFamily f, CUstream s) {
  if (only_ && *only_ != f) return;
  if (used_ == pairs_.size()) pairs_.push_back({f, std::make_unique<Event>(), std::make_unique<Event>()});
  Pair& p = pairs_[used_];
  p.family = f;
  p.start->record(s);
}

void KernelTimer::after(KernelFamily f, CUstream s) {
  if (only_ && *only_ != f) return;
  pairs_[used_++].end->record(s);
}

std::map<KernelFamily, double> KernelTimer::collect() {
  std::map<KernelFamily, double> ms;
  for (size_t i = 0; i < used_; ++i) ms[pairs_[i].family] += Event::elapsed_ms(*pairs_[i].start, *pairs_[i].end);
  used_ = 0;
  return ms;
}

}  // namespace moeblaze
