// `moeblaze space`: the kernel layer's tile space of a layer as the tuner sees it (no GPU):
// every point's legality with its reason, the legal ones ranked by the cost model, and, for
// bench/fit_cost_model.py, the model's terms of given (shape, family, tile) triples.
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <regex>

#include "cli/commands.hpp"
#include "cli/json_report.hpp"
#include "core/errors.hpp"
#include "generator/cost_model.hpp"
#include "generator/heuristics.hpp"
#include "generator/tile_space.hpp"

namespace moeblaze::cli {
namespace {

DeviceModel parse_device(const std::string& s) {
  if (s == "h100") return device_model_for("H100 SXM", 132);
  if (s == "h200") return device_model_for("H200", 132);
  throw InvalidArgument("--device", fmt::format("'{}' is not a device model: h100 or h200", s));
}

nlohmann::json terms_json(const CostTerms& c) {
  return {{"tiles_total", c.tiles_total}, {"tiles", c.tiles},     {"k_steps", c.k_steps},
          {"step_us", c.step_us},         {"mainloop_us", c.mainloop_us}, {"output_kib", c.output_kib},
          {"dram_us", c.dram_us},         {"tile_class", c.tile_class}};
}

// Batch mode: a JSON array of {"E","K","d","n","T","family","tile","device"[, "activation"]}
// in; out, the model's constants and the same objects with "terms" and "predicted_us".
int print_terms(const std::string& path) {
  require_regular_file(path, "--terms");
  std::ifstream in(path);
  nlohmann::json rows;
  try {
    rows = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw InvalidArgument("--terms", fmt::format("'{}' is not JSON: {}", path, e.what()));
  }
  if (!rows.is_array()) throw InvalidArgument("--terms", fmt::format("'{}' must hold a JSON array of rows", path));
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    try {
      LayerConfig l;
      l.shape = {r.at("E").get<int>(), r.at("K").get<int>(), r.at("d").get<int>(), r.at("n").get<int>()};
      if (r.contains("activation")) l.activation = parse_activation(r["activation"].get<std::string>());
      l.validate();
      const KernelSpec spec{parse_family(r.at("family").get<std::string>()), l,
                            TileConfig::parse(r.at("tile").get<std::string>()), Arch::sm_90a};
      const CostTerms c = cost_terms(spec, r.at("T").get<int64_t>(), parse_device(r.value("device", "h100")));
      nlohmann::json o = r;
      o["terms"] = terms_json(c);
      o["predicted_us"] = predicted_us(c);
      out.push_back(o);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("--terms", fmt::format("row {} of '{}': {}: {}", i, path, e.argument, e.reason));
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument("--terms", fmt::format("row {} of '{}': {}", i, path, e.what()));
    }
  }
  const CostConstants& k = cost_constants();
  auto three = [](const double (&v)[3]) { return nlohmann::json::array({v[0], v[1], v[2]}); };
  const nlohmann::json constants = {{"launch_us", k.launch_us},
                                    {"dram", k.dram},
                                    {"mainloop", three(k.mainloop)},
                                    {"tile_us", three(k.tile_us)},
                                    {"output_us_per_kib", three(k.output_us_per_kib)}};
  emit_json({{"constants", constants}, {"rows", out}});
  return 0;
}

}  // namespace

