// Per-kernel timing of a layer call: a LaunchObserver that records a CUDA event pair
// around each launch (of one family, or of all), read after the stream is synchronised.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "kernel_set.hpp"

namespace moeblaze {

class KernelTimer : public LaunchObserver {
 public:
  explicit KernelTimer(std::optional<KernelFamily> only = std::nullopt) : only_(only) {}
  void before(KernelFamily f, CUstream s) override;
  void after(KernelFamily f, CUstream s) override;
  // Milliseconds per family since the last collect (launches of a family are summed).
  // The stream must have been synchronised. Resets the recording.
  std::map<KernelFamily, double> collect();

 private:
  struct Pair {
    KernelFamily family;
    std::unique_ptr<Event> start, end;
  };
  std::optional<KernelFamily> only_;
  std::vector<Pair> pairs_;  // reused across recordings
  size_t used_ = 0;
};

}  // namespace moeblaze
