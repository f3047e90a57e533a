// A CUDA injection library (loaded through CUDA_INJECTION64_PATH; see ktrace.sh): every
// kernel's, copy's and fill's start and end on the GPU, CUDA-graph nodes included, from
// CUPTI's activity records, written to $KTRACE_OUT at exit as "start end stream name"
// (nanoseconds; copies named "[copy N bytes]", fills "[fill N bytes]").
// KREC, MREC, SREC: the newest kernel, copy and fill record layouts of the toolkit's
// headers (ktrace.sh finds them).
#include <cupti.h>
#include <cstdio>
#include <cstdlib>

static FILE* out;

static void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 32u << 20;
    *buffer = (uint8_t*)aligned_alloc(64, *size);
    *max_records = 0;
}

static void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const KREC* k = (const KREC*)rec;
            fprintf(out, "%llu %llu %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->streamId, k->name);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const MREC* m = (const MREC*)rec;
            fprintf(out, "%llu %llu %u [copy %llu bytes]\n", (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const SREC* m = (const SREC*)rec;
            fprintf(out, "%llu %llu %u [fill %llu bytes]\n", (unsigned long long)m->start, (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
        }
    }
    free(buffer);
}

static void at_exit() {
    cuptiActivityFlushAll(1);
    fclose(out);
}

extern "C" int InitializeInjection() {
    const char* path = getenv("KTRACE_OUT");
    out = fopen(path ? path : "ktrace.txt", "w");
    if (!out) return 0;
    cuptiActivityRegisterCallbacks(requested, completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    atexit(at_exit);
    return 1;
}
