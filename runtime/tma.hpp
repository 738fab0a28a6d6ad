// Host side of the TMA loads (templates/moeblaze/gemm/tma_loaders.cuh): the tensor maps a
// TMA tile's kernel argument carries. A weight [E, rows, k] (bf16, row-major) is viewed as
// the 2-D tensor [E*rows, k], boxes of [box_rows][64] (128-byte rows, 128-byte swizzle: the
// layout of the K-major stage tiles). Encoded per launch on the host (no device work).
#pragma once
#include <cstdint>
#include <string>

#include "cuda_driver.hpp"
#include "generator/kernel_spec.hpp"
#include "moeblaze/kernel_args.cuh"

namespace moeblaze {

// The arguments of cuTensorMapEncodeTiled for one weight view; `name` names the weight in
// errors. Pure (no driver call), so the checks are tested without a GPU.
struct WeightMapParams {
  uint64_t dims[2];     // {k, E*rows}: innermost first
  uint64_t strides[1];  // bytes between rows
  uint32_t box[2];      // {64, box_rows}
  uint32_t element_strides[2] = {1, 1};
};
// ld: elements between rows (0: k, rows packed).
WeightMapParams weight_map_params(CUdeviceptr base, int64_t total_rows, int64_t k, int box_rows, const char* name,
                                  int64_t ld = 0);

// Encodes the map (driver call; throws CudaError naming the tensor on failure). The same
// 2-D view serves activations: dH [T*K, G*n] and hg [T*K, cols] (rows ld apart), boxes of
// [64 rows][64 columns] for the MN-major stage blocks of the weight gradients.
TmaMap encode_weight_map(CUdeviceptr base, int64_t total_rows, int64_t k, int box_rows, const char* name,
                         int64_t ld = 0);

// Element type of an output map: bf16 gradients (stored or reduce-added), or an fp32 main
// gradient (reduce-added).
enum class OutputElement { bf16, f32 };
// The arguments of cuTensorMapEncodeTiled for an output [experts][rows][cols] (rows ld elements
// apart, experts rows*ld apart) written by TMA boxes of [1][box_rows][128 bytes] (the
// "_tmastore" epilogue, templates/moeblaze/gemm/epilogue/tma_store.cuh). Pure, tested without a
// GPU.
struct OutputMapParams {
  uint64_t dims[3];     // {cols, rows, experts}
  uint64_t strides[2];  // bytes between rows, between experts
  uint32_t box[3];      // {128 bytes of columns: 64 bf16 or 32 fp32, box_rows, 1}
  uint32_t element_strides[3] = {1, 1, 1};
};
// expert_rows: rows from one expert's first row to the next's (0: rows; a fused gate_up's dW1
// and dW3 views: 2n rows of which each view covers n). ld and expert_rows count elements.
OutputMapParams output_map_params(CUdeviceptr base, int64_t experts, int64_t rows, int64_t cols, int64_t ld,
                                  int box_rows, const char* name, int64_t expert_rows = 0,
                                  OutputElement element = OutputElement::bf16);
TmaMap encode_output_map(CUdeviceptr base, int64_t experts, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                         const char* name, int64_t expert_rows = 0, OutputElement element = OutputElement::bf16);

// A ragged view of a row-major [rows][cols] bf16 output (rows ld elements apart) for TMA stores
// that stop at a group's last row (the kernel layer's epilogue, templates/moeblaze/sm90/
// epilogue_store.cuh): dims {cols, 2^30, 2^31 - 1}, both outer strides one row, and the base
// moved back 2^30 rows (unsigned wrap-around). A box stored at (col, 2^30 - n, r0 + n) writes
// rows r0 .. r0 + n - 1 only: its rows from the n-th on lie at or past 2^30, outside the map.
// (The addressing is the public "ragged TMA" construction, e.g. Triton's tools/ragged_tma.py.)
struct RaggedMapParams {
  CUdeviceptr base;     // the output's address minus 2^30 rows
  uint64_t dims[3];
  uint64_t strides[2];  // bytes: one row, one row
  uint32_t box[3];      // {box_cols bf16, box_rows, 1}
  uint32_t element_strides[3] = {1, 1, 1};
};
// box_cols: 64 (128-byte swizzle) or 32 (64-byte swizzle: sm90/staging.cuh's 32-column boxes).
RaggedMapParams ragged_rows_map_params(CUdeviceptr base, int64_t rows, int64_t cols, int64_t ld, int box_rows,
                                       const char* name, int box_cols = 64);
TmaMap encode_ragged_rows_map(CUdeviceptr base, int64_t rows, int64_t cols, int64_t ld, int box_rows, const char* name,
                              int box_cols = 64);

// Rows of the box of a K-major weight map read by a [bn x parts]-row stage (gemm::TmaStageLoader):
// bn, or in a cluster pair whose stage has one part (down_proj's W2, a plain activation's W1)
// bn / cluster_m, since each block multicasts its half of the rows; a pair with two parts
// (W1 | W3) multicasts one whole part from each block.
int k_major_weight_box_rows(const TileConfig& t, int parts);

// Whether a TMA-store tile adds an fp32 main gradient by TMA (gemm/epilogue/tma_store.cuh
// f32_slabs_fit): tiles of 128 rows or more, whose bf16 staging holds a [64][BN] fp32 slab
// (whole-tile staging) or a [64][64] fp32 chunk (each 64-column buffer of _tmastore64); other
// tiles add from registers and get no fp32 map.
bool f32_tma_epilogue(const TileConfig& t);

// The tensor maps of a TMA tile's kernel argument (TileConfig::tma_contiguous; nothing otherwise).
void attach_weight_maps(GateUpArgs& up, const TileConfig& t, const LayerConfig& l);
void attach_weight_maps(DownProjArgs& down, const TileConfig& t, const LayerConfig& l, int64_t h_rows);
void attach_weight_maps(DownDgradArgs& dd, const TileConfig& t, const LayerConfig& l);
void attach_weight_maps(GateUpDgradArgs& ud, const TileConfig& t, const LayerConfig& l, int64_t slots);
// "_tmastore" tiles of the per-slot outputs (o of down_proj, dxs of gate_up_dgrad: [slots, d]):
// the output map, [1][slots][d] with [bm][64] boxes (nothing for other tiles).
void attach_output_map(DownProjArgs& down, const TileConfig& t, const LayerConfig& l, int64_t slots);
void attach_output_map(GateUpDgradArgs& ud, const TileConfig& t, const LayerConfig& l, int64_t slots);
// gate_up_wgrad reads dH (A: [slots, cols]), down_wgrad hg (B: [slots, cols], rows ld apart).
void attach_dh_map(WgradArgs& w, const TileConfig& t, int64_t slots, int64_t cols);
void attach_hg_map(WgradArgs& w, const TileConfig& t, int64_t slots, int64_t cols, int64_t ld);
// "_tmastore" weight gradients (bf16 stored or reduce-added; fp32 main gradients reduce-added on
// tiles of 128 rows or more, else the register epilogue):
// the output maps, [E][rows][cols] with rows ld apart and experts expert_rows rows apart (0:
// rows); out0 already offset to the first column (down wgrad column chunks), out1 dW3 or nullptr.
void attach_output_maps(WgradArgs& w, const TileConfig& t, int64_t experts, int64_t rows, int64_t cols,
                        int64_t ld, const void* out0, const void* out1, int64_t expert_rows = 0);
// The rows of those maps' boxes: the tile's, or 64 where the fp32 slabs of a hand-written tile go
// 64 rows at a time, or where a kernel-layer row tile can straddle two matrices (two_matrices and
// rows % bm != 0: sm90/epilogue_wgrad.cuh stores it in 64-row pieces, each inside one matrix).
int wgrad_output_box_rows(const TileConfig& t, bool f32, bool two_matrices, int64_t rows);

// Kernel-layer tiles (TileConfig::cute) of the families whose epilogues move activations by TMA
// (nothing for other tiles): gate_up's H (its gate and up columns apart, when saved) and h
// (h_rows: the h buffer's); down_dgrad's H and dH (in place: the same tensor) and the hg
// buffer's columns of the launch's chunk (cols of them, rows ld apart).
void attach_kernel_layer_maps(GateUpArgs& up, const TileConfig& t, const LayerConfig& l, int64_t slots, int64_t h_rows);
void attach_kernel_layer_maps(DownDgradArgs& dd, const TileConfig& t, const LayerConfig& l, int64_t slots);
void attach_hg_out_map(DownDgradArgs& dd, const TileConfig& t, int64_t slots, int64_t cols, int64_t ld);

// Rows of the TMA views of W1 and W3 ([rows, d]): E*n each, or for a fused gate_up the
// [E*2n, d] tensor from W1's first row and from W3's (n rows fewer).
int64_t w1_map_rows(const LayerConfig& l);
int64_t w3_map_rows(const LayerConfig& l);

}  // namespace moeblaze
