/* What an event transport must know about events and capture, sticky errors and costs.
   gcc -O2 -I/usr/local/cuda/include event_capture_race.c -o event_capture_race -L/usr/local/nvidia/lib64 -lcuda -lpthread
   (on the GPU machine; prints one line per fact).

   1. An event recorded into thread A's capture, queried by thread B in relaxed interaction mode
      while the capture is live: the result, and whether A's capture survives.
   2. The same event after the capture ended, after the graph was launched, and after a normal
      record again.
   3. A REUSED event (recorded normally and completed, then recorded into a capture that ended):
      does its query report the old completion (an early release for a transport that queries it)
      or an error?
   4. A sticky error (a trapping kernel): what cuEventQuery returns for events recorded before and
      after the trap, and what cuEventDestroy of such an event returns after the context's reset.
   5. Costs on an idle stream: cuEventRecord, cuEventQuery of a completed event,
      cuStreamGetCaptureInfo, a pair of cuThreadExchangeStreamCaptureMode calls. */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *nm(CUresult r) { const char *s = "?"; cuGetErrorName(r, &s); return s; }
static double now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }

static CUcontext g_ctx;
static CUevent g_ev;
static CUresult g_query;

static void *query_relaxed(void *arg) {
  (void)arg;
  cuCtxSetCurrent(g_ctx);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  cuThreadExchangeStreamCaptureMode(&mode);
  g_query = cuEventQuery(g_ev);
  return 0;
}

static CUresult query_from_relaxed_thread(CUevent ev) {
  pthread_t t; g_ev = ev; pthread_create(&t, 0, query_relaxed, 0); pthread_join(t, 0); return g_query;
}

static const char *PTX =
  ".version 7.0\n.target sm_50\n.address_size 64\n"
  ".visible .entry trap_now() { trap; ret; }\n";

int main(void) {
  CUdevice d; CUstream s;
  cuInit(0); cuDeviceGet(&d, 0); cuDevicePrimaryCtxRetain(&g_ctx, d); cuCtxSetCurrent(g_ctx);
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  const CUstreamCaptureMode modes[2] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED};
  const char *mode_names[2] = {"GLOBAL", "RELAXED"};

  for (int m = 0; m < 2; m++) {
    /* 1 and 2: a fresh event. */
    CUevent ev; cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    cuStreamBeginCapture(s, modes[m]);
    CUresult r = cuEventRecord(ev, s);
    printf("[%s] fresh event: record into capture: %s\n", mode_names[m], nm(r));
    r = query_from_relaxed_thread(ev);
    printf("[%s] fresh event: relaxed thread queries it during the capture: %s\n", mode_names[m], nm(r));
    CUgraph g = 0; r = cuStreamEndCapture(s, &g);
    printf("[%s] fresh event: end capture after that query: %s (graph %s)\n", mode_names[m], nm(r), g ? "made" : "none");
    r = query_from_relaxed_thread(ev);
    printf("[%s] fresh event: query after the capture ended: %s\n", mode_names[m], nm(r));
    if (g) {
      CUgraphExec e; cuGraphInstantiate(&e, g, 0); cuGraphLaunch(e, s); cuStreamSynchronize(s);
      r = query_from_relaxed_thread(ev);
      printf("[%s] fresh event: query after the graph was launched: %s\n", mode_names[m], nm(r));
      cuGraphExecDestroy(e); cuGraphDestroy(g);
    }
    r = cuEventRecord(ev, s); cuStreamSynchronize(s);
    printf("[%s] fresh event: recorded normally again: %s, query: %s\n", mode_names[m], nm(r), nm(query_from_relaxed_thread(ev)));

    /* 3: a reused event, completed before it is recorded into a capture. */
    CUevent re; cuEventCreate(&re, CU_EVENT_DISABLE_TIMING);
    cuEventRecord(re, s); cuStreamSynchronize(s);
    printf("[%s] reused event: completed normally, query: %s\n", mode_names[m], nm(cuEventQuery(re)));
    cuStreamBeginCapture(s, modes[m]);
    cuEventRecord(re, s);
    g = 0; r = cuStreamEndCapture(s, &g);
    printf("[%s] reused event: recorded into a capture, end capture (no query meanwhile): %s\n", mode_names[m], nm(r));
    r = query_from_relaxed_thread(re);
    printf("[%s] reused event: query after that capture ended: %s  <- SUCCESS here means an invisible capture can release early\n", mode_names[m], nm(r));
    if (g) cuGraphDestroy(g);
    cuEventDestroy(ev); cuEventDestroy(re);
  }

  /* 5: costs, idle stream. */
  {
    enum { N = 100000 };
    CUevent ev; cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    cuEventRecord(ev, s); cuStreamSynchronize(s);
    double t0 = now_ns();
    for (int i = 0; i < N; i++) cuEventQuery(ev);
    double t1 = now_ns();
    CUstreamCaptureStatus st; cuuint64_t id;
    for (int i = 0; i < N; i++) cuStreamGetCaptureInfo(s, &st, &id, 0, 0, 0, 0);
    double t2 = now_ns();
    for (int i = 0; i < N; i++) { CUstreamCaptureMode mo = CU_STREAM_CAPTURE_MODE_RELAXED; cuThreadExchangeStreamCaptureMode(&mo); cuThreadExchangeStreamCaptureMode(&mo); }
    double t3 = now_ns();
    CUevent ring[256]; for (int i = 0; i < 256; i++) cuEventCreate(&ring[i], CU_EVENT_DISABLE_TIMING);
    double t4 = now_ns();
    for (int i = 0; i < N; i++) { cuEventRecord(ring[i & 255], s); if ((i & 255) == 255) cuStreamSynchronize(s); }
    double t5 = now_ns();
    printf("costs, ns per call: cuEventQuery(done) %.1f, cuStreamGetCaptureInfo %.1f, exchange-mode pair %.1f, cuEventRecord (idle, ring of 256, sync per 256) %.1f\n",
           (t1 - t0) / N, (t2 - t1) / N, (t3 - t2) / N, (t5 - t4) / N);
  }

  /* 4: sticky error. */
  {
    CUmodule mod; CUfunction trap;
    CUresult r = cuModuleLoadData(&mod, PTX);
    if (r != CUDA_SUCCESS) { printf("sticky: module load failed: %s\n", nm(r)); return 0; }
    cuModuleGetFunction(&trap, mod, "trap_now");
    CUevent before, after; cuEventCreate(&before, CU_EVENT_DISABLE_TIMING); cuEventCreate(&after, CU_EVENT_DISABLE_TIMING);
    cuEventRecord(before, s);
    cuLaunchKernel(trap, 1, 1, 1, 1, 1, 1, 0, s, 0, 0);
    r = cuEventRecord(after, s);
    printf("sticky: record after the trapping kernel: %s\n", nm(r));
    r = cuStreamSynchronize(s);
    printf("sticky: stream synchronize: %s\n", nm(r));
    printf("sticky: query of the event before the trap: %s, after it: %s\n", nm(cuEventQuery(before)), nm(cuEventQuery(after)));
    r = cuDevicePrimaryCtxReset(d);
    printf("sticky: primary context reset: %s\n", nm(r));
    printf("sticky: cuEventDestroy of an event of the reset context: %s\n", nm(cuEventDestroy(after)));
    CUcontext c2; cuDevicePrimaryCtxRetain(&c2, d); cuCtxSetCurrent(c2);
    printf("sticky: the context handle after the reset is %s\n", c2 == g_ctx ? "the same" : "different");
    printf("sticky: query of an event of the old context from the new one: %s\n", nm(cuEventQuery(before)));
  }
  return 0;
}
