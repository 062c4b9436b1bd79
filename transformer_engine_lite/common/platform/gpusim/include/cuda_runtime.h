// gpusim stand-in for <cuda_runtime.h>: the runtime API plus the kernel language (gpusim/kernel.h).
// Reached through the include path of gpusim builds only (NVTE_BACKEND=gpusim); a CUDA build sees
// the toolkit's header.
#pragma once
#include "gpusim/api.h"
#include "gpusim/kernel.h"
