#include "cli/commands.hpp"

namespace moeblaze::cli {

std::vector<Command> all_commands() {
  return {presets_command(), generate_command()};
}

}  // namespace moeblaze::cli
