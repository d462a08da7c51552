/*
 * dlsym_local: does dlsym(RTLD_DEFAULT, name) from inside a library loaded
 * with RTLD_LOCAL find that library's own symbols? glibc searches the
 * caller's own scope for RTLD_DEFAULT, so it does without any preload; an
 * interposed dlsym that calls the real one from its own code makes glibc
 * see the interposer as the caller, and the lookup fails.
 *
 * Built twice: with -DDLSYM_LOCAL_LIB -shared -fPIC as the library, and as
 * the program, which dlopens the library given as argv[1] with RTLD_LOCAL
 * and prints one line per probe: "<name> found" or "<name> missing".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#ifdef DLSYM_LOCAL_LIB
int dlsym_local_own_symbol(void) { return 42; }
int cuDlsymLocalOwn(void) { return 43; } /* a cu-prefixed name cgpu does not hook */
int nvmlDlsymLocalOwn(void) { return 44; }

static void probe(const char *name, void *handle) {
    void *p = dlsym(handle, name);
    printf("%s%s %s\n", name, handle == RTLD_DEFAULT ? "@default" : "@next", p ? "found" : "missing");
}

void dlsym_local_probe(void) {
    probe("dlsym_local_own_symbol", RTLD_DEFAULT);
    probe("cuDlsymLocalOwn", RTLD_DEFAULT);
    probe("nvmlDlsymLocalOwn", RTLD_DEFAULT);
    /* Something after this library in its own scope: libc's puts. */
    probe("puts", RTLD_NEXT);
    fflush(stdout);
}
#else
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen %s\n", dlerror()); return 1; }
    void (*f)(void) = (void (*)(void))dlsym(h, "dlsym_local_probe");
    if (!f) { printf("no probe\n"); return 1; }
    f();
    return 0;
}
#endif
