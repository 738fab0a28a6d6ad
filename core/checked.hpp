// The one range, finiteness and overflow check of every number a user gives moeblaze: the CLI's
// options, the C ABI's arguments and the layer's own validation all call these, so a value is
// accepted or refused the same way (and with the same words) whichever door it came in by.
// Each throws InvalidArgument naming the argument and the reason; none reads global state.
#pragma once
#include <cstdint>
#include <string>

namespace moeblaze {

// Documented limits (docs/cache.md "Limits").
inline constexpr int64_t kMaxTokenSlots = (int64_t{1} << 31) - 1;  // T*K: slot indices are int32 on the device
inline constexpr int kMaxWidth = 65536;                            // d and n: keeps T*K*n and E*n*d in int64 bytes
inline constexpr double kMaxRouteScale = 1e6;                      // gate scale factor
inline constexpr double kMaxBudgetSeconds = 30 * 24 * 3600.0;      // tune --budget: a month
inline constexpr double kMaxTolerancePercent = 1000;               // regress --tolerance
inline constexpr double kMaxCacheMiB = 1024.0 * 1024.0;            // cache gc --max-mb: 1 TiB

// v when lo <= v <= hi; else InvalidArgument(argument, "<symbol> = v is outside [lo, hi]").
int64_t require_in_range(int64_t v, int64_t lo, int64_t hi, const std::string& argument, const std::string& symbol = "");

// v when it is a finite number with lo <= v <= hi (NaN and infinities are refused, not clamped).
double require_finite(double v, double lo, double hi, const std::string& argument, const std::string& symbol = "");

// a*b, or InvalidArgument(argument, "<what> = a x b overflows 64 bits") when it does not fit.
int64_t checked_mul(int64_t a, int64_t b, const std::string& argument, const std::string& what);

// T*K after checking T >= 1 and that the product stays within kMaxTokenSlots (computed without
// overflow, so T = 2^60 is refused rather than wrapped to a small or zero plan).
int64_t checked_token_slots(int64_t tokens, int64_t topk, const std::string& argument);

}  // namespace moeblaze
