#include "families.hpp"

#include "generator/kernel_layer.hpp"

namespace moeblaze::families {

int accumulator_tile_bytes(const KernelSpec& spec) {
  return spec.tile.bm * kernel_layer_accumulator_cols(spec) * 2;
}

int two_block_staging_bytes(const KernelSpec& spec) { return 2 * spec.tile.bm * 64 * 2; }

std::string no_problem(const KernelSpec&) { return {}; }

}  // namespace moeblaze::families
