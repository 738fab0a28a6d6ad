#include "cli/commands.hpp"

namespace moeblaze::cli {

std::vector<Command> all_commands() {
  return {presets_command(), generate_command(), plan_command(),  forward_check_command(), grad_check_command(),
          tune_command(),    bench_command(),    regress_command(), cache_command(),
          space_command()};
}

}  // namespace moeblaze::cli
