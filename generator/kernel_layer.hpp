// The kernel layer on the host (templates/moeblaze/sm90/, tiles with the _cute suffix): the rules
// every kernel-layer tile shares, composed with each family's KernelLayerDef (its template, the
// majors of its operands, its epilogue's staging, its template arguments and its own legality,
// written in generator/families/). A family on the layer is a row there plus its problem policy
// on the device.
#pragma once
#include <string>
#include <vector>

#include "family_def.hpp"
#include "kernel_spec.hpp"

namespace moeblaze {

// The family's kernel-layer row (generator/families/), or nullptr where the kernel layer does
// not run it.
const KernelLayerDef* kernel_layer_family(KernelFamily f);

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
