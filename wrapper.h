/*
 * The one header bindgen reads to produce cuda-dl-sys's committed bindings.
 * It is pinned to the headers of the PyPI wheel nvidia-cuda-runtime==13.5.37
 * (CUDA_VERSION 13050); see scripts/regenerate-bindings.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
