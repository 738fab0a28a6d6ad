#include "cubin_code.hpp"

#include <cstring>

namespace moeblaze {
namespace {
// Little-endian fields of the ELF64 header and section headers (the System V gABI layout).
template <class T>
bool read_at(const std::vector<char>& b, uint64_t at, T& out) {
  if (at > b.size() || b.size() - at < sizeof(T)) return false;
  std::memcpy(&out, b.data() + at, sizeof(T));
  return true;
}
}  // namespace

int64_t kernel_code_bytes(const std::vector<char>& cubin, const std::string& kernel_name) {
  static const char kMagic[] = {0x7f, 'E', 'L', 'F'};
  if (cubin.size() < 64 || std::memcmp(cubin.data(), kMagic, 4) != 0) return -1;
  if (cubin[4] != 2 || cubin[5] != 1) return -1;  // ELFCLASS64, little-endian
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  if (!read_at(cubin, 0x28, shoff) || !read_at(cubin, 0x3a, shentsize) || !read_at(cubin, 0x3c, shnum) ||
      !read_at(cubin, 0x3e, shstrndx) || shentsize < 64 || shstrndx >= shnum)
    return -1;
  // Section header i: sh_name at +0 (4 bytes), sh_offset at +0x18, sh_size at +0x20 (8 each).
  auto header = [&](uint16_t i, uint32_t& name, uint64_t& offset, uint64_t& size) {
    const uint64_t at = shoff + uint64_t{i} * shentsize;
    return read_at(cubin, at, name) && read_at(cubin, at + 0x18, offset) && read_at(cubin, at + 0x20, size);
  };
  uint32_t strtab_name = 0;
  uint64_t strtab_off = 0, strtab_size = 0;
  if (!header(shstrndx, strtab_name, strtab_off, strtab_size) || strtab_off > cubin.size() ||
      cubin.size() - strtab_off < strtab_size)
    return -1;
  const std::string wanted = ".text." + kernel_name;
  for (uint16_t i = 0; i < shnum; ++i) {
    uint32_t name = 0;
    uint64_t offset = 0, size = 0;
    if (!header(i, name, offset, size)) return -1;
    if (name >= strtab_size) continue;
    const char* s = cubin.data() + strtab_off + name;
    const size_t max_len = static_cast<size_t>(strtab_size - name);
    if (strnlen(s, max_len) == wanted.size() && std::memcmp(s, wanted.data(), wanted.size()) == 0)
      return static_cast<int64_t>(size);
  }
  return -1;
}

}  // namespace moeblaze
