// Build description returned by nvte_get_build_info(): JSON text assembled once.
#pragma once

#ifndef NVTE_VERSION_STRING
#define NVTE_VERSION_STRING "0.0.0"
#endif

namespace nvte {
const char *build_info_json();
}  // namespace nvte
