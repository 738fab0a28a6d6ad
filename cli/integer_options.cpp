// Every integer option is read in decimal. CLI11 converts integers with strtoll(.., 0), so
// `-T 0100` would be octal 64 and `-T 0x40` hex 64: a shape or bucket other than the one the
// user wrote, without a word.
#include <CLI/CLI.hpp>

#include <string>

#include "cli/commands.hpp"

namespace moeblaze::cli {
namespace {

// `value` as CLI11 must see it to read it in decimal (leading zeros dropped: "0100" is 100),
// or the reason it is no decimal integer.
std::string decimal_only(std::string& value) {
  size_t i = 0;
  std::string sign;
  if (!value.empty() && (value[0] == '+' || value[0] == '-')) {
    if (value[0] == '-') sign = "-";
    i = 1;
  }
  if (i == value.size()) return "'" + value + "' is not a decimal integer";
  for (size_t j = i; j < value.size(); ++j)
    if (value[j] < '0' || value[j] > '9')
      return "'" + value + "' is not a decimal integer (integers are decimal: no 0x, 0o or 0b prefix, no suffix)";
  const size_t first = value.find_first_not_of('0', i);
  value = first == std::string::npos ? "0" : sign + value.substr(first);
  return "";
}

bool is_integer_option(const CLI::Option& o) {
  const std::string type = o.get_type_name();
  return type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0;
}

}  // namespace

void read_integers_as_decimal(CLI::App& app) {
  for (CLI::Option* o : app.get_options())
    if (is_integer_option(*o)) o->transform(CLI::Validator(decimal_only, "", "decimal"));
  for (CLI::App* sub : app.get_subcommands(std::function<bool(CLI::App*)>{})) read_integers_as_decimal(*sub);
}

}  // namespace moeblaze::cli
