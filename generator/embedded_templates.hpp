// The kernel template headers of templates/, embedded at build time
// (cmake/EmbedTemplates.cmake). Names are paths relative to templates/, e.g.
// "moeblaze/common.cuh", exactly as kernels #include them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace moeblaze {

struct EmbeddedTemplate {
  const char* name;
  const char* text;
  std::size_t size;
  std::string_view view() const { return {text, size}; }
};

const std::vector<EmbeddedTemplate>& embedded_templates();

// Hash of every embedded template header (names and contents): changes whenever any
// kernel template changes. Part of every cache key.
uint64_t templates_hash();

}  // namespace moeblaze
