// The kernel layer's families on the host (templates/moeblaze/sm90/, tiles with the _cute
// suffix): for each family the template it instantiates, the majors and sources of its
// operands, its epilogue's staging, its template arguments and what its parts can run. One
// table, so that a family on the layer is a row here plus its problem policy on the device.
#pragma once
#include <string>
#include <vector>

#include "kernel_spec.hpp"

namespace moeblaze {

struct KernelLayerFamily {
  KernelFamily family;
  const char* header;    // the family's problem policy (templates/moeblaze/sm90/)
  const char* function;  // its kernel function template
  bool a_mn_major, b_mn_major;  // operand majors (sm90/config.cuh Major)
  bool gathered;                // an operand comes by the producer warpgroup's cp.async (sm90/operand_gather.cuh)
};

// The family's row, or nullptr where the kernel layer does not run it.
const KernelLayerFamily* kernel_layer_family(KernelFamily f);

// Accumulator columns of a kernel-layer tile (the device config's BN): gate_up stacks its W1
// and W3 tiles (nb x bn), every other family bn.
int kernel_layer_accumulator_cols(const KernelSpec& spec);
// Bytes of the epilogue's staging (the device epilogue's STAGING_BYTES), and the kernel's
// dynamic shared memory: stages, staging, 2 KiB of barriers and alignment
// (sm90/gemm_kernel.cuh kernel_smem_bytes).
int kernel_layer_staging_bytes(const KernelSpec& spec);
int kernel_layer_smem_bytes(const KernelSpec& spec);
// Why a kernel-layer spec cannot be built (empty when it can).
std::string kernel_layer_problem(const KernelSpec& spec, int max_smem_bytes);
// The kernel function's template arguments: its KernelConfig, then the shape.
std::string kernel_layer_template_arguments(const KernelSpec& spec);

// A kernel-layer tile: bm x bn (gate_up: bn a part), `stages` deep, ping-pong or cooperative
// (Mainloop::pingpong / persistent), alone or as a pair along M.
TileConfig kernel_layer_tile(int bm, int bn, int stages, Mainloop schedule, int cluster_m = 1);

}  // namespace moeblaze
