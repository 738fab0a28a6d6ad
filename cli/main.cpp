// The moeblaze command-line tool: a thin client of the library. Each subcommand lives in
// its own file (cli/cmd_*.cpp) and registers itself here.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "cli/commands.hpp"
#include "core/errors.hpp"

namespace {

// CLI11 reads an empty string as 0 for a number option: `cache gc --max-mb "$UNSET"` would
// delete every binary. No option of moeblaze takes an empty value, so none is accepted.
std::string empty_value_problem(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a.empty())
      return i > 1 && argv[i - 1][0] == '-' ? fmt::format("{}: an empty value is not allowed", argv[i - 1])
                                            : fmt::format("argument {}: an empty value is not allowed", i);
    if (a.rfind("--", 0) == 0 && a.back() == '=')
      return fmt::format("{}: an empty value is not allowed", a.substr(0, a.size() - 1));
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moeblaze: MoE layer kernels for Hopper GPUs, generated per shape, compiled with NVRTC"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("moeblaze ") + MOEBLAZE_VERSION);
  std::vector<moeblaze::cli::Command> commands = moeblaze::cli::all_commands();
  for (auto& c : commands) c.add(app);
  moeblaze::cli::read_integers_as_decimal(app);
  if (const std::string why = empty_value_problem(argc, argv); !why.empty()) {
    fmt::print(stderr, "error: {}\nRun with --help for more information.\n", why);
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0 as CLI11 prints them; every other parse error is a bad
    // argument: exit 2 (README "Exit codes"), with CLI11's message, which names the option.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    fmt::print(stderr, "error: {}\nRun with --help for more information.\n", e.what());
    return 2;
  }
  try {
    for (auto& c : commands)
      if (c.selected()) return c.run();
  } catch (const moeblaze::InvalidArgument& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const moeblaze::NoGpu& e) {
    fmt::print(stderr, "error: this command needs a GPU: {}\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
