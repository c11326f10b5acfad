/* What a primary-context reset does to event handles, and what host registration flags the
   low-latency page needs (answers in reset_and_register.out, from the H200).
   1. cuMemHostRegister with flags 0 (no DEVICEMAP): does cuMemHostGetDevicePointer still work?
   2. Events made, then cuDevicePrimaryCtxReset (the retain kept): how many events made after it
      get the handle of one destroyed by it; what cuEventQuery says of a destroyed handle that was
      not given out again.
   Build on the GPU machine:
   gcc -O2 -I/usr/local/cuda/include reset_and_register.c -o reset_and_register -L/usr/local/nvidia/lib64 -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
static const char *nm(CUresult r) { const char *s = "?"; cuGetErrorName(r, &s); return s; }
int main(void) {
  CUdevice d; CUcontext c;
  cuInit(0); cuDeviceGet(&d, 0); cuDevicePrimaryCtxRetain(&c, d); cuCtxSetCurrent(c);
  /* 1. registration flags */
  unsigned int flags[] = {0, CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_DEVICEMAP,
                          CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP};
  for (int i = 0; i < 4; i++) {
    void *page = 0; if (posix_memalign(&page, 4096, 4096)) return 1;
    CUresult r = cuMemHostRegister(page, 4096, flags[i]);
    CUdeviceptr dp = 0; CUresult g = cuMemHostGetDevicePointer(&dp, page, 0);
    printf("register flags %u: %s; device pointer: %s, %s host address\n", flags[i], nm(r), nm(g),
           (void *)dp == page ? "equal to the" : "not the");
    cuMemHostUnregister(page); free(page);
  }
  /* 2. event handles across a reset */
  enum { BEFORE = 32, AFTER = 256 };
  CUevent before[BEFORE], after[AFTER];
  unsigned long long id = 0; cuCtxGetId(c, &id);
  int made = 0;
  for (int i = 0; i < BEFORE; i++) made += cuEventCreate(&before[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
  printf("context id %llu; %d of %d events made before the reset\n", id, made, BEFORE);
  CUresult r = cuDevicePrimaryCtxReset(d); printf("reset: %s\n", nm(r));
  unsigned int fl = 0; int active = -1; cuDevicePrimaryCtxGetState(d, &fl, &active);
  printf("after the reset: state active %d; cuCtxGetId(handle): %s\n", active, nm(cuCtxGetId(c, &id)));
  r = cuCtxSetCurrent(c); printf("cuCtxSetCurrent(handle): %s\n", nm(r));
  CUevent e; r = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  printf("cuEventCreate with the handle current, no retain: %s\n", nm(r));
  CUcontext c2 = 0; r = cuDevicePrimaryCtxRetain(&c2, d);
  printf("retain again: %s, %s handle\n", nm(r), c2 == c ? "the same" : "another");
  cuCtxSetCurrent(c2); cuDevicePrimaryCtxGetState(d, &fl, &active);
  r = cuCtxGetId(c2, &id); printf("state active %d; cuCtxGetId: %s, id %llu\n", active, nm(r), id);
  made = 0;
  for (int i = 0; i < AFTER; i++) {
    after[i] = 0;
    made += cuEventCreate(&after[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
  }
  printf("%d of %d events made after the retain\n", made, AFTER);
  int reused = 0, stale = -1;
  for (int i = 0; i < BEFORE; i++) {
    int found = 0;
    for (int j = 0; j < AFTER; j++) if (after[j] && before[i] == after[j]) found = 1;
    reused += found;
    if (!found && stale < 0) stale = i;
  }
  printf("%d of %d events destroyed by the reset had their handle given to one of those %d\n",
         reused, BEFORE, made);
  if (stale >= 0) printf("cuEventQuery of a destroyed handle not given out again: %s\n", nm(cuEventQuery(before[stale])));
  return 0;
}
