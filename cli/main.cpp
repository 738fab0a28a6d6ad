// The moeblaze command-line tool: a thin client of the library. Each subcommand lives in
// its own file (cli/cmd_*.cpp) and registers itself here.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/commands.hpp"
#include "cli/json_report.hpp"
#include "core/errors.hpp"
#include "runtime/compile_processes.hpp"

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

// A failed command: the message on stderr and, with --json, the JSON error object on stdout
// (inside the command's report when it had built one), then the documented exit code.
int fail(bool json, const std::string& kind, const std::string& message, int code, const std::string& argument = "",
         const std::string& hint = "") {
  fmt::print(stderr, "error: {}\n{}", message, hint);
  if (json) {
    auto& report = moeblaze::cli::pending_json();
    const nlohmann::json e = moeblaze::cli::json_error(kind, message, code, argument);
    if (report && report->is_object()) (*report)["error"] = e;
    else report = nlohmann::json{{"error", e}};
    fmt::print("{}\n", moeblaze::cli::json_text(*report));
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moeblaze: MoE layer kernels for Hopper GPUs, generated per shape, compiled with NVRTC"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("moeblaze ") + MOEBLAZE_VERSION);
  std::vector<moeblaze::cli::Command> commands = moeblaze::cli::all_commands();
  for (auto& c : commands) c.add(app);
  moeblaze::cli::read_integers_as_decimal(app);
  const bool json = moeblaze::cli::wants_json(argc, argv);
  const std::string help = "Run with --help for more information.\n";
  if (const std::string why = empty_value_problem(argc, argv); !why.empty())
    return fail(json, "bad_argument", why, 2, "", help);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0 as CLI11 prints them; every other parse error is a bad
    // argument: exit 2 (README "Exit codes"), with CLI11's message, which names the option.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    return fail(json, "bad_argument", e.what(), 2, "", help);
  }
  // The CLI builds on one thread, so its compiles can run in forked children, which NVRTC's
  // process-wide lock does not serialise (runtime/compile_processes.hpp). MOEBLAZE_COMPILE_PROCESSES=0
  // keeps them in threads.
  const std::string in_processes = std::getenv("MOEBLAZE_COMPILE_PROCESSES") ? std::getenv("MOEBLAZE_COMPILE_PROCESSES") : "";
  if (in_processes != "" && in_processes != "0" && in_processes != "1")
    return fail(json, "bad_argument",
                fmt::format("MOEBLAZE_COMPILE_PROCESSES: '{}' is neither 0 (compile in threads) nor 1 (in child processes)",
                            in_processes),
                2, "MOEBLAZE_COMPILE_PROCESSES");
  moeblaze::set_compile_in_processes(in_processes != "0");
  try {
    for (auto& c : commands)
      if (c.selected()) {
        const int rc = c.run();
        if (auto& report = moeblaze::cli::pending_json()) fmt::print("{}\n", moeblaze::cli::json_text(*report));
        return rc;
      }
  } catch (const moeblaze::InvalidArgument& e) {
    return fail(json, "bad_argument", e.what(), 2, e.argument);
  } catch (const moeblaze::NoGpu& e) {
    return fail(json, "no_gpu", std::string("this command needs a GPU: ") + e.what(), 3);
  } catch (const std::exception& e) {
    return fail(json, "failure", e.what(), 1);
  }
  return 0;
}
