// Which cheap, non-blocking driver calls tell a context's sticky error, for a watcher thread that
// must notice a device fault while it waits for host-function or flag-write work (which the
// driver never completes after one)?  And how long after the trap does each first tell it?
//
// A kernel that spins until a host word opens, then traps, on stream A; the watcher (this
// thread, no context current, relaxed capture mode) calls each candidate in a loop and records
// the first time it answers an error, relative to the moment the host opened the word.
//
// Build and run (on the GPU machine):
//   nvcc -O2 -o /tmp/sticky tools/probes/sticky_error_probes.cu -lcuda && /tmp/sticky
#include <cuda.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

__global__ void wait_then_trap(volatile unsigned int* word) {
  while (*word == 0) {
  }
  asm volatile("trap;");
}

static double now_us() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static const char* name(CUresult r) {
  const char* n = 0;
  cuGetErrorName(r, &n);
  return n ? n : "?";
}

#define CHECK(call)                                                              \
  do {                                                                           \
    CUresult r_ = (call);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                    \
      printf("%s -> %d %s\n", #call, (int)r_, name(r_));                         \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

enum { N = 9 };
static const char* labels[N] = {
    "cuStreamQuery(idle stream B, made before)",
    "cuStreamQuery(stream A, the trapping one)",
    "cuEventQuery(never-recorded event)",
    "cuEventQuery(event recorded on B, done)",
    "cuCtxPushCurrent+cuStreamQuery(LEGACY)+Pop",
    "cuCtxPushCurrent+cuCtxGetLimit(STACK)+Pop",
    "cuCtxPushCurrent+cuMemGetInfo+Pop",
    "cuCtxGetId",
    "cuDevicePrimaryCtxGetState",
};

int main() {
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUstream a, b;
  CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUevent never, done;
  CHECK(cuEventCreate(&never, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(done, b));
  CHECK(cuStreamSynchronize(b));
  unsigned int* host = 0;
  CHECK(cuMemHostAlloc((void**)&host, 4, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *host = 0;
  CUdeviceptr dword;
  CHECK(cuMemHostGetDevicePointer(&dword, host, 0));
  // Each candidate's cost while the context is healthy (ns per call, 10,000 calls).
  double cost[N];
  for (int c = 0; c < N; c++) {
    double t0 = now_us();
    for (int i = 0; i < 10000; i++) {
      size_t fr, to, lim;
      unsigned int fl;
      int act;
      unsigned long long id;
      CUcontext popped;
      switch (c) {
        case 0: cuStreamQuery(b); break;
        case 1: cuStreamQuery(a); break;
        case 2: cuEventQuery(never); break;
        case 3: cuEventQuery(done); break;
        case 4: cuCtxPushCurrent(ctx); cuStreamQuery(CU_STREAM_LEGACY); cuCtxPopCurrent(&popped); break;
        case 5: cuCtxPushCurrent(ctx); cuCtxGetLimit(&lim, CU_LIMIT_STACK_SIZE); cuCtxPopCurrent(&popped); break;
        case 6: cuCtxPushCurrent(ctx); cuMemGetInfo(&fr, &to); cuCtxPopCurrent(&popped); break;
        case 7: cuCtxGetId(ctx, &id); break;
        case 8: cuDevicePrimaryCtxGetState(dev, &fl, &act); break;
      }
    }
    cost[c] = (now_us() - t0) * 1000.0 / 10000;
  }
  // The trap: a kernel on A waits for the word, then traps.
  void* args[] = {&dword};
  CUmodule mod;
  CUfunction fn;
  (void)mod;
  (void)fn;
  wait_then_trap<<<1, 1, 0, a>>>((volatile unsigned int*)dword);
  CHECK(cuCtxSetCurrent(NULL));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CHECK(cuThreadExchangeStreamCaptureMode(&mode));
  double first[N];
  CUresult code[N];
  for (int c = 0; c < N; c++) first[c] = -1;
  double opened = now_us();
  __atomic_store_n(host, 1u, __ATOMIC_SEQ_CST);
  int left = N;
  while (left > 0 && now_us() - opened < 2e6) {
    for (int c = 0; c < N; c++) {
      if (first[c] >= 0) continue;
      size_t fr, to, lim;
      unsigned int fl;
      int act = 0;
      unsigned long long id;
      CUcontext popped;
      CUresult r = CUDA_SUCCESS;
      switch (c) {
        case 0: r = cuStreamQuery(b); break;
        case 1: r = cuStreamQuery(a); if (r == CUDA_ERROR_NOT_READY) r = CUDA_SUCCESS; break;
        case 2: r = cuEventQuery(never); break;
        case 3: r = cuEventQuery(done); break;
        case 4: cuCtxPushCurrent(ctx); r = cuStreamQuery(CU_STREAM_LEGACY); if (r == CUDA_ERROR_NOT_READY) r = CUDA_SUCCESS; cuCtxPopCurrent(&popped); break;
        case 5: cuCtxPushCurrent(ctx); r = cuCtxGetLimit(&lim, CU_LIMIT_STACK_SIZE); cuCtxPopCurrent(&popped); break;
        case 6: cuCtxPushCurrent(ctx); r = cuMemGetInfo(&fr, &to); cuCtxPopCurrent(&popped); break;
        case 7: r = cuCtxGetId(ctx, &id); break;
        case 8: r = cuDevicePrimaryCtxGetState(dev, &fl, &act); break;
      }
      if (r != CUDA_SUCCESS) {
        first[c] = now_us() - opened;
        code[c] = r;
        left--;
      }
    }
  }
  printf("%-48s %10s %14s  %s\n", "call", "ns/call", "first error", "code");
  for (int c = 0; c < N; c++) {
    if (first[c] >= 0)
      printf("%-48s %10.0f %11.1f us  %d %s\n", labels[c], cost[c], first[c], (int)code[c], name(code[c]));
    else
      printf("%-48s %10.0f %14s  -\n", labels[c], cost[c], "never (2 s)");
  }
  // After the fault: does a host function enqueued now ever run, and does cuLaunchHostFunc say so?
  CHECK(cuCtxSetCurrent(ctx));
  CUresult sync = cuCtxSynchronize();
  printf("cuCtxSynchronize after -> %d %s\n", (int)sync, name(sync));
  CUresult reset = cuDevicePrimaryCtxReset(dev);
  printf("cuDevicePrimaryCtxReset -> %d %s\n", (int)reset, name(reset));
  (void)args;
  return 0;
}
