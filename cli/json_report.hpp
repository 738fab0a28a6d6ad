// The text of a --json report. Paths and names come from the user and need not be UTF-8,
// which JSON requires: nlohmann's default dump throws on them, after the command has done its
// work (a gc that deleted binaries, then exit 1 with no report). Invalid bytes are replaced
// with U+FFFD instead, so every report prints.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace moeblaze::cli {

inline std::string json_text(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace moeblaze::cli
