#include "tma.hpp"

#include <fmt/format.h>

#include <cstring>

namespace moeblaze {

namespace {
// The limits of cuTensorMapEncodeTiled (CUDA driver API, "Tensor Map Object Management") that
// every view here must meet: `rows` rows of `cols` elements of `elem_bytes` (bf16: 2, fp32: 4),
// `ld` elements apart, read or written in boxes of [box_rows][128 bytes].
void check_tma_view(CUdeviceptr base, int64_t rows, int64_t cols, int64_t ld, int box_rows, const char* name,
                    int elem_bytes = 2) {
  if (base % 16 != 0) throw InvalidArgument(name, fmt::format("pointer {:#x} is not 16-byte aligned (TMA)", base));
  if (cols <= 0 || rows <= 0) throw InvalidArgument(name, "is empty");
  if ((ld * elem_bytes) % 16 != 0)
    throw InvalidArgument(name, fmt::format("rows {} {} apart are not a multiple of 16 bytes apart (TMA)", ld,
                                            elem_bytes == 2 ? "bf16" : "fp32"));
  if (ld < cols) throw InvalidArgument(name, fmt::format("row stride {} is below the row width {}", ld, cols));
  if (box_rows < 1 || box_rows > 256) throw InvalidArgument("tile", fmt::format("TMA box of {} rows", box_rows));
  if (rows >= (int64_t{1} << 31)) throw InvalidArgument(name, "has 2^31 rows or more (TMA coordinates)");
}

// One bf16 (or fp32) tensor map in the 128-byte swizzle (the layout of the wgmma stage tiles).
template <int RANK>
TmaMap encode_tiled(CUdeviceptr base, const uint64_t (&dims)[RANK], const uint64_t (&strides)[RANK - 1],
                    const uint32_t (&box)[RANK], const uint32_t (&element_strides)[RANK],
                    CUtensorMapL2promotion promotion, const char* name,
                    CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                    CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  static_assert(sizeof(TmaMap) == sizeof(CUtensorMap) && alignof(TmaMap) >= alignof(CUtensorMap),
                "TmaMap must hold a CUtensorMap");
  CUtensorMap map;
  const CUresult r = cuda_driver().cuTensorMapEncodeTiled(
      &map, type, RANK, reinterpret_cast<void*>(base), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check_cuda(r, fmt::format("cuTensorMapEncodeTiled({})", name).c_str());
  TmaMap out;
  std::memcpy(&out, &map, sizeof map);
  return out;
}
}  // namespace

WeightMapParams weight_map_params(CUdeviceptr base, int64_t total_rows, int64_t k, int box_rows, const char* name,
                                  int64_t ld) {
  if (ld == 0) ld = k;
  check_tma_view(base, total_rows, k, ld, box_rows, name);
  WeightMapParams p;
  p.dims[0] = static_cast<uint64_t>(k);
  p.dims[1] = static_cast<uint64_t>(total_rows);
  p.strides[0] = static_cast<uint64_t>(ld) * 2;
  p.box[0] = 64;  // 128 bytes: the swizzle span
  p.box[1] = static_cast<uint32_t>(box_rows);
  return p;
}

TmaMap encode_weight_map(CUdeviceptr base, int64_t total_rows, int64_t k, int box_rows, const char* name,
                         int64_t ld) {
  const WeightMapParams p = weight_map_params(base, total_rows, k, box_rows, name, ld);
  return encode_tiled<2>(base, p.dims, p.strides, p.box, p.element_strides, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, name);
}

OutputMapParams output_map_params(CUdeviceptr base, int64_t experts, int64_t rows, int64_t cols, int64_t ld,
                                  int box_rows, const char* name, int64_t expert_rows, OutputElement element) {
  const int elem_bytes = element == OutputElement::f32 ? 4 : 2;
  check_tma_view(base, rows, cols, ld, box_rows, name, elem_bytes);
  if (experts <= 0) throw InvalidArgument(name, "is empty");
  if (expert_rows == 0) expert_rows = rows;
  if (expert_rows < rows)
    throw InvalidArgument(name, fmt::format("experts {} rows apart overlap their {} rows", expert_rows, rows));
  if (experts >= (int64_t{1} << 31)) throw InvalidArgument(name, "has 2^31 rows or more (TMA coordinates)");
  OutputMapParams p;
  p.dims[0] = static_cast<uint64_t>(cols);
  p.dims[1] = static_cast<uint64_t>(rows);
  p.dims[2] = static_cast<uint64_t>(experts);
  p.strides[0] = static_cast<uint64_t>(ld) * elem_bytes;
  p.strides[1] = static_cast<uint64_t>(expert_rows) * static_cast<uint64_t>(ld) * elem_bytes;
  p.box[0] = 128 / elem_bytes;  // the swizzle span
  p.box[1] = static_cast<uint32_t>(box_rows);
  p.box[2] = 1;
  return p;
}

TmaMap encode_output_map(CUdeviceptr base, int64_t experts, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                         const char* name, int64_t expert_rows, OutputElement element) {
  const OutputMapParams p = output_map_params(base, experts, rows, cols, ld, box_rows, name, expert_rows, element);
  return encode_tiled<3>(base, p.dims, p.strides, p.box, p.element_strides, CU_TENSOR_MAP_L2_PROMOTION_NONE, name,
                         element == OutputElement::f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
}

RaggedMapParams ragged_rows_map_params(CUdeviceptr base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                                       const char* name, int box_cols) {
  check_tma_view(base, rows, cols, ld, box_rows, name);
  if (box_cols != 64 && box_cols != 32)
    throw InvalidArgument("tile", fmt::format("a ragged TMA box of {} columns (64 or 32)", box_cols));
  constexpr uint64_t kBase = uint64_t{1} << 30, kLimit = (uint64_t{1} << 31) - 1;
  if (static_cast<uint64_t>(rows) > kLimit - kBase)
    throw InvalidArgument(name, fmt::format("{} rows are too many for a ragged TMA view (at most 2^30 - 1)", rows));
  RaggedMapParams p;
  const uint64_t row_bytes = static_cast<uint64_t>(ld) * 2;
  p.base = base - kBase * row_bytes;  // wraps around for small addresses: the map's coordinates add it back
  p.dims[0] = static_cast<uint64_t>(cols);
  p.dims[1] = kBase;
  p.dims[2] = kLimit;
  p.strides[0] = p.strides[1] = row_bytes;
  p.box[0] = static_cast<uint32_t>(box_cols);  // the swizzle span: 128 or 64 bytes
  p.box[1] = static_cast<uint32_t>(box_rows);
  p.box[2] = 1;
  return p;
}

TmaMap encode_ragged_rows_map(CUdeviceptr base, int64_t rows, int64_t cols, int64_t ld, int box_rows, const char* name,
                              int box_cols) {
  const RaggedMapParams p = ragged_rows_map_params(base, rows, cols, ld, box_rows, name, box_cols);
  return encode_tiled<3>(p.base, p.dims, p.strides, p.box, p.element_strides, CU_TENSOR_MAP_L2_PROMOTION_NONE, name,
                         CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                         box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B);
}

int64_t w1_map_rows(const LayerConfig& l) { return int64_t{l.shape.experts} * l.w1_rows(); }
int64_t w3_map_rows(const LayerConfig& l) { return w1_map_rows(l) - (l.fused_gate_up() ? l.shape.ffn : 0); }

bool f32_tma_epilogue(const TileConfig& t) { return t.tma_store && t.bm >= 128; }

int k_major_weight_box_rows(const TileConfig& t, int parts) {
  return parts == 1 ? t.bn / t.cluster_m : t.bn;
}

// TMA tiles (TileConfig::tma) read their weight tiles through tensor maps in the argument.
void attach_weight_maps(GateUpArgs& up, const TileConfig& t, const LayerConfig& l) {
  if (!t.tma_contiguous) return;
  const int box_rows = k_major_weight_box_rows(t, up.w3 ? 2 : 1);
  up.tma_w1 = encode_weight_map(reinterpret_cast<CUdeviceptr>(up.w1), w1_map_rows(l), l.shape.hidden, box_rows, "w1");
  if (up.w3)
    up.tma_w3 = encode_weight_map(reinterpret_cast<CUdeviceptr>(up.w3), w3_map_rows(l), l.shape.hidden, box_rows, "w3");
}
// h_rows: rows of the h buffer (one forward chunk).
void attach_weight_maps(DownProjArgs& down, const TileConfig& t, const LayerConfig& l, int64_t h_rows) {
  if (!t.tma_contiguous) return;
  const int64_t rows = int64_t{l.shape.experts} * l.shape.hidden;
  down.tma_w2 =
      encode_weight_map(reinterpret_cast<CUdeviceptr>(down.w2), rows, l.shape.ffn, k_major_weight_box_rows(t, 1), "w2");
  down.tma_h = encode_weight_map(reinterpret_cast<CUdeviceptr>(down.h), h_rows, l.shape.ffn, t.bm, "h");
}
// Backward: W2 for the down dgrad ([E*d, n], 64x64 boxes of MN-major k stages); dH ([T*K, G*n],
// [bm][64] boxes) and W1/W3 ([E*n, d], 64x64 boxes) for the up dgrad.
void attach_weight_maps(DownDgradArgs& dd, const TileConfig& t, const LayerConfig& l) {
  if (!t.tma_contiguous) return;
  const int64_t rows = int64_t{l.shape.experts} * l.shape.hidden;
  dd.tma_w2 = encode_weight_map(reinterpret_cast<CUdeviceptr>(dd.w2), rows, l.shape.ffn, 64, "w2");
}
void attach_weight_maps(GateUpDgradArgs& ud, const TileConfig& t, const LayerConfig& l, int64_t slots) {
  if (!t.tma_contiguous) return;
  ud.tma_dh = encode_weight_map(reinterpret_cast<CUdeviceptr>(ud.dH), slots, int64_t{l.gate_parts()} * l.shape.ffn,
                                t.bm, "dH");
  ud.tma_w1 = encode_weight_map(reinterpret_cast<CUdeviceptr>(ud.w1), w1_map_rows(l), l.shape.hidden, 64, "w1");
  if (ud.w3)
    ud.tma_w3 = encode_weight_map(reinterpret_cast<CUdeviceptr>(ud.w3), w3_map_rows(l), l.shape.hidden, 64, "w3");
}
// A [slots, d] per-slot output as one "expert" of the 3-D output maps.
static TmaMap slot_rows_map(const void* rows, const TileConfig& t, const LayerConfig& l, int64_t slots, const char* name) {
  return encode_output_map(reinterpret_cast<CUdeviceptr>(rows), 1, slots, l.shape.hidden, l.shape.hidden, t.bm, name);
}
void attach_output_map(DownProjArgs& down, const TileConfig& t, const LayerConfig& l, int64_t slots) {
  if (t.cute) down.tma_o = encode_ragged_rows_map(reinterpret_cast<CUdeviceptr>(down.o), slots, l.shape.hidden,
                                                 l.shape.hidden, t.bm, "o");
  else if (t.tma_store) down.tma_o = slot_rows_map(down.o, t, l, slots, "o");
}
void attach_output_map(GateUpDgradArgs& ud, const TileConfig& t, const LayerConfig& l, int64_t slots) {
  if (t.cute) ud.tma_dxs = encode_ragged_rows_map(reinterpret_cast<CUdeviceptr>(ud.dxs), slots, l.shape.hidden,
                                                  l.shape.hidden, t.bm, "dxs");
  else if (t.tma_store) ud.tma_dxs = slot_rows_map(ud.dxs, t, l, slots, "dxs");
}
// gate_up_wgrad reads dH (A: [T*K, G*n]), down_wgrad hg (B: [T*K, cols], rows ld apart) by TMA;
// kernel-layer tiles through ragged views, so a k step's rows stop at the expert's last slot.
void attach_dh_map(WgradArgs& w, const TileConfig& t, int64_t slots, int64_t cols) {
  const CUdeviceptr a = reinterpret_cast<CUdeviceptr>(w.a);
  if (t.cute) w.tma_a = encode_ragged_rows_map(a, slots, cols, cols, 64, "dH");
  else if (t.tma_contiguous) w.tma_a = encode_weight_map(a, slots, cols, 64, "dH");
}
void attach_hg_map(WgradArgs& w, const TileConfig& t, int64_t slots, int64_t cols, int64_t ld) {
  const CUdeviceptr b = reinterpret_cast<CUdeviceptr>(w.b);
  if (t.cute) w.tma_b = encode_ragged_rows_map(b, slots, cols, ld, 64, "hg");
  else if (t.tma_contiguous) w.tma_b = encode_weight_map(b, slots, cols, 64, "hg", ld);
}

void attach_kernel_layer_maps(GateUpArgs& up, const TileConfig& t, const LayerConfig& l, int64_t slots, int64_t h_rows) {
  if (!t.cute) return;
  const int64_t n = l.shape.ffn, G = l.gate_parts();
  const int box = t.bn % 64 ? 32 : 64;  // sm90/epilogue_gate_up.cuh: H's parts and h in bn-wide boxes' halves
  if (up.H) {
    const CUdeviceptr H = reinterpret_cast<CUdeviceptr>(up.H);
    up.tma_H_gate = encode_ragged_rows_map(H, slots, n, G * n, t.bm, "H", box);
    if (G == 2) up.tma_H_up = encode_ragged_rows_map(H + n * 2, slots, n, G * n, t.bm, "H", box);
  }
  if (up.h) up.tma_h_out = encode_ragged_rows_map(reinterpret_cast<CUdeviceptr>(up.h), h_rows, n, n, t.bm, "h", box);
}
void attach_kernel_layer_maps(DownDgradArgs& dd, const TileConfig& t, const LayerConfig& l, int64_t slots) {
  if (!t.cute) return;
  const int64_t n = l.shape.ffn, G = l.gate_parts();
  const CUdeviceptr H = reinterpret_cast<CUdeviceptr>(dd.H), dH = reinterpret_cast<CUdeviceptr>(dd.dH);
  dd.tma_H_gate = encode_ragged_rows_map(H, slots, n, G * n, t.bm, "H");
  dd.tma_dH_gate = encode_ragged_rows_map(dH, slots, n, G * n, t.bm, "dH");
  if (G == 2) {
    dd.tma_H_up = encode_ragged_rows_map(H + n * 2, slots, n, G * n, t.bm, "H");
    dd.tma_dH_up = encode_ragged_rows_map(dH + n * 2, slots, n, G * n, t.bm, "dH");
  }
}
void attach_hg_out_map(DownDgradArgs& dd, const TileConfig& t, int64_t slots, int64_t cols, int64_t ld) {
  if (t.cute) dd.tma_hg_out = encode_ragged_rows_map(reinterpret_cast<CUdeviceptr>(dd.hg), slots, cols, ld, t.bm, "hg");
}

int wgrad_output_box_rows(const TileConfig& t, bool f32, bool two_matrices, int64_t rows) {
  if (f32 && !t.cute) return 64;
  if (t.cute && two_matrices && rows % t.bm != 0) return 64;
  return t.bm;
}

void attach_output_maps(WgradArgs& w, const TileConfig& t, int64_t experts, int64_t rows, int64_t cols,
                        int64_t ld, const void* out0, const void* out1, int64_t expert_rows) {
  // TMA-store tiles write the gradients by TMA: bf16 stored or reduce-added in [bm][64] boxes, an
  // fp32 main gradient reduce-added in [64][32] boxes, 64 rows at a time through the staging
  // buffer (tiles of 128 rows or more: gemm/epilogue/wgrad_store.cuh tma_epilogue).
  // Kernel-layer tiles write both from whole [bm][128-byte] boxes, or in [64][128-byte] pieces
  // where a row tile can straddle the two matrices (rows % bm != 0: sm90/epilogue_wgrad.cuh).
  if (!t.tma_store) return;
  const bool f32 = w.grad_output == static_cast<int>(GradOutput::add_f32);
  if (f32 && !t.cute && !f32_tma_epilogue(t)) return;
  const OutputElement elem = f32 ? OutputElement::f32 : OutputElement::bf16;
  const int box_rows = wgrad_output_box_rows(t, f32, out1 != nullptr, rows);
  w.tma_out0 = encode_output_map(reinterpret_cast<CUdeviceptr>(out0), experts, rows, cols, ld, box_rows,
                                 "weight gradient", expert_rows, elem);
  if (out1)
    w.tma_out1 = encode_output_map(reinterpret_cast<CUdeviceptr>(out1), experts, rows, cols, ld, box_rows, "dw3",
                                   expert_rows, elem);
}

}  // namespace moeblaze
