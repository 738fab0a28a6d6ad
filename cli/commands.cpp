#include "cli/commands.hpp"

namespace moeblaze::cli {

std::vector<Command> all_commands() {
  return {presets_command(), generate_command(), forward_check_command(), grad_check_command()};
}

}  // namespace moeblaze::cli
