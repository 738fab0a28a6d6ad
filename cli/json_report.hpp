// The --json reports. Every one is a nlohmann::json value, printed once by main() when the
// command ends: a failure after the report was built (tune's --baseline-out without a GPU)
// then still prints one JSON document, the report with an "error" member, and a failure
// before it prints {"error": {...}}. Scripts can parse stdout in every outcome.
//
// Paths and names come from the user and need not be UTF-8, which JSON requires: nlohmann's
// default dump throws on them, after the command has done its work (a gc that deleted
// binaries, then exit 1 with no report). Invalid bytes are replaced with U+FFFD instead, so
// every report prints.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace moeblaze::cli {

inline std::string json_text(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The report of the running command, printed by main() (json_report.cpp).
void emit_json(nlohmann::json report);
std::optional<nlohmann::json>& pending_json();

// {"kind", "message", "exit_code"[, "argument"]}: what main() prints (or adds to the report)
// when a command fails with --json. kind: bad_argument (exit 2), no_gpu (3), failure (1).
nlohmann::json json_error(const std::string& kind, const std::string& message, int exit_code,
                          const std::string& argument = "");

// Whether the command line asks for --json (looked for before parsing, so that a parse error
// is reported as JSON too).
bool wants_json(int argc, char** argv);

}  // namespace moeblaze::cli
