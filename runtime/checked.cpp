#include "checked.hpp"

#include <fmt/format.h>

#include <cmath>

#include "errors.hpp"

namespace moeblaze {
namespace {

std::string named(const std::string& symbol, const std::string& value) {
  return symbol.empty() ? value : symbol + " = " + value;
}

}  // namespace

int64_t require_in_range(int64_t v, int64_t lo, int64_t hi, const std::string& argument, const std::string& symbol) {
  if (v < lo || v > hi)
    throw InvalidArgument(argument, fmt::format("{} is outside [{}, {}]", named(symbol, std::to_string(v)), lo, hi));
  return v;
}

double require_finite(double v, double lo, double hi, const std::string& argument, const std::string& symbol) {
  if (!std::isfinite(v))
    throw InvalidArgument(argument, fmt::format("{} is not a finite number", named(symbol, fmt::format("{}", v))));
  if (v < lo || v > hi)
    throw InvalidArgument(argument, fmt::format("{} is outside [{}, {}]", named(symbol, fmt::format("{}", v)), lo, hi));
  return v;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& argument, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw InvalidArgument(argument, fmt::format("{} = {} x {} overflows 64 bits", what, a, b));
  return r;
}

int64_t checked_token_slots(int64_t tokens, int64_t topk, const std::string& argument) {
  if (tokens < 1) throw InvalidArgument(argument, fmt::format("T = {} must be at least 1", tokens));
  int64_t slots = 0;
  if (__builtin_mul_overflow(tokens, topk, &slots) || slots > kMaxTokenSlots)
    throw InvalidArgument(argument, fmt::format("T*K = {} x {} must stay below 2^31", tokens, topk));
  return slots;
}

}  // namespace moeblaze
