// mxmoe/hd.h — the one macro that lets the numerics and layout headers compile for both the
// host (CPU reference, tools, tests) and the device (sm_90a kernels).
#pragma once

#if defined(__CUDACC__)
#define MXMOE_HD __host__ __device__ __forceinline__
#else
#define MXMOE_HD inline
#endif
