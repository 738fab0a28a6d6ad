#include "cli/json_report.hpp"

#include <string_view>

namespace moeblaze::cli {

std::optional<nlohmann::json>& pending_json() {
  static std::optional<nlohmann::json> report;
  return report;
}

void emit_json(nlohmann::json report) { pending_json() = std::move(report); }

nlohmann::json json_error(const std::string& kind, const std::string& message, int exit_code,
                          const std::string& argument) {
  nlohmann::json e{{"kind", kind}, {"message", message}, {"exit_code", exit_code}};
  if (!argument.empty()) e["argument"] = argument;
  return e;
}

bool wants_json(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") break;
    if (a == "--json" || a.rfind("--json=", 0) == 0) return true;
  }
  return false;
}

}  // namespace moeblaze::cli
