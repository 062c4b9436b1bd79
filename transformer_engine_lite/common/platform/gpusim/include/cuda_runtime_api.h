// gpusim stand-in for the CUDA runtime API header (host code: the GPU gtests, the library's glue).
#pragma once
#include "gpusim/api.h"
