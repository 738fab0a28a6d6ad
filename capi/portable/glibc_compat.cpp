// libmoeblaze_c.so for manylinux_2_28: every glibc function it calls must exist in glibc 2.28.
// Built against a newer glibc (Debian 12 has 2.36), the library's own code, the static
// libstdc++ and the static SQLite bind some calls to versions newer than 2.28: glibc 2.34 moved
// libpthread and libdl into libc under new versions, 2.33 made stat() a real function, 2.29
// gave exp/log/pow new versions, 2.36 added arc4random (std::random_device). The linker sends
// every such call here (`-Wl,--wrap=NAME`, cmake/PortableLibrary.cmake) and each wrapper calls
// the x86-64 baseline version, GLIBC_2.2.5, which every glibc since 2.2.5 still exports (from
// libpthread.so.0 and libdl.so.2 before 2.34, which the library therefore names as needed).
// scripts/wheel.sh checks that no newer version is left (auditwheel, objdump).
#include <dlfcn.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <cstdint>

#if !defined(__x86_64__) || !defined(__GLIBC__)
#error "glibc_compat.cpp is for x86-64 glibc (its baseline symbol version is GLIBC_2.2.5)"
#endif

// A call to `name` bound to name@GLIBC_2.2.5, made through __wrap_name.
#define MOEBLAZE_GLIBC_BASELINE(ret, name, params, args)                                       \
  extern "C" ret moeblaze_glibc_##name params;                                                 \
  __asm__(".symver moeblaze_glibc_" #name ", " #name "@GLIBC_2.2.5");                         \
  extern "C" __attribute__((visibility("hidden"))) ret __wrap_##name params { return moeblaze_glibc_##name args; }

// libpthread (GLIBC_2.34 in libc since 2.34).
MOEBLAZE_GLIBC_BASELINE(int, pthread_create, (pthread_t * t, const pthread_attr_t* a, void* (*f)(void*), void* p), (t, a, f, p))
MOEBLAZE_GLIBC_BASELINE(int, pthread_join, (pthread_t t, void** r), (t, r))
MOEBLAZE_GLIBC_BASELINE(int, pthread_detach, (pthread_t t), (t))
MOEBLAZE_GLIBC_BASELINE(int, pthread_once, (pthread_once_t * o, void (*f)()), (o, f))
MOEBLAZE_GLIBC_BASELINE(int, pthread_key_create, (pthread_key_t * k, void (*d)(void*)), (k, d))
MOEBLAZE_GLIBC_BASELINE(int, __pthread_key_create, (pthread_key_t * k, void (*d)(void*)), (k, d))
MOEBLAZE_GLIBC_BASELINE(int, pthread_mutex_trylock, (pthread_mutex_t * m), (m))
MOEBLAZE_GLIBC_BASELINE(int, pthread_mutexattr_init, (pthread_mutexattr_t * a), (a))
MOEBLAZE_GLIBC_BASELINE(int, pthread_mutexattr_settype, (pthread_mutexattr_t * a, int t), (a, t))
MOEBLAZE_GLIBC_BASELINE(int, pthread_mutexattr_destroy, (pthread_mutexattr_t * a), (a))

// libdl (GLIBC_2.34 in libc since 2.34).
MOEBLAZE_GLIBC_BASELINE(void*, dlopen, (const char* f, int m), (f, m))
MOEBLAZE_GLIBC_BASELINE(void*, dlsym, (void* h, const char* s), (h, s))
MOEBLAZE_GLIBC_BASELINE(int, dlclose, (void* h), (h))
MOEBLAZE_GLIBC_BASELINE(char*, dlerror, (), ())
MOEBLAZE_GLIBC_BASELINE(int, dladdr, (const void* a, Dl_info* i), (a, i))

// libm (new versions in 2.29).
MOEBLAZE_GLIBC_BASELINE(double, exp, (double x), (x))
MOEBLAZE_GLIBC_BASELINE(double, log, (double x), (x))
MOEBLAZE_GLIBC_BASELINE(double, log2, (double x), (x))
MOEBLAZE_GLIBC_BASELINE(double, pow, (double x, double y), (x, y))

// The stat family (functions since 2.33; before, inline calls of __xstat and friends with
// version 1, _STAT_VER_LINUX on x86-64, where struct stat and struct stat64 are one layout; the
// fstatat ones came in 2.4).
#define MOEBLAZE_GLIBC_STAT(name, old, version, params, old_params, args)                         \
  extern "C" int moeblaze_glibc_##old old_params;                                                 \
  __asm__(".symver moeblaze_glibc_" #old ", " #old "@" version);                                  \
  extern "C" __attribute__((visibility("hidden"))) int __wrap_##name params { return moeblaze_glibc_##old args; }
constexpr int kStatVer = 1;
MOEBLAZE_GLIBC_STAT(stat, __xstat, "GLIBC_2.2.5", (const char* p, struct stat* b), (int, const char*, struct stat*), (kStatVer, p, b))
MOEBLAZE_GLIBC_STAT(stat64, __xstat64, "GLIBC_2.2.5", (const char* p, struct stat64* b), (int, const char*, struct stat64*), (kStatVer, p, b))
MOEBLAZE_GLIBC_STAT(lstat, __lxstat, "GLIBC_2.2.5", (const char* p, struct stat* b), (int, const char*, struct stat*), (kStatVer, p, b))
MOEBLAZE_GLIBC_STAT(lstat64, __lxstat64, "GLIBC_2.2.5", (const char* p, struct stat64* b), (int, const char*, struct stat64*), (kStatVer, p, b))
MOEBLAZE_GLIBC_STAT(fstat, __fxstat, "GLIBC_2.2.5", (int fd, struct stat* b), (int, int, struct stat*), (kStatVer, fd, b))
MOEBLAZE_GLIBC_STAT(fstat64, __fxstat64, "GLIBC_2.2.5", (int fd, struct stat64* b), (int, int, struct stat64*), (kStatVer, fd, b))
MOEBLAZE_GLIBC_STAT(fstatat, __fxstatat, "GLIBC_2.4", (int d, const char* p, struct stat* b, int f), (int, int, const char*, struct stat*, int), (kStatVer, d, p, b, f))
MOEBLAZE_GLIBC_STAT(fstatat64, __fxstatat64, "GLIBC_2.4", (int d, const char* p, struct stat64* b, int f), (int, int, const char*, struct stat64*, int), (kStatVer, d, p, b, f))

// arc4random (2.36; std::random_device): the kernel's random bytes through getrandom (2.25).
extern "C" __attribute__((visibility("hidden"))) uint32_t __wrap_arc4random() {
  uint32_t v = 0;
  while (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) {
  }
  return v;
}

// libstdc++'s "is the process single-threaded" flag (2.32), read to skip atomic reference
// counts. This copy says "maybe not", so the library always counts atomically.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
