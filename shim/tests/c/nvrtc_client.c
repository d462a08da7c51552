/*
 * nvrtc_client LIBNVRTC: compiles CUDA C++ with NVIDIA's NVRTC (opened with
 * dlopen; its path is the argument) into a cubin for sm_80, loads it on the
 * simulated driver and checks what the driver reads from the image: a
 * template kernel (a weak symbol) is found by its lowered name, and each
 * kernel's parameters (offset, size) come from the image. Prints
 * "<check> ok ..." or "<check> FAIL ..." lines; exits 0 when all are ok.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*create_fn)(void **, const char *, const char *, int, const char *const *,
                         const char *const *);
typedef int (*add_name_fn)(void *, const char *);
typedef int (*compile_fn)(void *, int, const char *const *);
typedef int (*lowered_fn)(void *, const char *, const char **);
typedef int (*size_fn)(void *, size_t *);
typedef int (*get_fn)(void *, char *);

static const char *src =
    "template <typename T> __global__ void scale(T *x, T a, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }\n"
    "extern \"C\" __global__ void plain(float *p, double d, char c, int n) { if (n) p[0] = d + c; }\n"
    "extern \"C\" __global__ void none(void) {}\n";

static int failures;

static void params(CUmodule m, const char *kernel, const char *want) {
    CUfunction f;
    CUresult r = cuModuleGetFunction(&f, m, kernel);
    if (r) {
        printf("%s FAIL cuModuleGetFunction = %d\n", kernel, r);
        failures++;
        return;
    }
    size_t n = 0;
    if ((r = cuFuncGetParamCount(f, &n))) {
        printf("%s FAIL cuFuncGetParamCount = %d\n", kernel, r);
        failures++;
        return;
    }
    char got[256] = "";
    for (size_t i = 0; i < n; i++) {
        size_t off = 0, size = 0;
        if ((r = cuFuncGetParamInfo(f, i, &off, &size))) {
            printf("%s FAIL cuFuncGetParamInfo(%zu) = %d\n", kernel, i, r);
            failures++;
            return;
        }
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%zu:%zu", i ? "," : "", off, size);
    }
    if (strcmp(got, want)) {
        printf("%s FAIL params %s, want %s\n", kernel, got, want);
        failures++;
        return;
    }
    printf("%s ok params=%s\n", kernel, got[0] ? got : "-");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen FAIL %s\n", dlerror());
        return 3;
    }
    void *prog;
    const char *opts[] = {"--gpu-architecture=sm_80"};
    const char *lowered = NULL;
    if (((create_fn)dlsym(h, "nvrtcCreateProgram"))(&prog, src, "k.cu", 0, NULL, NULL) ||
        ((add_name_fn)dlsym(h, "nvrtcAddNameExpression"))(prog, "scale<float>") ||
        ((compile_fn)dlsym(h, "nvrtcCompileProgram"))(prog, 1, opts) ||
        ((lowered_fn)dlsym(h, "nvrtcGetLoweredName"))(prog, "scale<float>", &lowered)) {
        printf("nvrtc FAIL\n");
        return 4;
    }
    size_t n = 0;
    ((size_fn)dlsym(h, "nvrtcGetCUBINSize"))(prog, &n);
    char *cubin = malloc(n);
    ((get_fn)dlsym(h, "nvrtcGetCUBIN"))(prog, cubin);
    CUdevice dev;
    CUcontext ctx;
    CUmodule m;
    CUresult r;
    if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
        (r = cuCtxSetCurrent(ctx)) || (r = cuModuleLoadData(&m, cubin))) {
        printf("load FAIL %d\n", r);
        return 5;
    }
    printf("lowered %s\n", lowered);
    params(m, lowered, "0:8,8:4,12:4");
    params(m, "plain", "0:8,8:8,16:1,20:4");
    params(m, "none", "");
    CUfunction missing;
    r = cuModuleGetFunction(&missing, m, "not_there");
    printf("not_there %s rc=%d\n", r == CUDA_ERROR_NOT_FOUND ? "ok" : "FAIL", r);
    if (r != CUDA_ERROR_NOT_FOUND) failures++;
    return failures ? 1 : 0;
}
