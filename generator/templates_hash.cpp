#include "core/hash.hpp"
#include "embedded_templates.hpp"

namespace moeblaze {

uint64_t templates_hash() {
  uint64_t h = fnv1a64("moeblaze-templates");
  for (const auto& t : embedded_templates()) {
    h = fnv1a64(std::string_view(t.name), h);
    h = fnv1a64(t.view(), h);
  }
  return h;
}

}  // namespace moeblaze
