// Which AOTriton image arch runs on a device arch. Header-only: the selection rules
// (fused_attn/backend_select.cpp, every build) and the glue (AOTriton builds) share it.
#pragma once

#include <cctype>
#include <string>
#include <vector>

namespace nvte {
namespace aotriton {

// The archs the kernels are compiled for when the build has images for all of them.
constexpr const char *kTargetArchs = "gfx90a,gfx942,gfx950,sm_80,sm_90";

// The non-empty items of a `sep`-separated list ("gfx90a,gfx942"; the index's "name:type,...").
inline std::vector<std::string> split_list(const std::string &s, char sep = ',') {
  std::vector<std::string> out;
  for (size_t start = 0; start <= s.size();) {
    const size_t end = s.find(sep, start);
    const std::string item = s.substr(start, end == std::string::npos ? end : end - start);
    if (!item.empty()) out.push_back(item);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// The image arch that runs on device_arch, "" when none in `archs` (comma-separated): AMD needs the
// same base arch ("gfx942:sramecc+:xnack-" -> gfx942); CUDA takes sm_XY itself, else the newest
// sm_XZ of the same major with Z < Y (SASS runs on later minors of its major; Triton's sm_90 code
// is sm_90a, which runs on sm_90 only).
inline std::string image_arch_for(const std::string &device_arch, const std::string &archs) {
  std::string base = device_arch.substr(0, device_arch.find(':'));
  // "sm_90a" / "sm_100f": the arch-specific spellings name the same device.
  if (base.rfind("sm_", 0) == 0 && !base.empty() && std::isalpha(static_cast<unsigned char>(base.back())))
    base.pop_back();
  const std::vector<std::string> list = split_list(archs);
  for (const std::string &a : list)
    if (a == base) return a;
  if (base.rfind("sm_", 0) != 0 || base.size() < 5) return "";
  const std::string major = base.substr(3, base.size() - 4);  // sm_86 -> "8", sm_120 -> "12"
  std::string best;
  for (const std::string &a : list) {
    if (a.rfind("sm_", 0) != 0 || a.size() != base.size() || a.substr(3, a.size() - 4) != major ||
        a == "sm_90")
      continue;
    if (a.back() < base.back() && (best.empty() || a.back() > best.back())) best = a;
  }
  return best;
}

}  // namespace aotriton
}  // namespace nvte
