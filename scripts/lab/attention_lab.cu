// A standalone harness for the decode attention (not part of the build): the generated
// `attention_tiled` (and variants made from its text by scripts/lab/attention_lab.sh) and
// `attention_merge_rope` at DeepSeek-V4-Flash's decode shapes, timed as graphs of
// back-to-back launches.
#include "lab.h"

#include "attention_tiled.cu"
#include "attention_merge_rope.cu"
#ifdef VARIANTS
#include "variants.cu"
#endif

typedef void (*AttFn)(float*, const float*, const float*, const float*, const int*, const float*, usize, usize, usize, usize, usize, usize, usize, usize, usize, usize, float, usize);
typedef void (*MergeFn)(float*, const float*, const float*, usize, usize, usize, usize, usize, usize, float);

int main() {
    const usize heads = 64, hd = 512, window = 128, n_rot = 64;
    const usize pos0 = 2100;
    float *q, *win, *comp, *sinks, *part, *out, *inv;
    int* sel;
    CK(cudaMalloc(&q, heads * hd * 4));
    CK(cudaMalloc(&win, window * hd * 4));
    CK(cudaMalloc(&comp, 1024 * hd * 4));
    CK(cudaMalloc(&sinks, heads * 4));
    CK(cudaMalloc(&part, heads * 64 * (hd + 2) * 4));
    CK(cudaMalloc(&out, heads * hd * 4));
    CK(cudaMalloc(&inv, n_rot * 4));
    CK(cudaMalloc(&sel, 1024 * 4));
    {
        std::vector<float> h(1024 * hd);
        unsigned s = 1;
        for (auto& v : h) { s = s * 1664525u + 1013904223u; v = ((s >> 9) % 2001 - 1000) / 1000.0f; }
        CK(cudaMemcpy(q, h.data(), heads * hd * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(win, h.data() + 7, window * hd * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(comp, h.data() + 3, 1024 * hd * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(sinks, h.data() + 11, heads * 4, cudaMemcpyHostToDevice));
        std::vector<float> f(n_rot);
        for (usize i = 0; i < n_rot; i++) f[i] = powf(10000.0f, -(float)(2 * (i % 32)) / 64.0f);
        CK(cudaMemcpy(inv, f.data(), n_rot * 4, cudaMemcpyHostToDevice));
        std::vector<int> si(1024);
        for (int i = 0; i < 1024; i++) si[i] = (i * 37) % 544;
        CK(cudaMemcpy(sel, si.data(), 1024 * 4, cudaMemcpyHostToDevice));
    }
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    struct Case { const char* what; usize n_comp, mode, ratio, k_sel, nc; };
    const Case cases[] = {
        {"CSA (128 + 512 selected)", 544, 2, 4, 512, 32},
        {"HCA (128 + 16)", 16, 1, 128, 0, 9},
        // Other chunk counts (the merge's register paths' bounds), for the diffs.
        {"CSA, 17 chunks", 544, 2, 4, 512, 17},
        {"CSA, 16 chunks", 544, 2, 4, 512, 16},
        {"HCA, 12 chunks", 16, 1, 128, 0, 12},
        {"HCA, 8 chunks", 16, 1, 128, 0, 8},
        {"CSA, 64 chunks", 544, 2, 4, 512, 64},
        {"CSA, 40 chunks", 544, 2, 4, 512, 40},
        {"CSA, 33 chunks", 544, 2, 4, 512, 33},
    };
    struct K { const char* name; AttFn fn; MergeFn merge; };
    std::vector<K> ks = {{"attention_tiled", attention_tiled, attention_merge_rope}};
#ifdef VARIANTS
    VARIANT_LIST
#endif
    const usize smem = 2 * 16 * 512 * 4;
    for (auto& k : ks) CK(cudaFuncSetAttribute((const void*)k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    printf("%-26s %-28s %8s %8s %8s\n", "case", "kernel", "att us", "merge us", "both us");
    for (const Case& c : cases) {
        const usize blocks = 4 * c.nc;
        std::vector<float> ref;
        for (auto& k : ks) {
            auto att = [&](cudaStream_t t) {
                k.fn<<<(unsigned)blocks, 256, smem, t>>>(part, q, win, comp, sel, sinks, heads, hd, pos0, pos0 + 1 - window, window, window, c.n_comp, c.mode, c.ratio, c.k_sel, 0.044f, c.nc);
            };
            auto merge = [&](cudaStream_t t) {
                k.merge<<<(unsigned)heads, 512, hd * 4, t>>>(out, part, inv, hd, c.nc, heads, n_rot, pos0, 1, -1.0f);
            };
            att(st);
            merge(st);
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            std::vector<float> o(heads * hd);
            CK(cudaMemcpy(o.data(), out, o.size() * 4, cudaMemcpyDeviceToHost));
            float diff = 0;
            if (ref.empty()) ref = o;
            for (size_t i = 0; i < o.size(); i++) diff = std::max(diff, std::fabs(o[i] - ref[i]));
            const float ta = time_graph([&](cudaStream_t t, int) { att(t); }, st, 64);
            const float tm = time_graph([&](cudaStream_t t, int) { merge(t); }, st, 64);
            const float tb = time_graph([&](cudaStream_t t, int) { att(t); merge(t); }, st, 32);
            printf("%-26s %-28s %8.2f %8.2f %8.2f  max|diff| %.1e\n", c.what, k.name, ta, tm, tb, diff);
        }
    }
    return 0;
}
