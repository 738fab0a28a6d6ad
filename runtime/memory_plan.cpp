// Memory plans: the bytes a layer call needs (moe_layer.hpp), and how wide layers are split
// into chunks to hold less of h and hg at once.
#include <fmt/format.h>

#include <algorithm>

#include "checked.hpp"
#include "layer_buffers.hpp"
#include "moe_layer.hpp"

namespace moeblaze {
using namespace detail;

int backward_chunk_cols(const LayerConfig& l) {
  // hg = g*h is [T*K, n] (the down wgrad's input): with n > d the backward's largest buffer,
  // so down dgrad + down wgrad run in column chunks of a multiple of 256 (every dgrad/wgrad
  // tile width divides it), as many as the forward has slot chunks.
  const int chunks = forward_chunks(l);
  if (chunks == 1) return l.shape.ffn;
  return static_cast<int>(ceil_div(ceil_div(l.shape.ffn, chunks), 256) * 256);
}

int forward_chunks(const LayerConfig& l) {
  // h = act(A)*B is [T*K, n]; with n > d it is the forward's largest buffer (mixtral-8x7b:
  // 896 MiB beside o's 256), so the forward runs in up to 4 slot chunks that reuse one h.
  // chunk_slot_tile loops over the experts per block: only for layers with few of them.
  if (l.shape.ffn <= l.shape.hidden || l.shape.experts > 64) return 1;
  return static_cast<int>(std::min<int64_t>(4, ceil_div(int64_t{l.shape.ffn}, int64_t{l.shape.hidden})));
}

MemoryPlan plan_memory(const LayerConfig& l, int64_t tokens, CheckpointMode mode, int dgrad_bn) {
  // T*K within int32 slot indices, computed without overflow; with d, n <= kMaxWidth and
  // E <= 512 every byte count below then fits in 64 bits.
  l.validate();
  checked_token_slots(tokens, l.shape.topk, "tokens");
  MemoryPlan p;
  const SavedLayout s(l, tokens, mode);
  p.saved_bytes = s.total;
  p.index_bytes = s.index_bytes;
  p.forward_scratch_bytes = ForwardScratch(l, tokens).total;
  p.backward_scratch_bytes = BackwardScratch(l, tokens, mode, dgrad_bn).total;
  p.h_floor_bytes = static_cast<size_t>(tokens) * l.shape.topk * l.gate_parts() * l.shape.ffn * 2;
  return p;
}

}  // namespace moeblaze
