# moeblaze_portable_library(<target>): links the shared library <target> so that it runs on
# glibc 2.28 and later (manylinux_2_28), whatever glibc builds it: libstdc++ linked in (the
# system's libstdc++ may be older than the compiler's; --exclude-libs keeps its symbols
# private), and every call of a glibc function versioned after 2.28 sent to its baseline
# version (capi/portable/glibc_compat.cpp says which and why). scripts/wheel.sh checks the result.
set(MOEBLAZE_GLIBC_WRAPPED
  pthread_create pthread_join pthread_detach pthread_once pthread_key_create __pthread_key_create
  pthread_mutex_trylock pthread_mutexattr_init pthread_mutexattr_settype pthread_mutexattr_destroy
  dlopen dlsym dlclose dlerror dladdr
  exp log log2 pow
  stat stat64 lstat lstat64 fstat fstat64 fstatat fstatat64
  arc4random)

function(moeblaze_portable_library target)
  if(NOT CMAKE_SYSTEM_PROCESSOR STREQUAL "x86_64" OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    message(STATUS "MOEBLAZE_PORTABLE_C_LIBRARY: only for x86-64 with GCC; ${target} is linked as usual")
    return()
  endif()
  target_sources(${target} PRIVATE ${CMAKE_SOURCE_DIR}/capi/portable/glibc_compat.cpp)
  set(wraps "")
  foreach(name IN LISTS MOEBLAZE_GLIBC_WRAPPED)
    string(APPEND wraps ",--wrap=${name}")
  endforeach()
  target_link_options(${target} PRIVATE -static-libstdc++ "-Wl${wraps}")
  # Before glibc 2.34 the baseline pthread and dl functions live in these two libraries.
  target_link_libraries(${target} PRIVATE "-Wl,--push-state,--no-as-needed" "-l:libpthread.so.0" "-l:libdl.so.2"
                        "-Wl,--pop-state")
endfunction()
