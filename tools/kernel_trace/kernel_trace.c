// Every kernel's start and end on the device, as a program runs at full speed: the timeline that
// Nsight Systems would give, which the device image lacks (bench/RESULTS.md, session 16). ncu
// times each kernel alone, after a pause, so it misses what a back-to-back run pays (clocks under
// the power cap, one kernel's tail before the next); this records the run as it is.
//
// Loaded by LD_PRELOAD, it enables CUPTI's concurrent-kernel activity records before main runs and
// writes them as CSV lines "start_ns,end_ns,stream,grid,block,name" to $MT_KERNEL_TRACE (default
// kernel_trace.csv) when the program exits. A first line "#clock,<cupti_ns>,<unix_ns>" ties the
// records' clock to the wall clock (for nvidia-smi's samples). Built by
// tools/kernel_trace/build.sh; summarised by summarize.py.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static FILE* g_out;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI wants 8-byte-aligned buffers; 8 MB holds ~20k kernel records.
  *size = 8u << 20;
  *buffer = aligned_alloc(8, *size);
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size,
                                      size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity* rec = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)rec;
    if (g_out)
      fprintf(g_out, "%llu,%llu,%u,%d,%d,\"%s\"\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->streamId, k->gridX * k->gridY * k->gridZ,
              k->blockX * k->blockY * k->blockZ, k->name ? k->name : "?");
  }
  free(buffer);
}

static void flush_at_exit(void) {
  cuptiActivityFlushAll(1);
  if (g_out) fclose(g_out);
  g_out = NULL;
}

__attribute__((constructor)) static void kernel_trace_start(void) {
  const char* path = getenv("MT_KERNEL_TRACE");
  g_out = fopen(path && *path ? path : "kernel_trace.csv", "w");
  if (!g_out) {
    fprintf(stderr, "kernel_trace: cannot open %s\n", path ? path : "kernel_trace.csv");
    return;
  }
  uint64_t cupti_now = 0;
  struct timespec wall;
  cuptiGetTimestamp(&cupti_now);
  clock_gettime(CLOCK_REALTIME, &wall);
  fprintf(g_out, "#clock,%llu,%llu\n", (unsigned long long)cupti_now,
          (unsigned long long)wall.tv_sec * 1000000000ull + (unsigned long long)wall.tv_nsec);
  fprintf(g_out, "start_ns,end_ns,stream,grid,block,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    fprintf(stderr, "kernel_trace: CUPTI refused the activity callbacks\n");
    return;
  }
  atexit(flush_at_exit);
  fprintf(stderr, "kernel_trace: recording kernels to %s\n",
          path && *path ? path : "kernel_trace.csv");
}
