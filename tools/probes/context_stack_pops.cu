/* When does cuCtxPopCurrent fail on a real driver, and does a failed pop leave the stack as it was?
   (The crate retries a failed pop once: support/pushed_context.rs. A retry is right only if a
   failed pop popped nothing.)
   nvcc -O2 context_stack_pops.cu -o context_stack_pops -lcuda   (on the GPU machine)

   1. Push and pop on a healthy primary context, the stack two deep (the caller's context under
      ours): each call's result and what is current after.
   2. Pop with an empty stack: the result, and what is current after.
   3. After a trapping kernel's sticky error has surfaced: push the dead context on top of a
      healthy one of... the same device (the only one): the push's result, the pop's result, what is
      current after each, and a second pop's. Then cuCtxSetCurrent(NULL) on a two-deep stack: how
      many levels it takes off. */
#include <cuda.h>
#include <stdio.h>
__global__ void trap_kernel() { asm volatile("trap;"); }
static const char* name(CUresult r) { const char* n = 0; cuGetErrorName(r, &n); return n ? n : "?"; }
static void current(const char* when, CUcontext a, CUcontext b) {
  CUcontext c = 0; CUresult r = cuCtxGetCurrent(&c);
  printf("  current %s: %s, %s\n", when, name(r), c == 0 ? "none" : c == a ? "A" : c == b ? "B" : "other");
}
int main() {
  cuInit(0);
  CUdevice dev; cuDeviceGet(&dev, 0);
  CUcontext A = 0, B = 0, popped = 0;
  cuDevicePrimaryCtxRetain(&A, dev);
  CUctxCreateParams params = {};
  printf("1. cuCtxCreate (B, a second context): %s\n", name(cuCtxCreate(&B, &params, 0, dev)));
  cuCtxSetCurrent(NULL); cuCtxSetCurrent(NULL); cuCtxSetCurrent(NULL);
  current("at start", A, B);
  printf("  push A: %s\n", name(cuCtxPushCurrent(A)));
  printf("  push B: %s\n", name(cuCtxPushCurrent(B)));
  current("after push A, push B", A, B);
  CUresult r = cuCtxPopCurrent(&popped);
  printf("  pop: %s, popped %s\n", name(r), popped == A ? "A" : popped == B ? "B" : "other");
  current("after one pop", A, B);
  printf("  push B again: %s\n", name(cuCtxPushCurrent(B)));
  printf("  cuCtxSetCurrent(NULL): %s\n", name(cuCtxSetCurrent(NULL)));
  current("after SetCurrent(NULL) on [A, B]", A, B);
  printf("  cuCtxSetCurrent(NULL) again: %s\n", name(cuCtxSetCurrent(NULL)));
  current("after a second SetCurrent(NULL)", A, B);
  popped = 0; r = cuCtxPopCurrent(&popped);
  printf("2. pop on an empty stack: %s, popped %p\n", name(r), (void*)popped);
  current("after it", A, B);
  /* 3. Sticky error in B (A, the primary, stays healthy). */
  cuCtxPushCurrent(B);
  trap_kernel<<<1,1>>>();
  printf("3. after the trap in B, cuCtxSynchronize: %s\n", name(cuCtxSynchronize()));
  current("(B pushed, trapped)", A, B);
  popped = 0; r = cuCtxPopCurrent(&popped);
  printf("  pop of the trapped B: %s, popped %s\n", name(r), popped == A ? "A" : popped == B ? "B" : popped ? "other" : "nothing");
  current("after it", A, B);
  printf("  push A: %s\n", name(cuCtxPushCurrent(A)));
  printf("  push the trapped B on it: %s\n", name(cuCtxPushCurrent(B)));
  current("after push A, push B", A, B);
  popped = 0; r = cuCtxPopCurrent(&popped);
  printf("  pop: %s, popped %s\n", name(r), popped == A ? "A" : popped == B ? "B" : popped ? "other" : "nothing");
  current("after it", A, B);
  popped = 0; r = cuCtxPopCurrent(&popped);
  printf("  pop again: %s, popped %s\n", name(r), popped == A ? "A" : popped == B ? "B" : popped ? "other" : "nothing");
  current("after it", A, B);
  printf("  cuCtxDestroy(B): %s\n", name(cuCtxDestroy(B)));
  printf("  push A, push destroyed B: %s, %s\n", name(cuCtxPushCurrent(A)), name(cuCtxPushCurrent(B)));
  current("after them", A, B);
  popped = 0; r = cuCtxPopCurrent(&popped);
  printf("  pop: %s, popped %s\n", name(r), popped == A ? "A" : popped == B ? "B" : popped ? "other" : "nothing");
  current("after it", A, B);
  return 0;
}
