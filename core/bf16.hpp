// Host-side bfloat16: storage type and round-to-nearest-even conversion.
// The device side uses CUDA's __nv_bfloat16; both are 16-bit IEEE-style bf16, so a
// buffer of moeblaze::bf16 on the host is bit-compatible with one on the device.
#pragma once
#include <cstdint>
#include <cstring>

namespace moeblaze {

struct bf16 {
  uint16_t bits = 0;
};

inline float to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return bf16{0x7fc0};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace moeblaze