Command space_command() {
  struct State {
    CLI::App* app = nullptr;
    ShapeOptions shape;
    std::vector<std::string> families;
    int top = 8;
    std::string device = "h100";
    std::string terms;
    bool json = false, refused = false;
  };
  auto st = std::make_shared<State>();
  Command c;
  c.add = [st](CLI::App& root) {
    st->app = root.add_subcommand(
        "space", "the kernel layer's tile space of a layer: legality, and the cost model's ranking (no GPU)");
    st->shape.add(st->app, true);
    st->app->add_option("--family", st->families, "a family to show (repeatable; default: every expert GEMM)");
    st->app->add_option("--top", st->top, "ranked tiles shown per family")->capture_default_str();
    st->app->add_option("--device", st->device, "the device the model assumes: h100 | h200")->capture_default_str();
    st->app->add_flag("--refused", st->refused, "also count the refused points by reason");
    st->app->add_option("--terms", st->terms,
                        "FILE: a JSON array of {E,K,d,n,T,family,tile,device} rows; prints each row's model terms "
                        "(bench/fit_cost_model.py); no layer options needed");
    st->app->add_flag("--json", st->json, "machine-readable output");
  };
  c.selected = [st] { return st->app->parsed(); };
  c.run = [st] {
    if (!st->terms.empty()) return print_terms(st->terms);
    if (st->top < 1 || st->top > kMaxCandidates)
      throw InvalidArgument("--top", fmt::format("{} is not in [1, {}]", st->top, kMaxCandidates));
    const DeviceModel device = parse_device(st->device);
    const LayerConfig l = st->shape.layer();
    const int64_t T = st->shape.token_count(0);
    if (T <= 0) throw InvalidArgument("--tokens", "give the step's token count (-T): the model ranks tiles for it");
    std::vector<KernelFamily> families;
    for (const std::string& f : st->families) {
      try {
        families.push_back(parse_family(f));
      } catch (const InvalidArgument& e) {
        throw InvalidArgument("--family", e.reason);
      }
      if (!has_cost_model(families.back()))
        throw InvalidArgument("--family", fmt::format("{} has no tile space (the expert GEMMs have)", f));
    }
    if (families.empty())
      for (KernelFamily f : all_families())
        if (has_cost_model(f) && family_runs(f, l)) families.push_back(f);
    nlohmann::json j = {{"layer", l.describe()}, {"tokens", T}, {"device", device.name}};
    if (!st->json) fmt::print("{} T={} (model: {})\n", l.describe(), T, device.name);
    for (KernelFamily f : families) {
      const auto space = kernel_layer_space(f, l, Arch::sm_90a);
      std::map<std::string, int> reasons;
      // The reasons that name a size grouped without it ("N bytes of shared memory exceeds 232448").
      static const std::regex leading_count("^[0-9]+ ");
      for (const auto& p : space)
        if (!p.refused.empty()) ++reasons[std::regex_replace(p.refused, leading_count, "N ")];
      const auto ranked = ranked_tiles(f, l, T, Arch::sm_90a, device);
      const TileConfig def = default_tile(f, l, Arch::sm_90a, T);
      const double def_us = predicted_us(KernelSpec{f, l, def, Arch::sm_90a}, T, device);
      nlohmann::json jf = {{"family", to_string(f)},          {"points", space.size()},
                           {"legal", ranked.size()},          {"default", def.to_string()},
                           {"default_predicted_us", def_us}, {"ranked", nlohmann::json::array()}};
      if (!st->json)
        fmt::print("{}: {} points, {} legal; default {} predicted {:.1f} us\n", to_string(f), space.size(),
                   ranked.size(), def.to_string(), def_us);
      for (size_t i = 0; i < ranked.size() && int(i) < st->top; ++i) {
        const CostTerms t = cost_terms(KernelSpec{f, l, ranked[i].tile, Arch::sm_90a}, T, device);
        if (st->json)
          jf["ranked"].push_back({{"tile", ranked[i].tile.to_string()}, {"predicted_us", ranked[i].predicted_us},
                                  {"terms", terms_json(t)}});
        else
          fmt::print("  {:>2}. {:<48} {:>9.1f} us  ({:.0f} tiles/SM x {} k-steps x {:.3f} us, {:.0f} KiB out)\n", i + 1,
                     ranked[i].tile.to_string(), ranked[i].predicted_us, t.tiles, t.k_steps, t.step_us, t.output_kib);
      }
      if (st->refused) {
        nlohmann::json jr = nlohmann::json::object();
        for (const auto& [why, n] : reasons) {
          jr[why] = n;
          if (!st->json) fmt::print("  refused {:>4}: {}\n", n, why);
        }
        jf["refused"] = jr;
      }
      j["families"].push_back(jf);
    }
    if (st->json) emit_json(j);
    return 0;
  };
  return c;
}

}  // namespace moeblaze::cli
