// gpusim stand-in for <hip/hip_runtime.h>: HIP's runtime API spellings plus the kernel language.
#pragma once
#include "hip_runtime_api.h"
#include "../gpusim/kernel.h"
