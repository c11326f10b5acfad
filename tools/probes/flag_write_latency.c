/* How soon a host spinner sees a stream's write into host memory, by the write's width and the
   memory's kind: what separates our LowLatency flags (cuStreamWriteValue64 into malloc'd pages
   registered with cuMemHostRegister(DEVICEMAP | PORTABLE)) from cuda-async's reactor slots
   (cuStreamWriteValue32 into cuMemHostAlloc(DEVICEMAP | PORTABLE) memory), both with flags 0.
   gcc -O2 -I/usr/local/cuda/include flag_write_latency.c -o flag_write_latency \
       -L/usr/local/nvidia/lib64 -lcuda    (on the GPU machine)

   Each sample: the stream waits (cuStreamWaitValue32) on a mapped gate word, then writes the
   flag; the host sleeps HOLD µs, opens the gate, and spins on the flag: open → seen, ns.
   Variants interleaved, N samples each; p50 and p99 per variant. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return x < y ? -1 : x > y; }
#define CK(call) do { CUresult r = (call); if (r) { const char* n; cuGetErrorName(r, &n); printf("%s: %s\n", #call, n); exit(1); } } while (0)

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 1000;
  int hold_us = argc > 2 ? atoi(argv[2]) : 50;
  CUdevice dev; CUcontext ctx; CUstream s;
  CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  volatile uint32_t* gate; CUdeviceptr gate_d;
  CK(cuMemHostAlloc((void**)&gate, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CK(cuMemHostGetDevicePointer(&gate_d, (void*)gate, 0));
  void* alloc; CUdeviceptr alloc_d;
  CK(cuMemHostAlloc(&alloc, 4096, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CK(cuMemHostGetDevicePointer(&alloc_d, alloc, 0));
  void* reg = aligned_alloc(4096, 4096); memset(reg, 0, 4096); CUdeviceptr reg_d;
  CK(cuMemHostRegister(reg, 4096, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
  CK(cuMemHostGetDevicePointer(&reg_d, reg, 0));
  memset(alloc, 0, 4096);
  const char* names[4] = {"32-bit into cuMemHostAlloc (cuda-async's)", "64-bit into a registered page (ours)",
                          "64-bit into cuMemHostAlloc", "32-bit into a registered page"};
  double* t[4]; for (int v = 0; v < 4; v++) t[v] = malloc(sizeof(double) * n);
  uint32_t gen = 0;
  for (int i = 0; i < n; i++) {
    for (int v = 0; v < 4; v++) {
      gen++;
      *gate = 0;
      __sync_synchronize();
      CK(cuStreamWaitValue32(s, gate_d, gen, CU_STREAM_WAIT_VALUE_EQ));
      int wide = v == 1 || v == 2;
      int in_alloc = v == 0 || v == 2;
      void* host = in_alloc ? alloc : reg;
      CUdeviceptr dptr = (in_alloc ? alloc_d : reg_d) + 64 * v;
      volatile uint32_t* f32 = (volatile uint32_t*)((char*)host + 64 * v);
      volatile uint64_t* f64 = (volatile uint64_t*)((char*)host + 64 * v);
      if (wide) CK(cuStreamWriteValue64(s, dptr, gen, 0)); else CK(cuStreamWriteValue32(s, dptr, gen, 0));
      double until = now_ns() + hold_us * 1000.0;
      while (now_ns() < until) { }
      double t0 = now_ns();
      *gate = gen;
      __sync_synchronize();
      if (wide) { while (*f64 != gen) { } } else { while (*f32 != gen) { } }
      t[v][i] = now_ns() - t0;
    }
  }
  CK(cuStreamSynchronize(s));
  printf("hold %d us, %d samples each, open -> seen by a host spinner, ns:\n", hold_us, n);
  for (int v = 0; v < 4; v++) {
    qsort(t[v], n, sizeof(double), cmp);
    printf("  %-45s p50 %7.0f  p90 %7.0f  p99 %7.0f\n", names[v], t[v][n / 2], t[v][n * 9 / 10], t[v][n * 99 / 100]);
  }
  return 0;
}
