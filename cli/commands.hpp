// Subcommand registry of the CLI. A command adds its options to the app and runs when
// selected; it returns the process exit code.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "generator/kernel_spec.hpp"
#include "generator/layer_config.hpp"

#include <map>

namespace moeblaze::cli {

struct Command {
  std::function<void(CLI::App&)> add;  // registers the subcommand
  std::function<bool()> selected;
  std::function<int()> run;
};

std::vector<Command> all_commands();

// Makes every integer option of `app` and its subcommands decimal only (CLI11 alone takes
// 0x.., 0o.., 0b.. and reads a leading zero as octal); call once every command is added.
void read_integers_as_decimal(CLI::App& app);

// Shape options shared by every command that works on one layer:
// --preset NAME | --experts --topk --hidden --ffn [--activation] [--router] ...
struct ShapeOptions {
  std::string preset;
  std::string preset_positional;  // `moeblaze plan qwen3-30b-a3b`: the same as --preset
  int experts = 0, topk = 0, hidden = 0, ffn = 0;
  std::string activation = "swiglu";
  std::string router;  // empty: the preset's router, or none
  std::string weight_layout = "separate";
  bool expert_bias = false;
  bool renormalize = false;
  float route_scale = 1.f;
  long long tokens = 0;  // when -T was not given: the preset's T
  CLI::Option* tokens_option = nullptr;  // the command's -T, to tell "-T 0" from no -T
  void add(CLI::App* cmd, bool with_tokens);
  bool tokens_given() const { return tokens_option && tokens_option->count() > 0; }
  // The layer and token count these options name; throws InvalidArgument naming the option.
  LayerConfig layer() const;
  long long token_count(long long fallback) const;
};

// Upper limits of the CLI's own counts (docs/cache.md "Limits").
inline constexpr int kMaxSamples = 100000;    // timed samples or steps
inline constexpr int kMaxCandidates = 1000;   // tile candidates per family

// Throws InvalidArgument(option) unless `path` is a regular file that exists (checked without
// opening it: a FIFO would block the read).
void require_regular_file(const std::string& path, const char* option);

// The timing routings of tune and bench: router | random | balanced | skewed; throws
// InvalidArgument(option) before any compile or launch.
void require_timing_routing(const std::string& routing, const char* option);

// Progress lines on stderr (cmd_tune.cpp): transient ones only on a terminal, where they
// overwrite each other; none at all when quiet.
std::function<void(const std::string& line, bool transient)> progress_printer(bool quiet);

// FAMILY=TILE pairs (repeatable --tile / --force options); throws InvalidArgument(option).
std::map<KernelFamily, TileConfig> parse_tiles(const std::vector<std::string>& pairs, const char* option);

Command presets_command();
Command generate_command();
Command forward_check_command();
Command grad_check_command();
Command tune_command();
Command regress_command();
Command bench_command();
Command plan_command();
Command cache_command();
Command space_command();

}  // namespace moeblaze::cli
